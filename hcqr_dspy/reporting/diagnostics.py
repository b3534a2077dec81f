"""The report's checks on how runs ran: fallbacks taken, invalid answers by cause, and DURs judged on different
questions (each with the warnings it raises). The DUR judge's controls are :mod:`hcqr_dspy.reporting.judge_tables`."""

from __future__ import annotations

from collections.abc import Sequence

from hcqr_dspy.evaluation.metrics import fallback_summary
from hcqr_dspy.reporting.runs import Run, judged_ids

# A method "ran mostly on its fallback" when more than this share of its questions (or queries) took it.
FALLBACK_WARNING = 0.5
# Fallbacks that replace a method's own retrieval (the row then ran as another method would).
PRIMARY_FALLBACKS = ("hypothesis_failed", "queries_from_question", "passage_failed", "judge_vote_scored")


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
                warnings.append(
                    f"{run.label} ran mostly on its fallback: {name.replace('_', ' ')} in "
                    f"{f['questions']}/{n} questions ({f['rate']:.0%})"
                )
        shares = {k[len("query_share_") :]: v for k, v in summary.items() if k.startswith("query_share_")}
        if set(shares) - {"rewrite", "passage"}:
            cells.append("queries by source: " + ", ".join(f"{src} {v:.0%}" for src, v in shares.items()))
            if shares.get("hypothesis", 0) > FALLBACK_WARNING:
                warnings.append(
                    f"{run.label} ran mostly on its fallback: {shares['hypothesis']:.0%} of its queries "
                    "were built from the hypothesis, not written by the rewrite step"
                )
        if cells:
            lines.append(f"| {run.label} | " + "; ".join(cells) + " |")
    if not lines:
        return "", warnings
    return "\n".join(["| run | fallbacks taken |", "|---|---|", *lines]), warnings


def invalid_table(runs: Sequence[Run]) -> str:
    """Markdown: invalid answers by the stage and cause of the bad reply; ``""`` when none is invalid."""
    lines = []
    for run in runs:
        causes = {
            k[len("invalid_") :]: v
            for k, v in run.metrics.items()
            if k.startswith("invalid_") and k not in ("invalid_rate",) and isinstance(v, (int, float))
        }
        if causes:
            lines.append(
                f"| {run.label} | {run.metrics['invalid']} | "
                + ", ".join(f"{k.replace('_', ' ', 1)}: {int(v)}" for k, v in sorted(causes.items()))
                + " |"
            )
    if not lines:
        return ""
    return "\n".join(["| run | invalid | by stage and cause |", "|---|---:|---|", *lines])


def dur_sample_warning(runs: Sequence[Run]) -> list[str]:
    """A warning when judged runs were judged on different questions: their DURs are then not comparable
    (the differences table leaves Δ DUR out for such a run); ``[]`` if all judged runs share their sample."""
    judged = [r for r in runs if r.judgments]
    if len({judged_ids(r) for r in judged}) <= 1:
        return []
    counts = ", ".join(f"{r.label} {len(r.judgments)}" for r in judged)
    return [
        f"DURs were judged on different questions ({counts} judged): compare DURs only on one shared sample "
        "(`hcqr judge RUN --limit N --seed S` draws the same questions for runs over the same question set)"
    ]
