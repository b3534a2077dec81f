"""The answer step's probability of each option letter, read from the LM's token log-probabilities.

Definition: at the *answer slot* (the position where the answer step writes its letter, after the reasoning
it generated), ``p(X) = sum_t exp(lp(t)) / sum_Y sum_t exp(lp(t))`` over the question's option letters ``X``,
``Y``, where ``t`` runs over the vocabulary tokens that spell the letter (``C``, `` C``, ``"C``) and ``lp`` is
the model's raw next-token log-probability there (no repetition penalty or grammar). The gold option's
probability is ``p(gold)``. This is the option-letter scoring of multiple-choice evaluation (Hendrycks et al.
2021, "Measuring Massive Multitask Language Understanding", section 3: the option with the highest
next-token probability among ``A``-``D``; likewise lm-evaluation-harness's log-likelihood scoring) applied
after chain-of-thought: the reasoning the step generated is fed back (teacher forcing) and the letter
distribution is read in one prefill, without generating.

The answer slot follows the adapter's reply format (:func:`answer_slot_prefix`). The distribution is the
model's raw one: the generated letter can differ from its argmax, because decoding applies llama.cpp's
repetition penalty (:data:`hcqr_dspy.lm.DEFAULT_REPEAT_PENALTY`), which lowers letters already written
(an ``A`` of "A 45-year-old ..." lowers option ``A``).

Only LMs that expose their next-token distribution can be scored: the in-process llama.cpp engine
(:meth:`hcqr_dspy.lm.LlamaCppEngine.next_token_logprobs`). For any other LM the probabilities are absent
and the reason is recorded (:data:`NO_LOGPROBS`), never guessed.

A scoring is kept in DSPy's response cache (``dspy.cache``) when the LM caches its replies, keyed as they are by
the engine's model name (which holds the settings that can change a reply,
:func:`hcqr_dspy.lm.dspy_lm.engine_model_name`) and the request, here the messages and the answer slot's prefix.
A reply answered from the cache was never computed in
this process, so its scoring would otherwise prefill the whole prompt again, which on a CPU is most of a rerun's
cost (or an optimizer's that replays cached traces); with it a rerun reads the same distribution the first run
computed. A cached scoring adds no ``scoring_tokens``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import dspy
import numpy as np
from scipy.special import logsumexp

from hcqr_dspy.lm import LlamaCppEngine
from hcqr_dspy.programs.costs import add_to_stage

# Why a row has no option probabilities.
NO_LOGPROBS = "the LM gives no next-token log-probabilities (only the in-process llama.cpp engine does)"
NO_REASONING = "the answer step recorded no reasoning to score the letter after"
NOT_SCORED = "not scored: the program's score_options is off (a compile whose metric does not read them)"
# Names the scoring in its DSPy cache request, apart from the LM's own requests.
SCORING = "option letter log-probabilities at the answer slot, v1"  # a new version when the scoring changes


def scores_options(lm: Any) -> bool:
    """Whether ``lm`` can give option probabilities (module note): its engine is the in-process llama.cpp one."""
    return isinstance(getattr(lm, "engine", None), LlamaCppEngine)


def answer_slot_prefix(adapter: Any, reasoning: str) -> str:
    """The start of the answer step's reply up to where its letter is written, after ``reasoning``.

    JSONAdapter: ``{"reasoning": "<reasoning, JSON-escaped>", "answer": "`` (the one-line object the
    grammar-constrained engine writes); ChatAdapter: ``[[ ## reasoning ## ]]\\n<reasoning>\\n\\n[[ ## answer ## ]]\\n``.

    Raises:
        ValueError: another adapter (its reply format is not known here).
    """
    if isinstance(adapter, dspy.JSONAdapter):
        return json.dumps({"reasoning": reasoning}, ensure_ascii=False)[:-1] + ', "answer": "'
    if isinstance(adapter, dspy.ChatAdapter):
        return f"[[ ## reasoning ## ]]\n{reasoning}\n\n[[ ## answer ## ]]\n"
    raise ValueError(f"no answer slot known for {type(adapter).__name__}")


def option_probabilities(
    predictor: dspy.Predict,
    signature: type[dspy.Signature],
    inputs: dict[str, Any],
    letters: list[str],
    reasoning: str | None,
    demos: list[Any] | None = None,
) -> tuple[dict[str, float] | None, str | None]:
    """The answer step's letter distribution over ``letters``, teacher-forced after ``reasoning``.

    Args:
        predictor: The answer predictor (its demos are used unless ``demos`` is given).
        signature: The signature it was called with (letters restricted as at the call).
        inputs: Its inputs as given at the call (``question``, ``options`` text, ``context``, ...).
        letters: The question's option letters.
        reasoning: The reasoning the step generated (``None``: nothing to score).
        demos: Few-shot demos as shown at the call (default: the predictor's).

    Returns:
        ``({letter: probability}, None)``, probabilities rounded to 6 digits and summing to 1 over ``letters``;
        or ``(None, reason)`` when the LM cannot be scored (:data:`NO_LOGPROBS`) or there is no reasoning.
    """
    lm = predictor.lm or dspy.settings.lm
    if not scores_options(lm):
        return None, NO_LOGPROBS
    engine = lm.engine
    if not isinstance(reasoning, str):
        return None, NO_REASONING
    adapter = dspy.settings.adapter or dspy.ChatAdapter()
    shown = predictor.demos if demos is None else demos
    messages = adapter.format(signature, shown, inputs)
    prefix = answer_slot_prefix(adapter, reasoning)
    start, usage = time.perf_counter(), {"prompt_tokens": 0}
    request = {"model": lm.model, "scoring": SCORING, "messages": messages, "assistant_prefix": prefix}
    cached = getattr(lm, "cache", False)
    per_letter = dspy.cache.get(request) if cached else None
    if per_letter is None:
        logprobs = engine.next_token_logprobs(messages, prefix, usage=usage)
        ids = engine.letter_tokens()
        per_letter = {x: float(logsumexp(logprobs[ids[x]])) if ids.get(x) else float("-inf") for x in letters}
        if cached:
            dspy.cache.put(request, per_letter)
    # the prefill's cost, filed in the calling stage's record beside its LM calls (hcqr_dspy.programs.costs)
    add_to_stage(scoring_seconds=time.perf_counter() - start, scoring_tokens=usage["prompt_tokens"])
    total = logsumexp(list(per_letter.values()))
    return {x: round(float(np.exp(v - total)), 6) for x, v in per_letter.items()}, None
