"""Replicate compiles as one optimizer arm: the effect of a recipe over several compile seeds, against the zero-shot
run of the same method.

A compile is one random draw (which training questions are drawn and in what order, which traces bootstrap), so
one compiled program measures one draw of the optimizer, not the optimizer. Runs of saved programs that share
method, recipe, training dataset and LM and differ only in compile seed form one **optimizer arm**
(:func:`replicate_groups`, automatically from the run records, or named with ``hcqr compare --group``). For each
arm with a zero-shot partner, over the questions every run answered, the report gives for accuracy (0/1 per
question) and for the gold option's probability:

- the effect per seed: the mean per-question difference ``compiled_s - zero-shot``;
- the pooled effect: the mean of the per-seed effects (every seed weighs alike);
- its 95% interval from a two-level bootstrap (:func:`two_level_bootstrap`): seeds are resampled with replacement,
  then questions with replacement, the same drawn questions for every drawn seed, since seeds and questions are
  crossed and each question's zero-shot row is shared (Davison & Hinkley 1997, *Bootstrap Methods and their
  Application*, section 3.8, multi-stage resampling; Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat., for
  crossed factors); the percentile interval of the resampled pooled effects;
- the between-seed standard deviation of the per-seed effects (``ddof = 1``), the compile's own variance;
- the design's minimum detectable effect at 5% two-sided and 80% power, ``(z_0.975 + z_0.80) * SE`` with the
  bootstrap standard error (Bloom 1995, "Minimum detectable effects", Evaluation Review 19(5));
- a two-sided p-value of the pooled effect from the same normal approximation, ``2 * (1 - Phi(|pooled| / SE))``,
  and, with a margin, a two one-sided test of equivalence with it (Schuirmann 1987).

An arm of one seed gets no pooled row (its effect is the zero-shot-against-compiled section's): the report says that
the compile's variance is unmeasured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.reporting.compiled import is_compiled, zero_shot_partner
from hcqr_dspy.reporting.family import REPLICATES, mde_text, p_text
from hcqr_dspy.reporting.gold_probability import gold_probs
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.setups import pair_confounds

# The test name the pooled effects' p-values are registered under (the family of tests).
POOLED_TEST = "pooled effect, two-level bootstrap SE (normal)"
# Two-level bootstrap resamples and seed (reproducible intervals).
REPLICATE_RESAMPLES = 10_000
REPLICATE_SEED = 0
Z_975 = 1.959963984540054  # scipy.stats.norm.ppf(0.975)
Z_80 = 0.8416212335729143  # scipy.stats.norm.ppf(0.80)

REPLICATES_NOTE = (
    "Runs of saved programs that share method, recipe, training dataset and LM and differ only in compile seed "
    "form one optimizer arm, paired with the zero-shot run of the same method over the questions every run "
    "answered. Per seed: the mean per-question difference (compiled - zero-shot). Pooled: the mean over seeds. "
    "Interval: 95% percentile interval of a two-level bootstrap (seeds resampled, then questions, the same "
    "questions for every drawn seed; Davison & Hinkley 1997, section 3.8; 10,000 resamples, seed 0). "
    "Between-seed SD: the standard deviation of the per-seed effects. MDE: (z_0.975 + z_0.80) x the bootstrap "
    "SE, the smallest pooled effect this design detects with 80% power at 5% (Bloom 1995). p: normal "
    "approximation with the bootstrap SE."
)


def compile_seed(run: Run) -> int | None:
    """The compile seed of a run's saved program: its run record's ``saved_program.seed``, else the seed of the
    recipe in the program folder's ``meta.json`` (:attr:`~hcqr_dspy.reporting.runs.Run.program`, read once per
    comparison); ``None`` when neither records one."""
    saved = run.config.get("saved_program") or {}
    if isinstance(saved.get("seed"), int):
        return saved["seed"]
    if run.program is None:
        return None
    meta, _ = run.program.meta
    seed = (meta.get("recipe") or {}).get("seed") if isinstance(meta, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def arm_key(run: Run) -> tuple:
    """What replicate compiles share: method, recipe, training dataset, LM spec and the answer step source."""
    saved = run.config.get("saved_program") or {}
    return (
        run.config.get("method"),
        saved.get("recipe"),
        saved.get("train_dataset"),
        (run.config.get("lm") or {}).get("spec"),
        json.dumps(run.config.get("answer_step"), sort_keys=True),
    )


def replicate_groups(runs: Sequence[Run], explicit: dict[str, Sequence[str]] | None = None) -> dict[str, list[Run]]:
    """Optimizer arms: ``{arm name: [runs, one per seed]}``.

    Without ``explicit``, compiled runs of one :func:`arm_key` form an arm named ``<method> + <recipe>`` (two
    or more runs; a lone compile is an arm of one seed). ``explicit`` maps an arm name to the labels or folder
    names of its runs (``hcqr compare --group NAME=RUN,RUN``); every compiled run it leaves out is grouped
    automatically.

    Raises:
        HCQRError: an explicit group names an unknown run, a run twice or in two groups, a run that is not a
            compiled program, or runs whose methods, recipes or LMs differ.
    """
    groups: dict[str, list[Run]] = {}
    taken: set[int] = set()
    for name, members in (explicit or {}).items():
        chosen = []
        for member in members:
            found = [r for r in runs if member in (r.label, r.path.name, str(r.path))]
            if len(found) != 1:
                raise HCQRError(
                    f"--group {name}: {member!r} names {'none' if not found else len(found)} of the compared runs "
                    f"({', '.join(r.label for r in runs)})"
                )
            run = found[0]
            if id(run) in taken:
                raise HCQRError(f"--group {name}: run {run.label} is named twice or in two groups")
            if not is_compiled(run):
                raise HCQRError(f"--group {name}: run {run.label} is not a saved (compiled) program")
            taken.add(id(run))
            chosen.append(run)
        keys = {arm_key(r) for r in chosen}
        if len(keys) > 1:
            fields = ("method", "recipe", "training dataset", "LM", "answer step")
            differ = [f for i, f in enumerate(fields) if len({k[i] for k in keys}) > 1]
            raise HCQRError(
                f"--group {name}: its runs differ in {', '.join(differ)} "
                f"({'; '.join(f'{r.label}: {arm_key(r)[0]} + {arm_key(r)[1]}' for r in chosen)}); "
                "a group holds replicate compiles of one recipe and method"
            )
        groups[name] = chosen
    auto: dict[tuple, list[Run]] = {}
    for run in runs:
        if is_compiled(run) and id(run) not in taken:
            auto.setdefault(arm_key(run), []).append(run)
    for key, members in auto.items():
        name = f"{key[0]} + {key[1]}"
        while name in groups:
            name += "'"
        groups[name] = members
    return groups


def check_groups(runs: Sequence[Run], explicit: dict[str, Sequence[str]] | None) -> None:
    """Refuse, before a report is written, an optimizer arm that holds one compile seed twice (two runs of one draw
    would count as two), and ``--group`` arms that cannot be compared: those :func:`replicate_groups` refuses, an
    arm of fewer than two runs, or one without a zero-shot run of its method among ``runs`` (``runs[0]``: the
    report's reference).

    Raises:
        HCQRError: one line naming the arm or group.
    """
    groups = replicate_groups(runs, explicit)
    for name, members in groups.items():
        seen: dict[int, str] = {}
        for run in members:
            seed = compile_seed(run)
            if seed in seen:
                raise HCQRError(
                    f"optimizer arm {name}: runs {seen[seed]} and {run.label} are both compile seed {seed}; an arm's "
                    "seeds are separate draws, so compare one of the two"
                )
            if seed is not None:
                seen[seed] = run.label
    if not explicit:
        return
    for name in explicit:
        members = groups[name]
        if len(members) < 2:
            raise HCQRError(f"--group {name}: one run ({members[0].label}); a group holds two or more compile seeds")
        if zero_shot_partner(members[0], runs, runs[0]) is None:
            raise HCQRError(
                f"--group {name}: no zero-shot run of {members[0].config.get('method')} among the compared runs "
                "to measure the optimizer against; add one"
            )


def two_level_bootstrap(
    diffs, resamples: int = REPLICATE_RESAMPLES, seed: int = REPLICATE_SEED
) -> dict[str, float | None]:
    """Pooled effect of a seeds x questions matrix of paired differences and its two-level bootstrap.

    Args:
        diffs: array-like of shape ``(seeds, questions)``: ``compiled_s[q] - zero_shot[q]``.

    Returns:
        ``pooled`` (mean of the per-seed means), ``between_seed_sd`` (``None`` under two seeds), and from the
        bootstrap (seeds and questions resampled with replacement, one question draw shared by the drawn seeds):
        ``ci_low``/``ci_high`` (2.5 and 97.5 percentiles), ``se``; ``mde`` and ``p_value`` from the normal
        approximation with that SE (``None`` without spread). With one seed the bootstrap resamples questions
        only.
    """
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    s, n = d.shape
    per_seed = d.mean(axis=1)
    pooled = float(per_seed.mean())
    rng = np.random.default_rng(seed)
    seed_draw = rng.integers(0, s, size=(resamples, s))
    question_draw = rng.integers(0, n, size=(resamples, n))
    # one question draw per resample, shared by the drawn seeds: mean over drawn questions per seed, then seeds
    per_seed_q = d[:, question_draw].mean(axis=2).T  # (resamples, s)
    boot = np.take_along_axis(per_seed_q, seed_draw, axis=1).mean(axis=1)
    se = float(boot.std(ddof=1))
    out: dict[str, float | None] = {
        "seeds": s,
        "n": n,
        "pooled": pooled,
        "between_seed_sd": float(per_seed.std(ddof=1)) if s >= 2 else None,
        "ci_low": float(np.percentile(boot, 2.5)),
        "ci_high": float(np.percentile(boot, 97.5)),
        "se": se,
        "mde": (Z_975 + Z_80) * se if se > 0 else None,
        "p_value": float(2 * stats.norm.sf(abs(pooled) / se)) if se > 0 else None,
    }
    return out


def equivalence(pooled: float, se: float | None, margin: float) -> dict[str, float] | None:
    """Two one-sided tests that the pooled effect lies within ``(-margin, +margin)``, normal approximation with
    the bootstrap SE (Schuirmann 1987): ``p_lower = 1 - Phi((pooled + margin) / se)``, ``p_upper =
    Phi((pooled - margin) / se)``, ``p_value = max`` of the two. ``None`` without spread."""
    if not se:
        return None
    from scipy import stats

    low = float(stats.norm.sf((pooled + margin) / se))
    high = float(stats.norm.cdf((pooled - margin) / se))
    return {"margin": margin, "p_lower": low, "p_upper": high, "p_value": max(low, high)}


def effect_matrices(zero_shot: Run, members: Sequence[Run]) -> dict[str, tuple[list[str], Any]]:
    """Per outcome (``accuracy``, ``gold_prob``): the questions every run answered (p(gold): scored) and the
    seeds x questions matrix of ``compiled_s[q] - zero_shot[q]`` over them."""
    import numpy as np

    shared = sorted(set(zero_shot.correct).intersection(*(r.correct for r in members)))
    acc = np.array([[float(r.correct[q]) - float(zero_shot.correct[q]) for q in shared] for r in members])
    probs = [gold_probs(r) for r in members]
    p_zs = gold_probs(zero_shot)
    scored = sorted(set(p_zs).intersection(*probs))
    gold = np.array([[p[q] - p_zs[q] for q in scored] for p in probs])
    return {"accuracy": (shared, acc), "gold_prob": (scored, gold)}


def tost_cell(
    effect: dict[str, Any], estimate: float, margin: float | None, scale: float, unit: str, section: str, label: str
) -> str:
    """The equivalence cell of a pooled estimate with the bootstrap SE ``effect["se"]`` (:func:`equivalence`,
    stored as ``effect["tost"]``) joined to the report's family under ``section`` and ``label``: ``—`` without a
    margin for this outcome, "not testable (no spread)" without spread."""
    tost = None if margin is None else equivalence(estimate, effect["se"], margin)
    effect["tost"] = tost
    if tost is None:
        return "—" if margin is None else "not testable (no spread)"
    within = f"±{margin * scale:g}{unit}"
    test = f"TOST {within} (normal, bootstrap SE)"
    return p_text(tost["p_value"], section=section, label=label, test=test, margin=within, difference=label)


def arm_effects(zero_shot: Run, members: Sequence[Run]) -> dict[str, Any]:
    """Per-seed and pooled effects of one optimizer arm against its zero-shot run, for accuracy and p(gold), over
    the questions every run answered (p(gold): every run scored)."""
    out: dict[str, Any] = {
        "zero_shot": zero_shot.label,
        "runs": [r.label for r in members],
        "seeds": [compile_seed(r) for r in members],
    }
    for name, (_, matrix) in effect_matrices(zero_shot, members).items():
        if matrix.size == 0:
            out[name] = None
            continue
        out[name] = {"per_seed": [float(x) for x in matrix.mean(axis=1)], **two_level_bootstrap(matrix)}
    return out


def pooled_arms(
    runs: Sequence[Run], explicit: dict[str, Sequence[str]] | None = None
) -> dict[str, tuple[Run, list[Run]]]:
    """The optimizer arms a report pools and tests: ``{arm name: (zero-shot run, seeds)}`` for each arm of two or
    more seeds with a zero-shot run of its method among ``runs`` (``runs[0]``, the reference, picks it where
    several qualify)."""
    out = {}
    for name, members in replicate_groups(runs, explicit).items():
        zs = zero_shot_partner(members[0], runs, runs[0]) if len(members) >= 2 else None
        if zs is not None:
            out[name] = (zs, members)
    return out


def _fmt(x: float | None, scale: float, digits: int) -> str:
    return "—" if x is None else f"{x * scale:+.{digits}f}"


def replicates_table(
    runs: Sequence[Run],
    explicit: dict[str, Sequence[str]] | None = None,
    margins: dict[str, float] | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of every optimizer arm with a zero-shot partner (``runs[0]`` is the report's reference,
    which picks the partner where several qualify). Each pooled effect's p-value and TOST join the report's family
    of tests (:func:`hcqr_dspy.reporting.family.p_text`).

    Args:
        explicit: ``--group`` arms (see :func:`replicate_groups`).
        margins: ``{"accuracy": fraction, "gold_prob": probability}`` equivalence margins (either may be absent).

    Returns:
        ``(None, {})`` when no run is compiled.
    """
    groups = replicate_groups(runs, explicit)
    if not groups:
        return None, {}
    margins = margins or {}
    lines = [
        "| optimizer arm | outcome | seeds | n | per-seed effects (seed: effect) | pooled [95% CI] | between-seed SD "
        "| MDE | p" + (" | equivalence (TOST)" if margins else "") + " |",
        "|---|---|---:|---:|---|---|---:|---:|---:" + ("|---" if margins else "") + "|",
    ]
    notes: list[str] = []
    figures: dict[str, Any] = {}
    for name, members in groups.items():
        zs = zero_shot_partner(members[0], runs, runs[0])
        if zs is None:
            notes.append(f"{name}: no zero-shot run of {members[0].config.get('method')} among the compared runs")
            continue
        if len(members) == 1:  # its effect is the zero-shot-against-compiled section's; nothing to pool
            notes.append(
                f"{name}: one compile seed ({members[0].label}): the compile's own variance is unmeasured, so its "
                "effect (in the zero-shot-against-compiled section) is that of one draw of the optimizer, not of "
                "the optimizer"
            )
            continue
        effects = arm_effects(zs, members)
        confounded = {r.label: why for r in members if (why := pair_confounds(zs, r))}
        effects["confounded"] = confounded
        figures[name] = effects
        if confounded:
            notes.append(
                f"{name} †: setups differ from {zs.label}'s, the pooled effect is not the optimizer's alone: "
                + "; ".join(f"{label} ({', '.join(why)})" for label, why in confounded.items())
            )
        mark = " †" if confounded else ""
        for outcome, scale, digits, unit, title in (
            ("accuracy", 100, 1, " points", "accuracy, points"),
            ("gold_prob", 1, 3, "", "p(gold)"),
        ):
            e = effects[outcome]
            if e is None:
                continue
            seeds = ", ".join(
                f"{'?' if s is None else s}: {_fmt(x, scale, digits)}" for s, x in zip(effects["seeds"], e["per_seed"])
            )
            sd = f"{e['between_seed_sd'] * scale:.{digits}f}"
            limit = 1.0  # a difference of two 0/1 or probability outcomes
            mde = mde_text(e["mde"], scale, digits, limit, unit)
            label = f"{name} vs {zs.label}: {title} (pooled over {e['seeds']} seeds)"
            p = p_text(e["p_value"], section=REPLICATES, label=label, test=POOLED_TEST, mde=mde, difference=label)
            row = (
                f"| {name}{mark} | {title} | {e['seeds']} | {e['n']} | {seeds} | {_fmt(e['pooled'], scale, digits)} "
                f"[{_fmt(e['ci_low'], scale, digits)}, {_fmt(e['ci_high'], scale, digits)}] | {sd} | {mde} | {p}"
            )
            if margins:
                row += " | " + tost_cell(e, e["pooled"], margins.get(outcome), scale, unit, REPLICATES, label)
            lines.append(row + " |")
    body = "\n".join(lines) if len(lines) > 2 else ""
    if notes:
        body += ("\n\n" if body else "") + "\n".join(f"- {n}" for n in notes)
    return body or None, figures
