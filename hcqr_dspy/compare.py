"""Paired comparison of runs on the same questions: tables, exact McNemar tests, plots.

Every run is a run folder written by ``hcqr eval`` (``config.json``,
``predictions.jsonl``, ``metrics.json``, and ``dur.json`` /
``judgments.jsonl`` once judged by ``hcqr judge``). Runs are compared only on
identical question sets; accuracy differences against a reference run are
tested with the exact McNemar test on the discordant pairs
(``statsmodels.stats.contingency_tables.mcnemar(..., exact=True)``: a
two-sided binomial test of b vs c; McNemar 1947).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hcqr_dspy.dur import DUR_METRICS, JUDGMENTS, dur_metrics
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluate import CONFIG, PREDICTIONS, read_rows
from hcqr_dspy.metrics import hypothesis_changes, summarize


@dataclass
class Run:
    """A finished run folder, loaded."""

    path: Path
    label: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]
    dur: dict[str, Any] = field(default_factory=dict)
    judgments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def correct(self) -> dict[str, bool]:
        return {r["qid"]: bool(r["correct"]) for r in self.rows}


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Load a run folder.

    Raises:
        HCQRError: not a run folder, or no finished question.
    """
    path = Path(path)
    if not (path / CONFIG).is_file() or not (path / PREDICTIONS).is_file():
        raise HCQRError(f"{path} is not a run folder (needs {CONFIG} and {PREDICTIONS}; made by `hcqr eval`)")
    config = _read_json(path / CONFIG)
    rows = read_rows(path / PREDICTIONS)
    if not rows:
        raise HCQRError(f"run {path} has no finished question")
    judgments = read_rows(path / JUDGMENTS)
    _check_judgments(path / JUDGMENTS, judgments, {r["qid"] for r in rows})
    # the judgments file is the record (a judge stopped midway has not rewritten dur.json yet)
    if judgments:
        dur = dur_metrics(judgments)
    else:
        dur = _read_json(path / DUR_METRICS) if (path / DUR_METRICS).is_file() else {}
    return Run(path, label or run_label(config, path), config, rows, summarize(rows), dur, judgments)


def _read_json(file: Path) -> dict[str, Any]:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HCQRError(f"{file} is unreadable ({exc}); repair it or run the step that writes it again") from None
    if not isinstance(value, dict):
        raise HCQRError(f"{file} is not a JSON object; repair it or run the step that writes it again")
    return value


def _check_judgments(file: Path, judgments: list[dict[str, Any]], qids: set[str]) -> None:
    """Refuse judgments that cannot be this run's: malformed, repeated, or for questions the run does not hold."""
    seen: set[str] = set()
    for j in judgments:
        if not isinstance(j.get("valid"), bool) or "label" not in j or not isinstance(j.get("passage_queries"), list):
            raise HCQRError(f"{file}: the judgment of {j['qid']!r} lacks 'valid', 'label' or 'passage_queries' "
                            "(not written by `hcqr judge`); repair or delete that line")
        if j["qid"] in seen:
            raise HCQRError(f"{file}: question {j['qid']!r} is judged twice; delete one of the lines")
        seen.add(j["qid"])
    foreign = sorted(seen - qids)
    if foreign:
        raise HCQRError(f"{file} judges {len(foreign)} question(s) this run does not hold ({', '.join(foreign[:5])}); "
                        "was it copied from another run?")


def run_label(config: dict[str, Any], path: Path) -> str:
    """The method, and for a saved (compiled) program ``method+recipe`` (``hcqr+bootstrap_fewshot``)."""
    method = config.get("method", path.name)
    saved = config.get("saved_program")
    if saved:
        return f"{method}+{saved.get('recipe') or 'saved'}"
    return method


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
            cells.append("–" if value is None or base is None else f"{(value - base) * 100:+.1f}")
        lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hypothesis_table(runs: Sequence[Run]) -> str:
    """Markdown: for each run with working hypotheses (HCQR), the hypothesis's accuracy and how the final
    answer relates to it (counts from :func:`hcqr_dspy.metrics.hypothesis_changes`); ``""`` if none has one."""
    keys = ("kept_right", "kept_wrong", "fixed", "broke", "changed_wrong_to_wrong", "invalid_answer")
    lines = []
    for run in runs:
        c = hypothesis_changes(run.rows)
        n = c["with_hypothesis"]
        if not n:
            continue
        changed = c["fixed"] + c["broke"] + c["changed_wrong_to_wrong"]
        lines.append(f"| {run.label} | {n} | {c['hypothesis_correct'] / n:.1%} | {changed / n:.1%} | "
                     + " | ".join(str(c[k]) for k in keys) + " |")
    if not lines:
        return ""
    head = ("| run | with hypothesis | hypothesis accuracy | answer changed | "
            + " | ".join(k.replace("_", " ") for k in keys) + " |")
    return "\n".join([head, "|---|" + "---:|" * (3 + len(keys)), *lines])


def program_state(run: Run) -> dict[str, Any] | None:
    """The run's program state (instructions, demos per predictor): a saved program's ``program.json``,
    else the zero-shot program rebuilt from the method and its recorded options; ``None`` if unavailable."""
    from hcqr_dspy.program_io import STATE_FILE, fresh_state

    saved = run.config.get("saved_program")
    if saved:
        path = Path(saved.get("folder") or "") / STATE_FILE
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
    try:
        return fresh_state(run.config.get("method"), run.config.get("program") or {})
    except HCQRError:
        return None


def program_diff(runs: Sequence[Run], reference: Run) -> str | None:
    """Markdown: how each saved program's instructions and demos differ from the reference's, per predictor.

    ``None`` when no run ran a saved program (then there is nothing to diff).
    """
    import difflib

    if not any(r.config.get("saved_program") for r in runs):
        return None
    ref_state = program_state(reference)
    parts = []
    for run in runs:
        if run is reference or not run.config.get("saved_program"):
            continue
        state = program_state(run)
        saved = run.config["saved_program"]
        parts.append(f"### {run.label} vs {reference.label}\n\noptimizer: {saved.get('optimizer')}, recipe: "
                     f"{saved.get('recipe')}, compiled on {saved.get('train_count')} {saved.get('train_dataset')} questions")
        if state is None or ref_state is None:
            parts.append("(program state unavailable)")
            continue
        for name in sorted(k for k in state if k != "metadata"):
            mine, theirs = state.get(name) or {}, ref_state.get(name) or {}
            a = (theirs.get("signature") or {}).get("instructions", "")
            b = (mine.get("signature") or {}).get("instructions", "")
            demos_a, demos_b = theirs.get("demos") or [], mine.get("demos") or []
            lines = [f"**{name}**: {len(demos_a)} -> {len(demos_b)} demos; instructions "
                     + ("unchanged" if a == b else "changed")]
            if a != b:
                diff = difflib.unified_diff(a.splitlines(), b.splitlines(), reference.label, run.label, lineterm="")
                lines.append("```diff\n" + "\n".join(diff) + "\n```")
            for i, demo in enumerate(demos_b, start=1):
                q = " ".join(str(demo.get("question", "")).split())[:100]
                extra = ", ".join(f"{k}={str(v)[:40]!r}" for k, v in demo.items() if k not in ("question", "options", "augmented"))
                lines.append(f"- demo {i}: {q} ... ({extra})")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


def mcnemar_exact(reference: dict[str, bool], other: dict[str, bool]) -> dict[str, float]:
    """Exact McNemar test of two paired correctness vectors over the same question ids.

    Returns:
        ``b`` (reference right, other wrong), ``c`` (reference wrong, other
        right), ``both_right``, ``both_wrong`` and the two-sided exact
        ``p_value`` (1.0 when there is no discordant pair).
    """
    from statsmodels.stats.contingency_tables import mcnemar

    a = sum(reference[q] and other[q] for q in reference)
    b = sum(reference[q] and not other[q] for q in reference)
    c = sum(not reference[q] and other[q] for q in reference)
    d = sum(not reference[q] and not other[q] for q in reference)
    p = 1.0 if b + c == 0 else float(mcnemar([[a, b], [c, d]], exact=True).pvalue)
    return {"both_right": a, "b": b, "c": c, "both_wrong": d, "p_value": p}


def check_same_questions(runs: Sequence[Run]) -> list[str]:
    """The shared question ids, in the first run's order.

    Raises:
        HCQRError: a run covers other questions (the first differing ids are named).
    """
    first = [r["qid"] for r in runs[0].rows]
    for run in runs[1:]:
        ids = [r["qid"] for r in run.rows]
        if set(ids) != set(first):
            only_a = sorted(set(first) - set(ids))[:5]
            only_b = sorted(set(ids) - set(first))[:5]
            raise HCQRError(
                f"runs cover different questions: {runs[0].path} ({len(first)}) vs {run.path} ({len(ids)}); "
                f"only in the first: {only_a or '-'}; only in the second: {only_b or '-'}. "
                "Compare runs made with the same dataset, --limit/--seed or --ids (finish interrupted runs first)."
            )
    return first


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
        "| run | n | accuracy | ± SE | invalid | DUR | LM calls/q | prompt tok/q | completion tok/q | s/q | vs ref (b/c) | McNemar p |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        m = run.metrics
        dur = dur_cell(run)
        if reference is not None and run is not reference:
            t = mcnemar_exact(reference.correct, run.correct)
            vs = f"{t['b']}/{t['c']}"
            p = f"{t['p_value']:.3g}"
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
            notes.append(f"{run.label} ({len(cached)}/{len(run.rows)} questions with cached calls, "
                         f"{whole} wholly from the cache)")
    if not notes:
        return ""
    return ("**Costs and the cache:** tokens and seconds per question count only LM calls that reached the model; "
            "calls answered by DSPy's cache cost nothing here. Compare costs with care for: " + "; ".join(notes) + ".")


def metrics_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Markdown table of accuracy ± standard error, invalid answers and cost per question.

    Args:
        runs: ``(label, metrics)`` pairs, metrics from :func:`hcqr_dspy.metrics.summarize`.
    """
    lines = [
        "| method | n | accuracy | ± SE | invalid | LM calls/q | prompt tok/q | completion tok/q | s/q |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, m in runs:
        if not m.get("n"):
            lines.append(f"| {label} | 0 | – | – | – | – | – | – | – |")
            continue
        lines.append(
            f"| {label} | {m['n']} | {m['accuracy']:.1%} | {m['accuracy_se']:.1%} | {m['invalid']} "
            f"({m['invalid_rate']:.0%}) | {_calls(m)} | {m['mean_prompt_tokens']:.0f} | "
            f"{m['mean_completion_tokens']:.0f} | {m['mean_seconds']:.1f} |"
        )
    return "\n".join(lines)


def disagreements(runs: Sequence[Run], qids: Sequence[str]) -> str:
    """Markdown list of the questions on which the runs' correctness differs."""
    by_run = [{r["qid"]: r for r in run.rows} for run in runs]
    lines = ["| qid | gold | " + " | ".join(run.label for run in runs) + " |", "|---|---|" + "---|" * len(runs)]
    for q in qids:
        marks = [rows[q]["correct"] for rows in by_run]
        if len(set(marks)) > 1:
            cells = [f"{rows[q]['prediction'] or 'invalid'} {'✓' if rows[q]['correct'] else '✗'}" for rows in by_run]
            lines.append(f"| {q} | {by_run[0][q]['gold']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "No question is answered differently."


def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(runs: Sequence[Run], out: Path) -> Path:
    """Bar chart of accuracy with 95% Wilson intervals (statsmodels ``proportion_confint``)."""
    plt = _pyplot()
    from statsmodels.stats.proportion import proportion_confint

    labels = [r.label for r in runs]
    acc = [r.metrics["accuracy"] for r in runs]
    lo, hi = zip(*(proportion_confint(r.metrics["correct"], r.metrics["n"], method="wilson") for r in runs))
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(runs)), 3.5))
    ax.bar(labels, acc, yerr=[[a - lo_ for a, lo_ in zip(acc, lo)], [hi_ - a for a, hi_ in zip(acc, hi)]], capsize=4, color="#4C72B0")
    ax.set_ylabel("accuracy (95% Wilson CI)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Accuracy on {runs[0].metrics['n']} questions")
    plt.xticks(rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_dur(runs: Sequence[Run], out: Path) -> Path | None:
    """Stacked bars of DUR labels (ENTAILED / USEFUL / NOT_USEFUL / invalid) per judged run."""
    judged = [r for r in runs if r.dur.get("dur_n")]
    if not judged:
        return None
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(judged)), 3.5))
    bottom = [0.0] * len(judged)
    for key, color in (("entailed", "#2ca02c"), ("useful", "#98df8a"), ("not_useful", "#d62728"), ("invalid", "#7f7f7f")):
        vals = []
        for r in judged:
            n, inv = r.dur["dur_n"], r.dur["dur_invalid"]
            vals.append(inv / n if key == "invalid" else r.dur.get(f"dur_{key}", 0.0) * (n - inv) / n)
        ax.bar([r.label for r in judged], vals, bottom=bottom, label=key.replace("_", " ").upper(), color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("share of judged questions")
    ax.set_title("Decision-Useful Rate labels")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    plt.xticks(rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_hypothesis_changes(runs: Sequence[Run], out: Path) -> Path | None:
    """Stacked bars: how HCQR answers relate to their working hypothesis (kept, fixed, broke ...)."""
    with_h = [(r, hypothesis_changes(r.rows)) for r in runs]
    with_h = [(r, c) for r, c in with_h if c["with_hypothesis"]]
    if not with_h:
        return None
    plt = _pyplot()

    keys = ("kept_right", "fixed", "kept_wrong", "broke", "changed_wrong_to_wrong", "invalid_answer")
    colors = ("#2ca02c", "#98df8a", "#ff9896", "#d62728", "#ffbb78", "#7f7f7f")
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(with_h)), 3.5))
    bottom = [0] * len(with_h)
    for key, color in zip(keys, colors):
        vals = [c[key] for _, c in with_h]
        ax.bar([r.label for r, _ in with_h], vals, bottom=bottom, label=key.replace("_", " "), color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("questions")
    ax.set_title("Final answer vs working hypothesis")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def compare(run_dirs: Sequence[str | Path], reference: str | None = None, out_dir: str | Path | None = None) -> tuple[str, list[Path]]:
    """Compare runs: Markdown report and plots.

    Args:
        run_dirs: Two or more run folders over the same questions.
        reference: Label (method) or folder of the reference run; default the first run.
        out_dir: Where to write ``comparison.md``, ``comparison.json`` and the PNGs (default ``./comparison``).

    Returns:
        The Markdown report and the written files.

    Raises:
        HCQRError: fewer than two runs, the same folder twice, unknown reference, different
            question sets, or an ``out_dir`` that is a file or cannot be created.
    """
    if len(run_dirs) < 2:
        raise HCQRError("compare needs at least two run folders")
    seen: dict[Path, str] = {}
    for p in run_dirs:
        real = Path(p).resolve()
        if real in seen:
            raise HCQRError(f"run folder {p} is given twice (also as {seen[real]}); compare distinct runs")
        seen[real] = str(p)
    out = Path(out_dir or "comparison")
    if out.exists() and not out.is_dir():
        raise HCQRError(f"--out {out} exists and is not a folder; choose another --out")
    runs = [load_run(p) for p in run_dirs]
    counts: dict[str, int] = {}
    for r in runs:  # make labels unique: method, then method + lm
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:
        if counts[r.label] > 1:
            r.label = f"{r.label} ({r.config.get('lm', {}).get('spec', r.path.name)})"
    qids = check_same_questions(runs)
    ref = runs[0]
    if reference:
        matches = [r for r in runs if reference in (r.label, r.config.get("method"), str(r.path), r.path.name)]
        if not matches:
            raise HCQRError(f"reference {reference!r} is none of: {', '.join(r.label for r in runs)}")
        ref = matches[0]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HCQRError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    files = [plot_accuracy(runs, out / "accuracy.png")]
    files += [f for f in (plot_dur(runs, out / "dur.png"), plot_hypothesis_changes(runs, out / "hypothesis_changes.png")) if f]
    ordered = [ref] + [r for r in runs if r is not ref]
    report = "\n\n".join(
        [
            f"# Comparison on {len(qids)} questions (reference: {ref.label})",
            comparison_table(ordered, ref),
            "b = questions the reference got right and this run wrong; c = the reverse; exact McNemar test "
            "(statsmodels) on b vs c." + (f"\n\n{note}" if (note := cache_note(ordered)) else ""),
            "## Differences from the reference (percentage points)\n\n" + stage_differences(ordered, ref),
        ]
        + ([f"## Working hypothesis vs final answer\n\n{hyp}\n\nfixed = a wrong hypothesis turned into a right answer; "
             "broke = a right hypothesis turned into a wrong answer."] if (hyp := hypothesis_table(ordered)) else [])
        + [
            "## Runs\n\n" + "\n".join(f"- {r.label}: `{r.path}`" for r in ordered),
            "## Questions answered differently\n\n" + disagreements(ordered, qids),
        ]
        + ([f"## Programs: instructions and demos\n\n{diff}"] if (diff := program_diff(ordered, ref)) else [])
    ) + "\n"
    md = out / "comparison.md"
    md.write_text(report, encoding="utf-8")
    summary = {
        "reference": ref.label,
        "questions": len(qids),
        "runs": {r.label: {"path": str(r.path), **r.metrics, **r.dur} for r in ordered},
        "mcnemar": {r.label: mcnemar_exact(ref.correct, r.correct) for r in ordered if r is not ref},
    }
    js = out / "comparison.json"
    js.write_text(json.dumps(summary, indent=2) + "\n")
    return report, [md, js, *files]
