"""The resumable parallel run loop: apply a function to every item that has no record yet in a
:class:`~hcqr_dspy.evaluation.records.JsonlTable`, appending each record as it finishes, and stop the whole loop
on the first failure with one line that says what is saved (:func:`run_resumable`).

``evaluate`` runs programs over questions with it, ``hcqr judge`` its judge over a run's rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from dspy.utils.parallelizer import ParallelExecutor

from hcqr_dspy.errors import LMUnavailableError, OutageError, RunError
from hcqr_dspy.evaluation.outages import disk_full, disk_full_error, lm_failure
from hcqr_dspy.evaluation.progress import ProgressReport
from hcqr_dspy.evaluation.records import JsonlTable
from hcqr_dspy.lm.memory import bounded_lm_memory, trim_global_history


def run_resumable(
    table: JsonlTable,
    items: Sequence[Any],
    key: Callable[[Any], str],
    work: Callable[[Any], dict[str, Any]],
    stop_errors: tuple[type[BaseException], ...],
    num_threads: int = 1,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    on_error: Callable[[Any, BaseException], BaseException] | None = None,
    collect: bool = True,
) -> tuple[list[dict[str, Any]], int, int]:
    """Apply ``work`` to each item without a record in ``table`` yet, appending each record as it finishes.

    Items run in DSPy's ``ParallelExecutor`` (``num_threads`` at once), with what DSPy keeps in memory per LM call
    bounded (:func:`~hcqr_dspy.lm.memory.bounded_lm_memory`: its response cache's memory tier, its histories, no DSPy
    trace), so the loop's memory does not grow with the items it has run (the records it returns do, unless
    ``collect`` is false: then it keeps their keys alone, a few dozen bytes an item). The
    first failure stops the loop: items in flight finish, no new item starts,
    and finished records are kept. An error in ``stop_errors`` (the LM is not
    answering) becomes :class:`~hcqr_dspy.errors.LMUnavailableError`; a failed write becomes
    :class:`~hcqr_dspy.errors.RunError` (:class:`~hcqr_dspy.errors.DiskFullError` on a full disk);
    any other exception is passed to ``on_error(item, exc)``, whose returned exception is raised
    (default: re-raised as it is).

    Args:
        table: Where the records are (one per item, under ``qid``); a partial last line is cut first.
        items: What to run, in order.
        key: An item's ``qid``.
        work: Makes an item's record (with ``qid``).
        stop_errors: The exceptions that mean the LM is not answering.
        num_threads: Items in flight at once.
        progress: Show the progress (:class:`~hcqr_dspy.evaluation.progress.ProgressReport`: a bar on a terminal,
            whole lines in a log, with the running accuracy of records that have ``correct``).
        on_row: Called with each new record after it is written.
        on_error: Turns an item's other exception into the one raised.
        collect: Return the records; ``False``: return none (``[]``), read them from ``table``.

    Returns:
        ``(records in item order or [], resumed count, run-now count)``.

    Raises:
        LMUnavailableError: ``work`` raised one of ``stop_errors``.
        DiskFullError: the disk filled (a record or a write of ``work``).
        RunError: a record could not be written for another reason.
        OutageError: ``work`` raised another outage (a retrieval backend down), said again with what is saved.
        Exception: what ``on_error`` returns for any other failure (default: that failure itself).
    """
    table.path.parent.mkdir(parents=True, exist_ok=True)
    table.drop_partial_tail()
    wanted = {key(item) for item in items}
    # the records saved before, by key (None: not collected)
    done = {r["qid"]: r if collect else None for r in table.iter() if r["qid"] in wanted}
    todo = [item for item in items if key(item) not in done]
    stop = threading.Event()
    failure: list[tuple[Any, BaseException]] = []
    started: set[str] = set()
    finished: dict[str, dict[str, Any] | None] = {}  # the records written now, by key (None: not collected)
    started_lock = threading.Lock()

    def run_one(item):
        if stop.is_set():
            return None
        with started_lock:  # one run, and one record, per item, whatever the executor does
            if key(item) in started:
                return None
            started.add(key(item))
        try:
            row = work(item)
        except BaseException as exc:  # noqa: BLE001 - every failure stops the loop; classified below
            stop.set()
            failure.append((item, exc))
            return None
        finally:
            trim_global_history()
        try:
            table.append(row)
        except OSError as exc:  # disk full, folder removed: stop, never drop rows silently
            stop.set()
            error = exc if disk_full(exc) else RunError(f"cannot write {table.path}: {exc.strerror or exc}")
            failure.append((item, error))
            return None
        with started_lock:
            finished[key(item)] = row if collect else None
        if on_row:
            on_row(row)
        if report is not None:
            report.row(row)
        return None  # the executor's results list would hold every record

    report = (
        ProgressReport(len(items), (r for r in table.iter() if r["qid"] in wanted), table.what)
        if progress and todo and ProgressReport.shown
        else None
    )
    if todo:
        # timeout=0: no straggler resubmission. DSPy's ParallelExecutor otherwise starts an item again once it has
        # run 120 s (its default ``timeout``) while at most 3 remain (dspy/utils/parallelizer.py, _execute_parallel),
        # which ran a question twice and recorded it twice (a slow remote LM with --threads 3).
        executor = ParallelExecutor(
            num_threads=num_threads, disable_progress_bar=True, max_errors=len(todo) + 1, timeout=0
        )
        try:
            with bounded_lm_memory():
                executor.execute(run_one, todo)
        finally:
            if report is not None:
                report.close()
    by_key = {**done, **finished}
    rows = [by_key[key(item)] for item in items if key(item) in by_key] if collect else []
    if failure:
        item, exc = failure[0]
        saved = f"{len(by_key)}/{len(items)} {table.what}s are saved in {table.path}"
        if disk_full(exc):
            raise disk_full_error(exc, saved) from None
        if isinstance(exc, OutageError):  # a retrieval backend that stayed down after its retries ...
            raise type(exc)(f"{exc}; {saved}; run the same command again to resume") from None
        if isinstance(exc, RunError):
            raise RunError(f"{exc}; {saved}; fix it and run again to resume")
        if isinstance(exc, stop_errors):
            raise LMUnavailableError(
                f"the LM stopped answering or cannot be used ({lm_failure(exc)}); {saved}; "
                "run the same command again to resume"
            )
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise (on_error(item, exc) if on_error else exc)
    return rows, len(done), len(finished)
