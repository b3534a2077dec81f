"""Planning the next study from an optimizer arm's variance: how the smallest pooled effect a design detects moves
with more compile seeds or more questions, and how many questions a stated margin needs.

Per optimizer arm (:func:`~hcqr_dspy.reporting.replicates.pooled_arms`) and outcome, the seeds x questions matrix of
paired differences ``d[s, q]`` (compiled seed ``s`` minus the zero-shot run, on question ``q``;
:func:`~hcqr_dspy.reporting.replicates.effect_matrices`) is read as a two-way crossed random-effects model without
replication, ``d[s, q] = mu + a[s] + b[q] + e[s, q]``: ``a`` the compile seed's own effect, ``b`` the question's,
``e`` their interaction and noise. The variance components are the ANOVA (method-of-moments) estimators from the
mean squares of the balanced two-way layout (the additive fit's, as statsmodels ``anova_lm`` gives them, computed
from the row and column means so that no k x (k + n) design matrix is built): ``var_a = (MS_seed - MS_e) / n``,
``var_b = (MS_question - MS_e) / k``, ``var_e = MS_e``, a negative estimate set to 0 (Searle, Casella & McCulloch
1992, *Variance Components*, ch. 4, balanced data).

With ``k`` seeds answering the same ``n`` questions the pooled effect (the mean of ``d``) has variance
``var_a / k + var_b / n + var_e / (k n)``; its minimum detectable effect at 5% two-sided with 80% power is
``(z_0.975 + z_0.80)`` times its square root (Bloom 1995). For an MDE of ``M`` with ``k`` seeds it needs
``n = (var_b + var_e / k) / ((M / z)^2 - var_a / k)`` questions, and none suffices while ``(M / z)^2 <= var_a / k``:
then only more seeds help, at least ``var_a (z / M)^2`` of them. The same with ``z_0.95 + z_0.90`` for a TOST within
``±M`` to show equivalence with 80% power when the true effect is 0. Planning is no test: nothing here joins the
report's family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hcqr_dspy.reporting.replicates import Z_80, Z_975, effect_matrices, pooled_arms
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import format_mde

Z = Z_975 + Z_80
EMPTY = " | — | — | — | — | — |"  # the cells of a row not planned
# A TOST at 5% with 80% power where the true difference is 0: both one-sided tests must reject (Chow, Shao & Wang
# 2008, Sample Size Calculations in Clinical Research, section 3.2): z_0.95 + z_0.90 (scipy.stats.norm.ppf).
Z_TOST = 1.6448536269514722 + 1.2815515655446004
PLANNING_NOTE = (
    "Each arm's paired differences (seeds x questions) read as a two-way crossed random-effects model, d = mu + "
    "seed + question + seed x question; SDs: the ANOVA estimates of the three components (Searle, Casella & "
    "McCulloch 1992, ch. 4; a negative variance estimate is 0). MDE: (z_0.975 + z_0.80) x sqrt(var_seed / k + "
    "var_question / n + var_seed x question / (k n)), the smallest pooled effect detected with 80% power at 5% "
    "with k seeds answering the same n questions; now: at this report's k and n (the bootstrap's MDE in "
    "Replicate compiles should be close). Questions to detect the margin: the n at which the MDE equals the "
    "report's equivalence margin; to show equivalence: the n at which a TOST within the margin rejects with 80% "
    "power when the true effect is 0 (SE = margin / (z_0.95 + z_0.90); Chow, Shao & Wang 2008, section 3.2); at k "
    "and at 2k seeds. Where the seeds' own variance alone is too large, no number of questions suffices and the "
    "seeds needed are given. The components are estimates: the seed one rests on k - 1 degrees of freedom, so "
    "with few seeds it is rough (a negative estimate, shown 0, means the seeds differed no more than question "
    "noise makes them; the between-seed SD of Replicate compiles includes that noise). An MDE over the outcome's "
    "range (100 points, or 1 of p(gold)) reads undetectable. Not planned: fewer than 2 "
    "shared questions, or differences without spread. A plan, not a test: it joins no family."
)


def variance_components(d: Any) -> dict[str, float]:
    """The ANOVA estimates of a seeds x questions matrix ``d`` (k >= 2 rows, n >= 2 columns): ``{"seeds",
    "questions", "var_seed", "var_question", "var_residual"}`` (see the module docstring).

    Raises:
        ValueError: fewer than 2 seeds or 2 questions.
    """
    import numpy as np

    d = np.asarray(d, dtype=float)
    if d.ndim != 2 or min(d.shape) < 2:
        raise ValueError(f"variance components need 2 or more seeds and questions, got {' x '.join(map(str, d.shape))}")
    k, n = d.shape
    grand, seed_means, question_means = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_seed = n * float(((seed_means - grand) ** 2).sum()) / (k - 1)
    ms_question = k * float(((question_means - grand) ** 2).sum()) / (n - 1)
    interaction = d - seed_means[:, None] - question_means[None, :] + grand
    residual = float((interaction**2).sum()) / ((k - 1) * (n - 1))
    return {
        "seeds": k,
        "questions": n,
        "var_seed": max(0.0, (ms_seed - residual) / n),
        "var_question": max(0.0, (ms_question - residual) / k),
        "var_residual": residual,
    }


def planned_se(components: dict[str, float], seeds: int, questions: int) -> float:
    """The standard error of the pooled effect with ``seeds`` compile seeds answering the same ``questions``."""
    c = components
    return math.sqrt(c["var_seed"] / seeds + c["var_question"] / questions + c["var_residual"] / (seeds * questions))


def planned_mde(components: dict[str, float], seeds: int, questions: int) -> float:
    """The MDE of the pooled effect with ``seeds`` compile seeds answering the same ``questions`` questions."""
    return Z * planned_se(components, seeds, questions)


def questions_needed(components: dict[str, float], seeds: int, mde: float, z: float = Z) -> int | None:
    """The fewest questions for an MDE of ``mde`` with ``seeds`` seeds (``z``: :data:`Z_TOST` for the questions a TOST
    within ``±mde`` needs to show equivalence of a true difference of 0); ``None`` where no number suffices (the
    seeds' own variance alone is over it)."""
    c = components
    room = (mde / z) ** 2 - c["var_seed"] / seeds
    if room <= 0:
        return None
    return max(2, math.ceil((c["var_question"] + c["var_residual"] / seeds) / room))


def seeds_needed(components: dict[str, float], mde: float, z: float = Z) -> int:
    """The fewest seeds below which no number of questions gives an MDE of ``mde``: the smallest k with
    ``var_seed / k < (mde / z)^2``."""
    return math.floor(components["var_seed"] * (z / mde) ** 2) + 1


def planning_table(
    runs: Sequence[Run],
    explicit: dict[str, Sequence[str]] | None = None,
    margins: dict[str, float] | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of the plan for every pooled optimizer arm (``None`` when there is none):
    ``{arm: {outcome: {**variance_components, "mde", "mde_double_seeds", "mde_double_questions",
    "mde_quadruple_questions", "margin"}}}`` (``{"seeds", "questions", "why_not"}`` where it is not planned: fewer
    than 2 shared questions, or differences without spread), with a margin also ``"questions_for_margin"`` and
    ``"questions_for_tost"`` (``{seeds: questions or None}`` at k and 2k seeds) and ``"seeds_for_margin"`` (the
    fewest seeds with which some number of questions lets a TOST show equivalence)."""
    arms = pooled_arms(runs, explicit)
    if not arms:
        return None, {}
    margins = margins or {}
    lines = [
        "| optimizer arm | outcome | seeds x questions | SD: seed; question; seed x question | MDE now "
        "| 2x seeds | 2x questions | 4x questions | questions to detect the margin / show equivalence within it |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    figures: dict[str, Any] = {}
    for name, (zero_shot, members) in arms.items():
        figures[name] = {}
        for outcome, (_, d) in effect_matrices(zero_shot, members).items():
            label = "accuracy, points" if outcome == "accuracy" else "p(gold)"
            n = d.shape[1] if d.ndim == 2 else 0
            if n < 2:  # nothing to split a variance over
                figures[name][outcome] = {"seeds": len(members), "questions": n, "why_not": "too few questions"}
                lines.append(f"| {name} | {label} | {len(members)} x {n} | not planned: {n} question(s) shared{EMPTY}")
                continue
            c = variance_components(d)
            k = c["seeds"]
            if not any(c[v] for v in ("var_seed", "var_question", "var_residual")):
                figures[name][outcome] = {**c, "why_not": "no spread"}
                lines.append(f"| {name} | {label} | {k} x {n} | not planned: the differences have no spread{EMPTY}")
                continue
            scale, digits, unit = (100, 1, " points") if outcome == "accuracy" else (1, 3, "")
            entry = {
                **c,
                "mde": planned_mde(c, k, n),
                "mde_double_seeds": planned_mde(c, 2 * k, n),
                "mde_double_questions": planned_mde(c, k, 2 * n),
                "mde_quadruple_questions": planned_mde(c, k, 4 * n),
                "margin": margins.get(outcome),
            }
            need = "— (no margin given)"
            if entry["margin"] is not None:
                m = entry["margin"]
                entry["questions_for_margin"] = {s: questions_needed(c, s, m) for s in (k, 2 * k)}
                entry["questions_for_tost"] = {s: questions_needed(c, s, m, Z_TOST) for s in (k, 2 * k)}
                entry["seeds_for_margin"] = seeds_needed(c, m, Z_TOST)

                def count(q: int | None) -> str:
                    return "none" if q is None else f"{q:,}"

                said = [
                    f"{count(entry['questions_for_margin'][s])} / {count(entry['questions_for_tost'][s])} at {s} seeds"
                    for s in (k, 2 * k)
                ]
                need = f"±{m * scale:g}{unit}: " + "; ".join(said)
                if None in entry["questions_for_tost"].values():
                    need += f" (no number of questions: at least {entry['seeds_for_margin']} seeds)"
            figures[name][outcome] = entry
            sds = [math.sqrt(c[v]) * scale for v in ("var_seed", "var_question", "var_residual")]
            sd = "; ".join(f"{x:.{digits}f}" for x in sds)
            mdes = " | ".join(
                format_mde(entry[key], scale, digits)  # over the outcome's range: "undetectable"
                for key in ("mde", "mde_double_seeds", "mde_double_questions", "mde_quadruple_questions")
            )
            lines.append(f"| {name} | {label} | {k} x {n} | {sd} | {mdes} | {need} |")
    return "\n".join(lines), figures
