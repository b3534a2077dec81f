"""The metrics a recipe names: ``accuracy``, ``grounded``, and for GEPA ``feedback`` (the same score plus a textual
diagnosis) and ``feedback_gold_prob`` (``grounded`` and ``feedback_gold_prob``: :mod:`hcqr_dspy.optimize.objectives`).

:func:`diagnose` says what went wrong in a prediction (an invalid answer, a wrong hypothesis with or without
evidence for the correct option in the context, a right hypothesis the answer flipped away from);
:func:`make_metric` builds the DSPy metric of a recipe from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dspy

from hcqr_dspy.errors import RecipeError
from hcqr_dspy.evaluation.evidence import mentions
from hcqr_dspy.evaluation.metrics import accuracy_metric
from hcqr_dspy.optimize.objectives import gold_prob_feedback_metric, grounded_metric, shown_texts

METRICS = ("accuracy", "grounded", "feedback", "feedback_gold_prob")
# Metrics that read the answer step's letter distribution (option_probs); the others compile without scoring it.
PROBABILITY_METRICS = ("feedback_gold_prob",)


def diagnose(example: dspy.Example, pred: Any, passages: list[str] | None = None) -> tuple[float, str, str]:
    """Score (1 correct, 0 otherwise) and what went wrong in a prediction.

    Args:
        example: The question with its gold ``answer`` and ``options``.
        pred: The program's prediction (``answer``, ``valid``, ``error``, and
            for HCQR ``hypothesis``).
        passages: Texts of the passages the answer step saw, to tell whether
            the correct option was named in the context.

    Returns:
        ``(score, case, feedback)``; ``case`` is one of ``correct``,
        ``invalid_answer``, ``wrong_hypothesis_no_evidence``,
        ``wrong_hypothesis_evidence_ignored``, ``right_hypothesis_flipped``,
        ``wrong_hypothesis_corrected`` (correct, listed apart), ``wrong``.
    """
    gold = example.answer
    gold_text = example.options.get(gold, "")
    letters = ", ".join(example.options)
    h = pred.get("hypothesis") if hasattr(pred, "get") else None
    y0 = (h or {}).get("working_hypothesis")
    if not getattr(pred, "valid", False):
        error = getattr(pred, "error", None) or "no letter"
        return (
            0.0,
            "invalid_answer",
            (
                f"Invalid answer format: the reply was not one of the option letters ({letters}) [{str(error)[:200]}]. "
                "The answer must be exactly one option letter."
            ),
        )
    answer = pred.answer
    if answer == gold:
        if y0 and y0 != gold:
            return (
                1.0,
                "wrong_hypothesis_corrected",
                (
                    f"Correct ({gold}. {gold_text}), although the working hypothesis was {y0} "
                    f"({example.options.get(y0, '?')}); the retrieved evidence corrected it."
                ),
            )
        return 1.0, "correct", f"Correct: {gold}. {gold_text}."
    chosen = f"{answer} ({example.options.get(answer, '?')})"
    if y0 is None:
        return 0.0, "wrong", f"Wrong: answered {chosen}; the correct answer is {gold}. {gold_text}."
    if y0 == gold:
        return (
            0.0,
            "right_hypothesis_flipped",
            (
                f"The working hypothesis {gold} ({gold_text}) was right, but the final answer flipped away to "
                f"{chosen}. The answer step should keep the option that the question's findings and the context "
                "support."
            ),
        )
    evidence = mentions(gold_text, passages or [])
    if not evidence:
        return (
            0.0,
            "wrong_hypothesis_no_evidence",
            (
                f"Wrong hypothesis {y0} ({example.options.get(y0, '?')}); the correct answer is {gold} "
                f"({gold_text}), and no retrieved passage names it: the context did not contain distinguishing "
                "evidence. The hypothesis should weigh the findings that separate the options, and the distinction "
                "query should contrast "
                f"{y0} with the alternatives by the features that tell them apart."
            ),
        )
    return (
        0.0,
        "wrong_hypothesis_evidence_ignored",
        (
            f"Wrong hypothesis {y0} ({example.options.get(y0, '?')}); the context did name the correct answer "
            f"{gold} ({gold_text}) but the final answer was {chosen}. The answer step should weigh the passages "
            "over the first guess."
        ),
    )


# Which diagnoses concern which HCQR predictor (GEPA asks per predictor via pred_name).
_BLAME = {
    "hypothesis": {"wrong_hypothesis_no_evidence", "wrong_hypothesis_evidence_ignored", "wrong_hypothesis_corrected"},
    "rewrite": {"wrong_hypothesis_no_evidence"},
    "answer": {"invalid_answer", "right_hypothesis_flipped", "wrong_hypothesis_evidence_ignored", "wrong"},
}


def make_metric(kind: str, retriever=None) -> Callable:
    """The DSPy metric named by a recipe.

    Args:
        kind: ``accuracy`` -> ``metric(example, pred, trace=None) -> bool``
            (:func:`hcqr_dspy.evaluation.metrics.accuracy_metric`); ``grounded`` -> the same signature
            (:func:`hcqr_dspy.optimize.objectives.grounded_metric`); ``feedback_gold_prob`` ->
            :func:`hcqr_dspy.optimize.objectives.gold_prob_feedback_metric`; ``feedback`` -> GEPA's
            ``metric(gold, pred, trace, pred_name, pred_trace) ->
            dspy.Prediction(score, feedback)`` built on :func:`diagnose`.
        retriever: The retriever the passages the answer step saw are read from.

    Raises:
        RecipeError: an unknown kind.
    """
    if kind == "accuracy":
        return accuracy_metric
    if kind == "grounded":
        return grounded_metric(retriever)
    if kind == "feedback_gold_prob":
        return gold_prob_feedback_metric(retriever, diagnose)
    if kind != "feedback":
        raise RecipeError(f"unknown metric {kind!r}; valid metrics: {', '.join(METRICS)}")

    def feedback_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score, case, text = diagnose(gold, pred, shown_texts(retriever, pred))
        if pred_name in _BLAME and case not in ("correct",) and case not in _BLAME[pred_name]:
            text += f" (This outcome is not mainly due to the {pred_name} step.)"
        return dspy.Prediction(score=score, feedback=text)

    return feedback_metric
