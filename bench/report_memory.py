"""The ``hcqr eval`` memory section of ``RESULTS.md`` (:mod:`bench.eval_memory`'s results)."""

from __future__ import annotations


def _mb(kb: int | None) -> str:
    return "–" if kb is None else f"{kb / 1024:.0f}"


def _losses(losses: dict | None) -> str:
    if losses is None:
        return "–"
    warnings = losses["queue_full_warnings"]
    return f"{losses['rebuilt']:,} ({warnings} warning{'' if warnings == 1 else 's'})"


def render_eval_memory(results: dict) -> list[str]:
    """One table row per ``eval_memory/...`` section, then the stored span text of each."""
    keys = sorted(k for k in results if k.startswith("eval_memory/"))
    if not keys:
        return []
    first = results[keys[0]]
    lines = [
        "",
        "## `hcqr eval` memory and MLflow store growth over many questions (`bench/eval_memory.py`)",
        "",
        "The real command in a child process (MLflow tracking on), its LM the tests' stub OpenAI-compatible server"
        " (no delay, every question new), so the figures are hcqr's, DSPy's and MLflow's, not an LM's. RSS is the"
        " child's `VmRSS` at its first row and as `predictions.jsonl` passes 1k, 5k and 20k rows; the slope is a"
        " least squares fit from 1,000 questions on (a fifth of a shorter run); peak is `VmHWM` during the loop and"
        " overall (the end: metrics, trace checks, scoring). Store: `mlflow.db` + `artifacts/` after the command"
        " exited, per question.",
        "",
        "| method | traces | label | questions | machine | first row s | total s | RSS MB first / 1k / 5k / 20k "
        "| slope KB/question | peak MB loop / all | store bytes/question | span text bytes/question "
        "| traces rebuilt (MLflow queue full) |",
        "|---|---|---|---:|---|---:|---:|---|---:|---|---:|---:|---|",
    ]
    for key in keys:
        s = results[key]
        at = s["rss_kb_at"]
        m = s["machine"]
        slope = "–" if s["slope_kb_per_question"] is None else f"{s['slope_kb_per_question']:.1f}"
        lines.append(
            f"| {s['method']} | {s['traces']} | {s.get('label') or '–'} | {s['questions']:,} | {m['nproc']} cores, "
            f"{m['cpu']} ({s['date'][:10]}) | {s['seconds_to_first_row']} | {s['seconds']:.0f} | "
            f"{' / '.join(_mb(at.get(k)) for k in ('1', '1000', '5000', '20000'))} | {slope} | "
            f"{_mb(s['peak_rss_kb_loop'])} / {_mb(s['peak_rss_kb'])} | {s['store_bytes_per_question']:,} | "
            f"{s['spans']['span_bytes_per_question']:,} | {_losses(s.get('trace_losses'))} |"
        )
    lines += ["", "Stored span text per question, the largest span names (bytes, spans per question):", ""]
    for key in keys:
        s = results[key]
        top = ", ".join(
            f"{name} {v['bytes_per_question']:,} ({v['spans_per_question']:g})"
            for name, v in s["spans"]["top_spans"].items()
        )
        lines.append(f"- {key}: {top or 'no spans'}")
    if first.get("load_average_start"):
        lines += [
            "",
            "Load average at start of each: "
            + "; ".join(f"{k}: {', '.join(map(str, results[k]['load_average_start']))}" for k in keys)
            + ".",
        ]
    return lines
