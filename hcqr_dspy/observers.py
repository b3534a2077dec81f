"""Who is told what a program does while it answers: the seam between running programs and recording them.

An :class:`Observer` is told of each question as it starts and finishes (:meth:`Observer.question`, a context
manager open while the question's program runs), of each stage of the program as it is entered and left
(:meth:`Observer.stage`), of each batched search (:meth:`Observer.retrieved`) and of each fusion of hit lists
(:meth:`Observer.fused`). Nothing here records anything or imports MLflow: the evaluation loop
(:func:`hcqr_dspy.evaluation.answering.evaluate`) takes an observer as a parameter and installs it while each
question runs (:func:`observing`), the programs' stages (:func:`hcqr_dspy.programs.program_base.stage`) and
searches tell the installed one (:func:`installed`), and
:class:`hcqr_dspy.tracking.question_traces.QuestionTraces` is the observer that makes each question an MLflow
trace. :data:`NO_OBSERVER`, the default, does nothing.

The installed observer is per thread and context (a :class:`contextvars.ContextVar`): the loop installs it in the
thread that runs the question, which is where the program's stages run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, Protocol


class StageRecord(Protocol):
    """What a stage's ``with`` block gets from :meth:`Observer.stage`."""

    def output(self, value: Any) -> None:
        """Record the stage's outputs (any JSON-like value)."""


class QuestionRecord(Protocol):
    """What a question's ``with`` block gets from :meth:`Observer.question`."""

    @property
    def trace_id(self) -> str | None:
        """The id of the question's record where the observer keeps one (an MLflow trace id), else ``None``."""

    def output(self, value: Any) -> None:
        """Record what the question's work returned (any JSON-like value)."""

    def finish(self, row: dict[str, Any]) -> None:
        """Record the question's finished run row (:func:`hcqr_dspy.evaluation.rows.prediction_row`); an observer
        that keeps a record id adds it to ``row`` as ``trace_id``."""


class Observer(Protocol):
    """The hooks a run of programs calls (see the module's text)."""

    def question(
        self, name: str, question: str, options: dict[str, str], tags: dict[str, str]
    ) -> AbstractContextManager[QuestionRecord]:
        """Open while one question is answered (or judged).

        Args:
            name: What answers it (the method, ``dur judge`` ...).
            question, options: The question's text and its options ``{letter: text}``.
            tags: The question's own tags (``qid`` ...), strings.
        """

    def stage(self, name: str, inputs: Any = None) -> AbstractContextManager[StageRecord]:
        """Open while a program's stage runs (``hypothesis``, ``retrieval``, ``answer`` ...), with its inputs."""

    def retrieved(
        self,
        retriever: Any,
        queries: Sequence[str],
        hit_lists: Sequence[Sequence[Any]],
        names: Sequence[str],
        k: int,
        start_ns: int,
        end_ns: int,
    ) -> None:
        """One batched search: the queries in search order, one hit list each
        (:class:`hcqr_dspy.retrieval.retriever_base.Hit`), a label per query, the hits asked per query, and the search's
        start and end (``time.time_ns()``); ``retriever`` resolves hit ids to passages."""

    def fused(
        self,
        retriever: Any,
        fused: Sequence[Any],
        names: Sequence[str],
        strategy: str,
        budget: int,
        start_ns: int,
        end_ns: int,
    ) -> None:
        """One fusion of several hit lists into ``budget`` passages (:class:`hcqr_dspy.retrieval.fusion.FusedPassage`
        each), by ``strategy``, the lists labelled ``names``; its start and end (``time.time_ns()``)."""


class _Nothing:
    """The record of a question or stage nobody keeps."""

    trace_id = None

    def output(self, value: Any) -> None:
        pass

    def finish(self, row: dict[str, Any]) -> None:
        pass


_NOTHING = _Nothing()


class NoObserver:
    """An :class:`Observer` that records nothing; a base for observers that watch only some events."""

    @contextmanager
    def question(
        self, name: str, question: str, options: dict[str, str], tags: dict[str, str]
    ) -> Iterator[QuestionRecord]:
        yield _NOTHING

    @contextmanager
    def stage(self, name: str, inputs: Any = None) -> Iterator[StageRecord]:
        yield _NOTHING

    def retrieved(
        self,
        retriever: Any,
        queries: Sequence[str],
        hit_lists: Sequence[Sequence[Any]],
        names: Sequence[str],
        k: int,
        start_ns: int,
        end_ns: int,
    ) -> None:
        pass

    def fused(
        self,
        retriever: Any,
        fused: Sequence[Any],
        names: Sequence[str],
        strategy: str,
        budget: int,
        start_ns: int,
        end_ns: int,
    ) -> None:
        pass


NO_OBSERVER = NoObserver()
"""The default observer: nothing is recorded."""
_INSTALLED: ContextVar[Observer] = ContextVar("hcqr_observer", default=NO_OBSERVER)


def installed() -> Observer:
    """The observer installed in this thread and context (:func:`observing`), else :data:`NO_OBSERVER`."""
    return _INSTALLED.get()


@contextmanager
def observing(observer: Observer) -> Iterator[Observer]:
    """Install ``observer`` for the block, in this thread and context; the one before it is back after."""
    token = _INSTALLED.set(observer)
    try:
        yield observer
    finally:
        _INSTALLED.reset(token)
