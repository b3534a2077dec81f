"""The two-sided Wilcoxon signed-rank test of paired differences (Wilcoxon 1945), as ``scipy.stats.wilcoxon``
gives it with its defaults (``method="auto"``, ``zero_method="wilcox"``: zero differences take no rank).

For a few differences with ties or zeros (at most :data:`EXHAUSTIVE_MAX_N`), scipy's exact null distribution
does not apply, and ``wilcoxon`` runs an exhaustive sign-flip permutation test (``scipy.stats.permutation_test``,
every one of the ``2**n`` sign assignments) calling its statistic once per assignment in Python.
:func:`signed_rank_p` runs that same permutation test with a vectorized statistic (the sum of
the positive differences' ranks, all assignments at once), so its p-value is scipy's own; every other case is
``scipy.stats.wilcoxon`` itself.
"""

from __future__ import annotations

from collections.abc import Sequence

# scipy.stats.wilcoxon(method="auto") runs the exhaustive permutation test on ties or zeros up to this many
# differences (2**13 sign assignments are fewer than its 9999 resamples), the normal approximation above it.
EXHAUSTIVE_MAX_N = 13


def signed_rank_p(diffs: Sequence[float]) -> float:
    """The two-sided p-value of ``scipy.stats.wilcoxon(diffs)``, whatever ``diffs`` holds (scipy's own result or
    error where the vectorized permutation test does not apply: NaN, no nonzero difference, not numbers).

    Args:
        diffs: Paired differences (zeros are dropped from the ranking).

    Raises:
        ValueError: as ``scipy.stats.wilcoxon``.
    """
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs)
    numeric = d.ndim == 1 and d.dtype.kind in "iuf" and not np.isnan(d).any()
    nonzero = np.abs(d[d != 0]) if numeric else None
    if not numeric or not nonzero.size or d.size > EXHAUSTIVE_MAX_N:
        return float(stats.wilcoxon(diffs).pvalue)
    ties = np.unique(nonzero).size < nonzero.size
    if not (ties or nonzero.size < d.size):
        return float(stats.wilcoxon(diffs).pvalue)  # scipy's exact null distribution

    def positive_rank_sum(x, axis):  # scipy's statistic (r_plus), for every sign assignment along the other axes
        ranks = stats.rankdata(np.where(x == 0, np.nan, np.abs(x)), axis=axis, nan_policy="omit")
        return np.nansum(ranks * (x > 0), axis=axis)

    test = stats.permutation_test(
        (d.astype(float),), positive_rank_sum, permutation_type="samples", vectorized=True, alternative="two-sided"
    )
    return float(test.pvalue)
