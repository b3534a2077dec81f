"""The report's headline tables: accuracy, cost and McNemar per run, differences from the reference,
the cache note and the questions answered differently; and the metrics table ``hcqr eval`` prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.evaluation.cpu_pressure import CONTENDED
from hcqr_dspy.reporting.family import MCNEMAR, REFERENCE, compared, mde_text, p_text
from hcqr_dspy.reporting.runs import Run, judged_ids
from hcqr_dspy.reporting.stats import discordant_mde, mcnemar_exact


def _calls(m: dict[str, Any]) -> str:
    """LM calls per question, with the cache-served ones in brackets when there are any."""
    cached = m.get("mean_cached_lm_calls") or 0
    return f"{m['mean_lm_calls']:.1f}" + (f" (+{cached:.1f} cached)" if cached else "")


def dur_cell(run: Run) -> str:
    """DUR as a percentage; "–" when unjudged; "(k/n judged)" added when only some judgeable questions are judged."""
    judgeable = sum(bool(r.get("passages")) for r in run.rows)
    judged = int(run.dur.get("dur_n", 0))
    cell = f"{run.dur['dur']:.1%}" if "dur" in run.dur else "–"
    if judged and judged < judgeable:
        cell += f" ({judged}/{judgeable} judged)"
    return cell


def comparison_table(runs: Sequence[Run], reference: Run | None = None) -> str:
    """Markdown: accuracy ± SE, invalid answers, DUR, cost, and McNemar vs the reference."""
    lines = [
        "| run | n | accuracy | ± SE | invalid | DUR | LM calls/q | prompt tok/q | completion tok/q | s/q "
        "| vs ref (b/c) | McNemar p |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        m = run.metrics
        dur = dur_cell(run)
        if reference is not None and run is not reference:
            t = mcnemar_exact(reference.correct, run.correct)
            vs = f"{t['b']}/{t['c']}"
            n = len(reference.correct)
            p = p_text(
                t["p_value"],
                section=REFERENCE,
                label=compared(reference.label, run.label, "accuracy"),
                test=MCNEMAR,
                mde=mde_text(discordant_mde(t["b"], t["c"], n), 100, 1, unit=" points"),
            )
        else:
            vs, p = ("reference", "") if reference is run else ("", "")
        lines.append(
            f"| {run.label} | {m['n']} | {m['accuracy']:.1%} | {m['accuracy_se']:.1%} | {m['invalid']} | {dur} | "
            f"{_calls(m)} | {m['mean_prompt_tokens']:.0f} | {m['mean_completion_tokens']:.0f} | "
            f"{m['mean_seconds']:.1f} | {vs} | {p} |"
        )
    return "\n".join(lines)


def cache_note(runs: Sequence[Run]) -> str:
    """A warning for runs whose LM calls were partly answered by DSPy's cache: their tokens and seconds
    per question count only the calls that reached the LM, so their costs are not comparable; ``""`` if none."""
    notes = []
    for run in runs:
        cached = [r for r in run.rows if (r.get("cached_lm_calls") or 0) > 0]
        if cached:
            whole = sum(1 for r in cached if not r.get("lm_calls"))
            notes.append(
                f"{run.label} ({len(cached)}/{len(run.rows)} questions with cached calls, "
                f"{whole} wholly from the cache)"
            )
    if not notes:
        return ""
    return (
        "**Costs and the cache:** tokens and seconds per question count only LM calls that reached the model; "
        "calls answered by DSPy's cache cost nothing here (the answer step's letter-distribution prefill is never "
        "cached and shows in the answer stage's seconds). Compare costs with care for: " + "; ".join(notes) + "."
    )


def contention_note(runs: Sequence[Run]) -> str:
    """A warning when the runs' seconds per question were measured under unlike CPU contention
    (:mod:`hcqr_dspy.evaluation.cpu_pressure`, the rows' ``cpu_pressure``): some run was contended (at least
    :data:`CONTENDED` of its answering time), or some runs measured it and others did not; ``""`` when every run
    measured less, or none measured it."""
    shares = {run.label: run.metrics.get("mean_cpu_pressure") for run in runs}
    measured = [v for v in shares.values() if v is not None]
    if not measured:
        return ""
    unmeasured = [label for label, v in shares.items() if v is None]
    if not unmeasured and max(measured) < CONTENDED:
        return ""

    def share(run: Run) -> str:
        value, m = shares[run.label], run.metrics
        if value is None:
            return f"{run.label} not measured"
        rows = int(m.get("cpu_pressure_rows", 0))
        return f"{run.label} {value:.0%}" + ("" if rows == m["n"] else f" ({rows}/{m['n']} questions measured)")

    return (
        "**Seconds and CPU contention:** s/q is wall time, which other work on the machine inflates. Share of each "
        "run's answering time in which some task waited for a CPU (Linux pressure stall information, "
        "/proc/pressure/cpu): " + "; ".join(share(run) for run in runs) + f". A share of {CONTENDED:.0%} or more means "
        "other work inflated that run's seconds, and a run not measured cannot be checked: compare their s/q with "
        "care; LM calls and tokens per question do not depend on it."
    )


def stage_differences(runs: Sequence[Run], reference: Run) -> str:
    """Markdown: each run's accuracy, hypothesis accuracy, DUR and invalid rate minus the reference's (points)."""

    def values(run: Run) -> dict[str, float | None]:
        m = run.metrics
        return {
            "accuracy": m.get("accuracy"),
            "hypothesis accuracy": m.get("hypothesis_accuracy"),
            "DUR": run.dur.get("dur"),
            "invalid rate": m.get("invalid_rate"),
        }

    ref = values(reference)
    lines = ["| run | " + " | ".join(f"Δ {k}" for k in ref) + " |", "|---|" + "---:|" * len(ref)]
    for run in runs:
        if run is reference:
            continue
        cells = []
        for key, value in values(run).items():
            base = ref[key]
            if key == "DUR" and judged_ids(run) != judged_ids(reference):
                base = None  # judged on other questions: no difference to take
            cells.append("–" if value is None or base is None else f"{(value - base) * 100:+.1f}")
        lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def disagreements(runs: Sequence[Run], qids: Sequence[str]) -> str:
    """Markdown list of the questions the runs answer differently: their correctness differs, or they give other
    letters (both wrong with different letters, or one invalid)."""
    by_run = [{r["qid"]: r for r in run.rows} for run in runs]
    lines = ["| qid | gold | " + " | ".join(run.label for run in runs) + " |", "|---|---|" + "---|" * len(runs)]
    for q in qids:
        answers = {(rows[q]["correct"], rows[q]["prediction"]) for rows in by_run}
        if len(answers) > 1:
            cells = [f"{rows[q]['prediction'] or 'invalid'} {'✓' if rows[q]['correct'] else '✗'}" for rows in by_run]
            lines.append(f"| {q} | {by_run[0][q]['gold']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "No question is answered differently."


def metrics_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Markdown table of accuracy ± standard error, invalid answers and cost per question; a line under it names
    the runs whose seconds were measured under CPU contention (:data:`CONTENDED` or more).

    Args:
        runs: ``(label, metrics)`` pairs, metrics from :func:`hcqr_dspy.evaluation.metrics.summarize`.
    """
    lines = [
        "| method | n | accuracy | ± SE | invalid | LM calls/q | prompt tok/q | completion tok/q | s/q |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, m in runs:
        if not m.get("n"):
            lines.append(f"| {label} | 0 | – | – | – | – | – | – | – |")
            continue
        acc = f"{m['accuracy']:.1%} | {m['accuracy_se']:.1%}" if "accuracy" in m else "– (no gold answers) | –"
        lines.append(
            f"| {label} | {m['n']} | {acc} | {m['invalid']} "
            f"({m['invalid_rate']:.0%}) | {_calls(m)} | {m['mean_prompt_tokens']:.0f} | "
            f"{m['mean_completion_tokens']:.0f} | {m['mean_seconds']:.1f} |"
        )
    contended = [f"{label} {m['mean_cpu_pressure']:.0%}" for label, m in runs if _contended(m)]
    if contended:
        lines += [
            "",
            "s/q measured under CPU contention (the share of the answering time some task waited for a CPU): "
            + ", ".join(contended)
            + "; other work on the machine inflated it.",
        ]
    return "\n".join(lines)


def _contended(m: dict[str, Any]) -> bool:
    """Whether a run's metrics measured a CPU contention of :data:`CONTENDED` or more."""
    return (m.get("mean_cpu_pressure") or 0) >= CONTENDED
