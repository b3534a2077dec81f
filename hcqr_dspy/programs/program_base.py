"""The base of every method: the answer step, context building under a token budget, and stages.

Every program is a ``dspy.Module`` whose ``forward(question, options)``
returns a ``dspy.Prediction`` with at least:

* ``answer`` — an option letter, or ``None`` when the LM's reply could not be
  parsed into one of the question's letters (never mapped to a default);
* ``valid`` — whether ``answer`` is one of the option letters;
* ``error`` — why the question is invalid (stage and message), else ``None``;
* ``stages`` — ``{stage: {seconds, lm_calls, cached_lm_calls, prompt_tokens, completion_tokens}}``;
* retrieval methods also ``queries`` and ``passages`` (id, title, fused score,
  positions of the queries that retrieved it and its rank in each).

The retriever is injected at construction and is not part of the program
state (``program.save`` stores only predictor instructions and demos), so a
saved program loads against any retriever.

Here: :class:`MCQProgram` (retrieval, context under the token budget, the answer step),
:func:`stage` (a stage's costs, told to the installed :class:`~hcqr_dspy.observers.Observer`;
:func:`observe_stages` to watch stages) and
:func:`accepted_options`. The rest of the shared machinery has a module each: LM cost accounting
(:mod:`~hcqr_dspy.programs.costs`), the context and its token budget (:mod:`~hcqr_dspy.programs.context`),
query cleaning (:mod:`~hcqr_dspy.programs.queries`), bad replies (:mod:`~hcqr_dspy.programs.invalid_replies`) and
registered variants of a method (:mod:`~hcqr_dspy.programs.variants`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import dspy

from hcqr_dspy import observers
from hcqr_dspy.data import format_options
from hcqr_dspy.lm import count_tokens
from hcqr_dspy.programs.answer_slot_probs import NOT_SCORED, option_probabilities
from hcqr_dspy.programs.context import (
    DEFAULT_MAX_CONTEXT_TOKENS,
    DEMO_CONTEXT_TOKENS,
    DEMO_OVERHEAD_TOKENS,
    PROMPT_OVERHEAD_TOKENS,
    demo_text,
    fit_documents,
    passage_records,
    shown_documents,
    trimmed_demos,
)
from hcqr_dspy.programs.costs import lm_costs
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS, bad_reply
from hcqr_dspy.programs.signatures import restrict_letters
from hcqr_dspy.retrieval.fusion import FusedPassage, fuse
from hcqr_dspy.retrieval.retriever_base import Hit, Retriever

# Who is told when a stage starts and ends (``hcqr ask`` and ``hcqr demo`` print it): a callable
# ``observer(name, record)``, called with ``record=None`` when stage ``name`` starts and with its
# ``stages[name]`` record when it ends. Set with :func:`observe_stages`; per thread and context.
STAGE_OBSERVER: ContextVar[Callable[[str, dict[str, Any] | None], None] | None] = ContextVar(
    "hcqr_stage_observer", default=None
)


@contextmanager
def observe_stages(observer: Callable[[str, dict[str, Any] | None], None]) -> Iterator[None]:
    """Call ``observer(name, None)`` when a program's stage starts and ``observer(name, record)`` when it
    ends (its seconds, LM calls and tokens), for the programs run inside the block."""
    token = STAGE_OBSERVER.set(observer)
    try:
        yield
    finally:
        STAGE_OBSERVER.reset(token)


@contextmanager
def stage(stages: dict[str, dict[str, Any]], name: str, inputs: Any = None) -> Iterator[observers.StageRecord]:
    """Record wall time, LM calls and tokens of one stage into ``stages[name]``
    (:func:`~hcqr_dspy.programs.costs.lm_costs`), and tell the installed observer
    (:func:`hcqr_dspy.observers.installed`: :meth:`~hcqr_dspy.observers.Observer.stage`, with ``inputs``); under a
    question's MLflow trace the stage is a span of that name.

    ``lm_calls`` and the token counts come from DSPy's usage tracker, which
    sees only requests the model actually served; ``cached_lm_calls`` counts
    the requests DSPy's response cache answered (no cost, no tokens), so cost
    summaries of a partly cached run are not mistaken for cheap methods.

    Yields:
        The observer's record of the stage (``record.output(value)`` records the stage's outputs: its span's).
    """
    observer = STAGE_OBSERVER.get()
    if observer is not None:
        observer(name, None)
    t0 = time.perf_counter()
    record: dict[str, Any] = {}
    with observers.installed().stage(name, inputs) as handle:
        try:
            with lm_costs(record, t0):
                yield handle
        finally:
            if record:
                stages[name] = record
                if observer is not None:
                    observer(name, record)


class MCQProgram(dspy.Module):
    """Base of every method: holds the answer step and the context budget.

    Args:
        retriever: Shared retriever (``None`` for methods without retrieval).
        budget: Maximum passages shown to the answer step (15 in HCQR).
        max_context_tokens: Token budget of the context; passages are
            dropped from the end (and the last one cut) to fit, and the cut
            is recorded in ``context_cut``.
    """

    method: str = "base"
    uses_retrieval: bool = True
    # A bound, not a method: forward() takes the gold answer (``gold=``); evaluations pass it, and
    # predict, serving and compiling refuse the method (:mod:`hcqr_dspy.programs.bounds`).
    uses_answer: bool = False
    # Context tokens a few-shot demo of the answer step keeps when it is shown (see trimmed_demos);
    # set from a compile recipe's demo_context_tokens and saved with the program.
    demo_context_tokens: int = DEMO_CONTEXT_TOKENS
    # Whether the answer step scores its letter distribution (``option_probs``); a compile whose metric does not
    # read it turns it off while candidates are scored (hcqr_dspy.optimize.recipe_compile), sparing a prefill per call.
    score_options: bool = True

    def __init__(
        self, retriever: Retriever | None = None, budget: int = 15, max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    ):
        super().__init__()
        if self.uses_retrieval and retriever is None:
            raise ValueError(f"method {self.method!r} needs a retriever")
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.retriever = retriever
        self.budget = budget
        self.max_context_tokens = max_context_tokens

    def settings(self) -> dict[str, Any]:
        """Configuration recorded with each run (not the learned state)."""
        return {"method": self.method, "budget": self.budget, "max_context_tokens": self.max_context_tokens}

    def options(self) -> dict[str, Any]:
        """Constructor options that rebuild this program (``make_program(method, retriever, **options)``):
        the :meth:`settings` that are constructor arguments. Saved programs store these."""
        accepted = accepted_options(type(self))
        return {k: v for k, v in self.settings().items() if k in accepted}

    # -- retrieval -----------------------------------------------------
    def retrieve(self, queries: list[str], k: int, names: list[str] | None = None) -> list[list[Hit]]:
        """Search ``queries`` in one batched retriever call (``k`` hits each) and tell the installed observer
        (:meth:`hcqr_dspy.observers.Observer.retrieved`); under an MLflow trace, one ``RETRIEVER`` span per query
        named ``retrieve <name>``.

        Args:
            queries: The queries.
            k: Hits per query.
            names: A label per query for the spans (default ``q1``, ``q2`` ...).
        """
        start = time.time_ns()
        hit_lists = self.retriever.search(queries, k=k)
        names = names or [f"q{i + 1}" for i in range(len(queries))]
        observers.installed().retrieved(self.retriever, queries, hit_lists, names, k, start, time.time_ns())
        return hit_lists

    def fuse(
        self, hit_lists: list[list[Hit]], budget: int, strategy: str = "score_sum", names: list[str] | None = None
    ) -> list[FusedPassage]:
        """:func:`hcqr_dspy.retrieval.fusion.fuse`; for more than one hit list the installed observer is told
        (:meth:`hcqr_dspy.observers.Observer.fused`): under an MLflow trace, a ``fusion`` span with the fused
        passages."""
        start = time.time_ns()
        fused = fuse(hit_lists, budget=budget, strategy=strategy)
        if len(hit_lists) > 1:
            observers.installed().fused(
                self.retriever,
                fused,
                names or [f"q{i + 1}" for i in range(len(hit_lists))],
                strategy,
                budget,
                start,
                time.time_ns(),
            )
        return fused

    # -- context -------------------------------------------------------
    def context_budget(self, question: str, options: dict[str, str], other_inputs: str = "") -> int:
        """Tokens the context may use: ``max_context_tokens``, and for a local
        llama.cpp model no more than its window leaves after the output
        (``max_tokens``), the question, the options, any ``other_inputs`` of
        the answer step (e.g. a hypothesis shown to it), the answer step's
        few-shot demos (a compiled program's; :func:`~hcqr_dspy.programs.context.demo_text`) and the
        prompt template (:data:`~hcqr_dspy.programs.context.PROMPT_OVERHEAD_TOKENS`, and
        :data:`~hcqr_dspy.programs.context.DEMO_OVERHEAD_TOKENS` per demo)."""
        lm = dspy.settings.lm
        budget = self.max_context_tokens
        engine = getattr(lm, "engine", None)
        n_ctx = getattr(engine, "n_ctx", None)
        if isinstance(n_ctx, int):
            max_tokens = int((getattr(lm, "kwargs", {}) or {}).get("max_tokens") or 1024)
            demos = self.answer_demos()
            parts = [question, format_options(options), other_inputs, demo_text(demos)]
            rest = count_tokens(lm, "\n".join(filter(None, parts))) + DEMO_OVERHEAD_TOKENS * len(demos)
            budget = min(budget, n_ctx - max_tokens - rest - PROMPT_OVERHEAD_TOKENS)
        return max(0, budget)

    def build_context(
        self, passage_ids: list[str], budget: int | None = None
    ) -> tuple[str, dict[str, int], dict[int, int]]:
        """MedRAG's context format, ``Document [i] (Title: t) text``, cut to the token budget
        (:func:`~hcqr_dspy.programs.context.fit_documents`, which says how a passage is cut and what is
        returned; ``budget`` default: ``max_context_tokens``)."""
        passages = [self.retriever.get(pid) for pid in passage_ids]
        return fit_documents(passages, self.max_context_tokens if budget is None else budget, dspy.settings.lm)

    # -- answering -----------------------------------------------------
    def answer_from_passages(
        self,
        question: str,
        options: dict[str, str],
        fused: list[FusedPassage],
        stages: dict,
        fallbacks: dict[str, int] | None = None,
        **shown: str,
    ) -> dict[str, Any]:
        """The answer step over fused passages: context under the token budget, answer, passage records.

        Args:
            question, options: The question.
            fused: Passages in context order (at most ``budget``).
            stages: The prediction's stage record (``answer`` is added).
            fallbacks: The method's fallback counts so far (``context_cut`` and
                ``passages_dropped`` are added when the token budget cut the context).
            **shown: Extra inputs of the answer predictor (e.g. a hypothesis
                for the anchoring ablation); counted against the context budget.

        Returns:
            ``answer, valid, reasoning, error, invalid_stage, invalid_cause, stages,
            passages`` (what the answer step received), ``dropped_passages`` (fused
            but cut by the budget), ``context_cut`` and ``fallbacks``, for the
            method's ``dspy.Prediction``.
        """
        budget = self.context_budget(question, options, "\n".join(shown.values()))
        context, cut, partial = self.build_context([f.passage_id for f in fused], budget)
        demos = {"demos": self.answer_demos()} if self.answer.demos else {}
        inputs = {"question": question, "options": options, "context": context, **shown}
        with stage(stages, "answer", inputs=inputs) as span:
            out = self.answer_step(self.answer, options, question=question, context=context, **demos, **shown)
            span.output({k: out[k] for k in ("answer", "valid", "reasoning", "error")})
        records = passage_records(self.retriever, fused, partial)
        fallbacks = dict(fallbacks or {})
        if cut["tokens_dropped"]:
            fallbacks["context_cut"] = 1
            fallbacks["passages_dropped"] = cut["passages_dropped"]
        return {
            **out,
            "stages": stages,
            "passages": records[: cut["passages_kept"]],
            "dropped_passages": records[cut["passages_kept"] :],
            "context_cut": cut,
            "fallbacks": fallbacks,
        }

    def answer_inputs(self, row: dict[str, Any], question: str, options: dict[str, str]) -> dict[str, Any]:
        """The answer step's inputs (besides ``options``) as a run row's question received them: the context
        rebuilt from the row's shown passages (:func:`~hcqr_dspy.programs.context.shown_documents`) and the
        demos as shown. Methods that show more (a hypothesis) or no context override it."""
        context = "\n".join(shown_documents(self.retriever, row.get("passages") or []))
        demos = {"demos": self.answer_demos()} if self.answer.demos else {}
        return {"question": question, "context": context, **demos}

    def answer_demos(self) -> list[Any]:
        """The answer step's few-shot demos as shown: contexts cut to ``demo_context_tokens``
        (:func:`~hcqr_dspy.programs.context.trimmed_demos`).

        Trimming when shown, not only after compiling, matters while an
        optimizer (random search, MIPROv2) scores candidate programs whose
        bootstrapped demos still hold whole contexts.
        """
        demos = getattr(getattr(self, "answer", None), "demos", None) or []
        return trimmed_demos(demos, self.demo_context_tokens, dspy.settings.lm) if demos else []

    def answer_step(self, predictor: dspy.Predict, options: dict[str, str], **inputs: Any) -> dict[str, Any]:
        """Run an answer predictor with its letter field narrowed to the options.

        Returns:
            ``{"answer", "valid", "reasoning", "error", "invalid_stage", "invalid_cause", "option_probs",
            "option_probs_absent"}``; a reply that cannot be parsed into one of the letters gives
            ``answer=None``, ``valid=False`` and the cause (:func:`~hcqr_dspy.programs.invalid_replies.bad_reply`).
            ``option_probs`` is the step's letter distribution after the reasoning it generated
            (:func:`~hcqr_dspy.programs.answer_slot_probs.option_probabilities`), ``None`` with the reason in
            ``option_probs_absent`` where the LM cannot be scored.
        """
        letters = list(options)
        signature = restrict_letters(predictor.signature, "answer", letters)
        try:
            pred = predictor(signature=signature, options=format_options(options), **inputs)
        except BAD_REPLY_ERRORS as exc:
            _, absent = self.option_probabilities(predictor, options, None, **inputs)  # why there is none
            return {**bad_reply("answer", exc), "option_probs": None, "option_probs_absent": absent}
        probs, absent = self.option_probabilities(predictor, options, pred.reasoning, **inputs)
        scored = {"option_probs": probs, "option_probs_absent": absent}
        answer = str(pred.answer).strip().upper() if pred.answer is not None else None
        if answer not in letters:
            return {
                **bad_reply("answer", message=f"{pred.answer!r} is not one of {letters}"),
                "reasoning": pred.reasoning,
                **scored,
            }
        return {
            "answer": answer,
            "valid": True,
            "reasoning": pred.reasoning,
            "error": None,
            "invalid_stage": None,
            "invalid_cause": None,
            **scored,
        }

    def option_probabilities(
        self, predictor: dspy.Predict, options: dict[str, str], reasoning: str | None, **inputs: Any
    ) -> tuple[dict[str, float] | None, str | None]:
        """The answer step's letter distribution after ``reasoning``, for the inputs it was called with
        (:func:`~hcqr_dspy.programs.answer_slot_probs.option_probabilities`); ``(None, reason)`` where it cannot be had
        or is not asked for (``score_options`` off)."""
        if not self.score_options:
            return None, NOT_SCORED
        letters = list(options)
        call = {"options": format_options(options), **inputs}
        demos = call.pop("demos", None)
        signature = restrict_letters(predictor.signature, "answer", letters)
        return option_probabilities(predictor, signature, call, letters, reasoning, demos)


def accepted_options(program_cls: type[MCQProgram]) -> set[str]:
    """Keyword options a program's constructor chain accepts (besides the retriever).

    Read with ``inspect.signature`` from the class's ``__init__`` (a
    :func:`~hcqr_dspy.programs.variants.variant` reports its base's options minus
    the fixed ones) and :class:`MCQProgram`'s.
    """
    names: set[str] = set()
    for fn in (program_cls.__init__, MCQProgram.__init__):
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self", "retriever"):
                names.add(p.name)
    return names
