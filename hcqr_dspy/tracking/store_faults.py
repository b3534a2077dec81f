"""The MLflow store as a dependency that fails: another process holding its SQLite file locked, a disk that fills
under it, a file that is not a whole MLflow database (a truncated copy, a damaged file).

* A lock is waited for. MLflow's SQLAlchemy store sets SQLite's busy timeout to 20 s on every session
  (``PRAGMA busy_timeout = 20000`` in ``mlflow.store.db.utils``); in an hcqr process each statement waits
  ``$HCQR_MLFLOW_LOCK_SECONDS`` (:data:`DEFAULT_LOCK_SECONDS`) instead, new connections included, before it fails
  with "database is locked".
* A failure met where MLflow writes traces in the background (its trace exporter's worker threads) reaches no
  caller: MLflow logs it through ``logging``, with SQLAlchemy tracebacks whose SQL parameters hold prompt text.
  Those records are kept off stderr and counted (:data:`WATCH`); the traces they lose are rebuilt from the run
  folder's rows (:mod:`hcqr_dspy.tracking.trace_repair`).
* A lock that outlasted the whole wait, or a full disk, is an outage: :data:`WATCH` keeps it as the one-line error
  to stop with, stops the run at its next question (:func:`~hcqr_dspy.tracking.question_traces.stop_questions`), and
  every later statement gives up at once on a lock instead of waiting again (pending trace exports, the run's own end).
* :func:`store_error` turns a failed MLflow call into that one-line error: :class:`~hcqr_dspy.errors.StoreLockedError`,
  :class:`~hcqr_dspy.errors.DiskFullError`, or an :class:`~hcqr_dspy.errors.HCQRError` for a malformed or read-only
  file.

The SQLAlchemy listeners are process-wide (every engine; they act on SQLite connections only) and installed once
(:func:`install`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import threading
import time

from hcqr_dspy.errors import DiskFullError, HCQRError, StoreLockedError
from hcqr_dspy.evaluation.outages import disk_full, disk_full_error
from hcqr_dspy.tracking import question_traces

LOCK_SECONDS_VAR = "HCQR_MLFLOW_LOCK_SECONDS"
DEFAULT_LOCK_SECONDS = 60.0
# SQLite's own messages, by the kind of failure :func:`store_fault` names
_MESSAGES = {
    "locked": ("database is locked", "database table is locked"),
    "full": ("database or disk is full",),
    "malformed": ("database disk image is malformed", "file is not a database"),
    "read-only": ("attempt to write a readonly database",),
}
# A log record of MLflow's that carries one of them (SQLAlchemy prefixes the driver's message with its class)
_RECORD = re.compile(r"\(sqlite3\.\w+\) (" + "|".join(m for ms in _MESSAGES.values() for m in ms) + ")")
# MLflow's loggers that report store failures met in the background (the trace exporter, its queue) or log every
# SQLAlchemy error with its traceback before raising it to the caller (``mlflow.store.db.utils``)
QUIETED = (
    "mlflow.store.db.utils",
    "mlflow.tracing.export.mlflow_v3",
    "mlflow.tracing.export.async_export_queue",
    "mlflow.tracing.client",
)
_STARTED = "hcqr_statement_started"  # where a connection's info keeps when its last statement began


def lock_seconds() -> float:
    """How long a statement waits for another process's lock on the store: ``$HCQR_MLFLOW_LOCK_SECONDS``, else
    :data:`DEFAULT_LOCK_SECONDS`.

    Raises:
        HCQRError: the variable is not a number of seconds >= 0.
    """
    text = os.environ.get(LOCK_SECONDS_VAR, "").strip()
    if not text:
        return DEFAULT_LOCK_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise HCQRError(
            f"${LOCK_SECONDS_VAR}={text!r}: expected a number of seconds >= 0 (default {DEFAULT_LOCK_SECONDS:g})"
        )
    return value


def store_fault(exc: BaseException | None) -> str | None:
    """What failed in ``exc``'s chain (``__cause__``, ``__context__``, SQLAlchemy's ``orig``): ``"locked"``,
    ``"full"`` (:func:`~hcqr_dspy.evaluation.outages.disk_full`), ``"malformed"`` or ``"read-only"``, read from
    the SQLite driver's own error; ``None`` for anything else."""
    if disk_full(exc) is not None:
        return "full"
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sqlite3.Error):
            return _kind(str(exc))
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return None


def _kind(message: str) -> str | None:
    return next((kind for kind, texts in _MESSAGES.items() if any(t in message for t in texts)), None)


def store_error(exc: BaseException, where: str, saved: str | None = None) -> HCQRError | None:
    """The one-line error of an MLflow call that failed on the store at ``where`` (a folder or URI), ``None`` when
    the failure is not the store's (:func:`store_fault`).

    Args:
        exc: What the call raised.
        where: The store, as the message names it.
        saved: What is saved (``"3/6 questions are saved in ..."``) when a run stops mid-way: the message then
            says to run the same command again to resume; ``None`` before anything was written.
    """
    kind = store_fault(exc)
    if kind == "full":
        return disk_full_error(exc, f"{saved + '; ' if saved else ''}the MLflow store is {where}")
    if kind == "locked":
        then = (
            f"{saved}; run the same command again to resume" if saved else "run the same command again once it is free"
        )
        return StoreLockedError(f"{lock_message(where, WATCH.wait)}; {then}")
    if kind is None:
        return None
    what = (str(_sqlite_error(exc) or exc).splitlines() or [""])[0][:200]
    if kind == "read-only":
        return HCQRError(
            f"the MLflow store {where} is read-only ({what}); `hcqr ui`, `hcqr prompts` and `hcqr served` can browse "
            f"it, a command that records runs needs a store it can write (--mlflow-dir){'; ' + saved if saved else ''}"
        )
    return HCQRError(
        f"the MLflow store {where} is not a whole MLflow database ({what}); restore its mlflow.db from a copy or give "
        f"--mlflow-dir another folder{'; ' + saved if saved else ''}"
    )


def lock_message(where: str, seconds: float) -> str:
    """The first part of a lock's one-line error: the store, how long it was waited for, and the variable."""
    return (
        f"the MLflow store {where} stayed locked by another process for {seconds:g} s (database is locked; "
        f"${LOCK_SECONDS_VAR} sets how long to wait)"
    )


def _sqlite_error(exc: BaseException | None) -> BaseException | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sqlite3.Error):
            return exc
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return None


class StoreWatch:
    """What this process met on its MLflow store since :meth:`reset`: the outage to stop with (``failure``), the
    question traces MLflow could not write (``lost_traces``) and the statements that failed (``failed_statements``).

    Attributes:
        where: The store the messages name (set by :func:`hcqr_dspy.tracking.store.configure`).
        wait: Seconds a statement waits for a lock (:func:`lock_seconds`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.where = "mlruns"
        self.wait = DEFAULT_LOCK_SECONDS
        self.failure: HCQRError | None = None
        self.lost_traces = 0
        self.failed_statements = 0

    def reset(self) -> None:
        """Forget what was met (a new evaluation starts) and lift the stop of
        :func:`~hcqr_dspy.tracking.question_traces.question`."""
        with self._lock:
            self.failure, self.lost_traces, self.failed_statements = None, 0, 0
        question_traces.stop_questions(None)

    def busy_ms(self) -> int:
        """The busy timeout of the next statement: the whole wait, or none once a lock outlasted it."""
        return 0 if isinstance(self.failure, StoreLockedError) else int(self.wait * 1000)

    def met(self, kind: str, waited: float) -> None:
        """Record a failed statement of kind ``kind`` (:func:`store_fault`) that waited ``waited`` seconds; a lock
        held through the whole wait, or a full disk, becomes the outage to stop with (the first one is kept)."""
        with self._lock:
            self.failed_statements += 1
            if self.failure is not None:
                return
            if kind == "locked" and waited >= 0.9 * self.wait:
                self.failure = StoreLockedError(lock_message(self.where, self.wait))
            elif kind == "full":
                self.failure = DiskFullError(f"database or disk is full: the MLflow store {self.where}")
            else:
                return  # a lock refused at once (SQLite avoiding a deadlock between this process's connections)
            failure = self.failure
        question_traces.stop_questions(failure)

    def stop_if_failed(self, saved: str) -> None:
        """Raise the outage met on the store since :meth:`reset` (in the background too), saying ``saved`` (what
        is saved) and to run the same command again; nothing when none was met.

        Raises:
            StoreLockedError: a lock outlasted the wait.
            DiskFullError: the store's disk is full.
        """
        failure = self.failure
        if isinstance(failure, DiskFullError):
            raise disk_full_error(failure, saved)
        if failure is not None:
            raise type(failure)(f"{failure}; {saved}; run the same command again to resume")

    def lost_trace(self) -> None:
        with self._lock:
            self.lost_traces += 1


WATCH = StoreWatch()
_installed: list[bool] = []


class QuietStoreFailures(logging.Filter):
    """Drops (and counts in :data:`WATCH`) MLflow's log records of store failures: every record of
    ``mlflow.store.db.utils`` (it logs each SQLAlchemy error with its traceback, then raises it to its caller),
    and the trace exporter's records whose message carries SQLite's failure; others pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "mlflow.store.db.utils":
            return False
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format: not ours to judge
            return True
        if not _RECORD.search(message):
            return True
        if "trace" in message.lower():
            WATCH.lost_trace()
        return False


def install() -> None:
    """Install, once per process, the SQLAlchemy listeners (the busy timeout, failures met) and the logging
    filter :class:`QuietStoreFailures` on :data:`QUIETED`; read the wait (:func:`lock_seconds`) every call.

    Raises:
        HCQRError: ``$HCQR_MLFLOW_LOCK_SECONDS`` is malformed.
    """
    WATCH.wait = lock_seconds()
    if _installed:
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    event.listen(Pool, "connect", _on_connect)
    event.listen(Engine, "before_cursor_execute", _before_statement, retval=True)
    event.listen(Engine, "commit", _before_commit)
    event.listen(Engine, "handle_error", _on_error)
    quiet = QuietStoreFailures()
    for name in QUIETED:
        logging.getLogger(name).addFilter(quiet)
    _installed.append(True)


def _on_connect(dbapi_connection, _record) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute(f"PRAGMA busy_timeout = {WATCH.busy_ms()}")


def _before_statement(conn, _cursor, statement, parameters, _context, _executemany):
    conn.info[_STARTED] = time.monotonic()
    if statement.startswith("PRAGMA busy_timeout") and conn.dialect.name == "sqlite":
        statement = f"PRAGMA busy_timeout = {WATCH.busy_ms()};"
    return statement, parameters


def _before_commit(conn) -> None:
    conn.info[_STARTED] = time.monotonic()


def _on_error(context) -> None:
    error = context.original_exception
    if not isinstance(error, sqlite3.Error):
        return
    kind = _kind(str(error))
    if kind is None:
        return
    try:
        started = context.connection.info.get(_STARTED) if context.connection is not None else None
    except Exception:  # a connection SQLAlchemy has invalidated: when it began is unknown
        started = None
    WATCH.met(kind, time.monotonic() - started if started is not None else 0.0)
