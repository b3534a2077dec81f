"""The comparison's figures (matplotlib, Agg backend): accuracy, accuracy against cost, DUR labels,
hypothesis changes and zero-shot against compiled programs, and :data:`PLOTS`, the file name -> plot function
table :func:`~hcqr_dspy.reporting.compare` writes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hcqr_dspy.evaluation.metrics import hypothesis_changes
from hcqr_dspy.judge.controls import CONTROL_LIMITS, control_flags
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import MIN_PAIRS_FOR_INTERVAL, wilson_interval


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


def plot_accuracy(runs: Sequence[Run], out: Path) -> Path:
    """Bar chart of accuracy with 95% Wilson intervals (:func:`hcqr_dspy.reporting.stats.wilson_interval`)."""
    plt = _pyplot()

    labels = [r.label for r in runs]
    acc = [r.metrics["accuracy"] for r in runs]
    lo, hi = zip(*(wilson_interval(r) for r in runs))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(runs)), 3.8))
    ax.bar(
        labels,
        acc,
        yerr=[[a - lo_ for a, lo_ in zip(acc, lo)], [hi_ - a for a, hi_ in zip(acc, hi)]],
        capsize=4,
        color="#4C72B0",
    )
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
    cache). Right: tokens per question (prompt + completion, counted on calls the model served: a cached call
    counts none). The axis labels say so. Runs are told apart by colour and marker, named in one legend under the
    axes; runs at the same point (equal cost and accuracy, as two variants often are) are drawn side by side
    (:func:`dodge`) instead of on top of each other.

    Returns:
        The matplotlib figure (two axes).
    """
    plt = _pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    xs = {
        "LM calls per question\n(cached calls included)": [
            r.metrics["mean_lm_calls"] + (r.metrics.get("mean_cached_lm_calls") or 0) for r in runs
        ],
        "tokens per question, prompt + completion\n(calls the model served; a cached call counts none)": [
            r.metrics["mean_prompt_tokens"] + r.metrics["mean_completion_tokens"] for r in runs
        ],
    }
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    accuracies = [r.metrics["accuracy"] for r in runs]
    for ax, (xlabel, x) in zip(axes, xs.items()):
        shown = dodge(x, accuracies)
        for i, run in enumerate(runs):
            lo, hi = wilson_interval(run)
            acc = run.metrics["accuracy"]
            ax.errorbar(
                [shown[i]],
                [acc],
                yerr=[[acc - lo], [hi - acc]],
                fmt=MARKERS[i % len(MARKERS)],
                capsize=4,
                color=colors[i % len(colors)],
                label=run.label,
            )
        ax.set_xlabel(xlabel)
        ax.set_xlim(left=0, right=max(x) * 1.25 if max(x) > 0 else 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (95% Wilson CI)")
    axes[0].set_ylim(0, 1)
    # one legend under both axes: labels written beside the points overlapped where two runs cost the same
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.06),  # below the two-line axis labels
        ncol=min(len(runs), 4),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(f"Accuracy versus cost\n{plot_context(runs)}", fontsize=10)
    return fig


MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")


def dodge(x: Sequence[float], y: Sequence[float], share: float = 0.03) -> list[float]:
    """``x`` with the points that share an ``(x, y)`` spread side by side: the k-th of m equal points moves by
    ``(k - (m - 1) / 2) * share`` of the axis span (``max(x)``), so none hides another."""
    span = max(x) if x and max(x) > 0 else 1.0
    groups: dict[tuple[float, float], list[int]] = {}
    for i, point in enumerate(zip(x, y)):
        groups.setdefault((round(point[0], 9), round(point[1], 9)), []).append(i)
    shown = list(x)
    for members in groups.values():
        for k, i in enumerate(members):
            shown[i] = x[i] + (k - (len(members) - 1) / 2) * share * span
    return shown


def plot_dur(runs: Sequence[Run], out: Path) -> Path | None:
    """Write :func:`dur_figure` to ``out``; ``None`` when no run was judged."""
    fig = dur_figure(runs)
    return None if fig is None else _save(fig, out)


def dur_figure(runs: Sequence[Run]):
    """Stacked bars of DUR labels (ENTAILED / USEFUL / NOT_USEFUL / invalid) per judged run, each bar named
    with how many questions were judged, and the judge's control rates (share of positive and of negative
    controls labelled useful, and of on-topic controls where judged) as markers on the bar; the legend gives the
    trust limits (:data:`hcqr_dspy.judge.controls.CONTROL_LIMITS`). A run whose judge failed its controls
    or was not checked by them (:func:`hcqr_dspy.judge.controls.control_flags`; the report says why) has hatched,
    faded bars and a red name saying it is not trusted.

    Returns:
        A matplotlib figure, or ``None`` when no run was judged.
    """
    judged = [r for r in runs if r.dur.get("dur_n")]
    if not judged:
        return None
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(max(4.5, 1.4 * len(judged)), 3.8))
    flagged = [bool(control_flags(r.dur)) for r in judged]
    names = [
        f"{r.label}\n({r.dur['dur_n']} judged)" + ("\nJUDGE NOT TRUSTED" if bad else "")
        for r, bad in zip(judged, flagged)
    ]
    bottom = [0.0] * len(judged)
    for key, color in (
        ("entailed", "#2ca02c"),
        ("useful", "#98df8a"),
        ("not_useful", "#d62728"),
        ("invalid", "#7f7f7f"),
    ):
        vals = []
        for r in judged:
            n, inv = r.dur["dur_n"], r.dur["dur_invalid"]
            vals.append(inv / n if key == "invalid" else r.dur.get(f"dur_{key}", 0.0) * (n - inv) / n)
        bars = ax.bar(names, vals, bottom=bottom, label=key.replace("_", " ").upper(), color=color, width=0.6)
        for bar, bad in zip(bars, flagged):
            if bad:  # an untrustworthy judge's labels: hatched
                bar.set_hatch("//")
                bar.set_alpha(0.45)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for key, marker, label in (
        ("positive", "^", f"positive controls useful (trusted ≥ {CONTROL_LIMITS['positive_min']:.0%})"),
        ("negative", "v", f"negative controls useful (trusted ≤ {CONTROL_LIMITS['negative_max']:.0%})"),
        ("on_topic", "s", f"on-topic controls useful (trusted ≤ {CONTROL_LIMITS['on_topic_max']:.0%})"),
    ):
        points = [(i, r.dur[f"dur_{key}_control"]) for i, r in enumerate(judged) if f"dur_{key}_control" in r.dur]
        if points:
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                linestyle="none",
                marker=marker,
                markersize=9,
                markerfacecolor="white",
                markeredgecolor="black",
                label=label,
            )
    ax.set_ylabel("share of judged questions")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Decision-Useful Rate labels and judge controls\n{plot_context(judged)}", fontsize=10)
    # the legend's label swatches plain (the first bar of a label may be a hatched, untrusted one)
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    handles = [
        Patch(facecolor=h.patches[0].get_facecolor()[:3], label=lab) if hasattr(h, "patches") else h
        for h, lab in zip(handles, labels)
    ]
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    plt.xticks(rotation=20, ha="right")
    for tick, bad in zip(ax.get_xticklabels(), flagged):
        if bad:
            tick.set_color("#b00020")
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


def plot_compiled(runs: Sequence[Run], out: Path) -> Path | None:
    """Write :func:`compiled_figure` to ``out``; ``None`` when no compiled run has a zero-shot partner."""
    fig = compiled_figure(runs)
    return None if fig is None else _save(fig, out)


def compiled_figure(runs: Sequence[Run]):
    """Zero-shot against compiled programs, per method (:func:`hcqr_dspy.reporting.compiled.compiled_table`'s
    pairs): left, the accuracy of the zero-shot run and of each compiled one (95% Wilson intervals), grouped by
    method; right, each compiled run's paired difference from its zero-shot run in accuracy and in the gold
    option's probability, with their 95% paired bootstrap intervals, then each difference of two methods' gains
    (:func:`hcqr_dspy.reporting.compiled.gain_against_gain`). ``None`` without a pair."""
    from hcqr_dspy.reporting.compiled import compiled_table, gain_against_gain

    _, figures = compiled_table(runs)
    _, gains = gain_against_gain(runs)
    if not figures:
        return None
    plt = _pyplot()
    by_label = {r.label: r for r in runs}
    groups: dict[str, list[str]] = {}
    for label, f in figures.items():
        groups.setdefault(f["zero_shot"], [f["zero_shot"]]).append(label)
    order = [label for members in groups.values() for label in members]
    rows = [(f"{lab}\nvs {f['zero_shot']}", f["accuracy_diff"], f["gold_prob_diff"]) for lab, f in figures.items()]
    rows += [
        (f"gain of {g['first'][1]}\n- gain of {g['second'][1]}", g["accuracy_gain_diff"], g["gold_prob_gain_diff"])
        for g in gains.values()
    ]
    height = max(4.0, 0.55 * len(rows) + 1.8)  # two label lines a row stay apart however many rows
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(9, 1.1 * len(order) + 5), height))
    x, colors, pos = [], [], 0.0
    for members in groups.values():
        for i, _ in enumerate(members):
            x.append(pos)
            colors.append("#8c8c8c" if i == 0 else "#4C72B0")
            pos += 1
        pos += 0.6  # a gap between methods
    acc = [by_label[lab].metrics["accuracy"] for lab in order]
    lo, hi = zip(*(wilson_interval(by_label[lab]) for lab in order))
    left.bar(x, acc, color=colors, yerr=[[a - b for a, b in zip(acc, lo)], [b - a for a, b in zip(acc, hi)]], capsize=4)
    left.set_xticks(x, order, rotation=25, ha="right", fontsize=8)
    left.set_ylim(0, 1)
    left.set_ylabel("accuracy (95% Wilson CI)")
    left.set_title("Accuracy: zero-shot (grey) and compiled (blue)", fontsize=9)
    no_interval = False  # a point drawn without its interval (fewer pairs than an interval needs)
    for k, (name, color) in enumerate((("Δ accuracy", "#4C72B0"), ("Δ p(gold)", "#DD8452"))):
        legend = name  # on the first marker drawn (a row may have no p(gold))
        for i, row in enumerate(rows):
            d = row[1 + k]
            if d["mean_diff"] is None:
                continue
            y = i + (k - 0.5) * 0.25
            err, face = None, color
            if d["ci_low"] is not None:
                err = [[d["mean_diff"] - d["ci_low"]], [d["ci_high"] - d["mean_diff"]]]
            else:
                no_interval, face = True, "white"  # hollow: a point estimate alone
            right.errorbar([d["mean_diff"]], [y], xerr=err, fmt="o", color=color, mfc=face, capsize=4, label=legend)
            legend = None
    right.set_ylim(len(rows) - 0.5, -0.5)  # each pair's markers beside its label, the first on top
    right.axvline(0, color="black", linewidth=0.8)
    right.set_yticks(range(len(rows)), [row[0] for row in rows], fontsize=8)
    hollow = f"; hollow: no interval (under {MIN_PAIRS_FOR_INTERVAL} paired questions)" if no_interval else ""
    right.set_xlabel(
        "compiled - zero-shot (gain rows: one method's gain - another's), paired,\n95% bootstrap CI"
        f"{hollow}; accuracy as a fraction (0.1 = 10 points)",
        fontsize=8,
    )
    right.set_title("Paired differences", fontsize=9)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"Zero-shot against compiled programs\n{plot_context(runs)}", fontsize=10)
    fig.tight_layout()
    return fig


# The figures compare() writes (a function returns None where its figure does not apply); one that an earlier
# comparison left in --out and this one does not make is removed.
PLOTS = {
    "accuracy.png": plot_accuracy,
    "accuracy_vs_cost.png": plot_accuracy_vs_cost,
    "dur.png": plot_dur,
    "hypothesis_changes.png": plot_hypothesis_changes,
    "compiled.png": plot_compiled,
}
