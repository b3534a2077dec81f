"""Metrics over run records: accuracy, invalid-answer rate, cost per question and stage.

Accuracy counts an invalid answer (a reply that is not one of the option
letters) as wrong; invalid answers are also reported on their own and never
mapped to a default letter. Standard error of accuracy is the binomial
``sqrt(p (1 - p) / n)``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable


def accuracy_metric(example, prediction, trace=None) -> bool:
    """DSPy metric: the predicted letter equals the gold answer (invalid = wrong)."""
    return bool(getattr(prediction, "valid", False)) and prediction.answer == example.answer


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Aggregate run rows into metrics.

    Args:
        rows: Records written by :func:`hcqr_dspy.evaluate.evaluate`.

    Returns:
        ``n``, ``accuracy``, ``accuracy_se``, ``invalid_rate``, ``invalid``,
        means per question of ``lm_calls`` (served by the model),
        ``cached_lm_calls`` (served by DSPy's cache), ``prompt_tokens``,
        ``completion_tokens``, ``seconds``, and the same per stage as
        ``<stage>_<field>``; for HCQR rows also ``hypothesis_accuracy`` and
        ``answer_changed_rate`` (final answer differs from the hypothesis).
    """
    rows = list(rows)
    n = len(rows)
    if n == 0:
        return {"n": 0}
    correct = sum(bool(r["correct"]) for r in rows)
    invalid = sum(not r["valid"] for r in rows)
    acc = correct / n
    out: dict[str, float] = {
        "n": n,
        "correct": correct,
        "accuracy": acc,
        "accuracy_se": math.sqrt(acc * (1 - acc) / n),
        "invalid": invalid,
        "invalid_rate": invalid / n,
    }
    for field in ("lm_calls", "cached_lm_calls", "prompt_tokens", "completion_tokens", "seconds"):
        out[f"mean_{field}"] = sum(r.get(field) or 0 for r in rows) / n
    per_stage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        for name, st in (r.get("stages") or {}).items():
            for field, value in st.items():
                per_stage[name][field] += value or 0
    for name, fields in per_stage.items():
        for field, total in fields.items():
            out[f"{name}_mean_{field}"] = total / n
    changes = hypothesis_changes(rows)
    if changes["with_hypothesis"]:
        n_h = changes["with_hypothesis"]
        out["hypothesis_accuracy"] = changes["hypothesis_correct"] / n_h
        out["answer_changed_rate"] = (changes["fixed"] + changes["broke"] + changes["changed_wrong_to_wrong"]) / n_h
        out.update({f"hypothesis_{k}": v for k, v in changes.items() if k not in ("with_hypothesis", "hypothesis_correct")})
    return out


def hypothesis_changes(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How the final answer relates to HCQR's working hypothesis.

    Counts over rows that have a hypothesis (HCQR runs): ``hypothesis_correct``;
    ``kept_right`` / ``kept_wrong`` (answer = hypothesis); ``fixed`` (wrong
    hypothesis, right answer); ``broke`` (right hypothesis, wrong answer);
    ``changed_wrong_to_wrong``; ``invalid_answer`` (no valid final answer).
    """
    c = dict.fromkeys(
        ("with_hypothesis", "hypothesis_correct", "kept_right", "kept_wrong", "fixed", "broke",
         "changed_wrong_to_wrong", "invalid_answer"), 0)
    for r in rows:
        h = (r.get("hypothesis") or {}).get("working_hypothesis")
        if not h:
            continue
        c["with_hypothesis"] += 1
        h_right = h == r["gold"]
        c["hypothesis_correct"] += h_right
        if not r["valid"]:
            c["invalid_answer"] += 1
        elif r["prediction"] == h:
            c["kept_right" if h_right else "kept_wrong"] += 1
        elif r["correct"]:
            c["fixed"] += 1
        elif h_right:
            c["broke"] += 1
        else:
            c["changed_wrong_to_wrong"] += 1
    return c
