"""Shared machinery of every method: option formatting, the answer step,
context building under a token budget, and per-stage cost accounting.

Every program is a ``dspy.Module`` whose ``forward(question, options)``
returns a ``dspy.Prediction`` with at least:

* ``answer`` — an option letter, or ``None`` when the LM's reply could not be
  parsed into one of the question's letters (never mapped to a default);
* ``valid`` — whether ``answer`` is one of the option letters;
* ``error`` — why the question is invalid (stage and message), else ``None``;
* ``stages`` — ``{stage: {seconds, lm_calls, prompt_tokens, completion_tokens}}``;
* retrieval methods also ``queries`` and ``passages`` (id, title, fused score,
  positions of the queries that retrieved it and its rank in each).

The retriever is injected at construction and is not part of the program
state (``program.save`` stores only predictor instructions and demos), so a
saved program loads against any retriever.

Also here: the query cleaning shared by every method whose LM writes search
queries (:func:`clean_query`, :func:`dedupe`), and :func:`variant`, which
registers a method as another one with some options fixed (ablations,
``query_rewrite_options``) without copying its code.
"""

from __future__ import annotations

import inspect
import re
import time
import types
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, TypeVar

import dspy
from dspy.utils.exceptions import AdapterParseError, ContextWindowExceededError
from dspy.utils.callback import BaseCallback
from dspy.utils.usage_tracker import track_usage

from hcqr_dspy import traces
from hcqr_dspy.data import format_options
from hcqr_dspy.lm import count_tokens
from hcqr_dspy.retrieval.base import Hit, Retriever
from hcqr_dspy.retrieval.fusion import FusedPassage, fuse
from hcqr_dspy.signatures import restrict_letters

# Replies that make one question invalid but must not stop a run: unparseable
# output, a letter outside the options, a prompt too long for the model.
BAD_REPLY_ERRORS: tuple[type[BaseException], ...] = (AdapterParseError, ContextWindowExceededError)

DEFAULT_MAX_CONTEXT_TOKENS = 6000
# Tokens of DSPy's JSONAdapter template around the answer step's inputs
# (field list, instructions, output format, chat markup): 320 with the
# Qwen2.5 tokenizer for empty inputs (dspy 3.4.1), plus margin for chat
# markup and tokenizer differences.
PROMPT_OVERHEAD_TOKENS = 600
MAX_QUERY_WORDS = 32
# JSON field names and chat turns around one few-shot demo (a user and an assistant message).
DEMO_OVERHEAD_TOKENS = 60
# Context kept in a few-shot demo of the answer step: about three passages. A bootstrapped demo carries its
# question's whole fused context (15 passages, 3-4k tokens); two of them and the live context would not fit 8k.
DEMO_CONTEXT_TOKENS = 600


def trim_context(context: str, max_tokens: int, lm=None) -> str:
    """A MedRAG-format context (one ``Document [i] ...`` per line) cut to ``max_tokens``: whole documents
    from the top, or the head of the first when even it is longer. Tokens counted by
    :func:`hcqr_dspy.lm.count_tokens` for ``lm``."""
    if count_tokens(lm, context) <= max_tokens:
        return context
    kept, used = [], 0
    for line in context.split("\n"):
        n = count_tokens(lm, line)
        if used + n > max_tokens:
            break
        kept.append(line)
        used += n
    if not kept:
        first = context.split("\n")[0]
        kept = [first[: max(0, int(len(first) * max_tokens / max(1, count_tokens(lm, first))))]]
    return "\n".join(kept)


def trimmed_demos(demos: list[Any], max_tokens: int, lm=None) -> list[Any]:
    """Copies of few-shot demos whose ``context`` is cut by :func:`trim_context` (others as they are)."""
    out = []
    for demo in demos:
        context = demo.get("context") if hasattr(demo, "get") else None
        if isinstance(context, str) and count_tokens(lm, context) > max_tokens:
            demo = demo.copy() if hasattr(demo, "copy") else dict(demo)
            demo["context"] = trim_context(context, max_tokens, lm)
        out.append(demo)
    return out


def demo_text(demos: list[Any]) -> str:
    """The field values of few-shot demos joined: what they add to a prompt, for token counting."""
    values = []
    for demo in demos:
        items = demo.items() if hasattr(demo, "items") else []
        values.extend(str(v) for k, v in items if k != "augmented" and v is not None)
    return "\n".join(values)


class _LMCallCounter(BaseCallback):
    """Counts LM requests (served by the model or by DSPy's cache) within one stage."""

    def __init__(self) -> None:
        self.requests = 0

    def on_lm_start(self, call_id, instance, inputs):
        self.requests += 1


# Who is told when a stage starts and ends (``hcqr ask`` and ``hcqr demo`` print it): a callable
# ``observer(name, record)``, called with ``record=None`` when stage ``name`` starts and with its
# ``stages[name]`` record when it ends. Set with :func:`observe_stages`; per thread and context.
STAGE_OBSERVER: ContextVar[Callable[[str, dict[str, Any] | None], None] | None] = ContextVar("hcqr_stage_observer",
                                                                                             default=None)


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
def stage(stages: dict[str, dict[str, Any]], name: str, inputs: Any = None) -> Iterator[traces.SpanHandle]:
    """Record wall time, LM calls and tokens of one stage into ``stages[name]``; under an MLflow trace,
    the stage is also a span of that name (:func:`hcqr_dspy.traces.span`, with ``inputs``).

    ``lm_calls`` and the token counts come from DSPy's usage tracker, which
    sees only requests the model actually served; ``cached_lm_calls`` counts
    the requests DSPy's response cache answered (no cost, no tokens), so cost
    summaries of a partly cached run are not mistaken for cheap methods.

    Yields:
        The stage's span handle (``handle.output(value)`` sets the span's outputs when it is recorded).
    """
    observer = STAGE_OBSERVER.get()
    if observer is not None:
        observer(name, None)
    t0 = time.perf_counter()
    counter = _LMCallCounter()
    with traces.span(name, inputs=inputs) as handle, \
            dspy.context(callbacks=[*(dspy.settings.get("callbacks") or []), counter]), track_usage() as tracker:
        try:
            yield handle
        finally:
            entries = [u for lm_entries in tracker.usage_data.values() for u in lm_entries]
            stages[name] = {
                "seconds": round(time.perf_counter() - t0, 4),
                "lm_calls": len(entries),
                "cached_lm_calls": max(0, counter.requests - len(entries)),
                "prompt_tokens": sum(int(u.get("prompt_tokens") or 0) for u in entries),
                "completion_tokens": sum(int(u.get("completion_tokens") or 0) for u in entries),
            }
            if observer is not None:
                observer(name, stages[name])


# Option texts that carry no searchable content (PubMedQA/BioASQ-style answers).
CONTENT_FREE_OPTIONS = {"yes", "no", "maybe", "true", "false", "unknown", "none of the above", "all of the above"}
# Words that only join option letters ("A and B", "both A and C", "options B, D").
_LETTER_LIST_WORDS = {"and", "or", "both", "neither", "nor", "either", "option", "options", "versus", "vs", "all", "none"}


def is_content_free(text: object) -> bool:
    """Whether ``text`` holds nothing to search for: empty, a yes/no/maybe-style answer
    (:data:`CONTENT_FREE_OPTIONS`), a list of option letters (``"A; B; C"``, ``"both A and C"``), or
    any mix of those words, option letters, joiners and English stopwords (``"no Yes"``, ``"yes or
    no"``, ``"Yes, B"``, ``"None of these"``; stopwords: bm25s' STOPWORDS_EN_PLUS, as :func:`key_terms`)."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    if not isinstance(text, str):
        return True
    words = re.findall(r"[A-Za-z0-9]+", text)
    if not words:
        return True
    if " ".join(w.lower() for w in words) in CONTENT_FREE_OPTIONS:
        return True
    empty = _CONTENT_FREE_WORDS | _LETTER_LIST_WORDS | set(STOPWORDS_EN_PLUS)
    return all((len(w) == 1 and w.isalpha()) or w.lower() in empty for w in words)


_CONTENT_FREE_WORDS = {w for option in CONTENT_FREE_OPTIONS for w in option.split()}


def key_terms(text: str, max_words: int = 16) -> str:
    """The content words of ``text`` in order: lower-cased word tokens without English stopwords
    (bm25s' extended English list, STOPWORDS_EN_PLUS: 179 words) or digits-only tokens, each once, at most ``max_words``."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    stop = set(STOPWORDS_EN_PLUS)
    out: list[str] = []
    for w in re.findall(r"[A-Za-z][A-Za-z0-9'-]*", text):
        lw = w.lower().strip("'-")
        if len(lw) > 1 and lw not in stop and lw not in out:
            out.append(lw)
        if len(out) == max_words:
            break
    return " ".join(out)


def clean_query(text: object, max_words: int = MAX_QUERY_WORDS) -> str | None:
    """A usable search query, or ``None``.

    Strips quotes, list markers (``1.``, ``-``), labels like ``q1:`` or
    ``query 2:``, a leading option letter (``A. Fava beans``) and whitespace; keeps at most ``max_words`` words (the 1.5B
    model's "queries" were often 30-60-word copies of its reasoning). Unusable:
    empty text, content-free text (:func:`is_content_free`: letter lists such as
    ``"A; B; C"``, a bare "yes"/"no", "no Yes"), a template placeholder or an output
    field's name echoed back (``{support_query}``, seen with SmolLM2-135M; ``<support_query>``,
    ``support_query``: :data:`~hcqr_dspy.signatures.QUERY_FIELD_NAMES`), and a copy of one of the
    example queries the prompts show (:data:`~hcqr_dspy.signatures.PROMPT_EXAMPLE_QUERIES`), also
    one that differs only in punctuation, stopwords or word order (the same :func:`key_terms`).
    """
    from hcqr_dspy.signatures import PROMPT_EXAMPLE_QUERIES, QUERY_FIELD_NAMES

    if not isinstance(text, str) or re.fullmatch(r"\s*[{\[<][\w ]*[}\]>]\s*", text):
        return None  # missing, or a template placeholder echoed back ("{support_query}", "<support_query>")
    if _normalized(text.replace("_", " ")) in {_normalized(f.replace("_", " ")) for f in QUERY_FIELD_NAMES}:
        return None  # an output field's name echoed back bare ("support_query")
    q = re.sub(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+", "", text.strip())
    q = re.sub(r"^\s*(q\d|query(\s*\d)?|support|distinction|key[ _]features?)\s*[:\-]\s*", "", q, flags=re.I)
    q = re.sub(r"^\s*(?:\(?[A-Z][.)]|option [A-Z][.:)]?)\s+(?=\S)", "", q)  # an option letter prefix: "A. Fava beans"
    q = " ".join(q.strip().strip("\"'`").split())
    if len(re.sub(r"[^A-Za-z0-9]", "", q)) < 3 or is_content_free(q):
        return None
    if _normalized(q) in {_normalized(e) for e in PROMPT_EXAMPLE_QUERIES}:
        return None
    terms = set(key_terms(q, max_words=64).split())
    if any(terms == set(key_terms(e).split()) for e in PROMPT_EXAMPLE_QUERIES):
        return None  # the example up to punctuation, stopwords and word order ("digoxin toxicity, yellow vision and nausea")
    return " ".join(q.split()[:max_words])


def _normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def dedupe(queries: list[str | None]) -> list[str | None]:
    """Mark a query that repeats an earlier one (ignoring case) as unusable."""
    seen: set[str] = set()
    out: list[str | None] = []
    for q in queries:
        key = q.lower() if q else None
        out.append(None if key is None or key in seen else q)
        if key:
            seen.add(key)
    return out


def format_document(i: int, title: str, content: str, max_chars: int | None = None) -> str:
    """One passage as the answer step and the DUR judge see it: MedRAG's ``Document [i] (Title: t) text``.

    Args:
        i: 1-based position in the context.
        title, content: The passage.
        max_chars: Keep only the first ``max_chars`` characters of ``content`` (a passage cut by the
            context's token budget); ``None`` keeps it whole.
    """
    text = content if max_chars is None else content[:max_chars]
    return f"Document [{i}] (Title: {title}) {text}"


def passage_records(retriever: Retriever, fused: list[FusedPassage], shown_chars: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """JSON-able description of fused passages (id, title, score, provenance).

    Args:
        retriever: Resolves ids to titles.
        fused: The passages, in context order.
        shown_chars: ``{position: characters of content shown}`` for passages cut short by the
            token budget (recorded as ``shown_chars``).
    """
    records = []
    for i, f in enumerate(fused):
        record = {
            "id": f.passage_id,
            "title": retriever.get(f.passage_id).title,
            "score": round(f.score, 6),
            "queries": list(f.queries),
            "ranks": list(f.ranks),
        }
        if shown_chars and i in shown_chars:
            record["shown_chars"] = shown_chars[i]
        records.append(record)
    return records


def shown_documents(retriever: Retriever, passages: list[dict[str, Any]]) -> list[str]:
    """The documents of a run row's ``passages`` exactly as the answer step saw them
    (:func:`format_document`, a cut passage cut at its ``shown_chars``)."""
    docs = []
    for i, record in enumerate(passages, start=1):
        p = retriever.get(record["id"])
        docs.append(format_document(i, p.title, p.content, record.get("shown_chars")))
    return docs


def bad_reply(stage_name: str, exc: BaseException | None = None, message: str | None = None) -> dict[str, Any]:
    """Fields of a prediction made invalid by a bad LM reply at ``stage_name``.

    ``invalid_cause`` is ``"context_window"`` (the prompt did not fit the model's
    window), ``"unparseable"`` (DSPy could not parse the reply) or
    ``"not_an_option"`` (a parsed letter outside the question's options, given
    as ``message``).
    """
    if exc is not None:
        cause = "context_window" if isinstance(exc, ContextWindowExceededError) else "unparseable"
        message = f"{type(exc).__name__}: {exc}"
    else:
        cause = "not_an_option"
    return {"answer": None, "valid": False, "reasoning": None, "error": f"{stage_name}: {message}"[:500],
            "invalid_stage": stage_name, "invalid_cause": cause}


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
    # Context tokens a few-shot demo of the answer step keeps when it is shown (see trimmed_demos);
    # set from a compile recipe's demo_context_tokens and saved with the program.
    demo_context_tokens: int = DEMO_CONTEXT_TOKENS

    def __init__(self, retriever: Retriever | None = None, budget: int = 15, max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS):
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
        from hcqr_dspy.programs import accepted_options

        accepted = accepted_options(type(self))
        return {k: v for k, v in self.settings().items() if k in accepted}

    # -- retrieval -----------------------------------------------------
    def retrieve(self, queries: list[str], k: int, names: list[str] | None = None) -> list[list[Hit]]:
        """Search ``queries`` in one batched retriever call (``k`` hits each); under an MLflow trace, one
        ``RETRIEVER`` span per query named ``retrieve <name>`` (:func:`hcqr_dspy.traces.retriever_spans`).

        Args:
            queries: The queries.
            k: Hits per query.
            names: A label per query for the spans (default ``q1``, ``q2`` ...).
        """
        start = traces.now_ns()
        hit_lists = self.retriever.search(queries, k=k)
        traces.retriever_spans(self.retriever, queries, hit_lists, names or [f"q{i + 1}" for i in range(len(queries))],
                               k, start, traces.now_ns())
        return hit_lists

    def fuse(self, hit_lists: list[list[Hit]], budget: int, strategy: str = "score_sum",
             names: list[str] | None = None) -> list[FusedPassage]:
        """:func:`hcqr_dspy.retrieval.fusion.fuse`; under an MLflow trace, for more than one hit list, a
        ``fusion`` span with the fused passages (:func:`hcqr_dspy.traces.fusion_span`)."""
        start = traces.now_ns()
        fused = fuse(hit_lists, budget=budget, strategy=strategy)
        if len(hit_lists) > 1:
            traces.fusion_span(self.retriever, fused, names or [f"q{i + 1}" for i in range(len(hit_lists))],
                               strategy, budget, start, traces.now_ns())
        return fused

    # -- context -------------------------------------------------------
    def context_budget(self, question: str, options: dict[str, str], other_inputs: str = "") -> int:
        """Tokens the context may use: ``max_context_tokens``, and for a local
        llama.cpp model no more than its window leaves after the output
        (``max_tokens``), the question, the options, any ``other_inputs`` of
        the answer step (e.g. a hypothesis shown to it), the answer step's
        few-shot demos (a compiled program's; :func:`demo_text`) and the
        prompt template (:data:`PROMPT_OVERHEAD_TOKENS`, and as much again per demo)."""
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

    def build_context(self, passage_ids: list[str], budget: int | None = None) -> tuple[str, dict[str, int], dict[int, int]]:
        """MedRAG's context format, ``Document [i] (Title: t) text`` (:func:`format_document`), cut to the token budget.

        Whole passages are kept from the top while they fit; the passage that
        crosses the budget keeps the head of its text when more than 50 tokens
        are left, and the rest are dropped.

        Returns:
            The context string; the cut (``passages_kept``, ``passages_dropped``,
            ``tokens_before``, ``tokens_after``, ``tokens_dropped``; 0 dropped when
            nothing was cut); and ``{position: characters of content shown}`` for
            a passage cut short.
        """
        lm = dspy.settings.lm
        passages = [self.retriever.get(pid) for pid in passage_ids]
        docs = [format_document(i, p.title, p.content) for i, p in enumerate(passages, start=1)]
        limit = self.max_context_tokens if budget is None else budget
        counts = [count_tokens(lm, d) for d in docs]
        total = sum(counts)
        kept, used, partial = [], 0, {}
        for pos, (p, doc, n) in enumerate(zip(passages, docs, counts)):
            if used + n <= limit:
                kept.append(doc)
                used += n
                continue
            room = limit - used
            if room > 50:  # keep the head of the passage that crosses the budget
                chars = int(len(p.content) * room / n)
                doc = format_document(pos + 1, p.title, p.content, chars)
                while chars > 0 and count_tokens(lm, doc) > room:
                    chars = int(chars * 0.9)
                    doc = format_document(pos + 1, p.title, p.content, chars)
                kept.append(doc)
                used += count_tokens(lm, doc)
                partial[pos] = chars
            break
        cut = {
            "passages_kept": len(kept),
            "passages_dropped": len(docs) - len(kept),
            "tokens_before": total,
            "tokens_after": used,
            "tokens_dropped": max(0, total - used),
        }
        return "\n".join(kept), cut, partial

    # -- answering -----------------------------------------------------
    def answer_from_passages(
        self, question: str, options: dict[str, str], fused: list[FusedPassage], stages: dict,
        fallbacks: dict[str, int] | None = None, **shown: str,
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
        with stage(stages, "answer", inputs={"question": question, "options": options, "context": context, **shown}) as span:
            out = self.answer_step(self.answer, options, question=question, context=context, **demos, **shown)
            span.output({k: out[k] for k in ("answer", "valid", "reasoning", "error")})
        records = passage_records(self.retriever, fused, partial)
        fallbacks = dict(fallbacks or {})
        if cut["tokens_dropped"]:
            fallbacks["context_cut"] = 1
            fallbacks["passages_dropped"] = cut["passages_dropped"]
        return {**out, "stages": stages, "passages": records[: cut["passages_kept"]],
                "dropped_passages": records[cut["passages_kept"]:], "context_cut": cut, "fallbacks": fallbacks}

    def answer_demos(self) -> list[Any]:
        """The answer step's few-shot demos as shown: contexts cut to ``demo_context_tokens`` (:func:`trimmed_demos`).

        Trimming when shown, not only after compiling, matters while an
        optimizer (random search, MIPROv2) scores candidate programs whose
        bootstrapped demos still hold whole contexts.
        """
        demos = getattr(getattr(self, "answer", None), "demos", None) or []
        return trimmed_demos(demos, self.demo_context_tokens, dspy.settings.lm) if demos else []

    def answer_step(self, predictor: dspy.Predict, options: dict[str, str], **inputs: Any) -> dict[str, Any]:
        """Run an answer predictor with its letter field narrowed to the options.

        Returns:
            ``{"answer", "valid", "reasoning", "error", "invalid_stage", "invalid_cause"}``;
            a reply that cannot be parsed into one of the letters gives
            ``answer=None``, ``valid=False`` and the cause (:func:`bad_reply`).
        """
        letters = list(options)
        try:
            pred = predictor(
                options=format_options(options),
                signature=restrict_letters(predictor.signature, "answer", letters),
                **inputs,
            )
        except BAD_REPLY_ERRORS as exc:
            return bad_reply("answer", exc)
        answer = str(pred.answer).strip().upper() if pred.answer is not None else None
        if answer not in letters:
            return {**bad_reply("answer", message=f"{pred.answer!r} is not one of {letters}"), "reasoning": pred.reasoning}
        return {"answer": answer, "valid": True, "reasoning": pred.reasoning, "error": None,
                "invalid_stage": None, "invalid_cause": None}


P = TypeVar("P", bound=MCQProgram)


def variant(base: type[P], name: str, method: str, doc: str, **fixed: Any) -> type[P]:
    """A registered method that is ``base`` with some constructor options fixed.

    Ablations and controls are options of one class, not copies of it; this
    gives such a configuration its own registry name (recorded as ``method``
    in ``settings()`` and the run records). The class is placed in ``base``'s
    module: assign it there to a module-level ``name`` so it pickles.

    Args:
        base: The program class.
        name: Class name of the variant (``"HCQRNoSupport"``).
        method: Its registry name (``"hcqr_no_support"``).
        doc: Its docstring.
        **fixed: The options it fixes; passing one of them with another
            value raises ``ValueError`` (passing the same value is allowed).

    Example:
        >>> HCQRNoSupport = variant(HCQR, "HCQRNoSupport", "hcqr_no_support", "...",
        ...                         roles=("distinction", "key_features"))
        >>> HCQRNoSupport(retriever).settings()["roles"]
        ['distinction', 'key_features']
    """

    def __init__(self, retriever=None, **options: Any) -> None:
        for key, value in fixed.items():
            if key in options and _as_tuple(options[key]) != _as_tuple(value):
                raise ValueError(f"method {method!r} fixes {key}={value!r}; use {base.method!r} to choose {key}")
            options[key] = value
        base.__init__(self, retriever, **options)

    # Introspection (e.g. checking an experiment's method_options) sees base's options minus the fixed ones.
    sig = inspect.signature(base.__init__)
    __init__.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in fixed])

    def body(ns: dict[str, Any]) -> None:
        ns.update(__init__=__init__, __doc__=doc, __module__=base.__module__, method=method, fixed_options=dict(fixed))

    return types.new_class(name, (base,), exec_body=body)


def _as_tuple(value: Any) -> Any:
    """Lists and tuples compare equal by content (settings() records tuples as lists)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value
