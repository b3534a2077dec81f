"""Metrics that teach the answer step to use its context: ``grounded`` and GEPA's ``feedback_gold_prob``.

``grounded`` (any optimizer but GEPA, whose metric must give feedback): a prediction passes when its answer is
right, a passage the answer step was shown names the gold option, and the answer step's reasoning names it too (each
"names" is :func:`hcqr_dspy.evaluation.evidence.mentions`: every stemmed content word of the option in one text).
With BootstrapFewShot, whose demos are the training traces that pass the metric
(``dspy.teleprompt.BootstrapFewShot``), every bootstrapped demo then shows a context that decides its question and
an answer that draws on it, not a right guess beside an unhelpful context. In the committed MMLU-Med study's HCQR
rows 12 of 100 questions met it (40 right, 16 of them with the gold option named in the context).

``feedback_gold_prob`` (GEPA): two objectives in one score, since GEPA's metric returns one number per example
(``dspy.teleprompt.GEPA``: ``score`` and ``feedback``): the mean of right/wrong and the answer step's probability
of the gold option (:mod:`hcqr_dspy.programs.answer_slot_probs`), so a candidate that makes the reader surer of the
right option gains even where the letter does not change. The feedback is :func:`hcqr_dspy.optimize.feedback
.diagnose`'s with the gold probability added. An LM that gives no option probabilities cannot be scored this way:
the compile is refused before any call (:func:`hcqr_dspy.programs.answer_slot_probs.scores_options`), and a valid
answer scored without them stops it, never scored on the letter alone in their place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dspy

from hcqr_dspy.errors import RecipeError
from hcqr_dspy.evaluation.evidence import mentions
from hcqr_dspy.evaluation.rows import gold_probability


def shown_texts(retriever: Any, pred: Any) -> list[str]:
    """Texts of the passages the answer step was shown (``pred.passages``, resolved with ``retriever``)."""
    if retriever is None:
        return []
    return [retriever.get(p["id"]).text for p in (pred.get("passages") or [])]


def is_grounded(example: dspy.Example, pred: Any, passages: list[str]) -> bool:
    """Right answer, the gold option named in one of ``passages`` and in the answer step's reasoning."""
    if not getattr(pred, "valid", False) or pred.answer != example.answer:
        return False
    gold = example.options[example.answer]
    return mentions(gold, passages) and mentions(gold, [pred.get("reasoning") or ""])


def grounded_metric(retriever: Any) -> Callable:
    """``metric(example, pred, trace=None) -> bool``: :func:`is_grounded` (module note).

    Raises:
        RecipeError: at the first call, a program without a retriever (no context to ground in).
    """

    def grounded(example, pred, trace=None):
        if retriever is None:
            raise RecipeError("metric 'grounded' needs a retrieval method: this program shows no context")
        return is_grounded(example, pred, shown_texts(retriever, pred))

    return grounded


def gold_prob_feedback_metric(retriever: Any, diagnose: Callable) -> Callable:
    """GEPA's ``metric(gold, pred, trace, pred_name, pred_trace) -> dspy.Prediction(score, feedback)`` with
    ``score = (correct + p_gold) / 2`` (module note); ``diagnose`` words the feedback.

    The metric keeps each such refusal in its ``refusals`` list as well as raising it, since GEPA catches a
    metric's exception and scores it as a failure: :func:`hcqr_dspy.optimize.recipe_compile.compile_program` raises the
    first one after the compile.

    Raises:
        RecipeError: a valid answer without option probabilities (the LM gives no log-probabilities; the reason
            the row records is named).
    """

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score, _, text = diagnose(gold, pred, shown_texts(retriever, pred))
        if not getattr(pred, "valid", False):
            return dspy.Prediction(score=0.0, feedback=text)
        p_gold = gold_probability(pred.get("option_probs"), gold.answer)
        if p_gold is None:
            error = RecipeError(
                "metric 'feedback_gold_prob' needs the answer step's option probabilities, which this LM does not "
                f"give ({pred.get('option_probs_absent') or 'no reason recorded'}); use metric 'feedback'"
            )
            metric.refusals.append(error)  # GEPA scores a metric's exception as a failure and goes on
            raise error
        text += f" The answer step gave the correct option a probability of {p_gold:.2f}."
        return dspy.Prediction(score=(score + p_gold) / 2, feedback=text)

    metric.refusals = []
    return metric
