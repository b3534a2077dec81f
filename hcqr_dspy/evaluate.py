"""Run a program over questions: parallel where the LM allows, one JSONL row per
question written as it finishes, resumable.

A run folder holds ``config.json`` (the resolved configuration),
``predictions.jsonl`` (one row per finished question) and ``metrics.json``.
Re-running with the same folder skips the questions already in the JSONL (a
partial last line left by a killed process is ignored and redone), and
refuses a folder whose configuration differs. When the LM stays unreachable
after DSPy's retries, the run stops cleanly: finished rows are kept, and
:class:`LMUnavailableError` says how to resume.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
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
)
from dspy.utils.parallelizer import ParallelExecutor

from hcqr_dspy.errors import HCQRError, LMCapabilityError
from hcqr_dspy.metrics import summarize

# Errors that mean "the LM is not answering or cannot be used" (after DSPy's
# own retries with backoff): the run stops rather than marking every later
# question invalid, and those questions are redone on resume.
LM_UNAVAILABLE: tuple[type[BaseException], ...] = (
    LMConfigurationError,
    LMTransportError,
    LMTimeoutError,
    LMServerError,
    LMRateLimitError,
    LMAuthError,
    LMBillingError,
    ConnectionError,
    LMCapabilityError,
)

PREDICTIONS = "predictions.jsonl"
CONFIG = "config.json"
METRICS = "metrics.json"


class RunError(HCQRError):
    """A run folder cannot be used (other configuration, not writable)."""


class LMUnavailableError(HCQRError):
    """The LM stopped answering mid-run; finished questions are saved."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a predictions file; a truncated last line (killed writer) is dropped."""
    rows = []
    if not path.exists():
        return rows
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.endswith("\n"):
                break  # partial write of a killed process: redo that question
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RunError(f"{path}:{lineno}: not a valid record ({exc.msg}); repair or delete that line") from None
            if not isinstance(row, dict) or "qid" not in row:
                raise RunError(f"{path}:{lineno}: not a run record (no qid); repair or delete that line")
            rows.append(row)
    return rows


def _truncate_partial_tail(path: Path) -> None:
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def prediction_row(example: dspy.Example, pred: dspy.Prediction, method: str, seconds: float) -> dict[str, Any]:
    """One run record: question id, answer, validity, correctness, retrieval and cost."""
    stages = dict(pred.get("stages") or {})
    row = {
        "qid": example.qid,
        "method": method,
        "prediction": pred.get("answer"),
        "gold": example.answer,
        "valid": bool(pred.get("valid")),
        "correct": bool(pred.get("valid")) and pred.get("answer") == example.answer,
        "error": pred.get("error"),
        "reasoning": pred.get("reasoning"),
        "hypothesis": pred.get("hypothesis"),
        "queries": pred.get("queries") or [],
        "query_sources": pred.get("query_sources"),
        "passages": pred.get("passages") or [],
        "context_cut": pred.get("context_cut"),
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


def error_row(example: dspy.Example, method: str, exc: BaseException, seconds: float) -> dict[str, Any]:
    """Record of a question that failed with an unexpected error (counted invalid)."""
    pred = dspy.Prediction(answer=None, valid=False, error=f"{type(exc).__name__}: {exc}"[:500], stages={})
    return prediction_row(example, pred, method, seconds)


def write_probe(folder: Path) -> None:
    """Create ``folder`` if needed, then write and delete a probe file in it.

    Raises:
        OSError: the folder cannot be created or written (read-only or full disk, ``/proc`` ...).
    """
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-test-{os.getpid()}"
    probe.write_text("ok")
    probe.unlink()


def lm_failure(exc: BaseException) -> str:
    """``"<error type>: <first line of the message>"`` (at most 300 characters) for one-line stop messages."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"


def prepare_run_dir(run_dir: str | Path, config: dict[str, Any]) -> Path:
    """Create or reopen a run folder; refuse one holding another configuration.

    Raises:
        RunError: the folder is not writable, or its ``config.json`` differs
            in any key other than ``mlflow_run_id`` (the differing keys are named).
    """
    run_dir = Path(run_dir)
    try:
        write_probe(run_dir)
    except OSError as exc:
        raise RunError(f"run folder {run_dir} is not writable: {exc.strerror}") from None
    cpath = run_dir / CONFIG
    if cpath.exists():
        try:
            old = json.loads(cpath.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RunError(f"{cpath} is not valid JSON ({exc}); repair it or use another --run-dir") from None
        keys = sorted(k for k in set(old) | set(config) if k != "mlflow_run_id" and old.get(k) != config.get(k))
        if keys:
            raise RunError(
                f"run folder {run_dir} holds a run with another configuration (differs in: {', '.join(keys)}); "
                "use another --run-dir or remove it"
            )
        config = {**config, "mlflow_run_id": old.get("mlflow_run_id")}
    cpath.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return run_dir


def update_config(run_dir: Path, **values: Any) -> None:
    """Add keys (such as the MLflow run id) to a run's ``config.json``."""
    cpath = run_dir / CONFIG
    config = json.loads(cpath.read_text(encoding="utf-8"))
    config.update(values)
    cpath.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate`: all rows (old and new), metrics, and how many were run now."""

    rows: list[dict[str, Any]]
    metrics: dict[str, float]
    resumed: int
    ran: int


def resumable_map(
    items: Sequence[Any],
    key: Callable[[Any], str],
    work: Callable[[Any], dict[str, Any]],
    path: Path,
    num_threads: int = 1,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], int, int]:
    """Apply ``work`` to each item not yet in the JSONL file ``path``, appending its row as it finishes.

    Rows are keyed by ``row["qid"]`` (``key(item)`` for items). A partial
    last line (killed writer) is dropped and its item redone. ``work`` may
    raise: LM-unavailable errors stop the whole map; a write failure stops
    it; anything else is the item's own problem and must be turned into a
    row by ``work`` itself.

    Returns:
        ``(rows in item order, resumed count, run-now count)``.

    Raises:
        LMUnavailableError: the LM stopped answering; finished rows are kept.
        RunError: a row could not be written (disk full ...); finished rows are kept.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _truncate_partial_tail(path)
    wanted = {key(item) for item in items}
    done = {r["qid"]: r for r in read_rows(path) if r["qid"] in wanted}
    todo = [item for item in items if key(item) not in done]
    lock = threading.Lock()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run_one(item):
        if stop.is_set():
            return None
        try:
            row = work(item)
        except LM_UNAVAILABLE as exc:
            stop.set()
            failure.append(exc)
            return None
        try:
            with lock:
                with path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
        except OSError as exc:  # disk full, folder removed: stop, never drop rows silently
            stop.set()
            failure.append(RunError(f"cannot write {path}: {exc.strerror or exc}"))
            return None
        if on_row:
            on_row(row)
        return row

    new_rows: list[dict[str, Any]] = []
    if todo:
        executor = ParallelExecutor(num_threads=num_threads, disable_progress_bar=not progress, max_errors=len(todo) + 1)
        new_rows = [r for r in executor.execute(run_one, todo) if r is not None]
    by_key = {**done, **{r["qid"]: r for r in new_rows}}
    rows = [by_key[key(item)] for item in items if key(item) in by_key]
    if failure:
        exc = failure[0]
        if isinstance(exc, RunError):
            raise RunError(f"{exc}; {len(rows)}/{len(items)} questions are saved; fix it and run again to resume")
        raise LMUnavailableError(
            f"the LM stopped answering or cannot be used ({lm_failure(exc)}); "
            f"{len(rows)}/{len(items)} questions are saved in {path}; run the same command again to resume"
        )
    return rows, len(done), len(new_rows)


def evaluate(
    program: dspy.Module,
    examples: Sequence[dspy.Example],
    run_dir: str | Path,
    method: str,
    num_threads: int = 1,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> EvalResult:
    """Run ``program`` over ``examples``, writing ``predictions.jsonl`` as it goes.

    Args:
        program: A method's module (``forward(question, options)``).
        examples: Questions (``dspy.Example`` with ``qid``).
        run_dir: Run folder prepared by :func:`prepare_run_dir`.
        method: Method name written in each row.
        num_threads: Questions in flight at once (DSPy's ``ParallelExecutor``);
            local llama.cpp models serialize calls, so 1 suits them.
        progress: Show a progress bar.
        on_row: Called with each new row after it is written.

    Returns:
        :class:`EvalResult` over every question of ``examples``.

    Raises:
        LMUnavailableError: the LM stopped answering; finished rows are kept.
        RunError: a row could not be written (disk full ...); finished rows are kept.
    """
    run_dir = Path(run_dir)

    def work(example: dspy.Example) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            pred = program(question=example.question, options=example.options)
            return prediction_row(example, pred, method, time.perf_counter() - t0)
        except LM_UNAVAILABLE:
            raise
        except Exception as exc:  # one broken question must not end the run
            return error_row(example, method, exc, time.perf_counter() - t0)

    try:
        rows, resumed, ran = resumable_map(
            examples, lambda e: e.qid, work, run_dir / PREDICTIONS, num_threads, progress, on_row
        )
    except HCQRError:
        write_metrics(run_dir, read_rows(run_dir / PREDICTIONS), {e.qid for e in examples})
        raise
    metrics = write_metrics(run_dir, rows)
    return EvalResult(rows=rows, metrics=metrics, resumed=resumed, ran=ran)


def write_metrics(run_dir: Path, rows: list[dict[str, Any]], keep: set[str] | None = None) -> dict[str, float]:
    """Summarize rows (those with qid in ``keep``, if given) into ``metrics.json``."""
    if keep is not None:
        rows = [r for r in rows if r["qid"] in keep]
    metrics = summarize(rows)
    (run_dir / METRICS).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics
