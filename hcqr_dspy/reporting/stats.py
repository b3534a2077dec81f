"""The paired statistics of a comparison: exact McNemar test, Wilson score interval, paired bootstrap interval,
Wilcoxon signed-rank test, the minimum detectable effect and the paired two one-sided tests of equivalence (TOST)
(scipy, statsmodels), and how a paired difference and an MDE are written in reports and run descriptions.

Accuracy differences against a reference run are tested with the exact McNemar test on the discordant pairs
(``statsmodels.stats.contingency_tables.mcnemar(..., exact=True)``: a two-sided binomial test of b vs c;
McNemar 1947).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.evaluation.signed_rank import signed_rank_p
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

    correct, n = run.metrics["correct"], run.metrics["n"]
    lo, hi = proportion_confint(correct, n, method="wilson")
    p = correct / n if n else 0.0
    # at 20/20 statsmodels gives 0.9999999999999999: keep the point inside its interval (plots draw hi - p)
    return float(min(lo, p)), float(max(hi, p))


# Paired bootstrap resamples (scipy.stats.bootstrap) and their seed: the interval is reproducible.
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
# The power a minimum detectable effect is stated at, and the test's level (Cohen 1988's conventions).
MDE_POWER = 0.80
# Fewer pairs than this get no bootstrap interval (BCa needs enough resample variety; at n = 2 it excluded 0
# where the Wilcoxon p was 0.5).
MIN_PAIRS_FOR_INTERVAL = 10
ALPHA = 0.05


def paired_difference(reference: Sequence[float], other: Sequence[float]) -> dict[str, float | int | None]:
    """Paired comparison of one outcome over the same questions: ``other - reference``.

    Returns:
        ``n``, ``mean_diff``, its 95% paired bootstrap interval ``ci_low``/``ci_high`` (the mean of the
        per-question differences resampled by question; ``None`` under :data:`MIN_PAIRS_FOR_INTERVAL` pairs;
        ``scipy.stats.bootstrap``, BCa,
        :data:`BOOTSTRAP_RESAMPLES` resamples, seed :data:`BOOTSTRAP_SEED`), the two-sided Wilcoxon
        signed-rank ``wilcoxon_p`` (``scipy.stats.wilcoxon``, zero differences dropped, Wilcoxon 1945; 1.0
        when every difference is zero), ``sd_diff`` and ``mde`` (:func:`minimum_detectable_effect`). With
        fewer than two pairs, the interval, p-value and MDE are ``None``.
    """
    import numpy as np
    from scipy import stats

    diff = np.asarray(other, dtype=float) - np.asarray(reference, dtype=float)
    n = int(diff.size)
    out: dict[str, float | int | None] = {"n": n, "mean_diff": float(diff.mean()) if n else None}
    if n < 2:
        return {**out, "ci_low": None, "ci_high": None, "wilcoxon_p": None, "sd_diff": None, "mde": None}
    if n < MIN_PAIRS_FOR_INTERVAL:  # a bootstrap of a handful of pairs claims far more than it knows
        low = high = None
    elif np.all(diff == diff[0]):  # no spread: the interval is the point, the test has nothing to rank
        low = high = float(diff[0])
    else:
        ci = stats.bootstrap(
            (diff,),
            np.mean,
            n_resamples=BOOTSTRAP_RESAMPLES,
            method="BCa",
            random_state=np.random.default_rng(BOOTSTRAP_SEED),
        ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    nonzero = diff[diff != 0]
    p = signed_rank_p(nonzero) if nonzero.size else 1.0
    sd = float(diff.std(ddof=1))
    return {
        **out,
        "ci_low": low,
        "ci_high": high,
        "wilcoxon_p": p,
        "sd_diff": sd,
        "mde": minimum_detectable_effect(n, sd),
    }


def minimum_detectable_effect(n: int, sd_diff: float, power: float = MDE_POWER, alpha: float = ALPHA) -> float | None:
    """The smallest mean paired difference a two-sided paired t-test at level ``alpha`` detects with
    ``power`` over ``n`` questions, given the observed standard deviation of the differences:
    ``d * sd_diff``, where ``d`` solves ``statsmodels.stats.power.TTestPower().solve_power`` (Cohen 1988,
    ch. 2). For 0/1 correctness this is the normal approximation to McNemar's test on the same pairs.
    ``None`` for fewer than two questions or no spread."""
    if n < 2 or not sd_diff:
        return None
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")
    return float(d) * sd_diff


def format_difference(d: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    """A :func:`paired_difference` as text: ``+m [+low, +high]`` times ``scale`` (100: points), the mean alone
    without an interval, ``—`` without a mean."""
    if d.get("mean_diff") is None:
        return "—"
    mean = f"{d['mean_diff'] * scale:+.{digits}f}"
    if d.get("ci_low") is None:
        return mean
    return f"{mean} [{d['ci_low'] * scale:+.{digits}f}, {d['ci_high'] * scale:+.{digits}f}]"


def format_mde(mde: float | None, scale: float = 1.0, digits: int = 3, limit: float = 1.0) -> str:
    """An MDE as text; ``limit``: the largest difference the outcome allows (1 for a difference of two 0/1 or
    probability outcomes, 2 for a difference of two such differences), above which nothing is detectable."""
    if mde is None:
        return "— (no spread)"
    return f"{mde * scale:.{digits}f}" if mde <= limit else "undetectable"


def discordant_mde(b: int, c: int, n: int) -> float | None:
    """:func:`minimum_detectable_effect` of a paired 0/1 difference known by its discordant counts: over ``n``
    pairs, ``c`` differences of +1, ``b`` of -1 and the rest 0 (their standard deviation, ``ddof=1``). ``None``
    for fewer than two pairs or no discordant pair."""
    if n < 2:
        return None
    mean = (c - b) / n
    var = (b + c - n * mean * mean) / (n - 1)
    return minimum_detectable_effect(n, max(var, 0.0) ** 0.5)


def tost_paired(reference: Sequence[float], other: Sequence[float], margin: float) -> dict[str, Any]:
    """Two one-sided tests of equivalence (TOST; Schuirmann 1987, "A comparison of the two one-sided tests
    procedure and the power approach for assessing the equivalence of average bioavailability", J.
    Pharmacokinet. Biopharm. 15(6)) for paired outcomes: whether the mean per-question difference
    ``other - reference`` lies within ``(-margin, +margin)``, by two one-sided paired t-tests
    (``statsmodels.stats.weightstats.ttost_paired(other, reference, -margin, margin)``). H0 is
    ``|mean| >= margin``: a small ``p_value`` shows equivalence; a large one shows nothing.

    Args:
        reference: The reference side's outcomes (0/1 correctness, or probabilities).
        other: The other side's outcomes, in the same question order.
        margin: The equivalence margin, > 0, on the outcomes' scale (a fraction for 0/1 outcomes).

    Returns:
        ``n``, ``mean_diff``, ``sd_diff``, ``margin``, ``low_p`` (H0: mean <= -margin), ``high_p`` (H0: mean >=
        margin) and ``p_value`` (the larger of the two). With fewer than two pairs or no spread in the differences
        (the t statistic is then undefined) the p-values are ``None`` and ``reason`` says why.
    """
    import numpy as np
    from statsmodels.stats.weightstats import ttost_paired

    x = np.asarray(other, dtype=float)
    y = np.asarray(reference, dtype=float)
    diff = x - y
    n = int(diff.size)
    out: dict[str, Any] = {"n": n, "mean_diff": float(diff.mean()) if n else None, "margin": margin}
    sd = float(diff.std(ddof=1)) if n > 1 else None
    out["sd_diff"] = sd
    if n < 2 or not sd:
        why = "fewer than two pairs" if n < 2 else "no spread in the paired differences"
        return {**out, "low_p": None, "high_p": None, "p_value": None, "reason": why}
    p, low, high = ttost_paired(x, y, -margin, margin)
    return {**out, "low_p": float(low[1]), "high_p": float(high[1]), "p_value": float(p), "reason": None}
