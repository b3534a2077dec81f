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

from hcqr_dspy.dur import CONTROL_LIMITS, control_flags, dur_metrics
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.metrics import fallback_summary, hypothesis_changes, summarize
from hcqr_dspy.run_folder import CONFIG, DUR_METRICS, RunFolder, check_same_questions

# A method "ran mostly on its fallback" when more than this share of its questions (or queries) took it.
FALLBACK_WARNING = 0.5
# Fallbacks that replace a method's own retrieval (the row then ran as another method would).
PRIMARY_FALLBACKS = ("hypothesis_failed", "queries_from_question", "passage_failed", "judge_vote_scored")


@dataclass
class Run:
    """A run folder, loaded: its configuration, rows, metrics and DUR judgments."""

    folder: RunFolder
    label: str
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]
    dur: dict[str, Any] = field(default_factory=dict)
    judgments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.folder.path

    @property
    def config(self) -> dict[str, Any]:
        return self.folder.config

    @property
    def correct(self) -> dict[str, bool]:
        return {r["qid"]: bool(r["correct"]) for r in self.rows}

    @property
    def hypothesis_correct(self) -> dict[str, bool] | None:
        """Per question, whether the working hypothesis was right (a hypothesis that could not be parsed
        counts wrong, as an invalid answer does); ``None`` for runs without hypotheses."""
        if not any("hypothesis" in r and (r.get("hypothesis") or (r.get("fallbacks") or {}).get("hypothesis_failed"))
                   for r in self.rows):
            return None
        return {r["qid"]: bool(r.get("hypothesis")) and r["hypothesis"].get("working_hypothesis") == r["gold"]
                for r in self.rows}


def restrict(run: Run, qids: Sequence[str]) -> None:
    """Keep only ``qids`` of a run: its rows, judgments, and the metrics and DUR recomputed from them."""
    keep = set(qids)
    run.rows = [r for r in run.rows if r["qid"] in keep]
    run.metrics = summarize(run.rows)
    run.judgments = [j for j in run.judgments if j.get("qid") in keep]
    run.dur = dur_metrics(run.judgments) if run.judgments else {}  # judgments are the record DUR is computed from


# What every row of a run needs to be compared (written by :func:`hcqr_dspy.evaluate.prediction_row`).
ROW_KEYS = ("prediction", "valid", "correct", "gold")


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Load a run folder (through :class:`~hcqr_dspy.run_folder.RunFolder`).

    Raises:
        HCQRError: not a run folder, no finished question, unreadable records or judgments.
    """
    folder = RunFolder.open(path)
    rows = folder.rows()
    if not rows:
        raise HCQRError(f"run {folder.path} has no finished question")
    for r in rows:
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            raise HCQRError(f"{folder.predictions.path}: the row of question {r['qid']!r} lacks {', '.join(missing)} "
                            "(not written by `hcqr eval`); repair or delete that line")
    if any(r.get("gold") is None for r in rows):
        raise HCQRError(f"run {folder.path} answered questions without gold answers (`hcqr predict`); "
                        "a comparison needs gold answers")
    judgments = folder.judgments()
    # the judgments file is the record (a judge stopped midway has not rewritten dur.json yet)
    dur = dur_metrics(judgments) if judgments else folder.read_json(DUR_METRICS)
    return Run(folder, label or run_label(folder.config, folder.path), rows, summarize(rows), dur, judgments)


def run_label(config: dict[str, Any], path: Path) -> str:
    """The method, and for a saved (compiled) program ``method+recipe`` (``hcqr+bootstrap_fewshot``)."""
    method = config.get("method", path.name)
    saved = config.get("saved_program")
    if saved:
        return f"{method}+{saved.get('recipe') or 'saved'}"
    return method


def unique_labels(runs: Sequence[Run]) -> None:
    """Make the runs' labels unique (reports and ``comparison.json`` are keyed by them): a label shared by
    several runs gets the LM spec, then the folder name, then a number."""
    for extra in (lambda i, r: (r.config.get("lm") or {}).get("spec") or r.path.name, lambda i, r: r.path.name,
                  lambda i, r: str(i + 1)):
        counts: dict[str, int] = {}
        for r in runs:
            counts[r.label] = counts.get(r.label, 0) + 1
        for i, r in enumerate(runs):
            if counts[r.label] > 1:
                r.label = f"{r.label} ({extra(i, r)})"


def judged_ids(run: Run) -> frozenset[str]:
    """The questions a run's DUR was judged on (its judgments)."""
    return frozenset(j["qid"] for j in run.judgments)


def dur_sample_warning(runs: Sequence[Run]) -> list[str]:
    """A warning when judged runs were judged on different questions: their DURs are then not comparable
    (the differences table leaves Δ DUR out for such a run); ``[]`` if all judged runs share their sample."""
    judged = [r for r in runs if r.judgments]
    if len({judged_ids(r) for r in judged}) <= 1:
        return []
    counts = ", ".join(f"{r.label} {len(r.judgments)}" for r in judged)
    return [f"DURs were judged on different questions ({counts} judged): compare DURs only on one shared sample "
            "(`hcqr judge RUN --limit N --seed S` draws the same questions for runs over the same question set)"]


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
        acc = (f"{m['accuracy']:.1%} | {m['accuracy_se']:.1%}" if "accuracy" in m else "– (no gold answers) | –")
        lines.append(
            f"| {label} | {m['n']} | {acc} | {m['invalid']} "
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


def plot_context(runs: Sequence[Run]) -> str:
    """The line every plot's title ends with: dataset, LM and question count (``medqa · LM local · n=20``);
    several datasets or LMs are listed."""
    datasets = sorted({r.folder.dataset_name for r in runs})
    lms = sorted({r.folder.lm_spec or "?" for r in runs})
    return f"{', '.join(datasets)} · LM {', '.join(lms)} · n={runs[0].metrics['n']}"


def _save(fig, out: Path) -> Path:
    """Write a figure with everything drawn around the axes (titles, legends, rotated labels) inside it."""
    import matplotlib.pyplot as plt

    fig.savefig(out, dpi=120, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return out


def wilson_interval(run: Run) -> tuple[float, float]:
    """95% Wilson score interval of a run's accuracy (statsmodels ``proportion_confint(method="wilson")``)."""
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(run.metrics["correct"], run.metrics["n"], method="wilson")
    return float(lo), float(hi)


def plot_accuracy(runs: Sequence[Run], out: Path) -> Path:
    """Bar chart of accuracy with 95% Wilson intervals (:func:`wilson_interval`)."""
    plt = _pyplot()

    labels = [r.label for r in runs]
    acc = [r.metrics["accuracy"] for r in runs]
    lo, hi = zip(*(wilson_interval(r) for r in runs))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(runs)), 3.8))
    ax.bar(labels, acc, yerr=[[a - lo_ for a, lo_ in zip(acc, lo)], [hi_ - a for a, hi_ in zip(acc, hi)]], capsize=4, color="#4C72B0")
    ax.set_ylabel("accuracy (95% Wilson CI)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Accuracy\n{plot_context(runs)}", fontsize=10)
    plt.xticks(rotation=20, ha="right")
    return _save(fig, out)


def plot_accuracy_vs_cost(runs: Sequence[Run], out: Path) -> Path:
    """Write :func:`accuracy_vs_cost_figure` to ``out``."""
    return _save(accuracy_vs_cost_figure(runs), out)


def accuracy_vs_cost_figure(runs: Sequence[Run]):
    """Accuracy (with its 95% Wilson interval) against cost per question, one point per run: is a method's
    extra cost (HCQR's three LM calls against Simple RAG's one) paid back in accuracy?

    Left: LM calls per question (every request the method makes, served by the model or by DSPy's
    cache). Right: tokens per question (prompt + completion, counted on calls the model served). Runs are told
    apart by colour, named in one legend under the axes.

    Returns:
        The matplotlib figure (two axes).
    """
    plt = _pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    xs = {
        "LM calls per question": [r.metrics["mean_lm_calls"] + (r.metrics.get("mean_cached_lm_calls") or 0) for r in runs],
        "tokens per question (prompt + completion)": [r.metrics["mean_prompt_tokens"] + r.metrics["mean_completion_tokens"]
                                                       for r in runs],
    }
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (xlabel, x) in zip(axes, xs.items()):
        for i, run in enumerate(runs):
            lo, hi = wilson_interval(run)
            acc = run.metrics["accuracy"]
            ax.errorbar([x[i]], [acc], yerr=[[acc - lo], [hi - acc]], fmt="o", capsize=4, color=colors[i % len(colors)],
                        label=run.label)
        ax.set_xlabel(xlabel)
        ax.set_xlim(left=0, right=max(x) * 1.25 if max(x) > 0 else 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (95% Wilson CI)")
    axes[0].set_ylim(0, 1)
    # one legend under both axes: labels written beside the points overlapped where two runs cost the same
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(runs), 4), fontsize=8, frameon=False)
    fig.suptitle(f"Accuracy versus cost\n{plot_context(runs)}", fontsize=10)
    return fig


def plot_dur(runs: Sequence[Run], out: Path) -> Path | None:
    """Write :func:`dur_figure` to ``out``; ``None`` when no run was judged."""
    fig = dur_figure(runs)
    return None if fig is None else _save(fig, out)


def dur_figure(runs: Sequence[Run]):
    """Stacked bars of DUR labels (ENTAILED / USEFUL / NOT_USEFUL / invalid) per judged run, each bar named
    with how many questions were judged, and the judge's control rates (share of positive and of negative
    controls labelled useful) as markers on the bar; the legend gives the trust limits (:data:`hcqr_dspy.dur.CONTROL_LIMITS`).

    Returns:
        A matplotlib figure, or ``None`` when no run was judged.
    """
    judged = [r for r in runs if r.dur.get("dur_n")]
    if not judged:
        return None
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(max(4.5, 1.4 * len(judged)), 3.8))
    names = [f"{r.label}\n({r.dur['dur_n']} judged)" for r in judged]
    bottom = [0.0] * len(judged)
    for key, color in (("entailed", "#2ca02c"), ("useful", "#98df8a"), ("not_useful", "#d62728"), ("invalid", "#7f7f7f")):
        vals = []
        for r in judged:
            n, inv = r.dur["dur_n"], r.dur["dur_invalid"]
            vals.append(inv / n if key == "invalid" else r.dur.get(f"dur_{key}", 0.0) * (n - inv) / n)
        ax.bar(names, vals, bottom=bottom, label=key.replace("_", " ").upper(), color=color, width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for key, marker, label in (("positive", "^", f"positive controls useful (trusted ≥ {CONTROL_LIMITS['positive_min']:.0%})"),
                               ("negative", "v", f"negative controls useful (trusted ≤ {CONTROL_LIMITS['negative_max']:.0%})")):
        points = [(i, r.dur[f"dur_{key}_control"]) for i, r in enumerate(judged) if f"dur_{key}_control" in r.dur]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="none", marker=marker, markersize=9,
                    markerfacecolor="white", markeredgecolor="black", label=label)
    ax.set_ylabel("share of judged questions")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Decision-Useful Rate labels and judge controls\n{plot_context(judged)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    plt.xticks(rotation=20, ha="right")
    return fig


def plot_hypothesis_changes(runs: Sequence[Run], out: Path) -> Path | None:
    """Write :func:`hypothesis_changes_figure` to ``out``; ``None`` when no run has hypotheses."""
    fig = hypothesis_changes_figure(runs)
    return None if fig is None else _save(fig, out)


def hypothesis_changes_figure(runs: Sequence[Run]):
    """Stacked bars: how HCQR answers relate to their working hypothesis (kept, fixed, broke ...), in
    questions (whole numbers on the axis); ``None`` when no run has hypotheses."""
    with_h = [(r, hypothesis_changes(r.rows)) for r in runs]
    with_h = [(r, c) for r, c in with_h if c["with_hypothesis"]]
    if not with_h:
        return None
    plt = _pyplot()

    keys = ("kept_right", "fixed", "kept_wrong", "broke", "changed_wrong_to_wrong", "invalid_answer")
    colors = ("#2ca02c", "#98df8a", "#ff9896", "#d62728", "#ffbb78", "#7f7f7f")
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(with_h)), 3.8))
    bottom = [0] * len(with_h)
    for key, color in zip(keys, colors):
        vals = [c[key] for _, c in with_h]
        ax.bar([r.label for r, _ in with_h], vals, bottom=bottom, label=key.replace("_", " "), color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("questions")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # question counts: whole numbers only
    ax.set_title(f"Final answer vs working hypothesis\n{plot_context([r for r, _ in with_h])}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def fallback_table(runs: Sequence[Run]) -> tuple[str, list[str]]:
    """Markdown: every fallback each run's method took (questions affected, and units where they differ),
    the share of its queries by source, and the warnings for runs that ran mostly on a fallback.

    Returns:
        ``(table, warnings)``; the table is ``""`` when no run took any fallback.
    """
    lines, warnings = [], []
    for run in runs:
        summary = fallback_summary(run.rows)
        n = len(run.rows)
        cells = []
        for name, f in summary.items():
            if name.startswith("query_share_"):
                continue
            if not f["total"]:
                continue
            units = f" ({f['total']} in all)" if f["total"] != f["questions"] else ""
            cells.append(f"{name.replace('_', ' ')}: {f['questions']}/{n} q{units}")
            if name in PRIMARY_FALLBACKS and f["rate"] > FALLBACK_WARNING:
                warnings.append(f"{run.label} ran mostly on its fallback: {name.replace('_', ' ')} in "
                                f"{f['questions']}/{n} questions ({f['rate']:.0%})")
        shares = {k[len("query_share_"):]: v for k, v in summary.items() if k.startswith("query_share_")}
        if set(shares) - {"rewrite", "passage"}:
            cells.append("queries by source: " + ", ".join(f"{src} {v:.0%}" for src, v in shares.items()))
            if shares.get("hypothesis", 0) > FALLBACK_WARNING:
                warnings.append(f"{run.label} ran mostly on its fallback: {shares['hypothesis']:.0%} of its queries "
                                "were built from the hypothesis, not written by the rewrite step")
        if cells:
            lines.append(f"| {run.label} | " + "; ".join(cells) + " |")
    if not lines:
        return "", warnings
    return "\n".join(["| run | fallbacks taken |", "|---|---|", *lines]), warnings


def invalid_table(runs: Sequence[Run]) -> str:
    """Markdown: invalid answers by the stage and cause of the bad reply; ``""`` when none is invalid."""
    lines = []
    for run in runs:
        causes = {k[len("invalid_"):]: v for k, v in run.metrics.items()
                  if k.startswith("invalid_") and k not in ("invalid_rate",) and isinstance(v, (int, float))}
        if causes:
            lines.append(f"| {run.label} | {run.metrics['invalid']} | "
                         + ", ".join(f"{k.replace('_', ' ', 1)}: {int(v)}" for k, v in sorted(causes.items())) + " |")
    if not lines:
        return ""
    return "\n".join(["| run | invalid | by stage and cause |", "|---|---:|---|", *lines])


def evidence_table(runs: Sequence[Run], reference: Run) -> str:
    """Markdown: judge-free evidence metrics of each retrieval run (gold / distractor coverage, margin),
    with paired tests against the reference (:func:`hcqr_dspy.evidence.paired_evidence_tests`)."""
    from hcqr_dspy.evidence import paired_evidence_tests

    with_ev = [r for r in runs if r.metrics.get("evidence_n")]
    if not with_ev:
        return ""
    ref_ev = {row["qid"]: row.get("evidence") for row in reference.rows}
    lines = ["| run | n | gold coverage | distractor coverage | margin | vs ref gold b/c | McNemar p | "
             "Δ margin | Wilcoxon p |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in with_ev:
        m = run.metrics
        cells = [f"{m['evidence_n']}", f"{m['gold_coverage']:.1%}", f"{m['distractor_coverage']:.1%}",
                 f"{m['evidence_margin']:+.3f}"]
        t = None
        if run is not reference and reference.metrics.get("evidence_n"):
            t = paired_evidence_tests(ref_ev, {row["qid"]: row.get("evidence") for row in run.rows})
        if t:
            cells += [f"{t['gold_b']}/{t['gold_c']}", f"{t['gold_p']:.3g}", f"{t['margin_mean_diff']:+.3f}", f"{t['margin_p']:.3g}"]
        else:
            cells += ["reference" if run is reference else "–", "", "", ""]
        lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def qrels_table(runs: Sequence[Run], qrels_path: Path | None, explicit: bool = False) -> tuple[str, dict[str, Any]]:
    """Markdown: recall@k and nDCG@10 of each retrieval run's fused contexts against relevance judgments
    (ir-measures; :func:`hcqr_dspy.evidence.qrels_metrics`); ``("", {})`` without qrels.

    Raises:
        HCQRError: ``explicit`` (the user named the file) and it judges none of the compared questions.
    """
    from hcqr_dspy.evidence import load_qrels, qrels_metrics

    if qrels_path is None:
        return "", {}
    qrels = load_qrels(qrels_path)
    no_relevant = 0
    if explicit:
        asked = {r["qid"] for run in runs for r in run.rows}
        if not any(q in asked and any(v > 0 for v in rel.values()) for q, rel in qrels.items()):
            raise HCQRError(f"qrels {qrels_path} mark a relevant passage for none of the {len(asked)} compared "
                            f"questions (e.g. {sorted(asked)[0]}); are they for another dataset?")
    lines, figures = [], {}
    for run in runs:
        if not any(r.get("passages") for r in run.rows):
            continue
        k = int((run.config.get("program") or {}).get("budget") or 15)
        m = qrels_metrics(run.rows, qrels, k=k)
        if not m:
            continue
        figures[run.label] = {key: v for key, v in m.items() if key != "per_query"}
        lines.append(f"| {run.label} | {m['qrels_n']} | {k} | {m[f'recall_at_{k}']:.3f} | {m['ndcg_at_10']:.3f} |")
        no_relevant = max(no_relevant, m["qrels_no_relevant"])
    if not lines:
        return "", {}
    return "\n".join([f"Relevance judgments: `{qrels_path}` (ir-measures)."
                      + (f" {no_relevant} question(s) listed there with no relevant passage are left out "
                         "(trec_eval's convention)." if no_relevant else ""), "",
                      "| run | judged questions | k | recall@k | nDCG@10 |", "|---|---:|---:|---:|---:|", *lines]), figures


def dur_controls_table(runs: Sequence[Run]) -> tuple[str, list[str]]:
    """Markdown: each judged run's DUR beside its judge's rates on the positive and negative controls,
    and the flags of :func:`hcqr_dspy.dur.control_flags`; ``("", [])`` when no run is judged."""
    judged = [r for r in runs if r.dur.get("dur_n")]
    if not judged:
        return "", []
    lines = ["| run | DUR | judged | positive controls useful | negative controls useful | judge |",
             "|---|---:|---:|---:|---:|---|"]
    flags = []
    for run in judged:
        d = run.dur
        judge = run.judgments[0] if run.judgments else d.get("judge") or {}
        pos = f"{d['dur_positive_control']:.0%} (n={d['dur_positive_control_n']})" if "dur_positive_control" in d else "–"
        neg = f"{d['dur_negative_control']:.0%} (n={d['dur_negative_control_n']})" if "dur_negative_control" in d else "–"
        who = ", ".join(f"{k}={judge.get(k)}" for k in ("judge_lm", "mode", "reasoning") if judge.get(k) is not None)
        lines.append(f"| {run.label} | {dur_cell(run)} | {d['dur_n']} | {pos} | {neg} | {who or '–'} |")
        flags += [f"DUR of {run.label} is not trustworthy: {f}" for f in control_flags(d)]
    return "\n".join(lines), flags


def hypothesis_vs_cot(runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    """Markdown: the working hypothesis's accuracy against CoT's on the same questions, exact McNemar test
    (a hypothesis that could not be parsed counts wrong); ``("", {})`` without a CoT run and an HCQR run."""
    cots = [r for r in runs if r.config.get("method") == "cot"]
    with_h = [(r, r.hypothesis_correct) for r in runs]
    with_h = [(r, h) for r, h in with_h if h is not None]
    if not cots or not with_h:
        return "", {}
    lines = ["| run | CoT run | n | hypothesis accuracy | CoT accuracy | b (CoT only) | c (hypothesis only) | McNemar p |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    figures = {}
    for run, h in with_h:
        for cot in cots:  # every CoT run given, each named (runs with other LMs are other baselines)
            t = mcnemar_exact(cot.correct, h)
            n = len(h)
            acc_h = sum(h.values()) / n
            acc_c = sum(cot.correct.values()) / n
            key = run.label if len(cots) == 1 else f"{run.label} vs {cot.label}"
            figures[key] = {"n": n, "cot_run": cot.label, "hypothesis_accuracy": acc_h, "cot_accuracy": acc_c, **t}
            lines.append(f"| {run.label} | {cot.label} | {n} | {acc_h:.1%} | {acc_c:.1%} | {t['b']} | {t['c']} | "
                         f"{t['p_value']:.3g} |")
    return "\n".join(lines), figures


def upstream_agreement(runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    """Markdown and figures: for each pair of runs that record working hypotheses (HCQR and its variants), on
    the questions both answered with one, how often the two runs share the hypothesis letter, the retrieval
    queries (in order) and the shown passages (ids, in order; ``None`` / "–" where a run does not retrieve,
    as ``hcqr_hypothesis``); ``("", {})`` with fewer than two such runs.

    An ablation that changes only the answer step (``hcqr`` against ``hcqr_show_hypothesis``) differs from
    its base by that step alone on the questions where all three agree. They need not agree even with the
    same prompts at temperature 0: the committed study's two HCQR cells, run in different sessions on
    fresh machines, disagree on some hypotheses, so the report says how often they do.
    """
    with_h = [r for r in runs if r.hypothesis_correct is not None]
    if len(with_h) < 2:
        return "", {}

    def upstream(run: Run) -> dict[str, tuple]:
        return {r["qid"]: (r["hypothesis"].get("working_hypothesis"), tuple(r.get("queries") or ()),
                           tuple(p.get("id") for p in r.get("passages") or ()))
                for r in run.rows if r.get("hypothesis")}

    ups = [upstream(r) for r in with_h]
    # runs without retrieval (hcqr_hypothesis) have no queries to agree on
    retrieves = [any(u[1] for u in up.values()) for up in ups]
    lines = ["| runs | n | same hypothesis letter | same queries | same passages | all three |",
             "|---|---:|---:|---:|---:|---:|"]
    figures = {}
    for i, a in enumerate(with_h):
        for j in range(i + 1, len(with_h)):
            b, ua, ub = with_h[j], ups[i], ups[j]
            both = sorted(ua.keys() & ub.keys())
            n = len(both)
            same = [tuple(x == y for x, y in zip(ua[q], ub[q])) for q in both]
            retrieve = retrieves[i] and retrieves[j]
            counts = {"n": n, "same_hypothesis": sum(s[0] for s in same),
                      "same_queries": sum(s[1] for s in same) if retrieve else None,
                      "same_passages": sum(s[2] for s in same) if retrieve else None,
                      "same_all": sum(all(s) for s in same) if retrieve else None}
            figures[f"{a.label} vs {b.label}"] = counts
            cells = " | ".join(f"{counts[k]} ({counts[k] / n:.0%})" if n and counts[k] is not None else "–"
                               for k in ("same_hypothesis", "same_queries", "same_passages", "same_all"))
            lines.append(f"| {a.label} vs {b.label} | {n} | {cells} |")
    return "\n".join(lines), figures


def session_summary(run: Run) -> dict[str, Any]:
    """Where a run's rows and judgments were made (``sessions.jsonl``): ``sessions`` (``hcqr eval`` sessions),
    ``machines`` (their :func:`hcqr_dspy.provenance.machine_key`, oldest first), ``rows_before_sessions``
    (rows written before the first recorded eval session: all of them for a run without one) and
    ``judge_sessions`` / ``judge_machines`` likewise for ``hcqr judge``."""
    from hcqr_dspy.provenance import machine_key

    records = run.folder.sessions()
    evals = [s for s in records if s.get("command") == "eval"]
    judges = [s for s in records if s.get("command") == "judge"]
    return {
        "sessions": len(evals),
        "machines": list(dict.fromkeys(machine_key(s) for s in evals)),
        "rows_before_sessions": evals[0]["predictions_before"] if evals else len(run.folder.predictions.read()),
        "judge_sessions": len(judges),
        "judge_machines": list(dict.fromkeys(machine_key(s) for s in judges)),
    }


def provenance_line(summary: dict[str, Any]) -> str:
    """The Runs section's note on where a run's rows (and judgments) were made, from its :func:`session_summary`."""

    def where(machines: list[str]) -> str:
        return (f"on one machine: {machines[0]}" if len(machines) == 1
                else f"on {len(machines)} different machines or LM stacks: " + " | ".join(machines))

    parts = []
    if summary["sessions"]:
        parts.append(f"rows written in {summary['sessions']} session(s) {where(summary['machines'])}")
    if summary["rows_before_sessions"]:
        parts.append(f"{summary['rows_before_sessions']} row(s) written before sessions were recorded (machine unknown)")
    if summary["judge_sessions"]:
        parts.append(f"judged in {summary['judge_sessions']} session(s) {where(summary['judge_machines'])}")
    return "; ".join(parts)


# The figures compare() writes (a function returns None where its figure does not apply); one that an earlier
# comparison left in --out and this one does not make is removed.
PLOTS = {"accuracy.png": plot_accuracy, "accuracy_vs_cost.png": plot_accuracy_vs_cost, "dur.png": plot_dur,
         "hypothesis_changes.png": plot_hypothesis_changes}


def compare(run_dirs: Sequence[str | Path], reference: str | None = None, out_dir: str | Path | None = None,
            qrels: str | Path | None = None, common: bool = False) -> tuple[str, list[Path]]:
    """Compare runs: Markdown report and plots.

    Args:
        run_dirs: Two or more run folders over the same questions.
        reference: Label (method) or folder of the reference run; default the first run.
        out_dir: Where to write ``comparison.md``, ``comparison.json`` and the PNGs (default ``./comparison``).
        qrels: Relevance judgments for recall@k / nDCG@10; default a ``qrels.json`` beside the dataset file.
        common: Runs still under way over the same question set are compared on the questions every run
            has answered (rows, metrics and judgments restricted to them; the report says how many of
            each run's questions that is). Without it, runs must hold the same questions.

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
    if (out / CONFIG).exists():
        raise HCQRError(f"--out {out} is a run folder; write the comparison to a folder of its own")
    runs = [load_run(p) for p in run_dirs]
    unique_labels(runs)
    qids = check_same_questions([r.folder for r in runs], [r.rows for r in runs], common=common)
    answered = {r.label: len(r.rows) for r in runs}
    if common:
        for r in runs:
            restrict(r, qids)
    ref = runs[0]
    if reference:
        matches = [r for r in runs if reference in (r.label, r.config.get("method"), str(r.path), r.path.name)
                   or Path(reference).resolve() == r.path.resolve()]
        if not matches:
            raise HCQRError(f"reference {reference!r} is none of: {', '.join(r.label for r in runs)}")
        if len(matches) > 1:
            raise HCQRError(f"reference {reference!r} matches {len(matches)} runs ({', '.join(r.label for r in matches)}); "
                            "give the reference run's folder")
        ref = matches[0]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HCQRError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    files = []
    for name, plot in PLOTS.items():
        if (written := plot(runs, out / name)) is not None:
            files.append(written)
        else:  # a plot of an earlier comparison in this folder that this one lacks
            (out / name).unlink(missing_ok=True)
    ordered = [ref] + [r for r in runs if r is not ref]
    from hcqr_dspy.evidence import qrels_beside

    fallbacks, warnings = fallback_table(ordered)
    invalid = invalid_table(ordered)
    evidence = evidence_table(ordered, ref)
    qrels_md, qrels_figures = qrels_table(ordered, Path(qrels) if qrels else qrels_beside(ref.folder.dataset),
                                            explicit=bool(qrels))
    controls, flags = dur_controls_table(ordered)
    h_vs_cot, h_vs_cot_figures = hypothesis_vs_cot(ordered)
    agreement, agreement_figures = upstream_agreement(ordered)
    warnings += flags + dur_sample_warning(ordered)
    sessions = {r.label: session_summary(r) for r in ordered}
    report = "\n\n".join(
        [
            f"# Comparison on {len(qids)} questions (reference: {ref.label})"
            + (f"\n\nRuns under way, compared on the {len(qids)} questions every run has answered of the "
               f"{ref.folder.questions_record.get('count', '?')} selected (answered so far: "
               + ", ".join(f"{label} {n}" for label, n in answered.items()) + ")."
               if common and len(set(answered.values()) | {len(qids)}) > 1 else ""),
            comparison_table(ordered, ref),
            "b = questions the reference got right and this run wrong; c = the reverse; exact McNemar test "
            "(statsmodels) on b vs c." + (f"\n\n{note}" if (note := cache_note(ordered)) else ""),
            "## Differences from the reference (percentage points)\n\n" + stage_differences(ordered, ref),
        ]
        + ([("## Warnings\n\n" + "\n".join(f"- **{w}**" for w in warnings))] if warnings else [])
        + ([f"## Invalid answers by stage and cause\n\n{invalid}"] if invalid else [])
        + ([f"## Fallbacks\n\n{fallbacks}\n\nA fallback is what a method did instead of its own path (e.g. HCQR "
             "queries built from the hypothesis fields because the rewrite gave fewer than two usable queries, or the "
             "question itself when the hypothesis reply could not be parsed); a run that took one mostly is flagged above."]
           if fallbacks else [])
        + ([f"## DUR judge controls\n\n{controls}\n\nPositive control: a context stating the gold answer and why; "
             "negative control: another question's context. A trustworthy judge calls at least "
             f"{CONTROL_LIMITS['positive_min']:.0%} of positive and at most {CONTROL_LIMITS['negative_max']:.0%} of "
             "negative controls useful."] if controls else [])
        + ([f"## Evidence in the context (judge-free)\n\n{evidence}\n\ngold coverage = share of questions whose shown "
             "context has a passage holding every stemmed content word of the gold option; distractor coverage = mean "
             "share of distractors so mentioned; margin = the difference. Paired tests against the reference: exact "
             "McNemar on gold mentions, Wilcoxon signed-rank on per-question margins."] if evidence else [])
        + ([f"## Retrieval against relevance judgments\n\n{qrels_md}"] if qrels_md else [])
        + ([f"## Working hypothesis vs CoT\n\n{h_vs_cot}\n\nb = questions CoT answered right and the hypothesis "
             "got wrong; c = the reverse; exact McNemar test. A hypothesis reply that could not be parsed counts wrong."]
           if h_vs_cot else [])
        + ([f"## Working hypothesis vs final answer\n\n{hyp}\n\nfixed = a wrong hypothesis turned into a right answer; "
             "broke = a right hypothesis turned into a wrong answer."] if (hyp := hypothesis_table(ordered)) else [])
        + ([f"## Working hypotheses across runs\n\n{agreement}\n\nOn the questions both runs answered with a working "
             "hypothesis: how often they formed the same hypothesis letter, rewrote it into the same queries and "
             "showed the same passages. Where these differ, a difference between the runs is not only that of their "
             "programs' answer steps (an LM can give another reply to the same prompt, e.g. in another session)."] if agreement else [])
        + [
            "## Runs\n\n" + "\n".join(f"- {r.label}: `{r.path}`; {provenance_line(sessions[r.label])}" for r in ordered),
            "## Questions answered differently\n\n" + disagreements(ordered, qids),
        ]
        + ([f"## Programs: instructions and demos\n\n{diff}"] if (diff := program_diff(ordered, ref)) else [])
    ) + "\n"
    md = out / "comparison.md"
    md.write_text(report, encoding="utf-8")
    summary = {
        "reference": ref.label,
        "questions": len(qids),
        "answered": answered,
        "runs": {r.label: {"path": str(r.path.resolve()), **r.metrics, **r.dur} for r in ordered},
        "mcnemar": {r.label: mcnemar_exact(ref.correct, r.correct) for r in ordered if r is not ref},
        "warnings": warnings,
        "fallbacks": {r.label: fallback_summary(r.rows) for r in ordered},
        "qrels": qrels_figures,
        "hypothesis_vs_cot": h_vs_cot_figures,
        "upstream_agreement": agreement_figures,
        "sessions": sessions,
    }
    js = out / "comparison.json"
    js.write_text(json.dumps(summary, indent=2) + "\n")
    return report, [md, js, *files]


def _metric_label(label: str) -> str:
    """A run label as part of an MLflow metric name (letters, digits, ``_ - . / :`` and spaces)."""
    import re

    return re.sub(r"[^\w.\- /:]", "_", label)


def track_comparison(out_dir: str | Path, mlflow_dir: str | Path | None = None) -> str:
    """Record a comparison written by :func:`compare` as an MLflow run (a child run when one is active).

    The run is named after what it compares (``compare hcqr vs simple_rag · medqa · local``) and tagged
    ``kind=comparison``, ``reference``, ``runs`` (the compared MLflow run ids, comma-separated) and
    ``run.<label>`` (each one's id); its description links each compared run. Metrics, per compared run
    label: ``accuracy.<label>``, ``delta_accuracy.<label>`` (minus the reference's), ``mcnemar_p.<label>``
    (exact McNemar against the reference), ``dur.<label>`` (when judged) and ``lm_calls.<label>``
    (LM calls per question). The report, the JSON summary and the plots are its artifacts.

    Args:
        out_dir: The folder :func:`compare` wrote (``comparison.json`` and the files beside it).
        mlflow_dir: MLflow store folder.

    Returns:
        The comparison run's id.

    Raises:
        HCQRError: ``out_dir`` holds no readable ``comparison.json``.
    """
    import mlflow

    from hcqr_dspy import tracking
    from hcqr_dspy.run_folder import read_json_object

    out = Path(out_dir)
    summary = read_json_object(out / "comparison.json", "comparison summary")
    labels = list(summary["runs"])
    ref = summary["reference"]
    folders = {label: RunFolder(info["path"]) for label, info in summary["runs"].items()}
    first = folders[ref].config if (folders[ref].path / "config.json").is_file() else {}
    dataset = Path(first.get("dataset", "")).stem or "?"
    lm = (first.get("lm") or {}).get("spec") or "?"
    run_ids = {label: (f.config.get("mlflow_run_id") if (f.path / "config.json").is_file() else None)
               for label, f in folders.items()}
    name = f"compare {' vs '.join(labels)} · {dataset} · {lm}"
    tags = {"kind": "comparison", "reference": ref, "dataset": dataset,
            "runs": ",".join(r for r in run_ids.values() if r),
            **{f"run.{_metric_label(label)}": rid for label, rid in run_ids.items() if rid}}
    with tracking.mlflow_run(name, {"reference": ref, "questions": summary["questions"]}, tags=tags,
                             store=mlflow_dir, traces=False) as run:
        metrics: dict[str, float] = {}
        ref_acc = summary["runs"][ref].get("accuracy")
        for label, info in summary["runs"].items():
            key = _metric_label(label)
            metrics[f"accuracy.{key}"] = info["accuracy"]
            metrics[f"lm_calls.{key}"] = info["mean_lm_calls"]
            if info.get("dur") is not None:
                metrics[f"dur.{key}"] = info["dur"]
            if label != ref:
                metrics[f"delta_accuracy.{key}"] = info["accuracy"] - ref_acc
                metrics[f"mcnemar_p.{key}"] = summary["mcnemar"][label]["p_value"]
        mlflow.log_metrics(metrics)
        lines = [f"Paired comparison on {summary['questions']} questions of `{dataset}` (reference: **{ref}**).", "",
                 "| run | accuracy | Δ vs reference | McNemar p | MLflow run |", "|---|---:|---:|---:|---|"]
        for label in labels:
            info = summary["runs"][label]
            delta = "reference" if label == ref else f"{(info['accuracy'] - ref_acc) * 100:+.1f} pts"
            p = "" if label == ref else f"{summary['mcnemar'][label]['p_value']:.3g}"
            link = tracking.run_link(run_ids[label]) if run_ids[label] else None
            lines.append(f"| {label} | {info['accuracy']:.1%} | {delta} | {p} | {link or '–'} |")
        mlflow.set_tag("mlflow.note.content", "\n".join(lines))
        for f in sorted(out.iterdir()):
            if f.is_file() and f.suffix in (".md", ".json", ".png"):
                mlflow.log_artifact(str(f), artifact_path="comparison")
        return run.info.run_id
