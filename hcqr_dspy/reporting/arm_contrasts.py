"""Optimizer arm against optimizer arm: the difference of two arms' pooled effects, each over its own compile seeds.

Two arms (:func:`~hcqr_dspy.reporting.replicates.pooled_arms`) are set against each other when they were compiled
with the same LM and training dataset and differ in one thing:

- **recipe** (same method): for instance bootstrapped traces against random labelled demos. Both effects are
  against the same zero-shot run, so the contrast is the difference of the two arms' pooled compiled means;
- **method** (same recipe): the optimizer's gain in one method against its gain in another, a difference in
  differences (each gain against its own method's zero-shot run).

Over the questions all the runs answered (p(gold): scored), the contrast is ``pooled_1 - pooled_2``, each pooled
effect the mean over its seeds of the mean per-question effect. Its 95% interval comes from a two-level bootstrap
that resamples each arm's seeds apart (the arms' compiles are independent draws) and the questions once for both
arms (the questions are shared and crossed with the seeds; Davison & Hinkley 1997, *Bootstrap Methods and their
Application*, section 3.8; Owen 2007, "The pigeonhole bootstrap"), the percentile interval of the resampled
contrasts. The SE of those resamples gives the MDE, ``(z_0.975 + z_0.80) * SE`` (Bloom 1995), the two-sided
p-value of the normal approximation, and with a margin a two one-sided test of equivalence (Schuirmann 1987).
Each test joins the report's family (section "arm against arm").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.reporting.family import ARMS, mde_text, p_text
from hcqr_dspy.reporting.replicates import (
    REPLICATE_RESAMPLES,
    REPLICATE_SEED,
    Z_80,
    Z_975,
    arm_key,
    effect_matrices,
    pooled_arms,
    tost_cell,
)
from hcqr_dspy.reporting.runs import Run

CONTRAST_TEST = "difference of pooled effects, two-level bootstrap SE (normal)"

ARMS_NOTE = (
    "Two optimizer arms compiled with the same LM and training dataset that differ in recipe (same method: the "
    "difference of their pooled compiled means against one zero-shot run) or in method (same recipe: the "
    "optimizer's gain in one method against its gain in the other, each against its own zero-shot run), over the "
    "questions every run answered. Contrast: first arm's pooled effect - second's. Interval: 95% percentile "
    "interval of a two-level bootstrap that resamples each arm's seeds apart and the questions once for both "
    "(Davison & Hinkley 1997, section 3.8; 10,000 resamples, seed 0). MDE: (z_0.975 + z_0.80) x the bootstrap SE "
    "(Bloom 1995). p: normal approximation with that SE. The seeds of an arm are not tested one by one: each "
    "arm is tested pooled, here and under Replicate compiles."
)


def contrast_bootstrap(
    first, second, resamples: int = REPLICATE_RESAMPLES, seed: int = REPLICATE_SEED
) -> dict[str, float | None]:
    """The difference of two arms' pooled effects and its two-level bootstrap.

    Args:
        first, second: array-likes of shape ``(seeds_1, questions)`` and ``(seeds_2, questions)``: each run's
            per-question effect against its zero-shot run, the same questions in the same order.

    Returns:
        ``contrast`` (``pooled_1 - pooled_2``), ``pooled_first``, ``pooled_second``, ``n``, and from the bootstrap
        (each arm's seeds resampled apart, one question draw shared by both arms and all drawn seeds):
        ``ci_low``/``ci_high`` (2.5 and 97.5 percentiles) and ``se``; ``mde`` and ``p_value`` from the normal
        approximation with that SE (``None`` without spread).

    Raises:
        ValueError: the two matrices are over different numbers of questions.
    """
    import numpy as np
    from scipy import stats

    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the arms' effects are over {a.shape[1]} and {b.shape[1]} questions")
    n = a.shape[1]
    rng = np.random.default_rng(seed)
    question_draw = rng.integers(0, n, size=(resamples, n))
    seeds_a = rng.integers(0, a.shape[0], size=(resamples, a.shape[0]))
    seeds_b = rng.integers(0, b.shape[0], size=(resamples, b.shape[0]))

    def pooled(d, seed_draw):
        per_seed_q = d[:, question_draw].mean(axis=2).T  # (resamples, seeds)
        return np.take_along_axis(per_seed_q, seed_draw, axis=1).mean(axis=1)

    boot = pooled(a, seeds_a) - pooled(b, seeds_b)
    pooled_a, pooled_b = float(a.mean(axis=1).mean()), float(b.mean(axis=1).mean())
    contrast = pooled_a - pooled_b
    se = float(boot.std(ddof=1))
    return {
        "contrast": contrast,
        "pooled_first": pooled_a,
        "pooled_second": pooled_b,
        "n": n,
        "ci_low": float(np.percentile(boot, 2.5)),
        "ci_high": float(np.percentile(boot, 97.5)),
        "se": se,
        "mde": (Z_975 + Z_80) * se if se > 0 else None,
        "p_value": float(2 * stats.norm.sf(abs(contrast) / se)) if se > 0 else None,
    }


def contrast_kind(first: Sequence[Run], second: Sequence[Run]) -> str | None:
    """``"recipe"`` or ``"method"``: what two arms differ in when they can be set against each other (same LM,
    training dataset and answer step source, and either the same method or the same recipe); ``None`` else."""
    (m1, r1, t1, lm1, a1), (m2, r2, t2, lm2, a2) = arm_key(first[0]), arm_key(second[0])
    if (t1, lm1, a1) != (t2, lm2, a2) or r1 is None or r2 is None:
        return None
    if m1 == m2 and r1 != r2:
        return "recipe"
    if m1 != m2 and r1 == r2:
        return "method"
    return None


def arm_contrasts(
    runs: Sequence[Run],
    explicit: dict[str, Sequence[str]] | None = None,
    margins: dict[str, float] | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of every two pooled optimizer arms that can be set against each other
    (:func:`contrast_kind`), in the order the arms appear; ``None`` when there are none. Each contrast's p-value
    and, with ``margins`` (``{"accuracy": fraction, "gold_prob": probability}``), its TOST join the report's
    family."""
    arms = pooled_arms(runs, explicit)
    names = list(arms)
    margins = margins or {}
    lines = [
        "| first arm | second arm | differ in | outcome | seeds | n | pooled first | pooled second "
        "| first − second [95% CI] | MDE | p" + (" | equivalence (TOST)" if margins else "") + " |",
        "|---|---|---|---|---:|---:|---:|---:|---|---:|---:" + ("|---" if margins else "") + "|",
    ]
    figures: dict[str, Any] = {}
    for i, one in enumerate(names):
        for two in names[i + 1 :]:
            kind = contrast_kind(arms[one][1], arms[two][1])
            if kind is None:
                continue
            first, second = effect_matrices(*arms[one]), effect_matrices(*arms[two])
            entry: dict[str, Any] = {"first": one, "second": two, "differ_in": kind}
            for outcome, scale, digits, unit, title in (
                ("accuracy", 100, 1, " points", "accuracy, points"),
                ("gold_prob", 1, 3, "", "p(gold)"),
            ):
                (q1, m1), (q2, m2) = first[outcome], second[outcome]
                shared = sorted(set(q1) & set(q2))
                if not shared:
                    entry[outcome] = None
                    continue
                c1, c2 = [q1.index(q) for q in shared], [q2.index(q) for q in shared]
                e = contrast_bootstrap(m1[:, c1], m2[:, c2])
                entry[outcome] = e
                label = f"{one} vs {two}: {'gain in' if kind == 'method' else 'compiled'} {title}"
                mde = mde_text(e["mde"], scale, digits, 2.0, unit)
                p = p_text(e["p_value"], section=ARMS, label=label, test=CONTRAST_TEST, mde=mde, difference=label)
                row = (
                    f"| {one} | {two} | {kind} | {title} | {m1.shape[0]} + {m2.shape[0]} | {e['n']} "
                    f"| {e['pooled_first'] * scale:+.{digits}f} | {e['pooled_second'] * scale:+.{digits}f} "
                    f"| {e['contrast'] * scale:+.{digits}f} [{e['ci_low'] * scale:+.{digits}f}, "
                    f"{e['ci_high'] * scale:+.{digits}f}] | {mde} | {p}"
                )
                if margins:
                    row += " | " + tost_cell(e, e["contrast"], margins.get(outcome), scale, unit, ARMS, label)
                lines.append(row + " |")
            figures[f"{one} vs {two}"] = entry
    return ("\n".join(lines) if figures else None), figures
