"""The signed-rank p-value against ``scipy.stats.wilcoxon`` itself, on the cases where scipy runs its exhaustive
permutation test (few differences with ties or zeros), its exact distribution and its normal approximation."""

import numpy as np
import pytest
from scipy import stats

from hcqr_dspy.evaluation.signed_rank import EXHAUSTIVE_MAX_N, signed_rank_p


def cases():
    rng = np.random.default_rng(7)
    yield [0.0, 0.5]  # one nonzero difference beside a zero
    yield [1.0, 1.0]
    yield [0.1] * 12  # no spread: every sign assignment but one is less extreme
    for n in (2, 3, 5, 8, 11, EXHAUSTIVE_MAX_N, EXHAUSTIVE_MAX_N + 1, 30):
        yield list(rng.choice([-1.0, 0.0, 1.0], n))  # accuracy-like: ties and zeros
        yield list(np.round(rng.normal(0.1, 0.3, n), 1))  # p(gold)-like, rounded: ties
        yield list(rng.normal(0.0, 1.0, n))  # no ties: scipy's exact distribution (or, above 50, asymptotic)


@pytest.mark.parametrize("diffs", [d for d in cases() if any(d)])
def test_the_p_value_is_scipys_own(diffs):
    assert signed_rank_p(diffs) == pytest.approx(float(stats.wilcoxon(diffs).pvalue), rel=1e-12, abs=1e-15)


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore:One or more sample arguments is too small")  # scipy's
@pytest.mark.parametrize(
    "diffs",
    [[0.0, 0.0], [0.0, -0.0], [0.0] * 20, [1.0, 1.0, -1.0, float("nan")], [float("nan")] * 2, [3, 3, -1, 0], []],
)
def test_nothing_to_rank_nan_and_integers_are_scipys_own_too(diffs):
    assert signed_rank_p(diffs) == pytest.approx(float(stats.wilcoxon(diffs).pvalue), nan_ok=True)


@pytest.mark.parametrize("diffs", [[None, 1.0], ["a", "b"]])
def test_what_scipy_refuses_is_refused(diffs):
    with pytest.raises(ValueError):
        stats.wilcoxon(diffs)
    with pytest.raises(ValueError):
        signed_rank_p(diffs)
