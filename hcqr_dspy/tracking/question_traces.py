"""MLflow traces of questions: what a reviewer opens in the Traces tab.

A tracked evaluation (``hcqr eval``, ``hcqr predict``, experiments) records one
trace per question. Its root span is named after the method (``hcqr``) and
holds the question and options as inputs and the answer, validity, hypothesis,
queries and the shown passages as outputs. Below it every method
stage is a named span (:func:`hcqr_dspy.programs.program_base.stage`, recorded by
:mod:`hcqr_dspy.tracking.stage_spans`): ``hypothesis``,
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

How much a question's trace holds is its level (:data:`hcqr_dspy.trace_levels.TRACE_LEVELS`; ``hcqr eval
--traces``, ``$HCQR_TRACES``): ``full`` is all of the above; ``light`` leaves out the LM call spans (the evaluation
does not record them), cuts every text of a stage span's inputs and outputs to
:data:`~hcqr_dspy.tracking.stage_spans.LIGHT_TEXT_CHARS` characters (the answer step's context included) and keeps
no passage text in documents (their ids, titles, scores and ranks stay); ``off`` records no question traces at all.
MLflow writes traces in the background and drops them once its queue is full; every
:data:`TRACE_BACKLOG_QUESTIONS` questions :func:`question` waits until the traces before it are written, which bounds
the traces held in memory and loses none.

A run of programs tells its :class:`hcqr_dspy.observers.Observer` what it does; :class:`QuestionTraces` is the
observer that records all of the above. An untracked run (``--no-mlflow``, ``hcqr ask``) never imports this module.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from hcqr_dspy.observers import observing
from hcqr_dspy.tracking.stage_spans import LINKED_PROMPTS, STAGE_SPANS, StageSpans, linked_prompts, recorded

# The trace tags of a question (the evaluation sets them; tests and filters read them).
QUESTION_TAGS = ("qid", "method", "dataset", "run_folder", "lm", "program")
TRACE_BACKLOG_QUESTIONS = 100
"""Question traces MLflow may hold unwritten: every this many, :func:`question` waits for them to be written."""
_questions_traced = itertools.count(1)
# The stop a tracking layer set when the MLflow store failed under the traces written in the background (it stayed
# locked past its wait, its disk filled): the next question's trace raises it instead of starting (:func:`question`).
_STOPS: list[BaseException] = []


def stop_questions(error: BaseException | None) -> None:
    """Make every later :func:`question` raise ``error`` (an :class:`~hcqr_dspy.errors.OutageError`), so that a run
    stops between questions with what is saved; ``None`` lifts the stop. Thread-safe: set from the thread that met
    the failure."""
    _STOPS[:] = [error] if error is not None else []


class QuestionTrace:
    """The trace of one question, open while its program runs (see :func:`question`)."""

    def __init__(self, root: Any, tags: dict[str, str]):
        self.root = root
        self.tags = tags

    @property
    def trace_id(self) -> str:
        return self.root.trace_id

    def output(self, value: Any) -> None:
        """Set the root span's outputs (a judging's labels, a served answer)."""
        self.root.set_outputs(value)

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
    (``option_probs``, where the LM gave one: :mod:`hcqr_dspy.programs.answer_slot_probs`) and what the method found."""
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
    """Open the root span of one question's trace and tag the trace; inside the block the stages, searches and
    fusions of the program it runs are its spans (:class:`~hcqr_dspy.tracking.stage_spans.StageSpans` installed:
    :func:`hcqr_dspy.observers.observing`). After every
    :data:`TRACE_BACKLOG_QUESTIONS`-th question of the process it waits until MLflow has written the traces before it
    (``mlflow.flush_trace_async_logging``).

    Args:
        name: The root span's name (the method).
        question_text, options: The root span's inputs.
        tags: Trace tags (:data:`QUESTION_TAGS`); values are made strings.
        level: ``full`` or ``light`` (:data:`hcqr_dspy.trace_levels.TRACE_LEVELS`): how much the spans opened in
            the block keep.
        prompts: ``{stage: PromptVersion}``, the Prompt Registry versions the program's stages use: the trace is
            tagged :data:`~hcqr_dspy.tracking.stage_spans.LINKED_PROMPTS` with all of them, and each stage's span names
            its own (:func:`hcqr_dspy.tracking.stage_spans.span`).

    Yields:
        A :class:`QuestionTrace`; call :meth:`QuestionTrace.finish` with the question's row before the block ends.

    Raises:
        OutageError: the stop set by :func:`stop_questions`, before anything is recorded.
    """
    if _STOPS:
        raise _STOPS[0]
    import mlflow

    with recorded(level, prompts), observing(STAGE_SPANS):
        with mlflow.start_span(name=name, span_type="CHAIN") as root:
            root.set_inputs({"question": question_text, "options": options})
            tags = {k: str(v) for k, v in tags.items() if v is not None}
            linked = {LINKED_PROMPTS: linked_prompts(list(prompts.values()))} if prompts else {}
            mlflow.update_current_trace(tags={**tags, **linked})
            yield QuestionTrace(root, tags)
    if next(_questions_traced) % TRACE_BACKLOG_QUESTIONS == 0:
        mlflow.flush_trace_async_logging()


class QuestionTraces(StageSpans):
    """The :class:`~hcqr_dspy.observers.Observer` that makes each question one MLflow trace (:func:`question`)
    and each of its program's stages, searches and fusions a span in it
    (:class:`~hcqr_dspy.tracking.stage_spans.StageSpans`).

    Args:
        tags: The trace tags of every question (:data:`QUESTION_TAGS` but ``qid``, and what a caller adds); each
            question's own tags (``qid``) are added to them.
        level: ``full`` or ``light`` (:data:`hcqr_dspy.trace_levels.TRACE_LEVELS`).
        prompts: ``{stage: PromptVersion}``, the Prompt Registry versions the program's stages use (:func:`question`).
    """

    def __init__(self, tags: dict[str, str], level: str = "full", prompts: dict[str, Any] | None = None):
        self.tags = dict(tags)
        self.level = level
        self.prompts = prompts

    def question(
        self, name: str, question_text: str, options: dict[str, str], tags: dict[str, str]
    ) -> AbstractContextManager[QuestionTrace]:
        return question(name, question_text, options, {**self.tags, **tags}, self.level, self.prompts)
