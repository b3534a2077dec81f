"""Report sections on the answer step's letter distribution and on what chance and letter habits score.

* :func:`gold_probability_table`: per run against the reference, the paired difference of the gold option's
  probability and of its log-odds (bootstrap interval, Wilcoxon p-value, minimum detectable effect), beside the
  accuracy difference's minimum detectable effect (:mod:`hcqr_dspy.reporting.stats`);
* :func:`calibration_table`: Brier score and expected calibration error per run;
* :func:`baselines_and_letters`: the majority-letter and uniform baselines and each run's predicted letters.

Sources: the multi-class Brier score (Brier 1950, "Verification of forecasts expressed in terms of
probability": the mean over questions of ``sum_x (p(x) - [x = gold])^2``); expected calibration error with 10
equal-width confidence bins (Guo et al. 2017, "On Calibration of Modern Neural Networks", section 2), for the
most probable option's probability against whether it is the gold one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hcqr_dspy.reporting.family import GOLD_PROBABILITY, WILCOXON, compared, mde_text, p_text
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import format_mde, minimum_detectable_effect, paired_difference

# Probabilities are clipped to [EPS, 1 - EPS] before log-odds, so a gold probability of 0 or 1 stays finite.
EPS = 1e-6
ECE_BINS = 10

GOLD_PROBABILITY_NOTE = (
    "p(gold): the answer step's probability of the gold option after the reasoning it generated, renormalised "
    "over the options (`hcqr rescore` adds it to runs recorded without it). Paired over the questions both runs "
    "scored: mean difference (run - reference) with a 95% paired bootstrap interval (BCa, 10,000 resamples), "
    "two-sided Wilcoxon signed-rank p; log-odds = log(p / (1 - p)). MDE: the smallest mean difference a paired "
    "test at 5% detects with 80% power over these questions given the observed spread; a true effect below it "
    "would most likely go unseen. The accuracy MDE is the same for the 0/1 outcome (points)."
)


def _log_odds(p: float) -> float:
    p = min(max(p, EPS), 1 - EPS)
    return math.log(p / (1 - p))


def gold_probs(run: Run) -> dict[str, float]:
    """Question id -> gold option probability, for the rows that have one."""
    return {r["qid"]: r["gold_prob"] for r in run.rows if r.get("gold_prob") is not None}


def _fmt(x: float | None, digits: int = 3, scale: float = 1.0) -> str:
    return "—" if x is None else f"{x * scale:+.{digits}f}"


def gold_probability_table(ordered: Sequence[Run]) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures: each run's paired difference from the reference (``ordered[0]``); ``None`` when
    no run has a gold probability (the absent reasons are listed instead when some rows say why)."""
    ref = ordered[0]
    probs = {r.label: gold_probs(r) for r in ordered}
    if not any(probs.values()):
        reasons = sorted({row.get("option_probs_absent") for r in ordered for row in r.rows} - {None})
        return (f"No run has it: {'; '.join(reasons)}." if reasons else None), {}
    lines = [
        "| run | scored | mean p(gold) | Δ p(gold) [95% CI] | Wilcoxon p | MDE Δp | Δ log-odds [95% CI] | "
        "Wilcoxon p | accuracy MDE (points) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    figures: dict[str, Any] = {}
    for run in ordered:
        mine = probs[run.label]
        mean = sum(mine.values()) / len(mine) if mine else None
        row = [run.label, f"{len(mine)}/{len(run.rows)}", "—" if mean is None else f"{mean:.3f}"]
        if run is ref:
            lines.append("| " + " | ".join(row + ["reference"] + ["—"] * 5) + " |")
            figures[run.label] = {"scored": len(mine), "mean_gold_prob": mean}
            continue
        shared = sorted(set(mine) & set(probs[ref.label]))
        p = paired_difference([probs[ref.label][q] for q in shared], [mine[q] for q in shared])
        lo = paired_difference([_log_odds(probs[ref.label][q]) for q in shared], [_log_odds(mine[q]) for q in shared])
        both = sorted(set(run.correct) & set(ref.correct))
        diffs = [int(run.correct[q]) - int(ref.correct[q]) for q in both]
        sd = _sd(diffs)
        acc_mde = minimum_detectable_effect(len(both), sd) if sd is not None else None
        row += [
            f"{_fmt(p['mean_diff'])} [{_fmt(p['ci_low'])}, {_fmt(p['ci_high'])}]",
            p_text(
                p["wilcoxon_p"],
                section=GOLD_PROBABILITY,
                label=compared(ref.label, run.label, "p(gold)"),
                test=WILCOXON,
                mde=mde_text(p["mde"]),
            ),
            format_mde(p["mde"]),
            f"{_fmt(lo['mean_diff'], 2)} [{_fmt(lo['ci_low'], 2)}, {_fmt(lo['ci_high'], 2)}]",
            p_text(
                lo["wilcoxon_p"],
                section=GOLD_PROBABILITY,
                label=compared(ref.label, run.label, "log-odds of p(gold)"),
                test=WILCOXON,
                mde=mde_text(lo["mde"], digits=2, limit=math.inf, unit=" log-odds"),
            ),
            "— (no discordant pair)" if acc_mde is None else format_mde(acc_mde, scale=100, digits=1),
        ]
        lines.append("| " + " | ".join(row) + " |")
        figures[run.label] = {
            "scored": len(mine),
            "mean_gold_prob": mean,
            "gold_prob_diff": p,
            "log_odds_diff": lo,
            "accuracy_mde": acc_mde,
        }
    return "\n".join(lines), figures


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def calibration(run: Run) -> dict[str, Any] | None:
    """Brier score, expected calibration error and how often the most probable option is the generated answer,
    over the rows with a letter distribution; ``None`` without any."""
    rows = [r for r in run.rows if r.get("option_probs")]
    if not rows:
        return None
    brier = sum(sum((p - (x == r["gold"])) ** 2 for x, p in r["option_probs"].items()) for r in rows) / len(rows)
    bins: dict[int, list[tuple[float, bool]]] = {}
    agree = 0
    for r in rows:
        top = max(r["option_probs"], key=r["option_probs"].get)
        conf = r["option_probs"][top]
        bins.setdefault(min(int(conf * ECE_BINS), ECE_BINS - 1), []).append((conf, top == r["gold"]))
        agree += top == r.get("prediction")
    ece = sum(
        len(b) / len(rows) * abs(sum(c for c, _ in b) / len(b) - sum(ok for _, ok in b) / len(b)) for b in bins.values()
    )
    return {"n": len(rows), "brier": brier, "ece": ece, "argmax_is_answer": agree / len(rows)}


def calibration_table(ordered: Sequence[Run]) -> tuple[str | None, dict[str, Any]]:
    """Markdown and figures of :func:`calibration` per run; ``None`` when no run has distributions."""
    figures = {r.label: c for r in ordered if (c := calibration(r)) is not None}
    if not figures:
        return None, {}
    lines = [
        "| run | scored | Brier (lower is better) | ECE | most probable option = generated answer |",
        "|---|---|---|---|---|",
    ]
    for label, c in figures.items():
        lines.append(f"| {label} | {c['n']} | {c['brier']:.3f} | {c['ece']:.3f} | {c['argmax_is_answer']:.0%} |")
    return "\n".join(lines), figures


def baselines_and_letters(ordered: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    """Markdown and figures: what always answering the most frequent gold letter and answering uniformly at
    random score on these questions, and the distribution of each run's predicted letters beside the gold one."""
    ref = ordered[0]
    gold = Counter(r["gold"] for r in ref.rows)
    n = len(ref.rows)
    letter, count = max(sorted(gold.items()), key=lambda kv: kv[1])
    counts_of_options = _option_counts(ref)
    uniform = sum(1 / k for k in counts_of_options) / n if len(counts_of_options) == n else None
    letters = sorted(set(gold) | {r.get("prediction") for run in ordered for r in run.rows} - {None})
    lines = [
        f"Majority letter: always answering **{letter}** scores **{count / n:.1%}** ({count}/{n}; the most "
        f"frequent gold letter of these questions, so an upper bound for any fixed-letter habit). Uniform "
        + (
            f"guessing scores **{uniform:.1%}**."
            if uniform is not None
            else "guessing: not known (the dataset cannot be read to count each question's options)."
        ),
        "",
        "| run | " + " | ".join(letters) + " | invalid |",
        "|---|" + "---|" * (len(letters) + 1),
        "| gold | " + " | ".join(str(gold.get(x, 0)) for x in letters) + " | — |",
    ]
    figures: dict[str, Any] = {"majority_letter": letter, "majority_accuracy": count / n, "uniform_accuracy": uniform}
    figures["letters"] = {"gold": dict(gold)}
    for run in ordered:
        counts = Counter(r.get("prediction") for r in run.rows)
        figures["letters"][run.label] = {k or "invalid": v for k, v in counts.items()}
        lines.append(
            f"| {run.label} | " + " | ".join(str(counts.get(x, 0)) for x in letters) + f" | {counts.get(None, 0)} |"
        )
    return "\n".join(lines), figures


def _option_counts(run: Run) -> list[int]:
    """Each row's number of options: from the run's dataset, else from the row's letter distribution; rows
    with neither are left out (the caller then states no uniform baseline)."""
    from hcqr_dspy.errors import HCQRError

    try:
        questions = run.folder.load_questions()
    except HCQRError:
        questions = {}
    counts = []
    for r in run.rows:
        if r["qid"] in questions:
            counts.append(len(questions[r["qid"]].options))
        elif r.get("option_probs"):
            counts.append(len(r["option_probs"]))
    return counts
