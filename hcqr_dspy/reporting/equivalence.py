"""The report's equivalence section: with a margin (``hcqr compare --margin POINTS`` for accuracy, ``--margin-pgold
P`` for the gold-option probability), two one-sided tests (TOST; Schuirmann 1987, paired t,
:func:`hcqr_dspy.reporting.stats.tost_paired`) of whether the mean per-question difference lies within ±margin, for
each paired difference the report tests: each run against the reference (accuracy; p(gold) over the questions both
scored) and each compiled program against its zero-shot run (accuracy; p(gold)). Each TOST p-value is a member of
the report's family of tests (:mod:`hcqr_dspy.reporting.family`), written with its verdict after Holm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.reporting.compiled import compiled_pairs
from hcqr_dspy.reporting.family import COMPILED, GOLD_PROBABILITY, REFERENCE, compared, p_text, runs_test
from hcqr_dspy.reporting.gold_probability import gold_probs
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import tost_paired

TOST_TEST = "TOST (paired t)"
# The smallest margins taken: a hundredth of a point of accuracy (one question in 10,000) and 0.0001 of p(gold);
# a margin below them means nothing a study of questions can resolve.
MIN_MARGIN_POINTS = 0.01
MIN_MARGIN_PGOLD = 0.0001

EQUIVALENCE_NOTE = (
    "Two one-sided tests (TOST, Schuirmann 1987): paired t-tests of H0 mean difference <= -margin and of H0 mean "
    "difference >= +margin over the per-question differences (0/1 for accuracy); p = the larger of the two. "
    "Equivalent = both rejected after Holm's adjustment over the report's family: the difference lies within "
    "±margin. Not shown equivalent says nothing either way. No spread in the differences: not testable."
)


def _number(value: Any) -> float | None:
    if isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value)):
        return float(value)
    return None


def check_margins(margin: float | None, margin_pgold: float | None) -> dict[str, float]:
    """The equivalence margins as the report uses them: ``{"accuracy": margin / 100, "gold_prob": margin_pgold}``,
    with only those given.

    Raises:
        HCQRError: ``margin`` (percentage points) not a number from :data:`MIN_MARGIN_POINTS` to 100, or
            ``margin_pgold`` (a probability) not a number from :data:`MIN_MARGIN_PGOLD` to 1.
    """
    margins: dict[str, float] = {}
    if margin is not None:
        points = _number(margin)
        if points is None or not MIN_MARGIN_POINTS <= points <= 100:
            raise HCQRError(f"--margin must be percentage points from {MIN_MARGIN_POINTS:g} to 100, got {margin!r}")
        margins["accuracy"] = points / 100
    if margin_pgold is not None:
        prob = _number(margin_pgold)
        if prob is None or not MIN_MARGIN_PGOLD <= prob <= 1:
            raise HCQRError(
                f"--margin-pgold must be a probability from {MIN_MARGIN_PGOLD:g} to 1, got {margin_pgold!r}"
            )
        margins["gold_prob"] = prob
    return margins


def _differences(ordered: Sequence[Run]) -> list[tuple[str, str, str, list[float], list[float]]]:
    """Every paired difference the report tests that a margin applies to: ``(section, label, outcome key,
    reference side, other side)``; the section is the one whose table tests the difference."""
    ref = ordered[0]
    out = []

    def add(acc_section: str, gold_section: str, base: Run, other: Run) -> None:
        shared = sorted(set(base.correct) & set(other.correct))
        acc = ([float(base.correct[q]) for q in shared], [float(other.correct[q]) for q in shared])
        out.append((acc_section, compared(base.label, other.label, "accuracy"), "accuracy", *acc))
        p_base, p_other = gold_probs(base), gold_probs(other)
        scored = sorted(set(p_base) & set(p_other))
        if scored:
            gold = ([p_base[q] for q in scored], [p_other[q] for q in scored])
            out.append((gold_section, compared(base.label, other.label, "p(gold)"), "gold_prob", *gold))

    for run in ordered[1:]:
        add(REFERENCE, GOLD_PROBABILITY, ref, run)
    for zs, run in compiled_pairs(ordered, ref)[0]:
        add(COMPILED, COMPILED, zs, run)
    return out


def equivalence_table(ordered: Sequence[Run], margins: dict[str, float] | None) -> tuple[str | None, list[dict]]:
    """Markdown and figures of a TOST for every paired difference a margin applies to (``ordered[0]`` is the
    reference); ``(None, [])`` without margins. Each figure's ``tested`` is false for a TOST of one seed of an
    optimizer arm of seeds, which the report does not run (its p-value is descriptive, in no family)."""
    if not margins:
        return None, []
    lines = ["| tested difference | section | n | mean difference | TOST |", "|---|---|---:|---:|---|"]
    figures = []
    for section, label, key, base, other in _differences(ordered):
        margin = margins.get(key)
        if margin is None:
            continue
        scale, unit = (100, " points") if key == "accuracy" else (1, "")
        t = tost_paired(base, other, margin)
        margin_text = f"±{margin * scale:g}{unit}"
        if t["p_value"] is None:
            cell = f"not testable ({t['reason']})"
        else:
            cell = p_text(
                t["p_value"],
                section=section,
                label=label,
                test=f"{TOST_TEST}, margin {margin_text}",
                margin=margin_text,
            )
        mean = "—" if t["mean_diff"] is None else f"{t['mean_diff'] * scale:+.{1 if key == 'accuracy' else 3}f}{unit}"
        lines.append(f"| {label} | {section} | {t['n']} | {mean} | {cell} |")
        # a TOST of one seed of an arm of seeds is not run (SEED_OF_ARM): its p-value here is descriptive
        figures.append({"section": section, "label": label, "outcome": key, **t, "tested": runs_test(section, label)})
    if not figures:
        return None, []
    return "\n".join(lines), figures
