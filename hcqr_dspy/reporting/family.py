"""The family of tests a comparison report prints: every p-value in ``comparison.md`` is a numbered member of one
family, shown with its Holm-adjusted value, and listed in the report's sections "What this report supports" and
"Tests in this report".

A section writes a p-value with :func:`p_text`. While :func:`collecting` is active (``compare`` holds it around
the report's sections), :func:`p_text` registers the test and returns a placeholder; :meth:`TestFamily.finish`
then numbers the tests in the order the report prints them (a test never printed is no member), adjusts the
whole family's raw p-values with Holm's step-down procedure (Holm 1979, "A simple sequentially rejective multiple
test procedure", Scand. J. Statist. 6(2); ``statsmodels.stats.multitest.multipletests(method="holm")``), which
keeps the chance of any false rejection in the family at :data:`ALPHA`, and writes each p-value as ``0.041 (#3;
Holm 0.49)``. Outside :func:`collecting`, :func:`p_text` writes the raw value alone.

An optimizer arm of two or more compile seeds is the unit a report tests (its pooled effect and its contrasts with
other arms): inside :func:`seeds_tested_as_arms`, a test of one seed of such an arm (its label names the seed as
:func:`compared` and the gain sections write it) is not run; :func:`p_text` writes :data:`SEED_OF_ARM` instead, and
the family holds the arm's tests alone, not one more per seed.

A test of equivalence (given ``margin``; two one-sided tests, Schuirmann 1987) is written with its verdict:
``equivalent within ±5 points (TOST p 0.012, #7; Holm 0.03)`` or ``not shown equivalent within ±5 points (...)``.
Tests of the same ``difference`` (a difference test and its TOST) are read together in "What this report
supports": significant after Holm, equivalent within the margin after Holm, or inconclusive with the difference's
minimum detectable effect (a non-significant difference is never read as no effect).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from hcqr_dspy.reporting.stats import ALPHA

# The sections whose tests the report numbers (a test's ``section``); a TOST names its difference test's section.
REFERENCE = "comparison with the reference"
GOLD_PROBABILITY = "gold-option probability"
COMPILED = "zero-shot against compiled"
GAINS = "gain against gain"
EVIDENCE = "evidence in the context"
HYPOTHESIS_VS_COT = "working hypothesis vs CoT"
REPLICATES = "replicate compiles"
ARMS = "arm against arm"

MCNEMAR = "exact McNemar"
WILCOXON = "Wilcoxon signed-rank"

_TOKEN = "\x00test{}\x00"
_TOKEN_RE = re.compile("\x00test(\\d+)\x00")


@dataclass(frozen=True)
class Member:
    """One registered test: its raw p-value and what it tests."""

    p_value: float
    section: str
    label: str
    test: str
    difference: str
    mde: str | None = None
    margin: str | None = None


class TestFamily:
    """The tests one report prints, collected while its sections are built (:func:`collecting`)."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.members: list[Member] = []

    def add(self, member: Member) -> str:
        """Register ``member``; the placeholder :meth:`finish` replaces with its numbered text. A test printed in
        two sections (the same comparison, outcome, test and p-value: a compiled run against a reference that is
        also its zero-shot run) is one member, with one number."""
        for i, known in enumerate(self.members):
            if (known.label, known.test, known.p_value, known.margin) == (
                member.label,
                member.test,
                member.p_value,
                member.margin,
            ):
                return _TOKEN.format(i)
        self.members.append(member)
        return _TOKEN.format(len(self.members) - 1)

    def finish(self, report: str) -> tuple[str, list[dict[str, Any]]]:
        """The report with every placeholder written out and the sections "What this report supports" and "Tests
        in this report" put before its first ``## `` section; and the numbered tests (``comparison.json``'s
        ``tests``): ``number``, ``section``, ``label``, ``test``, ``p_value``, ``p_holm``, ``reject`` (after
        Holm, at :data:`ALPHA`), ``margin`` (equivalence tests) and ``mde`` (difference tests)."""
        order: list[int] = []
        for match in _TOKEN_RE.finditer(report):
            if (i := int(match.group(1))) not in order:
                order.append(i)
        if not order:
            return report, []
        from statsmodels.stats.multitest import multipletests

        reject, holm, _, _ = multipletests([self.members[i].p_value for i in order], alpha=ALPHA, method="holm")
        tests = []
        for k, i in enumerate(order):
            m = self.members[i]
            tests.append(
                {
                    "number": k + 1,
                    "section": m.section,
                    "label": m.label,
                    "test": m.test,
                    "difference": m.difference,
                    "p_value": m.p_value,
                    "p_holm": float(holm[k]),
                    "reject": bool(reject[k]),
                    "margin": m.margin,
                    "mde": m.mde,
                }
            )
        by_index = dict(zip(order, tests))
        text = _TOKEN_RE.sub(lambda match: _written(by_index[int(match.group(1))]), report)
        head = "\n\n".join([supports_section(tests), tests_section(tests)])
        cut = text.find("\n\n## ")
        text = text + "\n\n" + head if cut < 0 else text[:cut] + "\n\n" + head + text[cut:]
        return text, tests


_ACTIVE: ContextVar[TestFamily | None] = ContextVar("hcqr_test_family", default=None)


@contextmanager
def collecting() -> Iterator[TestFamily]:
    """Collect the p-values :func:`p_text` writes into one :class:`TestFamily` until the block ends."""
    family = TestFamily()
    token = _ACTIVE.set(family)
    try:
        yield family
    finally:
        _ACTIVE.reset(token)


# What p_text writes instead of a test of one seed of an optimizer arm (seeds_tested_as_arms).
SEED_OF_ARM = "— (a seed: tested as its arm)"
# The sections whose tests are an arm's, never one seed's.
ARM_SECTIONS = frozenset({REPLICATES, ARMS})
_ARM_SEEDS: ContextVar[frozenset[str]] = ContextVar("hcqr_arm_seeds", default=frozenset())


@contextmanager
def seeds_tested_as_arms(labels: Iterable[str]) -> Iterator[None]:
    """Inside the block, :func:`p_text` runs no test of one of the runs ``labels`` (the seeds of optimizer arms of
    two or more seeds) outside :data:`ARM_SECTIONS`: the arm is tested pooled over its seeds instead."""
    token = _ARM_SEEDS.set(frozenset(labels))
    try:
        yield
    finally:
        _ARM_SEEDS.reset(token)


def tested_alone(label: str) -> bool:
    """Whether the run ``label`` is tested as one run: it is not a seed of an optimizer arm of two or more seeds
    (:func:`seeds_tested_as_arms`)."""
    return label not in _ARM_SEEDS.get()


def runs_test(section: str, label: str) -> bool:
    """Whether :func:`p_text` runs the test ``label`` of ``section``: not a test of one seed of an optimizer arm
    of two or more seeds outside :data:`ARM_SECTIONS` (:func:`seeds_tested_as_arms`)."""
    return section in ARM_SECTIONS or not names_a_seed(label, _ARM_SEEDS.get())


def names_a_seed(label: str, seeds: frozenset[str]) -> bool:
    """Whether a test's ``label`` compares one of ``seeds``: ``<seed> vs ...``, ``... vs <seed>: ...``
    (:func:`compared`) or ``gain of <seed> over ...`` (the gain-against-gain section)."""
    return any(label.startswith(f"{s} vs ") or f" vs {s}: " in label or f"gain of {s} over " in label for s in seeds)


def compared(reference: str, other: str, outcome: str) -> str:
    """A test's label: ``other vs reference: outcome``."""
    return f"{other} vs {reference}: {outcome}"


def p_text(
    p: float | None,
    *,
    section: str,
    label: str,
    test: str,
    mde: str | None = None,
    margin: str | None = None,
    difference: str | None = None,
) -> str:
    """A p-value as the report prints it (``—`` when there is none).

    Args:
        p: The raw p-value.
        section: Where the report prints it (one of this module's section names, or another section's title).
        label: What it compares (:func:`compared`).
        test: The test's name (``exact McNemar``, ``Wilcoxon signed-rank``, ``TOST ±5 points (paired t)`` ...).
        mde: For a difference test: the difference's minimum detectable effect as text with its unit
            (:func:`mde_text`), what "What this report supports" says could have been missed when the test does
            not reject (``None``: none stated).
        margin: For a test of equivalence: its margin as text (``±5 points``); the text is then the verdict.
        difference: The tested difference (a test and its TOST share one); default ``section: label``.
    """
    if p is None or math.isnan(p):
        return "—"
    if not runs_test(section, label):
        return SEED_OF_ARM
    member = Member(float(p), section, label, test, difference or f"{section}: {label}", mde, margin)
    family = _ACTIVE.get()
    if family is not None:
        return family.add(member)
    if margin is None:
        return f"{p:.3g}"
    return f"{'equivalent' if p < ALPHA else 'not shown equivalent'} within {margin} (TOST p {p:.3g})"


def labelled_p_text(section: str, test: str = "") -> Callable[..., str]:
    """``p_text(p, label, **more)`` for a section that names each test by a label (as the replicate-compiles
    section does): :func:`p_text` with ``section`` and a default ``test`` fixed; ``more`` passes ``mde``,
    ``margin`` (a test of equivalence: its verdict is then written), ``difference`` or another ``test`` on."""

    def write(p: float | None, label: str, **more: Any) -> str:
        return p_text(p, section=section, label=label, **{"test": test, **more})

    return write


# mde_text's text for a difference without spread (its MDE is undefined), and above the outcome's range.
NO_SPREAD = "none (no spread)"
UNDETECTABLE = "undetectable"


def mde_text(mde: float | None, scale: float = 1.0, digits: int = 3, limit: float = 1.0, unit: str = "") -> str:
    """A minimum detectable effect as :func:`p_text` takes it: ``12.3 points``; :data:`UNDETECTABLE` above
    ``limit`` (the largest difference the outcome allows); :data:`NO_SPREAD` without one."""
    if mde is None:
        return NO_SPREAD
    return f"{mde * scale:.{digits}f}{unit}" if mde <= limit else UNDETECTABLE


def _written(t: dict[str, Any]) -> str:
    number = f"#{t['number']}; Holm {t['p_holm']:.3g}"
    if t["margin"] is None:
        return f"{t['p_value']:.3g} ({number})"
    verdict = "equivalent" if t["reject"] else "not shown equivalent"
    return f"{verdict} within {t['margin']} (TOST p {t['p_value']:.3g}, {number})"


def _inconclusive(mde: str | None) -> str:
    if mde is None:
        return "no MDE stated for this test"
    if mde == NO_SPREAD:
        return "the paired differences have no spread, so no MDE"
    if mde == UNDETECTABLE:
        return "too few questions to detect any effect on this scale (MDE undetectable)"
    return f"effects under the MDE ({mde}) could be missed"


def verdict(tests: list[dict[str, Any]]) -> str:
    """What the tests of one difference support: significant after Holm, equivalent within the margin after Holm
    (TOST), or inconclusive with the difference's MDE."""
    diff = next((t for t in tests if t["margin"] is None), None)
    tost = next((t for t in tests if t["margin"] is not None), None)
    parts = []
    if diff and diff["reject"]:
        parts.append(f"significant after Holm (p_adj {diff['p_holm']:.3g}, #{diff['number']})")
    if tost and tost["reject"]:
        parts.append(f"equivalent within {tost['margin']} (TOST, p_adj {tost['p_holm']:.3g}, #{tost['number']})")
    if parts:
        return "; ".join(parts)
    if diff:
        parts.append(f"inconclusive: not significant after Holm (p_adj {diff['p_holm']:.3g}, #{diff['number']})")
        parts.append(_inconclusive(diff["mde"]))
    else:
        parts.append("inconclusive")
    if tost:
        parts.append(
            f"not shown equivalent within {tost['margin']} (TOST, p_adj {tost['p_holm']:.3g}, #{tost['number']})"
        )
    return "; ".join(parts)


def supports_section(tests: list[dict[str, Any]]) -> str:
    """``## What this report supports``: one verdict (:func:`verdict`) per tested difference."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for t in tests:
        groups.setdefault(t["difference"], []).append(t)
    lines = ["| section | tested difference | supports |", "|---|---|---|"]
    lines += [f"| {group[0]['section']} | {group[0]['label']} | {verdict(group)} |" for group in groups.values()]
    return (
        "## What this report supports\n\n"
        + "\n".join(lines)
        + "\n\nAfter Holm's adjustment over every test below. A difference neither significant nor shown equivalent "
        "is inconclusive, never evidence of no effect: only a two one-sided test (TOST) that rejects, with "
        "`hcqr compare --margin POINTS` (accuracy) or `--margin-pgold P` (gold-option probability), supports "
        '"no effect larger than the margin". MDE: the smallest difference a paired test at 5% detects with 80% '
        "power over these questions."
    )


def tests_section(tests: list[dict[str, Any]]) -> str:
    """``## Tests in this report (family of N; Holm-adjusted)``: every numbered test, raw and adjusted."""
    lines = [
        "| # | section | compares | test | p | Holm p | rejected at 5% after Holm |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    for t in tests:
        lines.append(
            f"| {t['number']} | {t['section']} | {t['label']} | {t['test']} | {t['p_value']:.3g} | {t['p_holm']:.3g} "
            f"| {'yes' if t['reject'] else 'no'} |"
        )
    return (
        f"## Tests in this report (family of {len(tests)}; Holm-adjusted)\n\n"
        "Every p-value this report prints is one of these tests, numbered in the order the report prints them "
        "(`0.041 (#3; Holm 0.49)`: raw p, its number, its Holm-adjusted p). Holm's step-down adjustment (Holm "
        "1979; statsmodels `multipletests`) over the whole family keeps the chance of any false rejection at 5%.\n\n"
        + "\n".join(lines)
    )
