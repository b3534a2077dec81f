"""A run folder: every record of one evaluation, and the only code that reads or writes them.

Layout (one folder per evaluation)::

    config.json         the resolved configuration (method, program options, dataset and question
                        fingerprints, index, LM); written once, after every input was checked
    predictions.jsonl   one row per finished question, appended as it finishes (whole lines only)
    metrics.json        summary of the rows (:func:`hcqr_dspy.metrics.summarize`)
    judgments.jsonl     DUR judge labels, one per judged question (``hcqr judge``)
    sessions.jsonl      one record per ``hcqr eval`` / ``hcqr judge`` session that wrote here: machine,
                        library versions, LM engine, and how many records existed before it
                        (:mod:`hcqr_dspy.provenance`)
    dur.json            summary of the judgments (:func:`hcqr_dspy.dur.dur_metrics`)
    tracebacks/<qid>.txt
                        the traceback of a question whose program raised an error that is not a
                        bad LM reply (the run stopped there; nothing was saved for that question)

:class:`RunFolder` creates, reopens (resume) and reads these; ``evaluate``,
``dur``, ``compare``, ``experiment``, ``tracking`` and the CLI go through it.
:class:`JsonlTable` is the append-only, resumable record file under
``predictions.jsonl`` and ``judgments.jsonl``: rows are keyed by ``qid``, a
partial last line left by a killed writer is dropped and its item redone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import traceback
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

from hcqr_dspy.errors import DiskFullError, HCQRError, OutageError

CONFIG = "config.json"
PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
JUDGMENTS = "judgments.jsonl"
DUR_METRICS = "dur.json"
SESSIONS = "sessions.jsonl"
# The fields of a session record (:meth:`RunFolder.record_session`) and their JSON types.
SESSION_FIELDS: dict[str, type | tuple[type, ...]] = {
    "session": int, "command": str, "started": str, "machine": dict, "packages": dict,
    "engine": (dict, type(None)), "predictions_before": int, "judgments_before": int,
}
TRACEBACKS = "tracebacks"
# The writer lock of a folder (hidden: never logged as a record file).
WRITER_LOCK = ".writer.lock"
# Keys of config.json that may change between a run and its resumption.
MUTABLE_KEYS = ("mlflow_run_id",)


class RunError(HCQRError):
    """A run folder cannot be used: another configuration, not writable, unreadable or foreign records."""


class LMUnavailableError(OutageError):
    """The LM stopped answering (or cannot be used) mid-run; finished questions are saved."""


# errno values of a write that failed for lack of space: ENOSPC (device full), EDQUOT (quota), EFBIG (a file-size
# limit, RLIMIT_FSIZE). SQLite reports the same as "database or disk is full" (sqlite3 result code SQLITE_FULL).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full(exc: BaseException | None) -> BaseException | None:
    """The exception in ``exc``'s chain (itself, its ``__cause__``/``__context__``, an ``orig`` that SQLAlchemy
    wraps) that says the disk is full, or ``None``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return exc
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        if "database or disk is full" in str(exc) or "No space left on device" in str(exc):
            return exc
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return None


def disk_full_error(exc: BaseException, saved: str = "") -> DiskFullError:
    """The one-line stop of a run whose disk filled: what failed, what is saved, what to do."""
    cause = disk_full(exc) or exc
    if isinstance(cause, OSError) and cause.strerror:
        what = f"{cause.strerror}: {cause.filename}" if cause.filename else cause.strerror
    else:
        what = (str(cause).splitlines() or ["disk full"])[0][:200]
    return DiskFullError(f"the disk is full ({what}); {saved + '; ' if saved else ''}"
                         "free space and run the same command again to resume")


class ProgramError(HCQRError):
    """A program raised an error that is not a bad LM reply (a bug): the run stopped at that question.

    Attributes:
        qid: The question.
        traceback_file: Where its traceback was written.
    """

    def __init__(self, message: str, qid: str, traceback_file: Path | None):
        super().__init__(message)
        self.qid = qid
        self.traceback_file = traceback_file


class WriterLock:
    """One writer per folder, across processes: an exclusive ``fcntl.flock`` on ``<folder>/.writer.lock``.

    The lock file names its holder (pid, host, command, start time) so that a refused process can say who
    writes the folder, and is removed when the lock is released. The kernel drops a ``flock`` when its
    process dies, so a lock file left by a killed process is taken over at once (its stale label is
    overwritten). A process that locked a file another one removed meanwhile (released) locks again, so two
    writers never hold two files. Within one process the lock is re-entrant (an experiment evaluates, then
    judges, the same folder): it is released when the last holder releases it. POSIX only (``fcntl``); on a
    network file system ``flock`` is only as good as the server's locking.

    Args:
        folder: The folder written (it must exist).
        command: What writes it (``eval``, ``judge``, ``compile``), for the refusal message.
        lock_file: The lock file (default ``<folder>/.writer.lock``).
    """

    _held: dict[str, list] = {}  # resolved lock file -> [open lock file, holders in this process]
    _guard = threading.Lock()

    def __init__(self, folder: str | Path, command: str, lock_file: str | Path | None = None):
        self.folder = Path(folder)
        self.command = command
        self.file = Path(lock_file) if lock_file else self.folder / WRITER_LOCK
        self.key = str(self.file.resolve())

    def acquire(self) -> "WriterLock":
        """Take the lock, or refuse.

        Raises:
            RunError: another live process holds it (its pid, host, command and start named), or the lock file
                cannot be created.
        """
        import fcntl
        import socket
        from datetime import datetime, timezone

        with self._guard:
            if self.key in self._held:
                self._held[self.key][1] += 1
                return self
            while True:
                try:
                    fh = open(self.file, "a+", encoding="utf-8")
                except OSError as exc:
                    raise RunError(f"cannot lock {self.folder}: {exc.strerror or exc}") from None
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    fh.seek(0)
                    holder = _holder(fh.read())
                    fh.close()
                    raise RunError(f"{self.folder} is being written by another process ({holder}); wait for it to "
                                   "finish or stop it, or use another folder") from None
                try:
                    if os.stat(self.file).st_ino == os.fstat(fh.fileno()).st_ino:
                        break
                except FileNotFoundError:
                    pass
                fh.close()  # the holder released and removed this file between our open and our lock: again
            info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                    "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            try:
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(info) + "\n")
                fh.flush()
            except OSError:
                pass  # the lock holds without its label (a full disk); a refused process then says "holder unknown"
            self._held[self.key] = [fh, 1]
        return self

    def release(self) -> None:
        """Give the lock up: the last holder in this process removes the lock file, then closes it (which drops
        the ``flock``)."""
        with self._guard:
            held = self._held.get(self.key)
            if held is None:
                return
            held[1] -= 1
            if held[1] == 0:
                del self._held[self.key]
                with contextlib.suppress(OSError):
                    self.file.unlink()
                held[0].close()

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(text: str) -> str:
    """``pid 123 on host h, `hcqr eval` since 2026-...`` from a lock file's label (``unknown`` if unreadable)."""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, `hcqr {info['command']}` since {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def write_probe(folder: Path) -> None:
    """Create ``folder`` if needed, then write and delete a probe file in it.

    Raises:
        OSError: the folder cannot be created or written (read-only or full disk, ``/proc`` ...).
    """
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-test-{os.getpid()}"
    probe.write_text("ok")
    probe.unlink()


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsynced and renamed over it:
    a reader sees the old file or the new one, never half of one.

    Raises:
        DiskFullError: the disk is full (the temporary file is removed). OSError: another write failure.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if disk_full(exc):
            raise disk_full_error(exc) from None
        raise


def read_json_object(file: Path, what: str = "file") -> dict[str, Any]:
    """A JSON object from ``file``.

    Raises:
        RunError: unreadable, not UTF-8, not JSON or not an object (one line naming the file).
    """
    from hcqr_dspy.config import read_json

    value = read_json(file, RunError, what, hint="repair it or run the step that writes it again")
    if not isinstance(value, dict):
        raise RunError(f"{file} is not a JSON object; repair it or run the step that writes it again")
    return value


def question_fingerprint(examples: Sequence[Any]) -> dict[str, Any]:
    """What identifies a question set: its ids and its content.

    Returns:
        ``count``; ``ids_sha256`` (SHA-256 of the ids, one per line, in order);
        ``content_sha256`` (SHA-256 of each question's id, text, options and
        answer as canonical JSON, one per line, in order): two runs over files
        that reuse ids for other questions differ here.
    """
    ids = [str(e.qid) for e in examples]
    content = "\n".join(
        json.dumps([str(e.qid), e.question, dict(e.options), e.answer], sort_keys=True, ensure_ascii=False) for e in examples
    )
    return {
        "count": len(ids),
        "ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
        "content_sha256": hashlib.sha256(content.encode("utf-8")).hexdigest(),
    }


class JsonlTable:
    """An append-only JSONL file of records keyed by ``qid``, written by several threads, resumable.

    Args:
        path: The file (created on the first append).
        what: What a record is, for messages (``"prediction"``, ``"judgment"``).
        key: The field every record must have (``qid``; ``session`` for ``sessions.jsonl``).
    """

    def __init__(self, path: Path, what: str = "record", key: str = "qid"):
        self.path = Path(path)
        self.what = what
        self.key = key
        self._lock = threading.Lock()

    def read(self) -> list[dict[str, Any]]:
        """The records, in file order; a partial last line (killed writer) is left out.

        Raises:
            RunError: a line that is not UTF-8, not JSON, or not a record with a ``qid``
                (file and line named).
        """
        rows: list[dict[str, Any]] = []
        if not self.path.exists():
            return rows
        with self.path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):
                    break  # partial write of a killed process: its item is redone
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise RunError(f"{self.path}:{lineno}: not valid UTF-8 (byte {exc.start}); "
                                   "repair or delete that line") from None
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RunError(f"{self.path}:{lineno}: not a valid record ({exc.msg}); repair or delete that line") from None
                if not isinstance(row, dict) or self.key not in row:
                    raise RunError(f"{self.path}:{lineno}: not a {self.what} record (no {self.key}); "
                                   "repair or delete that line")
                rows.append(row)
        return rows

    def drop_partial_tail(self) -> None:
        """Cut a partial last line (a killed writer's) so the next append starts on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, row: dict[str, Any]) -> None:
        """Append one record as one line, flushed and fsynced (thread-safe). A write that fails part-way
        (disk full) is cut back to the last whole line, so the file stays whole.

        Raises:
            OSError: the write failed (disk full, folder removed ...).
        """
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError as exc:
                    try:
                        os.ftruncate(fd, start)
                    except OSError:
                        pass  # a partial last line is dropped by read() and cut by drop_partial_tail()
                    if exc.filename is None:
                        exc.filename = str(self.path)
                    raise
            finally:
                os.close(fd)

    def map(
        self,
        items: Sequence[Any],
        key: Callable[[Any], str],
        work: Callable[[Any], dict[str, Any]],
        stop_errors: tuple[type[BaseException], ...],
        num_threads: int = 1,
        progress: bool = True,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        on_error: Callable[[Any, BaseException], BaseException] | None = None,
    ) -> tuple[list[dict[str, Any]], int, int]:
        """Apply ``work`` to each item without a record yet, appending each record as it finishes.

        Items run in DSPy's ``ParallelExecutor`` (``num_threads`` at once). The
        first failure stops the map: items in flight finish, no new item starts,
        and finished records are kept. An error in ``stop_errors`` (the LM is not
        answering) becomes :class:`LMUnavailableError`; a failed write becomes
        :class:`RunError`; any other exception is passed to ``on_error(item, exc)``,
        whose returned exception is raised (default: re-raised as it is).

        Returns:
            ``(records in item order, resumed count, run-now count)``.

        Raises:
            LMUnavailableError, RunError, or what ``on_error`` returns.
        """
        from dspy.utils.parallelizer import ParallelExecutor

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.drop_partial_tail()
        wanted = {key(item) for item in items}
        done = {r["qid"]: r for r in self.read() if r["qid"] in wanted}
        todo = [item for item in items if key(item) not in done]
        stop = threading.Event()
        failure: list[tuple[Any, BaseException]] = []

        def run_one(item):
            if stop.is_set():
                return None
            try:
                row = work(item)
            except BaseException as exc:  # noqa: BLE001 - every failure stops the map; classified below
                stop.set()
                failure.append((item, exc))
                return None
            try:
                self.append(row)
            except OSError as exc:  # disk full, folder removed: stop, never drop rows silently
                stop.set()
                failure.append((item, exc if disk_full(exc) else RunError(f"cannot write {self.path}: {exc.strerror or exc}")))
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
            item, exc = failure[0]
            saved = f"{len(rows)}/{len(items)} {self.what}s are saved in {self.path}"
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
        return rows, len(done), len(new_rows)


def lm_failure(exc: BaseException) -> str:
    """``"<error type>: <first line of the message>"`` (at most 300 characters) for one-line stop messages."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"


class RunFolder:
    """One evaluation's folder (see the module docstring for its files).

    Use :meth:`create` to start or resume a run with a configuration, and
    :meth:`open` to read a finished or partial one.

    Example:
        >>> folder = RunFolder.open("runs/medqa/hcqr-local-n100-s0-1a2b3c4d")
        >>> folder.method, folder.dataset_name, len(folder.rows())
        ('hcqr', 'medqa', 100)
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.predictions = JsonlTable(self.path / PREDICTIONS, "question")
        self.judgments_table = JsonlTable(self.path / JUDGMENTS, "judgment")
        self.sessions_table = JsonlTable(self.path / SESSIONS, "session", key="session")
        self.writer: WriterLock | None = None
        self._made: list[Path] = []  # folders claim() created, removed by release() until start()

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # -- creating and opening -------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, config: dict[str, Any], command: str = "eval") -> "RunFolder":
        """:meth:`claim` the folder for ``command`` and :meth:`start` it with ``config`` (released again if that
        fails); hold it until :meth:`release`.

        Raises:
            RunError: see :meth:`claim` and :meth:`start`.
        """
        folder = cls.claim(path, command)
        try:
            folder.start(config)
        except BaseException:
            folder.release()
            raise
        return folder

    @classmethod
    def claim(cls, path: str | Path, command: str = "eval") -> "RunFolder":
        """Become the folder's one writer before anything is written or any LM is asked: the folder is
        created if needed and its :class:`WriterLock` taken for ``command``. Until :meth:`start`,
        :meth:`release` removes again the folders this call created (a refused command leaves nothing).

        Raises:
            RunError: another live process writes the folder (its pid, host and command named), the path is
                a file, or the folder is not writable.
        """
        folder = cls(path)
        if folder.path.exists() and not folder.path.is_dir():
            raise RunError(f"run folder {folder.path} is a file; give --run-dir a folder")
        made = [p for p in (folder.path, *folder.path.parents) if not p.exists()]
        try:
            write_probe(folder.path)
        except OSError as exc:
            _remove_empty(made)
            raise RunError(f"run folder {folder.path} is not writable: {exc.strerror or exc}") from None
        try:
            folder.writer = WriterLock(folder.path, command).acquire()
        except RunError:
            _remove_empty(made)
            raise
        folder._made = made
        return folder

    def start(self, config: dict[str, Any]) -> None:
        """Write ``config`` into a claimed folder, or check it against the one there (resume).

        Call only after every input (LM, index, questions, program) has been checked: this is the first
        write of the run.

        Raises:
            RunError: its ``config.json`` differs in any key other than those in :data:`MUTABLE_KEYS` (the
                differing keys are named; a key absent on one side and ``None`` on the other is no
                difference), or is unreadable.
        """
        self._start(config)
        self._made = []

    def _start(self, config: dict[str, Any]) -> None:
        folder = self
        cpath = folder.path / CONFIG
        if cpath.exists():
            old = read_json_object(cpath, "run configuration")
            keys = sorted(k for k in set(old) | set(config)
                          if k not in MUTABLE_KEYS and _without_nones(old.get(k)) != _without_nones(config.get(k)))
            if keys:
                raise RunError(
                    f"run folder {folder.path} holds a run with another configuration (differs in: {', '.join(keys)}); "
                    "use another --run-dir or remove it"
                )
            config = {**config, **{k: old.get(k) for k in MUTABLE_KEYS}}
        folder._write_config(config)

    def release(self) -> None:
        """Release the writer lock taken by :meth:`claim` (no-op for a folder opened to read); a folder claimed
        but never started is removed again if this process created it."""
        if self.writer is not None:
            self.writer.release()
            self.writer = None
        _remove_empty(self._made)
        self._made = []

    @classmethod
    def open(cls, path: str | Path) -> "RunFolder":
        """An existing run folder (it needs ``config.json``).

        Raises:
            RunError: not a run folder, or an unreadable ``config.json``.
        """
        folder = cls(path)
        if not folder.path.exists():
            raise RunError(f"run folder {folder.path} does not exist")
        if not (folder.path / CONFIG).is_file():
            raise RunError(f"{folder.path} is not a run folder (no {CONFIG}; made by `hcqr eval`)")
        _ = folder.config  # read and check it now
        return folder

    def _write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.path / CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.__dict__.pop("config", None)

    # -- configuration -------------------------------------------------------
    @cached_property
    def config(self) -> dict[str, Any]:
        """The run's configuration.

        Raises:
            RunError: unreadable, or lacking ``method`` or ``dataset``.
        """
        config = read_json_object(self.path / CONFIG, "run configuration")
        missing = [k for k in ("method", "dataset") if not config.get(k)]
        if missing:
            raise RunError(f"{self.path / CONFIG} lacks {', '.join(missing)}: not written by `hcqr eval`")
        return config

    @property
    def method(self) -> str:
        return self.config["method"]

    @property
    def dataset(self) -> str:
        """The dataset file (absolute path) or hub name the run read its questions from."""
        return self.config["dataset"]

    @property
    def dataset_name(self) -> str:
        """The dataset's name: the file stem (``medqa``) or the hub name."""
        return Path(self.dataset).stem if Path(self.dataset).suffix else self.dataset

    @property
    def questions_record(self) -> dict[str, Any]:
        """``count``, ``limit``, ``seed``, ``ids_sha256``, (runs since 0.2) ``content_sha256``, and
        ``labelled: false`` for questions read without gold answers (``hcqr predict``)."""
        return self.config.get("questions") or {}

    @property
    def lm_spec(self) -> str | None:
        return (self.config.get("lm") or {}).get("spec")

    @property
    def index_path(self) -> str | None:
        """The index folder the run retrieved from; ``None`` for methods without retrieval."""
        return (self.config.get("index") or {}).get("path")

    @property
    def saved_program(self) -> dict[str, Any] | None:
        return self.config.get("saved_program")

    @property
    def mlflow_run_id(self) -> str | None:
        return self.config.get("mlflow_run_id")

    def set_mlflow_run_id(self, run_id: str | None) -> None:
        """Record the MLflow run that tracks this folder (kept when the run resumes)."""
        if run_id != self.mlflow_run_id:
            self._write_config({**self.config, "mlflow_run_id": run_id})

    def load_questions(self) -> dict[str, Any]:
        """The run's questions (from its dataset), by id.

        Raises:
            RunError: the dataset cannot be read any more, or its questions are not
                the ones the run was made with (content fingerprint differs).
        """
        from hcqr_dspy.data import load_questions

        try:
            questions = load_questions(self.dataset, labelled=self.questions_record.get("labelled", True))
        except HCQRError as exc:
            raise RunError(f"run {self.path}: its dataset cannot be read ({exc})") from None
        by_id = {q.qid: q for q in questions}
        rows = self.rows()
        missing = [r["qid"] for r in rows if r["qid"] not in by_id]
        if missing:
            raise RunError(f"run {self.path}: question(s) {', '.join(missing[:5])} are not in {self.dataset} any more")
        return by_id

    def question_sample(self) -> list[str]:
        """Ids of every question the run was asked to answer, in run order, finished or not.

        Rebuilt from the dataset with the run's recorded ``limit`` and ``seed``
        (:func:`hcqr_dspy.data.select`) and checked against the recorded
        ``ids_sha256``, so two runs over the same sample give the same list
        however far each has got.

        Raises:
            RunError: the dataset cannot be read, or the rebuilt sample is not the
                recorded one (a run made with an explicit id list, or a changed file).
        """
        from hcqr_dspy.data import select

        record = self.questions_record
        by_id = self.load_questions()
        sample = select(list(by_id.values()), limit=record.get("limit"), seed=record.get("seed") or 0)
        if question_fingerprint(sample)["ids_sha256"] != record.get("ids_sha256"):
            raise RunError(f"run {self.path}: its question sample cannot be rebuilt from {self.dataset} with limit "
                           f"{record.get('limit')} and seed {record.get('seed')} (made with an explicit id list?); "
                           "name the questions with --ids")
        return [str(e.qid) for e in sample]

    # -- records --------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """The prediction rows (one per finished question), in file order.

        Raises:
            RunError: a question is recorded twice (an edited or concatenated file).
        """
        rows = self.predictions.read()
        seen: set[str] = set()
        for r in rows:
            if r["qid"] in seen:
                raise RunError(f"{self.predictions.path}: question {r['qid']!r} is recorded twice; delete one of the lines")
            seen.add(r["qid"])
        return rows

    def judgments(self) -> list[dict[str, Any]]:
        """DUR judgments, checked against the rows: malformed, repeated or foreign ones are refused.

        Raises:
            RunError: a judgment lacks ``valid``/``label``/``passage_queries``, a question is judged
                twice, or judgments name questions this run does not hold.
        """
        judgments = self.judgments_table.read()
        file = self.judgments_table.path
        seen: set[str] = set()
        for j in judgments:
            if not isinstance(j.get("valid"), bool) or "label" not in j or not isinstance(j.get("passage_queries"), list):
                raise RunError(f"{file}: the judgment of {j['qid']!r} lacks 'valid', 'label' or 'passage_queries' "
                               "(not written by `hcqr judge`); repair or delete that line")
            if j["qid"] in seen:
                raise RunError(f"{file}: question {j['qid']!r} is judged twice; delete one of the lines")
            seen.add(j["qid"])
        foreign = sorted(seen - {r["qid"] for r in self.rows()})
        if foreign:
            raise RunError(f"{file} judges {len(foreign)} question(s) this run does not hold ({', '.join(foreign[:5])}); "
                           "was it copied from another run?")
        return judgments

    def record_session(self, command: str, lm: Any = None) -> dict[str, Any]:
        """Append this session's record to ``sessions.jsonl`` (:func:`hcqr_dspy.provenance.session_record`),
        numbered after the existing ones, with how many predictions and judgments the folder held before it.

        Returns:
            The record written.

        Raises:
            RunError: ``sessions.jsonl`` is malformed, or cannot be written.
        """
        from hcqr_dspy.provenance import session_record

        previous = self.sessions()
        record = {"session": len(previous) + 1, **session_record(command, lm),
                  "predictions_before": len(self.predictions.read()), "judgments_before": len(self.judgments_table.read())}
        self.sessions_table.drop_partial_tail()
        try:
            self.sessions_table.append(record)
        except OSError as exc:
            raise RunError(f"cannot write {self.sessions_table.path}: {exc.strerror or exc}") from None
        return record

    def sessions(self) -> list[dict[str, Any]]:
        """The sessions that wrote this folder, oldest first (empty for folders written before sessions were recorded).

        Raises:
            RunError: a line that is not a session record, or one whose fields have the wrong types
                (file and line named).
        """
        records = self.sessions_table.read()
        for lineno, record in enumerate(records, start=1):
            wrong = [name for name, kinds in SESSION_FIELDS.items() if not isinstance(record.get(name), kinds)
                     or isinstance(record.get(name), bool)]
            if wrong:
                raise RunError(f"{self.sessions_table.path}: session record {lineno} has missing or malformed "
                               f"{', '.join(wrong)} (not written by hcqr-dspy); repair or delete that line")
        return records

    def write_json(self, name: str, value: dict[str, Any]) -> Path:
        """Write a summary file (``metrics.json``, ``dur.json`` ...) of this folder atomically (a temporary
        file renamed over it), so a failed write (disk full) leaves the previous version whole.

        Raises:
            DiskFullError: the disk is full. OSError: another write failure.
        """
        path = self.path / name
        atomic_write_text(path, json.dumps(value, indent=2) + "\n")
        return path

    def read_json(self, name: str) -> dict[str, Any]:
        """A summary file of this folder, ``{}`` when absent.

        Raises:
            RunError: present but unreadable.
        """
        path = self.path / name
        return read_json_object(path) if path.is_file() else {}

    def write_metrics(self, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Summarize ``rows`` (default: all saved rows) into ``metrics.json``."""
        from hcqr_dspy.metrics import summarize

        metrics = summarize(self.rows() if rows is None else rows)
        self.write_json(METRICS, metrics)
        return metrics

    def save_traceback(self, qid: str, exc: BaseException) -> Path | None:
        """Write ``exc``'s traceback to ``tracebacks/<qid>.txt``; ``None`` if that cannot be written."""
        folder = self.path / TRACEBACKS
        try:
            folder.mkdir(exist_ok=True)
            path = folder / f"{_safe_name(qid)}.txt"
            path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
            return path
        except OSError:
            return None

    def clear_traceback(self, qid: str) -> None:
        """Remove ``tracebacks/<qid>.txt`` (the question has a row now), and the folder once it is empty."""
        folder = self.path / TRACEBACKS
        path = folder / f"{_safe_name(qid)}.txt"
        if path.is_file():
            path.unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty

    def files(self) -> list[Path]:
        """The folder's record files (for artifact logging): top-level files, not hidden ones."""
        return sorted(f for f in self.path.iterdir() if f.is_file() and not f.name.startswith("."))


def _remove_empty(folders: Sequence[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _safe_name(qid: str) -> str:
    """A question id as a file name: characters other than letters, digits, ``-_.`` become ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(qid)) or "question"


def _without_nones(value: Any) -> Any:
    """``value`` with ``None``-valued keys dropped at every depth: a setting a newer version records
    with its default ``None`` matches a configuration written before that setting existed."""
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    return value


def check_same_questions(folders: Sequence[RunFolder], rows: Sequence[list[dict[str, Any]]],
                         common: bool = False) -> list[str]:
    """The shared question ids (in the first run's order) of runs that must cover the same questions.

    Two runs match when they were made over the same questions: the content
    fingerprint of their question sets (ids, text, options, answer;
    :func:`question_fingerprint`) is equal. Runs recorded before content
    fingerprints existed are matched by dataset and id hash. They must also hold
    the same question ids, unless ``common`` is set: then runs still under way
    (a study resumed session by session) are compared on the questions every one
    of them has answered.

    Raises:
        RunError: another question set (datasets and fingerprints named); different
            ids without ``common``; no question answered by every run with it.
    """
    first = [r["qid"] for r in rows[0]]
    q0 = folders[0].questions_record
    shared = set(first)
    for folder, run_rows in zip(folders[1:], rows[1:]):
        ids = [r["qid"] for r in run_rows]
        if set(ids) != set(first) and not common:
            only_a = sorted(set(first) - set(ids))[:5]
            only_b = sorted(set(ids) - set(first))[:5]
            raise RunError(
                f"runs cover different questions: {folders[0].path} ({len(first)}) vs {folder.path} ({len(ids)}); "
                f"only in the first: {only_a or '-'}; only in the second: {only_b or '-'}. "
                "Compare runs made with the same dataset, --limit/--seed or --ids (finish interrupted runs first, "
                "or compare runs under way on the questions all have answered with --common)."
            )
        shared &= set(ids)
        q = folder.questions_record
        a, b = q0.get("content_sha256"), q.get("content_sha256")
        same = a == b if a and b else (folders[0].dataset == folder.dataset and q0.get("ids_sha256") == q.get("ids_sha256"))
        if not same:
            what = "share question ids but not questions" if set(ids) & set(first) else "were made over other questions"
            raise RunError(
                f"runs {what}: {folders[0].path} was made over {folders[0].dataset} "
                f"(questions {str(a or q0.get('ids_sha256'))[:12]}), {folder.path} over {folder.dataset} "
                f"(questions {str(b or q.get('ids_sha256'))[:12]}); a paired comparison needs the same questions"
            )
    if not shared:
        raise RunError("no question has been answered by every run: " + ", ".join(str(f.path) for f in folders))
    return [qid for qid in first if qid in shared]
