"""The paired statistics of a comparison: exact McNemar test and Wilson score interval (statsmodels).

Accuracy differences against a reference run are tested with the exact McNemar test on the discordant pairs
(``statsmodels.stats.contingency_tables.mcnemar(..., exact=True)``: a two-sided binomial test of b vs c;
McNemar 1947).
"""

from __future__ import annotations

from hcqr_dspy.reporting.runs import Run


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


def wilson_interval(run: Run) -> tuple[float, float]:
    """95% Wilson score interval of a run's accuracy (statsmodels ``proportion_confint(method="wilson")``)."""
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(run.metrics["correct"], run.metrics["n"], method="wilson")
    return float(lo), float(hi)
