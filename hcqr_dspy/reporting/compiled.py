"""The report's zero-shot against compiled section: each run of a saved (compiled) program paired with the
zero-shot run of the same method among the compared runs, whatever the report's reference, so that "the
optimizer helped HCQR" is read beside "the optimizer helped Simple RAG" and never against another method.

Per pair: accuracy both ways and their paired difference (95% paired bootstrap interval of the 0/1
differences, exact McNemar p on the discordant pairs, the accuracy MDE), the gold-option probability's paired
difference (bootstrap interval, Wilcoxon p, MDE), the cost per question of both runs and what compiling the
program cost (its ``meta.json``'s ``compile_cost``). The statistics are :mod:`hcqr_dspy.reporting.stats`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.optimize.saved import META_FILE
from hcqr_dspy.reporting.gold_probability import gold_probs
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import mcnemar_exact, paired_difference

COMPILED_NOTE = (
    "Each compiled program against the zero-shot run of its own method, paired over the questions both "
    "answered. Δ accuracy: mean of the per-question 0/1 differences (compiled - zero-shot) with a 95% paired "
    "bootstrap interval (BCa, 10,000 resamples) and the exact McNemar p (b = zero-shot right and compiled wrong, "
    "c = the reverse); Δ p(gold): the same for the gold option's probability, with the Wilcoxon signed-rank p. "
    "MDE: the smallest difference a paired test at 5% detects with 80% power over these questions (points for "
    "accuracy). s/q: wall seconds per question of each run (runs made on other builds or machines are not "
    "comparable). Compile: the optimizer's LM calls and wall time, from the saved program's meta.json."
)


def is_compiled(run: Run) -> bool:
    """Whether the run answered with a saved (compiled) program."""
    return bool(run.config.get("saved_program"))


def zero_shot_partner(run: Run, runs: Sequence[Run]) -> Run | None:
    """The zero-shot run of ``run``'s method among ``runs`` (no saved program, no borrowed answer step);
    ``None`` when there is none."""
    method = run.config.get("method")
    for other in runs:
        if (
            other is not run
            and other.config.get("method") == method
            and not is_compiled(other)
            and not other.config.get("answer_step")
        ):
            return other
    return None


def compile_cost(run: Run) -> dict[str, Any] | None:
    """The saved program's ``compile_cost`` (LM calls, tokens, seconds), read from its folder's ``meta.json``;
    ``None`` when the folder or the record is not there (a program saved before compile costs were kept)."""
    folder = (run.config.get("saved_program") or {}).get("folder")
    if not folder:
        return None
    try:
        meta = json.loads((Path(folder) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return meta.get("compile_cost") if isinstance(meta, dict) else None


def _interval(d: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    if d["mean_diff"] is None:
        return "—"
    mean = f"{d['mean_diff'] * scale:+.{digits}f}"
    if d["ci_low"] is None:
        return mean
    return f"{mean} [{d['ci_low'] * scale:+.{digits}f}, {d['ci_high'] * scale:+.{digits}f}]"


def _mde(mde: float | None, scale: float = 1.0, digits: int = 3) -> str:
    if mde is None:
        return "— (no spread)"
    return f"{mde * scale:.{digits}f}" if mde <= 1 else "undetectable"


def _cost(c: dict[str, Any] | None) -> str:
    if not c:
        return "not recorded"
    return f"{c.get('lm_calls', 0):.0f} calls, {c.get('seconds', 0) / 60:.0f} min"


def compiled_pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """``[(zero-shot run, compiled run)]`` for every compiled run whose method has a zero-shot run here."""
    return [(zs, run) for run in runs if is_compiled(run) and (zs := zero_shot_partner(run, runs)) is not None]


def compiled_table(runs: Sequence[Run]) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of each (zero-shot, compiled) pair; ``None`` when there is no such pair."""
    pairs = compiled_pairs(runs)
    if not pairs:
        return None, {}
    lines = [
        "| method | compiled | n | accuracy zero-shot → compiled | Δ accuracy, points [95% CI] | McNemar p (b/c) "
        "| accuracy MDE | Δ p(gold) [95% CI] | Wilcoxon p | MDE Δp | s/q zero-shot → compiled | compile |",
        "|---|---|---:|---|---|---|---:|---|---:|---:|---|---|",
    ]
    figures: dict[str, Any] = {}
    for zs, run in pairs:
        shared = sorted(set(zs.correct) & set(run.correct))
        acc = paired_difference([float(zs.correct[q]) for q in shared], [float(run.correct[q]) for q in shared])
        t = mcnemar_exact({q: zs.correct[q] for q in shared}, {q: run.correct[q] for q in shared})
        p_zs, p_run = gold_probs(zs), gold_probs(run)
        scored = sorted(set(p_zs) & set(p_run))
        gold = paired_difference([p_zs[q] for q in scored], [p_run[q] for q in scored])
        cost = compile_cost(run)
        n = len(shared)
        acc_zs = sum(zs.correct[q] for q in shared) / n if n else 0.0
        acc_run = sum(run.correct[q] for q in shared) / n if n else 0.0
        lines.append(
            f"| {zs.label} | {run.label} | {n} | {acc_zs:.1%} → {acc_run:.1%} | {_interval(acc, 100, 1)} | "
            f"{t['p_value']:.3g} ({t['b']}/{t['c']}) | {_mde(acc['mde'], 100, 1)} | "
            + (f"{_interval(gold)} | " if scored else "— | ")
            + ("—" if gold["wilcoxon_p"] is None else f"{gold['wilcoxon_p']:.3g}")
            + f" | {_mde(gold['mde']) if scored else '—'} | "
            f"{zs.metrics['mean_seconds']:.1f} → {run.metrics['mean_seconds']:.1f} | {_cost(cost)} |"
        )
        figures[run.label] = {
            "zero_shot": zs.label,
            "questions": n,
            "accuracy_zero_shot": acc_zs,
            "accuracy_compiled": acc_run,
            "accuracy_diff": acc,
            "mcnemar": t,
            "gold_prob_scored": len(scored),
            "gold_prob_diff": gold,
            "compile_cost": cost,
        }
    return "\n".join(lines), figures
