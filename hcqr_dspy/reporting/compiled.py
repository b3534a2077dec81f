"""The report's zero-shot against compiled section: each run of a saved (compiled) program paired with the
zero-shot run of the same method among the compared runs, whatever the report's reference, so that "the
optimizer helped HCQR" is read beside "the optimizer helped Simple RAG" and never against another method.

Per pair: accuracy both ways and their paired difference (95% paired bootstrap interval of the 0/1
differences, exact McNemar p on the discordant pairs, the accuracy MDE), the gold-option probability's paired
difference (bootstrap interval, Wilcoxon p, MDE), the cost per question of both runs and what compiling the
program cost (its ``meta.json``'s ``compile_cost``). The statistics are :mod:`hcqr_dspy.reporting.stats`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.evaluation.cpu_pressure import CONTENDED
from hcqr_dspy.reporting.family import (
    COMPILED,
    GAINS,
    MCNEMAR,
    WILCOXON,
    compared,
    mde_text,
    p_text,
    tested_alone,
)
from hcqr_dspy.reporting.gold_probability import gold_probs
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.setups import pair_confounds
from hcqr_dspy.reporting.stats import format_difference, format_mde, mcnemar_exact, paired_difference

COMPILED_NOTE = (
    "Each compiled program against the zero-shot run of its own method, paired over the questions both "
    "answered. Δ accuracy: mean of the per-question 0/1 differences (compiled - zero-shot) with a 95% paired "
    "bootstrap interval (BCa, 10,000 resamples) and the exact McNemar p (b = zero-shot right and compiled wrong, "
    "c = the reverse); Δ p(gold): the same for the gold option's probability, with the Wilcoxon signed-rank p. "
    "MDE: the smallest difference a paired test at 5% detects with 80% power over these questions (points for "
    "accuracy). s/q: wall seconds per question of each run (runs made on other builds or machines are not "
    "comparable). Compile: the optimizer's LM calls, tokens and wall time, from the saved program's meta.json."
)


GAIN_NOTE = (
    "Where two methods were compiled alike (same LM, recipe, training dataset and size): per question, the "
    "compiled run's gain over its "
    "own zero-shot run (-1, 0 or +1 for accuracy; the change in p(gold)) for each method, and their difference "
    "(first method's gain - second's; the second is the reference's method where it is one of them), over the "
    "questions all four runs answered (p(gold): all four scored). Interval: 95% paired bootstrap of that mean "
    "(BCa, 10,000 resamples); p: Wilcoxon signed-rank of the per-question differences; MDE: the smallest "
    "difference of gains a paired test at 5% detects with 80% power here (points for accuracy)."
)


def is_compiled(run: Run) -> bool:
    """Whether the run answered with a saved (compiled) program."""  # load_run checked the record's shape
    return bool(run.config.get("saved_program"))


def _lm(run: Run) -> str | None:
    return (run.config.get("lm") or {}).get("spec")


def zero_shot_partner(run: Run, runs: Sequence[Run], reference: Run | None = None) -> Run | None:
    """The zero-shot run of ``run``'s method and LM among ``runs`` (no saved program, no borrowed answer step);
    where several qualify, the one on ``run``'s own setup if exactly one is
    (:func:`~hcqr_dspy.reporting.setups.pair_confounds`), else the ``reference`` if it is one of them, else none
    (the pairing would be a guess). ``None`` when there is no such run."""
    candidates = [
        other
        for other in runs
        if other is not run
        and other.config.get("method") == run.config.get("method")
        and _lm(other) == _lm(run)
        and not is_compiled(other)
        and not other.config.get("answer_step")
    ]
    if len(candidates) == 1:
        return candidates[0]
    same_setup = [c for c in candidates if not pair_confounds(c, run)]
    if len(same_setup) == 1:  # the one zero-shot run on the compiled run's own setup
        return same_setup[0]
    return reference if reference is not None and any(c is reference for c in candidates) else None


def compile_cost(run: Run) -> tuple[dict[str, float] | None, str | None]:
    """The saved program's ``compile_cost`` (LM calls, tokens, seconds), from its folder's ``meta.json``
    (:attr:`~hcqr_dspy.reporting.runs.Run.program`, read once per comparison), or ``(None, why not)``: no folder
    recorded, the folder or its ``meta.json`` missing or unreadable, or no (well-formed) cost in it (a program
    saved before compile costs were kept)."""
    if run.program is None:
        return None, "no program folder recorded"
    meta, why = run.program.meta
    if why is not None:
        return None, why
    cost = meta.get("compile_cost") if isinstance(meta, dict) else None
    keys = ("lm_calls", "prompt_tokens", "completion_tokens", "seconds")
    if not isinstance(cost, dict) or not all(isinstance(cost.get(k), (int, float)) for k in keys):
        return None, "no compile cost recorded"
    return cost, None


def _cost(cost: dict[str, float] | None, why: str | None) -> str:
    if cost is None:
        return f"not known ({why})"
    tokens = cost["prompt_tokens"] + cost["completion_tokens"]
    pressure = cost.get("cpu_pressure")
    contended = (
        f" (under CPU contention: {pressure:.0%})"
        if isinstance(pressure, float | int) and not isinstance(pressure, bool) and pressure >= CONTENDED
        else ""
    )
    return f"{cost['lm_calls']:.0f} calls, {tokens:,.0f} tokens, {cost['seconds']:,.0f} s{contended}"


def compiled_pairs(runs: Sequence[Run], reference: Run | None = None) -> tuple[list[tuple[Run, Run]], list[Run]]:
    """``[(zero-shot run, compiled run)]`` for every compiled run with a zero-shot partner here
    (:func:`zero_shot_partner`), and the compiled runs left without one."""
    pairs, alone = [], []
    for run in runs:
        if is_compiled(run):
            zs = zero_shot_partner(run, runs, reference)
            pairs.append((zs, run)) if zs is not None else alone.append(run)
    return pairs, alone


def compiled_table(runs: Sequence[Run]) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of each (zero-shot, compiled) pair, ``runs[0]`` being the report's reference;
    compiled runs without a partner are named under the table. ``None`` when no run is compiled. Each figure's
    ``tested`` is false for a seed of an optimizer arm of seeds, tested pooled with its arm: its p-values are then
    descriptive, in no family."""
    pairs, alone = compiled_pairs(runs, runs[0] if runs else None)
    if not pairs and not alone:
        return None, {}
    lines = [
        "| method | compiled | n | accuracy zero-shot → compiled | Δ accuracy, points [95% CI] | McNemar p (b/c) "
        "| accuracy MDE | Δ p(gold) [95% CI] | Wilcoxon p | MDE Δp | s/q zero-shot → compiled | compile |",
        "|---|---|---:|---|---|---|---:|---|---:|---:|---|---|",
    ]
    figures: dict[str, Any] = {}
    notes: list[str] = []
    for zs, run in pairs:
        shared = sorted(set(zs.correct) & set(run.correct))
        acc = paired_difference([float(zs.correct[q]) for q in shared], [float(run.correct[q]) for q in shared])
        t = mcnemar_exact({q: zs.correct[q] for q in shared}, {q: run.correct[q] for q in shared})
        p_zs, p_run = gold_probs(zs), gold_probs(run)
        scored = sorted(set(p_zs) & set(p_run))
        gold = paired_difference([p_zs[q] for q in scored], [p_run[q] for q in scored])
        cost, why = compile_cost(run)
        n = len(shared)
        acc_zs = sum(zs.correct[q] for q in shared) / n if n else 0.0
        acc_run = sum(run.correct[q] for q in shared) / n if n else 0.0
        acc_mde = mde_text(acc["mde"], 100, 1, unit=" points")
        acc_p = p_text(
            t["p_value"], section=COMPILED, label=compared(zs.label, run.label, "accuracy"), test=MCNEMAR, mde=acc_mde
        )
        gold_label = compared(zs.label, run.label, "p(gold)")
        gold_p = p_text(
            gold["wilcoxon_p"], section=COMPILED, label=gold_label, test=WILCOXON, mde=mde_text(gold["mde"])
        )
        confounds = pair_confounds(zs, run)
        if confounds:
            notes.append(f"{run.label} against {zs.label}: {', '.join(confounds)}")
        lines.append(
            f"| {zs.label} | {run.label}{' †' if confounds else ''} | {n} | {acc_zs:.1%} → {acc_run:.1%} | "
            f"{format_difference(acc, 100, 1)} | "
            f"{acc_p} ({t['b']}/{t['c']}) | {format_mde(acc['mde'], 100, 1)} | "
            + (f"{format_difference(gold)}{'' if len(scored) == n else f' (n={len(scored)})'} | " if scored else "— | ")
            + gold_p
            + f" | {format_mde(gold['mde']) if scored else '—'} | "
            f"{zs.metrics['mean_seconds']:.1f} → {run.metrics['mean_seconds']:.1f} | {_cost(cost, why)} |"
        )
        figures[run.label] = {
            "zero_shot": zs.label,
            "questions": n,
            "accuracy_zero_shot": acc_zs,
            "accuracy_compiled": acc_run,
            "accuracy_diff": acc,
            "mcnemar": t,
            # a seed of an arm of seeds is tested pooled with its arm: its p-values here are descriptive, no test
            "tested": tested_alone(run.label),
            "gold_prob_scored": len(scored),
            "gold_prob_diff": gold,
            "compile_cost": cost,
            "compile_cost_absent": why,
        }
    if not pairs:
        lines = []
    if notes:
        lines += ["", "† setups differ, the delta is not the program's alone: " + "; ".join(notes) + " (see Setups)."]
    if alone:
        lines += [
            "",
            "Not paired (no single zero-shot run of the same method and LM among the compared runs, or several and "
            "none is the reference): " + ", ".join(r.label for r in alone) + ".",
        ]
    return "\n".join(lines).strip(), figures


def _recipe(run: Run) -> str | None:
    return (run.config.get("saved_program") or {}).get("recipe")


def _training(run: Run) -> str:
    """What the saved program was compiled on: ``recipe on dataset (n)``."""
    saved = run.config.get("saved_program") or {}
    return f"{saved.get('recipe')} on {saved.get('train_dataset') or '?'} ({saved.get('train_count') or '?'})"


def _not_comparable(c1: Run, c2: Run) -> str | None:
    """Why two compiled runs' gains are not set against each other (a different LM, recipe or training set, or
    an unknown recipe); ``None`` when they are."""
    if _lm(c1) != _lm(c2):
        return f"LMs differ ({_lm(c1)}, {_lm(c2)})"
    if _recipe(c1) is None or _recipe(c2) is None:
        return "a recipe is not recorded"
    if _training(c1) != _training(c2):
        return f"compiled differently ({_training(c1)}; {_training(c2)})"
    return None


def _gain_pairs(
    pairs: Sequence[tuple[Run, Run]], reference: Run | None
) -> tuple[list[tuple[tuple[Run, Run], ...]], list[str]]:
    """Every two (zero-shot, compiled) pairs of different methods compiled alike (:func:`_not_comparable`), the
    pair of the ``reference``'s method second, else in the order of ``pairs``; and a line for each two of
    different methods left out, saying why."""
    ref_method = reference.config.get("method") if reference is not None else None
    out, skipped = [], []
    for i, first in enumerate(pairs):
        for second in pairs[i + 1 :]:
            (zs1, c1), (zs2, c2) = first, second
            if zs1.config.get("method") == zs2.config.get("method"):
                continue
            if why := _not_comparable(c1, c2):
                skipped.append(f"{c1.label} and {c2.label}: {why}")
                continue
            out.append((second, first) if zs1.config.get("method") == ref_method else (first, second))
    return out, skipped


def _gains(outcome: Sequence[dict[str, float]]) -> tuple[list[float], list[float]]:
    """Per question present in all of ``outcome``'s four maps (zero-shot and compiled of the first method, then
    of the second): the second method's gains and the first's."""
    shared = sorted(set.intersection(*(set(o) for o in outcome)))
    z1, c1, z2, c2 = outcome
    return [c2[q] - z2[q] for q in shared], [c1[q] - z1[q] for q in shared]


def gain_against_gain(runs: Sequence[Run]) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of each difference in differences (:data:`GAIN_NOTE`), ``runs[0]`` being the report's
    reference: (compiled - zero-shot) of one method against the same of another, per question, for accuracy and
    the gold-option probability; where no two are comparable, only the line naming those left out and why.
    ``None`` when no two methods have a compiled run paired with its zero-shot run."""
    reference = runs[0] if runs else None
    pairs, _ = compiled_pairs(runs, reference)
    couples, skipped = _gain_pairs(pairs, reference)
    if not couples and not skipped:
        return None, {}
    if not couples:
        return "Not set against each other: " + "; ".join(skipped) + ".", {}
    lines = [
        "| first: compiled vs zero-shot | second: compiled vs zero-shot | compiled with | n | Δ accuracy first, points "
        "| Δ accuracy second, points | first − second, points [95% CI] | Wilcoxon p | MDE, points "
        "| Δ p(gold) first − second [95% CI] | Wilcoxon p | MDE Δp |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    figures: dict[str, Any] = {}
    for first, second in couples:
        correct = [{q: float(ok) for q, ok in r.correct.items()} for r in (*first, *second)]
        gains2, gains1 = _gains(correct)
        acc = paired_difference(gains2, gains1)
        gold = paired_difference(*_gains([gold_probs(r) for r in (*first, *second)]))
        n = len(gains1)
        mean1 = sum(gains1) / n if n else 0.0
        mean2 = sum(gains2) / n if n else 0.0
        arms = (f"gain of {second[1].label} over {second[0].label}", f"gain of {first[1].label} over {first[0].label}")
        acc_mde = mde_text(acc["mde"], 100, 1, limit=2, unit=" points")
        acc_p = p_text(acc["wilcoxon_p"], section=GAINS, label=compared(*arms, "accuracy"), test=WILCOXON, mde=acc_mde)
        gold_mde = mde_text(gold["mde"], limit=2)
        gold_p = p_text(
            gold["wilcoxon_p"], section=GAINS, label=compared(*arms, "p(gold)"), test=WILCOXON, mde=gold_mde
        )
        lines.append(
            f"| {first[1].label} vs {first[0].label} | {second[1].label} vs {second[0].label} | {_training(first[1])} "
            f"| {n} | {mean1 * 100:+.1f} | {mean2 * 100:+.1f} | {format_difference(acc, 100, 1)} | "
            + acc_p
            + f" | {format_mde(acc['mde'], 100, 1, limit=2)} | "
            + (f"{format_difference(gold)} (n={gold['n']})" if gold["n"] else "—")
            + " | "
            + gold_p
            + f" | {format_mde(gold['mde'], limit=2) if gold['n'] else '—'} |"
        )
        figures[f"{first[1].label} vs {second[1].label}"] = {
            "first": [first[0].label, first[1].label],
            "second": [second[0].label, second[1].label],
            "recipe": _recipe(first[1]),
            "compiled_with": _training(first[1]),
            "questions": n,
            "accuracy_gain_first": mean1,
            "accuracy_gain_second": mean2,
            "accuracy_gain_diff": acc,
            "gold_prob_gain_diff": gold,
        }
    if skipped:
        lines += ["", "Not set against each other: " + "; ".join(skipped) + "."]
    return "\n".join(lines), figures
