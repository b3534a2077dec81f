"""Run a program over questions: parallel where the LM allows, one JSONL row per
question written as it finishes, resumable (records: :class:`hcqr_dspy.run_folder.RunFolder`).

Only a bad LM reply makes a question *invalid*: unparseable output, a letter
outside the options, a prompt over the model's window. Programs turn those into
rows themselves (``valid=False``, ``error`` naming the stage). Anything else a
program raises is a bug: the run stops at that question with one line naming
it and the exception, the traceback goes to ``tracebacks/<qid>.txt`` in the run
folder, nothing is saved for that question, and the same command resumes once
the bug is fixed. When the LM stays unreachable after DSPy's retries, the run
stops cleanly too (:class:`~hcqr_dspy.run_folder.LMUnavailableError`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

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

from hcqr_dspy.errors import DiskFullError, HCQRError, LMCapabilityError
from hcqr_dspy.lm import LMReplyFormatError, call_retrying_bad_replies
from hcqr_dspy.metrics import is_correct
from hcqr_dspy.run_folder import METRICS, LMUnavailableError, ProgramError, RunError, RunFolder, lm_failure, write_probe

# Errors that mean "the LM is not answering or cannot be used" (after DSPy's
# own retries with backoff, or ours for replies that are not the API's format,
# hcqr_dspy.lm_replies): the run stops rather than marking every later
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

__all__ = [
    "LM_UNAVAILABLE",
    "EvalResult",
    "LMUnavailableError",
    "answer_record",
    "ProgramError",
    "RunError",
    "evaluate",
    "lm_failure",
    "prediction_row",
    "program_error",
    "write_probe",
]


def prediction_row(example: dspy.Example, pred: dspy.Prediction, method: str, seconds: float) -> dict[str, Any]:
    """One run record: question id, answer, validity, correctness, retrieval, fallbacks and cost.

    ``passages`` are the passages the answer step received (after the token
    budget; a cut one carries ``shown_chars``), ``dropped_passages`` those fused
    but cut by the budget; ``fallbacks`` counts what the method did instead of
    its main path (see :func:`hcqr_dspy.metrics.fallback_summary`);
    ``invalid_stage`` and ``invalid_cause`` say why an invalid question is invalid.
    :func:`evaluate` adds ``evidence`` (:func:`hcqr_dspy.evidence.question_evidence`
    over the shown passages) for retrieval methods.
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
    }
    for key in pred.keys():  # method-specific fields (hypothetical passage, reranker, query roles ...)
        if key not in row and key not in ("answer", "valid"):
            row[key] = pred.get(key)
    return row


def answer_record(qid: str, options: dict[str, str], answer: str | None, valid: bool, error: str | None,
                  hypothesis: dict[str, Any] | None, queries: list[str] | None,
                  passages: list[dict[str, Any]] | None) -> dict[str, Any]:
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
        "passages": [{"id": p["id"], "title": p["title"], "score": p.get("score"),
                      "found_by": [f"q{q + 1}" for q in p.get("queries") or []]} for p in passages or []],
    }


def program_error(folder: RunFolder, qid: str, exc: BaseException) -> ProgramError:
    """The one-line stop of a run whose program raised ``exc`` on question ``qid`` (traceback saved)."""
    tb = folder.save_traceback(qid, exc)
    where = f"traceback in {tb}" if tb else "its traceback could not be written"
    return ProgramError(
        f"question {qid!r} raised {lm_failure(exc)} ({where}); this is a bug, not a bad LM reply, so nothing was "
        "saved for it and the run stopped; fix it and run the same command again to resume",
        qid, tb,
    )


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate`: all rows (old and new), metrics, and how many were run now."""

    rows: list[dict[str, Any]]
    metrics: dict[str, Any]
    resumed: int
    ran: int


def evaluate(
    program: dspy.Module,
    examples: Sequence[dspy.Example],
    folder: RunFolder,
    method: str,
    num_threads: int = 1,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    trace_tags: dict[str, str] | None = None,
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
        trace_tags: Record each question as an MLflow trace (:func:`hcqr_dspy.traces.question`) with
            these tags plus ``qid``; the row keeps the trace's id as ``trace_id``. ``None``: no traces.

    Returns:
        :class:`EvalResult` over every question of ``examples``.

    Raises:
        LMUnavailableError: the LM stopped answering; finished rows are kept.
        ProgramError: the program raised something other than a bad LM reply (a bug).
        RunError: a row could not be written (disk full ...); finished rows are kept.
    """

    from hcqr_dspy.evidence import question_evidence
    from hcqr_dspy.programs.base import shown_documents

    retriever = getattr(program, "retriever", None)

    def answer(example: dspy.Example) -> dict[str, Any]:
        def attempt() -> tuple[dspy.Prediction, float]:
            t0 = time.perf_counter()
            return program(question=example.question, options=example.options), time.perf_counter() - t0

        # a reply that is not the API's format (a gateway's HTML page, a cut JSON body) is retried with back-off
        # like a refused connection; ``seconds`` is the answering try's
        pred, seconds = call_retrying_bad_replies(attempt)
        row = prediction_row(example, pred, method, seconds)
        if retriever is not None and row["passages"] and example.answer is not None:
            row["evidence"] = question_evidence(example.options, example.answer, shown_documents(retriever, row["passages"]))
        return row

    def work(example: dspy.Example) -> dict[str, Any]:
        if trace_tags is None:
            return answer(example)
        from hcqr_dspy import traces

        with traces.question(method, example.question, example.options, {**trace_tags, "qid": example.qid}) as trace:
            row = answer(example)
            trace.finish(row)
        return row

    def saved(row: dict[str, Any]) -> None:
        folder.clear_traceback(row["qid"])  # a question that failed in an earlier session and succeeded now
        if on_row:
            on_row(row)

    try:
        rows, resumed, ran = folder.predictions.map(
            examples, lambda e: e.qid, work, LM_UNAVAILABLE, num_threads, progress, saved,
            on_error=lambda e, exc: program_error(folder, e.qid, exc),
        )
    except HCQRError:
        keep = {e.qid for e in examples}
        try:  # the summary of what is saved; on a full disk the old metrics.json stays whole and the stop says why
            folder.write_metrics([r for r in folder.rows() if r["qid"] in keep])
        except (OSError, HCQRError):
            pass
        raise
    try:
        metrics = folder.write_metrics(rows)
    except DiskFullError as exc:
        raise DiskFullError(f"{exc} ({len(rows)}/{len(examples)} questions are saved in {folder.predictions.path}; "
                            f"{METRICS} was not updated)") from None
    return EvalResult(rows=rows, metrics=metrics, resumed=resumed, ran=ran)
