"""The records a run writes per question: a run row (:func:`prediction_row`, one line of ``predictions.jsonl``)
and an answer as ``hcqr predict`` and the served model give it (:func:`answer_record`)."""

from __future__ import annotations

from typing import Any

import dspy

from hcqr_dspy.evaluation.metrics import is_correct


def prediction_row(example: dspy.Example, pred: dspy.Prediction, method: str, seconds: float) -> dict[str, Any]:
    """One run record: question id, answer, validity, correctness, retrieval, fallbacks and cost.

    ``passages`` are the passages the answer step received (after the token
    budget; a cut one carries ``shown_chars``), ``dropped_passages`` those fused
    but cut by the budget; ``fallbacks`` counts what the method did instead of
    its main path (see :func:`hcqr_dspy.evaluation.metrics.fallback_summary`);
    ``invalid_stage`` and ``invalid_cause`` say why an invalid question is invalid; ``option_probs`` is the
    answer step's letter distribution (:mod:`hcqr_dspy.programs.answer_slot_probs`; ``None`` with the reason in
    ``option_probs_absent``) and ``gold_prob`` the gold option's share of it.
    :func:`~hcqr_dspy.evaluation.answering.evaluate` adds ``evidence``
    (:func:`hcqr_dspy.evaluation.evidence.question_evidence` over the shown passages) for retrieval methods, and
    ``cached_setups``: the setups under which the replies DSPy's cache served were made
    (:meth:`hcqr_dspy.lm.reply_setup.CachedReplies.summary`; ``[]`` when none was served).
    """
    stages = dict(pred.get("stages") or {})
    row = {
        "qid": example.qid,
        "method": method,
        "prediction": pred.get("answer"),
        "gold": example.answer,
        "valid": bool(pred.get("valid")),
        "correct": is_correct(pred.get("answer"), bool(pred.get("valid")), example.answer),
        "error": pred.get("error"),
        "invalid_stage": pred.get("invalid_stage"),
        "invalid_cause": pred.get("invalid_cause"),
        "reasoning": pred.get("reasoning"),
        "hypothesis": pred.get("hypothesis"),
        "queries": pred.get("queries") or [],
        "query_sources": pred.get("query_sources"),
        "passages": pred.get("passages") or [],
        "dropped_passages": pred.get("dropped_passages") or [],
        "context_cut": pred.get("context_cut"),
        "fallbacks": dict(pred.get("fallbacks") or {}),
        "stages": stages,
        "lm_calls": sum(s.get("lm_calls", 0) for s in stages.values()),
        "cached_lm_calls": sum(s.get("cached_lm_calls", 0) for s in stages.values()),
        "prompt_tokens": sum(s.get("prompt_tokens", 0) for s in stages.values()),
        "completion_tokens": sum(s.get("completion_tokens", 0) for s in stages.values()),
        "seconds": round(seconds, 4),
        "option_probs": pred.get("option_probs"),
        "option_probs_absent": pred.get("option_probs_absent"),
        "gold_prob": gold_probability(pred.get("option_probs"), example.answer),
    }
    for key in pred.keys():  # method-specific fields (hypothetical passage, reranker, query roles ...)
        if key not in row and key not in ("answer", "valid"):
            row[key] = pred.get(key)
    return row


def gold_probability(option_probs: dict[str, float] | None, gold: str | None) -> float | None:
    """The gold option's probability in the answer step's letter distribution; ``None`` without either."""
    if not option_probs or not gold:
        return None
    return option_probs.get(gold)


def answer_record(
    qid: str,
    options: dict[str, str],
    answer: str | None,
    valid: bool,
    error: str | None,
    hypothesis: dict[str, Any] | None,
    queries: list[str] | None,
    passages: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """One answer as ``hcqr predict`` writes it and the served model returns it: ``qid``, ``answer`` (a
    letter, ``None`` when the reply was not one), ``answer_text``, ``valid``, ``error``, ``hypothesis``,
    ``queries`` and ``passages`` (id, title, fused score and the queries, ``q1``..., that found each)."""
    answer = answer if valid else None
    return {
        "qid": qid,
        "answer": answer,
        "answer_text": options.get(answer) if answer else None,
        "valid": bool(valid),
        "error": error,
        "hypothesis": hypothesis,
        "queries": list(queries or []),
        "passages": [
            {
                "id": p["id"],
                "title": p["title"],
                "score": p.get("score"),
                "found_by": [f"q{q + 1}" for q in p.get("queries") or []],
            }
            for p in passages or []
        ],
    }
