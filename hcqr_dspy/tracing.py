"""MLflow traces of questions: what a reviewer opens in the Traces tab.

A tracked evaluation (``hcqr eval``, ``hcqr predict``, experiments) records one
trace per question. Its root span is named after the method (``hcqr``) and
holds the question and options as inputs and the answer, validity, hypothesis,
queries and the shown passages as outputs. Below it every method
stage is a named span (:func:`hcqr_dspy.programs.base.stage`): ``hypothesis``,
``rewrite``, ``retrieval``, ``answer`` ... A stage that calls the LM holds one
``CHAT_MODEL`` span per call (``LM <model>``: the messages, the reply and the
token usage, :mod:`hcqr_dspy.tracking.lm_spans`); DSPy's modules and adapters
record no spans of their own. Inside ``retrieval`` there is one
``RETRIEVER`` span per query (``retrieve q1 (support)``: the query as input,
the hits as documents in MLflow's retriever-span format,
:class:`mlflow.entities.Document` with the passage id, its title, text, score
and rank) and, for methods that fuse, a ``fusion`` span (``RERANKER``: the
fused passages as documents, each with the queries that found it). The
``answer`` span's inputs hold the context exactly as the answer step saw it.

The trace is tagged ``qid``, ``method``, ``dataset``, ``run_folder``, ``lm``
and ``program`` (``zero-shot`` or ``compiled:<recipe>``), and the gold answer
is logged on it as the expectation ``answer`` (:class:`~mlflow.entities.Expectation`,
source ``HUMAN``: the benchmark's label). Correctness, validity and the
hypothesis outcome are logged as feedback by the scorers of
:mod:`hcqr_dspy.tracking.scorers` when the run is scored, and the DUR judge's labels by
``hcqr judge``.

How much a question's trace holds is its level (:data:`TRACE_LEVELS`; ``hcqr eval --traces``, ``$HCQR_TRACES``):
``full`` is all of the above; ``light`` leaves out the LM call spans (the evaluation does not record them), cuts every
text of a stage span's inputs and outputs to :data:`LIGHT_TEXT_CHARS` characters (the answer step's context included)
and keeps no passage text in documents (their ids, titles, scores and ranks stay); ``off`` records no question traces
at all. MLflow writes traces in the background and drops them once its queue is full; every
:data:`TRACE_BACKLOG_QUESTIONS` questions :func:`question` waits until the traces before it are written, which bounds
the traces held in memory and loses none.

Nothing here records anything unless a trace is active: an untracked run
(``--no-mlflow``, ``hcqr ask``) never imports MLflow through this module.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from hcqr_dspy.errors import HCQRError

# The trace tags of a question (the evaluation sets them; tests and filters read them).
QUESTION_TAGS = ("qid", "method", "dataset", "run_folder", "lm", "program")
# Characters of a passage's text kept in a span's documents (the UI shows them; the store keeps every span).
DOCUMENT_CHARS = 2000
TRACE_LEVELS = ("full", "light", "off")
"""What a tracked evaluation records per question, most first (see the module's text)."""
TRACES_VARIABLE = "HCQR_TRACES"
LIGHT_TEXT_CHARS = 200
"""Characters a ``light`` trace keeps of each text in a stage span's inputs and outputs."""
TRACE_BACKLOG_QUESTIONS = 100
"""Question traces MLflow may hold unwritten: every this many, :func:`question` waits for them to be written."""
_LIGHT: ContextVar[bool] = ContextVar("hcqr_light_trace", default=False)  # set by question() for its block
# {stage: PromptVersion} of the question being traced (question()'s ``prompts``): span() marks those stages' spans
_PROMPTS: ContextVar[dict[str, Any]] = ContextVar("hcqr_stage_prompts", default={})  # noqa: B039 (never mutated)
LINKED_PROMPTS = "mlflow.linkedPrompts"
"""MLflow's trace tag and span attribute of the prompt versions used: JSON ``[{"name", "version"}]``."""
_questions_traced = itertools.count(1)
# The stop a tracking layer set when the MLflow store failed under the traces written in the background (it stayed
# locked past its wait, its disk filled): the next question's trace raises it instead of starting (:func:`question`).
_STOPS: list[BaseException] = []


def stop_questions(error: BaseException | None) -> None:
    """Make every later :func:`question` raise ``error`` (an :class:`~hcqr_dspy.errors.OutageError`), so that a run
    stops between questions with what is saved; ``None`` lifts the stop. Thread-safe: set from the thread that met
    the failure."""
    _STOPS[:] = [error] if error is not None else []


def trace_level(level: str | None = None) -> str:
    """``level``, else ``$HCQR_TRACES``, else ``full``.

    Raises:
        HCQRError: not one of :data:`TRACE_LEVELS` (one line naming them).
    """
    value = (level or os.environ.get(TRACES_VARIABLE, "") or "full").strip()
    if value not in TRACE_LEVELS:
        where = "--traces" if level else f"${TRACES_VARIABLE}"
        raise HCQRError(f"{where}={value!r}: choose one of {', '.join(TRACE_LEVELS)}")
    return value


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

    A span named after a stage of the traced question's ``prompts`` (:func:`question`) also gets the attributes
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
        hit_lists: One hit list per query (:class:`hcqr_dspy.retrieval.base.Hit`).
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
    import json

    return json.dumps([{"name": v.name, "version": str(v.version)} for v in versions])


def now_ns() -> int:
    return time.time_ns()


class QuestionTrace:
    """The trace of one question, open while its program runs (see :func:`question`)."""

    def __init__(self, root: Any, tags: dict[str, str]):
        self.root = root
        self.tags = tags

    @property
    def trace_id(self) -> str:
        return self.root.trace_id

    def finish(self, row: dict[str, Any]) -> None:
        """Set the root span's outputs from the question's run record, log the gold answer as the
        expectation ``answer`` (when the question has one), and note the trace id in the row."""
        import mlflow
        from mlflow.entities import AssessmentSource

        self.root.set_outputs(root_outputs(row))
        mlflow.update_current_trace(
            request_preview=self.root.inputs.get("question") if isinstance(self.root.inputs, dict) else None,
            response_preview=response_preview(row),
        )
        if row.get("gold") is not None:
            source = AssessmentSource(source_type="HUMAN", source_id=f"benchmark:{self.tags.get('dataset', 'gold')}")
            mlflow.log_expectation(trace_id=self.trace_id, name="answer", value=row["gold"], source=source)
        row["trace_id"] = self.trace_id


RESPONSE_PREVIEW_CHARS = 400
"""Characters of a question's reasoning its trace's response preview keeps (the Traces tab's response column)."""


def response_preview(row: dict[str, Any]) -> str:
    """What the Traces tab shows as a question's response: ``"<letter>: <reasoning>"`` (the reasoning cut to
    :data:`RESPONSE_PREVIEW_CHARS` characters), or ``"invalid: <error>"`` for an invalid reply."""
    if not row.get("valid"):
        return f"invalid: {row.get('error') or 'no option letter'}"[:RESPONSE_PREVIEW_CHARS]
    reasoning = " ".join(str(row.get("reasoning") or "").split())
    return f"{row.get('prediction')}: {reasoning}"[: len(str(row.get("prediction"))) + 2 + RESPONSE_PREVIEW_CHARS]


def root_outputs(row: dict[str, Any]) -> dict[str, Any]:
    """The root span's outputs: answer first, then validity, the answer step's letter distribution
    (``option_probs``, where the LM gave one: :mod:`hcqr_dspy.programs.option_probs`) and what the method found."""
    h = row.get("hypothesis") or None
    return {
        "answer": row.get("prediction"),
        "valid": row.get("valid"),
        **({"error": row["error"]} if row.get("error") else {}),
        **({"option_probs": row["option_probs"]} if row.get("option_probs") else {}),
        **({"hypothesis": h} if "hypothesis" in row else {}),
        **({"queries": row["queries"]} if row.get("queries") else {}),
        **(
            {
                "passages": [
                    {
                        "id": p["id"],
                        "title": p["title"],
                        "score": p.get("score"),
                        "found_by": [f"q{q + 1}" for q in p.get("queries") or []],
                    }
                    for p in row["passages"]
                ]
            }
            if row.get("passages")
            else {}
        ),
        "lm_calls": row.get("lm_calls"),
    }


@contextmanager
def question(
    name: str,
    question_text: str,
    options: dict[str, str],
    tags: dict[str, str],
    level: str = "full",
    prompts: dict[str, Any] | None = None,
) -> Iterator[QuestionTrace]:
    """Open the root span of one question's trace and tag the trace. After every
    :data:`TRACE_BACKLOG_QUESTIONS`-th question of the process it waits until MLflow has written the traces before it
    (``mlflow.flush_trace_async_logging``).

    Args:
        name: The root span's name (the method).
        question_text, options: The root span's inputs.
        tags: Trace tags (:data:`QUESTION_TAGS`); values are made strings.
        level: ``full`` or ``light`` (:data:`TRACE_LEVELS`): how much the spans opened in the block keep.
        prompts: ``{stage: PromptVersion}``, the Prompt Registry versions the program's stages use: the trace is
            tagged :data:`LINKED_PROMPTS` with all of them, and each stage's span names its own (:func:`span`).

    Yields:
        A :class:`QuestionTrace`; call :meth:`QuestionTrace.finish` with the question's row before the block ends.

    Raises:
        OutageError: the stop set by :func:`stop_questions`, before anything is recorded.
    """
    if _STOPS:
        raise _STOPS[0]
    import mlflow

    token, marked = _LIGHT.set(level == "light"), _PROMPTS.set(dict(prompts or {}))
    try:
        with mlflow.start_span(name=name, span_type="CHAIN") as root:
            root.set_inputs({"question": question_text, "options": options})
            tags = {k: str(v) for k, v in tags.items() if v is not None}
            linked = {LINKED_PROMPTS: linked_prompts(list(prompts.values()))} if prompts else {}
            mlflow.update_current_trace(tags={**tags, **linked})
            yield QuestionTrace(root, tags)
    finally:
        _LIGHT.reset(token)
        _PROMPTS.reset(marked)
    if next(_questions_traced) % TRACE_BACKLOG_QUESTIONS == 0:
        mlflow.flush_trace_async_logging()
