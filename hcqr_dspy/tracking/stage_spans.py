"""The spans a program's run records inside a question's MLflow trace: one per stage, one ``RETRIEVER`` span per
query of a batched search, one ``fusion`` span per fusion (:mod:`hcqr_dspy.tracking.question_traces` opens the
trace, says what a trace holds and which level keeps what).

:class:`StageSpans` is the :class:`hcqr_dspy.observers.Observer` that records them; a question's trace installs it
for its block, so the stages of the program it runs (:func:`hcqr_dspy.programs.program_base.stage`) become its spans.
Nothing here records anything unless a trace is active (MLflow imported and a span open in this thread): an
untracked run never imports MLflow through this module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from hcqr_dspy.observers import NoObserver

# Characters of a passage's text kept in a span's documents (the UI shows them; the store keeps every span).
DOCUMENT_CHARS = 2000
LIGHT_TEXT_CHARS = 200
"""Characters a ``light`` trace keeps of each text in a stage span's inputs and outputs."""
LINKED_PROMPTS = "mlflow.linkedPrompts"
"""MLflow's trace tag and span attribute of the prompt versions used: JSON ``[{"name", "version"}]``."""
_LIGHT: ContextVar[bool] = ContextVar("hcqr_light_trace", default=False)  # set by recorded() for its block
# {stage: PromptVersion} of the question being traced (recorded()'s ``prompts``): span() marks those stages' spans
_PROMPTS: ContextVar[dict[str, Any]] = ContextVar("hcqr_stage_prompts", default={})  # noqa: B039 (never mutated)


@contextmanager
def recorded(level: str, prompts: dict[str, Any] | None) -> Iterator[None]:
    """Inside the block, spans keep what a trace of ``level`` keeps (``light``: :func:`kept`, no passage text) and a
    span named after a stage of ``prompts`` (``{stage: PromptVersion}``) names its prompt version (:func:`span`)."""
    token, marked = _LIGHT.set(level == "light"), _PROMPTS.set(dict(prompts or {}))
    try:
        yield
    finally:
        _LIGHT.reset(token)
        _PROMPTS.reset(marked)


def kept(value: Any) -> Any:
    """``value`` as a span records it: in a ``light`` trace every string over :data:`LIGHT_TEXT_CHARS` characters
    (in dicts, lists and tuples too) is cut there and says how long it was; in a ``full`` trace, ``value``."""
    if not _LIGHT.get():
        return value
    if isinstance(value, str) and len(value) > LIGHT_TEXT_CHARS:
        return f"{value[:LIGHT_TEXT_CHARS]} ... ({len(value)} characters)"
    if isinstance(value, dict):
        return {k: kept(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [kept(v) for v in value]
    return value


def active() -> bool:
    """Whether a trace is being recorded in this thread (MLflow imported and a span open)."""
    mlflow = sys.modules.get("mlflow")
    return mlflow is not None and mlflow.get_current_active_span() is not None


class SpanHandle:
    """What a ``with`` block gets from :func:`span`: set the span's outputs when there is a span."""

    def __init__(self, span: Any = None):
        self.span = span

    def output(self, value: Any) -> None:
        if self.span is not None:
            self.span.set_outputs(kept(value))

    @property
    def trace_id(self) -> str | None:
        return self.span.trace_id if self.span is not None else None


@contextmanager
def span(
    name: str, span_type: str = "CHAIN", inputs: Any = None, attributes: dict[str, Any] | None = None
) -> Iterator[SpanHandle]:
    """A child span of the active one, or nothing when no trace is active.

    A span named after a stage of the traced question's ``prompts`` (:func:`recorded`) also gets the attributes
    ``prompt`` (``prompts:/NAME/VERSION``) and ``mlflow.linkedPrompts`` (:data:`LINKED_PROMPTS`).

    Args:
        name: Span name (``hypothesis``, ``answer`` ...).
        span_type: An :class:`mlflow.entities.SpanType` value.
        inputs: The span's inputs (texts cut in a ``light`` trace: :func:`kept`).
        attributes: Span attributes.

    Yields:
        A :class:`SpanHandle` (its ``span`` is ``None`` when nothing is recorded).
    """
    if not active():
        yield SpanHandle()
        return
    import mlflow

    version = _PROMPTS.get().get(name)
    if version is not None:
        attributes = {
            **(attributes or {}),
            "prompt": f"prompts:/{version.name}/{version.version}",
            LINKED_PROMPTS: linked_prompts([version]),
        }
    with mlflow.start_span(name=name, span_type=span_type, attributes=attributes) as s:
        if inputs is not None:
            s.set_inputs(kept(inputs))
        yield SpanHandle(s)


def document(passage: Any, score: float | None, **metadata: Any) -> dict[str, Any]:
    """One passage in MLflow's retriever-span document format
    (:meth:`mlflow.entities.Document.to_dict`: ``page_content``, ``metadata``, ``id``).

    ``metadata`` holds ``doc_uri`` (the passage id, which the MLflow UI shows as the document's
    name), ``title``, ``score`` and what the caller adds (``rank``, ``found_by`` ...). The text is cut to
    :data:`DOCUMENT_CHARS` characters; a ``light`` trace keeps none.
    """
    from mlflow.entities import Document

    text = passage.content if len(passage.content) <= DOCUMENT_CHARS else passage.content[:DOCUMENT_CHARS] + " ..."
    if _LIGHT.get():
        text = ""
    meta = {
        "doc_uri": passage.id,
        "title": passage.title,
        **({"score": round(float(score), 6)} if score is not None else {}),
        **metadata,
    }
    return Document(page_content=text, metadata=meta, id=passage.id).to_dict()


def retriever_spans(
    retriever: Any,
    queries: Sequence[str],
    hit_lists: Sequence[Sequence[Any]],
    names: Sequence[str],
    k: int,
    start_ns: int,
    end_ns: int,
) -> None:
    """Record one ``RETRIEVER`` span per query of one batched search under the active span.

    The queries were searched in one call, so each span carries that call's start and end time; the i-th
    span starts i nanoseconds later, because a store orders spans by start time and equal starts come back in
    any order (the UI and readers then see the queries in search order).

    Args:
        retriever: Resolves hit ids to passages.
        queries: The queries, in search order.
        hit_lists: One hit list per query (:class:`hcqr_dspy.retrieval.retriever_base.Hit`).
        names: A label per query (``q1 (support)``, ``question`` ...).
        k: Hits asked per query.
        start_ns, end_ns: When the batched search started and ended (``time.time_ns()``).
    """
    if not active():
        return
    import mlflow

    parent = mlflow.get_current_active_span()
    for i, (query, hits, name) in enumerate(zip(queries, hit_lists, names)):
        s = mlflow.start_span_no_context(
            name=f"retrieve {name}",
            span_type="RETRIEVER",
            parent_span=parent,
            inputs={"query": query, "k": k},
            start_time_ns=min(start_ns + i, end_ns),
        )
        docs = [document(retriever.get(h.passage_id), h.score, rank=rank) for rank, h in enumerate(hits, start=1)]
        s.end(outputs=docs, end_time_ns=end_ns)


def fusion_span(
    retriever: Any, fused: Sequence[Any], names: Sequence[str], strategy: str, budget: int, start_ns: int, end_ns: int
) -> None:
    """Record the ``fusion`` span (``RERANKER``) of a multi-query method: the fused passages as documents,
    each with its fused score and the queries (by label) and ranks that found it."""
    if not active():
        return
    import mlflow

    parent = mlflow.get_current_active_span()
    s = mlflow.start_span_no_context(
        name="fusion",
        span_type="RERANKER",
        parent_span=parent,
        inputs={"strategy": strategy, "budget": budget, "queries": list(names)},
        start_time_ns=start_ns,
    )
    docs = [
        document(retriever.get(f.passage_id), f.score, found_by=[names[q] for q in f.queries], ranks=list(f.ranks))
        for f in fused
    ]
    s.end(outputs=docs, end_time_ns=end_ns)


def linked_prompts(versions: Sequence[Any]) -> str:
    """The :data:`LINKED_PROMPTS` value of prompt versions (anything with ``name`` and ``version``)."""
    return json.dumps([{"name": v.name, "version": str(v.version)} for v in versions])


class StageSpans(NoObserver):
    """The :class:`~hcqr_dspy.observers.Observer` of a question being traced: each stage a span (:func:`span`),
    each batched search its ``RETRIEVER`` spans (:func:`retriever_spans`), each fusion its span
    (:func:`fusion_span`); questions it leaves to :class:`hcqr_dspy.tracking.question_traces.QuestionTraces`."""

    def stage(self, name: str, inputs: Any = None) -> Any:
        return span(name, inputs=inputs)

    def retrieved(self, retriever, queries, hit_lists, names, k, start_ns, end_ns) -> None:
        retriever_spans(retriever, queries, hit_lists, names, k, start_ns, end_ns)

    def fused(self, retriever, fused, names, strategy, budget, start_ns, end_ns) -> None:
        fusion_span(retriever, fused, names, strategy, budget, start_ns, end_ns)


STAGE_SPANS = StageSpans()
