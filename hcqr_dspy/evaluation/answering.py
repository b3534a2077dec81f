"""Run a program over questions: parallel where the LM allows, one JSONL row per
question written as it finishes, resumable (records:
:class:`hcqr_dspy.evaluation.run_folder.RunFolder`).

Only a bad LM reply makes a question *invalid*: unparseable output, a letter
outside the options, a prompt over the model's window. Programs turn those into
rows themselves (``valid=False``, ``error`` naming the stage). Anything else a
program raises is a bug: the run stops at that question with one line naming
it and the exception, the traceback goes to ``tracebacks/<prefix>-<hash>.txt`` in
the run folder (named by a hash of the id: :mod:`hcqr_dspy.evaluation.tracebacks`),
nothing is saved for that question, and the same command resumes once the bug
is fixed. When the LM stays unreachable after DSPy's retries, the run
stops cleanly too (:class:`~hcqr_dspy.errors.LMUnavailableError`).

Each question is told to an observer (:class:`hcqr_dspy.observers.Observer`, installed while the question runs so
that the program's stages reach it too): a tracked evaluation passes the one that makes it an MLflow trace
(:class:`hcqr_dspy.tracking.question_traces.QuestionTraces`); the default records nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.exceptions import (
    LMAuthError,
    LMBillingError,
    LMConfigurationError,
    LMRateLimitError,
    LMServerError,
    LMTimeoutError,
    LMTransportError,
    LMUnsupportedModelError,
)

from hcqr_dspy.errors import DiskFullError, HCQRError, LMCapabilityError, LMReplyFormatError, ProgramError
from hcqr_dspy.evaluation.cpu_pressure import PressureWindow
from hcqr_dspy.evaluation.evidence import question_evidence
from hcqr_dspy.evaluation.loop import run_resumable
from hcqr_dspy.evaluation.outages import lm_failure
from hcqr_dspy.evaluation.rows import prediction_row
from hcqr_dspy.evaluation.run_folder import METRICS, RunFolder
from hcqr_dspy.lm import call_retrying_bad_replies
from hcqr_dspy.lm.reply_setup import cached_reply_setups
from hcqr_dspy.observers import NO_OBSERVER, Observer, observing
from hcqr_dspy.programs.context import shown_documents

# Errors that mean "the LM is not answering or cannot be used" (after DSPy's
# own retries with backoff, or ours for replies that are not the API's format,
# hcqr_dspy.lm.reply_retries): the run stops rather than marking every later
# question invalid, and those questions are redone on resume.
LM_UNAVAILABLE: tuple[type[BaseException], ...] = (
    LMConfigurationError,
    LMTransportError,
    LMTimeoutError,
    LMServerError,
    LMRateLimitError,
    LMAuthError,
    LMBillingError,
    LMUnsupportedModelError,
    ConnectionError,
    LMCapabilityError,
    LMReplyFormatError,
)


def program_error(folder: RunFolder, qid: str, exc: BaseException) -> ProgramError:
    """The one-line stop of a run whose program raised ``exc`` on question ``qid`` (traceback saved)."""
    tb = folder.save_traceback(qid, exc)
    where = f"traceback in {tb}" if tb else "its traceback could not be written"
    return ProgramError(
        f"question {qid!r} raised {lm_failure(exc)} ({where}); this is a bug, not a bad LM reply, so nothing was "
        "saved for it and the run stopped; fix it and run the same command again to resume",
        qid,
        tb,
    )


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate`: metrics and counts; the rows stay in the run folder and are read on demand
    (:meth:`iter_rows`, :attr:`rows`), so a result of any length holds none of them.

    Attributes:
        folder: The run folder the rows are in.
        qids: The run's question ids, in run order.
        metrics: :func:`~hcqr_dspy.evaluation.metrics.summarize` of every row of ``qids`` (``metrics.json``).
        resumed: Rows found in the folder. ran: Rows made now.
    """

    folder: RunFolder
    qids: list[str]
    metrics: dict[str, Any]
    resumed: int
    ran: int

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """The rows of the run's questions, old and new, in file order, read from ``predictions.jsonl`` one at a
        time (:meth:`RunFolder.iter_rows`). Raises RunError: as that."""
        keep = set(self.qids)
        return (r for r in self.folder.iter_rows() if r["qid"] in keep)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every row of the run's questions in run order, read from the folder on each access (all in memory:
        large runs read :meth:`iter_rows`). Raises RunError: as :meth:`iter_rows`."""
        by_qid = {r["qid"]: r for r in self.iter_rows()}
        return [by_qid[q] for q in self.qids if q in by_qid]

    @property
    def saved(self) -> int:
        """How many of the run's questions have a row (``metrics["n"]``)."""
        return int(self.metrics.get("n", 0))


def evaluate(
    program: dspy.Module,
    examples: Sequence[dspy.Example],
    folder: RunFolder,
    method: str,
    num_threads: int = 1,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    observer: Observer = NO_OBSERVER,
) -> EvalResult:
    """Run ``program`` over ``examples``, writing ``predictions.jsonl`` as it goes.

    Args:
        program: A method's module (``forward(question, options)``).
        examples: Questions (``dspy.Example`` with ``qid``).
        folder: Run folder made by :meth:`RunFolder.create`.
        method: Method name written in each row.
        num_threads: Questions in flight at once (DSPy's ``ParallelExecutor``);
            local llama.cpp models serialize calls, so 1 suits them.
        progress: Show a progress bar.
        on_row: Called with each new row after it is written.
        observer: Told of each question (:meth:`~hcqr_dspy.observers.Observer.question`, named ``method``, tagged
            ``qid``; its record gets the finished row) and installed while it runs, so that the program's stages,
            searches and fusions reach it (:func:`hcqr_dspy.observers.observing`); an observer that keeps a record
            id (an MLflow trace's) adds it to the row as ``trace_id``. Default: nothing is recorded.

    Returns:
        :class:`EvalResult` over every question of ``examples``.

    Raises:
        LMUnavailableError: the LM stopped answering; finished rows are kept.
        ProgramError: the program raised something other than a bad LM reply (a bug).
        RunError: a row could not be written (disk full ...); finished rows are kept.
    """
    retriever = getattr(program, "retriever", None)

    def answer(example: dspy.Example) -> dict[str, Any]:
        def attempt() -> tuple[dspy.Prediction, float, list[dict[str, Any]], float | None]:
            window = PressureWindow()
            t0 = time.perf_counter()
            gold = {"gold": example.answer} if getattr(program, "uses_answer", False) else {}  # a bound's oracle
            with cached_reply_setups() as cached:
                pred = program(question=example.question, options=example.options, **gold)
            return pred, time.perf_counter() - t0, cached.summary(), window.share()

        # a reply that is not the API's format (a gateway's HTML page, a cut JSON body) is retried with back-off
        # like a refused connection; ``seconds``, ``cached_setups`` and ``cpu_pressure`` are the answering try's
        pred, seconds, cached, pressure = call_retrying_bad_replies(attempt)
        row = prediction_row(example, pred, method, seconds)
        row["cached_setups"] = cached  # under which setups the replies DSPy's cache served were made
        row["cpu_pressure"] = pressure  # how contended the machine was meanwhile: are its seconds the method's?
        if retriever is not None and row["passages"] and example.answer is not None:
            shown = shown_documents(retriever, row["passages"])
            row["evidence"] = question_evidence(example.options, example.answer, shown)
        return row

    def work(example: dspy.Example) -> dict[str, Any]:
        with (
            observing(observer),
            observer.question(method, example.question, example.options, {"qid": example.qid}) as record,
        ):
            row = answer(example)
            record.finish(row)
        return row

    def saved(row: dict[str, Any]) -> None:
        folder.clear_traceback(row["qid"])  # a question that failed in an earlier session and succeeded now
        if on_row:
            on_row(row)

    try:
        _, resumed, ran = run_resumable(
            folder.predictions,
            examples,
            lambda e: e.qid,
            work,
            LM_UNAVAILABLE,
            num_threads,
            progress,
            saved,
            on_error=lambda e, exc: program_error(folder, e.qid, exc),
            collect=False,  # the rows stay on disk: the metrics stream them from there
        )
    except HCQRError:
        keep = {e.qid for e in examples}
        try:  # the summary of what is saved; on a full disk the old metrics.json stays whole and the stop says why
            folder.write_metrics(r for r in folder.iter_rows() if r["qid"] in keep)
        except (OSError, HCQRError):
            pass
        raise
    result = EvalResult(folder=folder, qids=[e.qid for e in examples], metrics={}, resumed=resumed, ran=ran)
    try:
        result.metrics = folder.write_metrics(result.iter_rows())
    except DiskFullError as exc:
        raise DiskFullError(
            f"{exc} ({resumed + ran}/{len(examples)} questions are saved in {folder.predictions.path}; "
            f"{METRICS} was not updated)"
        ) from None
    return result
