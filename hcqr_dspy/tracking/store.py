"""The MLflow store: where it is (``--mlflow-dir``, ``$HCQR_MLFLOW_DIR``, ``./mlruns`` or
``$MLFLOW_TRACKING_URI``), opening it with its experiment, finding a run in it, its file locks, and a full disk
met while writing to it.

The store is an SQLite database ``<dir>/mlflow.db`` with artifacts under ``<dir>/artifacts`` (MLflow 3's file
store is in maintenance mode).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from hcqr_dspy.errors import HCQRError, OutageError
from hcqr_dspy.evaluation.outages import disk_full, disk_full_error
from hcqr_dspy.tracking import store_faults
from hcqr_dspy.tracking.experiment_page import EXPERIMENT, set_experiment_page

log = logging.getLogger(__name__)

DEFAULT_DIR = "mlruns"


def store_dir(path: str | Path | None = None) -> Path:
    """The tracking folder: the argument, ``$HCQR_MLFLOW_DIR`` or ``./mlruns``."""
    return Path(path or os.environ.get("HCQR_MLFLOW_DIR") or DEFAULT_DIR).resolve()


def existing_store(path: str | Path | None, first: str) -> str:
    """Where the store is (its folder, or ``$MLFLOW_TRACKING_URI`` when that names it), when it exists there;
    nothing is created.

    The store is the one :func:`tracking_uri` names. An SQLite store must exist as a file; a store of
    another kind (an MLflow tracking server) is left for MLflow to reach.

    Raises:
        HCQRError: an SQLite store that does not exist (the message says to run ``first`` first), or an in-memory
            or malformed SQLite URI (:func:`sqlite_file`).
    """
    uri = tracking_uri(path)
    database = sqlite_file(uri)
    if database is None:
        return uri
    where = str(database.parent) if database.name == "mlflow.db" else uri
    if not database.is_file():
        raise HCQRError(f"no MLflow store at {where} yet; {first} first")
    return where


def tracking_uri(path: str | Path | None = None) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<store_dir>/mlflow.db``."""
    if os.environ.get("MLFLOW_TRACKING_URI") and path is None:
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{store_dir(path) / 'mlflow.db'}"


def configure(path: str | Path | None = None, experiment: str = EXPERIMENT, browse: bool = False) -> str:
    """Point MLflow at the store and select (creating if needed) the experiment.

    The experiment gets its description and the saved view of its runs table with the key metrics as
    columns (:func:`~hcqr_dspy.tracking.experiment_page.set_experiment_page`), and becomes the
    active experiment (traces made outside a run, such as the DUR judge's, are recorded there).

    Several processes may start on one new store at once (parallel
    evaluations): MLflow creates and migrates the SQLite schema on first use,
    and two processes doing it together fail ("table ... already exists").
    The first use is therefore serialized with an exclusive ``fcntl.flock``
    on ``.init.lock`` beside the SQLite file; afterwards SQLite's own locking suffices.
    (With ``$MLFLOW_TRACKING_URI`` pointing at a tracking server, the server
    does this and the lock is moot.) POSIX only (``fcntl``).

    A new experiment keeps its artifacts in ``artifacts/<experiment>`` beside the SQLite file (this project's
    store or one ``$MLFLOW_TRACKING_URI`` names); a tracking server's experiments use the server's own root.

    SQLite statements wait for another process's lock as :mod:`hcqr_dspy.tracking.store_faults` sets
    (``$HCQR_MLFLOW_LOCK_SECONDS``), and store failures met in the background are counted there, from this call
    on (:data:`~hcqr_dspy.tracking.store_faults.WATCH` forgets what was met before).

    Args:
        path: The store folder (:func:`store_dir`).
        experiment: The experiment's name.
        browse: Only read: an SQLite store this process cannot write (a read-only mount, an archived study) is
            opened as it is, with nothing created or written (no lock file, experiment or page); its experiment
            must exist. A writable store is configured as for writing.

    Returns:
        The experiment id.

    Raises:
        HCQRError: the store folder cannot be created or written (read-only and ``browse`` false); a read-only
            store without the experiment; an in-memory or malformed SQLite URI (:func:`sqlite_file`);
            ``$HCQR_MLFLOW_LOCK_SECONDS`` malformed.
    """
    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    uri = tracking_uri(path)
    database = sqlite_file(uri)
    store_faults.install()
    store_faults.WATCH.reset()  # a command (or an experiment's next cell) starts: what was met before is over
    store_faults.WATCH.where = str(database.parent) if database is not None and database.name == "mlflow.db" else uri
    if database is not None and database.is_file() and not writable(database):
        if not browse:
            raise read_only_error(database, store_faults.WATCH.where)
        return _browse(uri, experiment)
    lock = nullcontext()  # a tracking server creates its own schema
    if database is not None:
        try:
            database.parent.mkdir(parents=True, exist_ok=True)
            lock = open(database.parent / ".init.lock", "a")
        except OSError as exc:
            verb = "write to" if database.parent.is_dir() else "create"
            raise HCQRError(f"cannot {verb} MLflow folder {database.parent}: {exc.strerror}") from None
    with lock:
        if database is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        mlflow.set_tracking_uri(uri)
        found = mlflow.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            # beside an SQLite store's file, so that a store and its artifacts move together; a server's own root
            artifacts = None if database is None else (database.parent / "artifacts" / experiment).as_uri()
            experiment_id = mlflow.create_experiment(experiment, artifact_location=artifacts)
        set_experiment_page(mlflow.MlflowClient(), experiment_id)
    mlflow.set_experiment(experiment_id=experiment_id)  # traces made outside a run (judge calls) go here too
    return experiment_id


def writable(database: Path) -> bool:
    """Whether this process can write the SQLite file ``database`` and create its journal beside it."""
    return os.access(database, os.W_OK) and os.access(database.parent, os.W_OK)


def read_only_error(database: Path, where: str) -> HCQRError:
    """The one-line refusal of a store whose SQLite file ``database`` (at ``where``, as messages name the store)
    this process cannot write, by a command that records runs."""
    return HCQRError(
        f"the MLflow store {where} is read-only (this process cannot write {database.name} or its folder); "
        "`hcqr ui`, `hcqr prompts` and `hcqr served` can browse it, a command that records runs needs a store it "
        "can write: give --mlflow-dir another folder"
    )


def _browse(uri: str, experiment: str) -> str:
    """Point MLflow at a store it may only read and select ``experiment`` there (nothing is written).

    Raises:
        HCQRError: the store holds no such experiment.
    """
    import mlflow

    mlflow.set_tracking_uri(uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        raise HCQRError(f"the read-only MLflow store {store_faults.WATCH.where} holds no experiment {experiment!r}")
    mlflow.set_experiment(experiment_id=found.experiment_id)
    return found.experiment_id


def sqlite_file(uri: str) -> Path | None:
    """The database file an SQLite tracking URI names, as SQLAlchemy reads it (percent-escapes decoded, the query
    left out; a relative path from the working folder), ``None`` for a store of another kind (a tracking server).

    Raises:
        HCQRError: the URI is malformed, or names an in-memory database (every run would be lost at exit).
    """
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        database = make_url(uri).database
    except ArgumentError as exc:
        raise HCQRError(f"tracking URI {uri!r} is not a database URI: {exc}") from None
    if not database or database == ":memory:":
        raise HCQRError(
            f"tracking URI {uri!r} is an in-memory SQLite store: every run would be lost when hcqr exits; "
            "name a file (sqlite:////path/to/mlflow.db)"
        )
    return Path(database).resolve()


def existing_mlflow_run_id(run_id: str | None, path: str | Path | None = None) -> str | None:
    """``run_id`` if the store at ``path`` holds that run (not deleted), else ``None`` (with a warning).

    A run folder remembers its MLflow run to resume it; if the store was
    moved or deleted, the evaluation is tracked in a new run instead.
    """
    if not run_id:
        return None
    import mlflow

    configure(path)
    try:
        deleted = mlflow.get_run(run_id).info.lifecycle_stage == "deleted"  # MLflow refuses to resume those
    except Exception as exc:
        if store_faults.store_fault(exc):  # the store failed, not the run: never a new run for that
            raise
        deleted = None
    if deleted is False:
        return run_id
    state = "was deleted from" if deleted else "is not in"
    log.warning(f"hcqr: note: MLflow run {run_id} {state} {tracking_uri(path)}; tracking in a new run")
    return None


def open_store(path: str | Path | None = None) -> str:
    """:func:`configure` the store, refusing one that cannot be used with one line, before a command writes
    anything else: a folder that cannot be created, a full disk, a read-only store, one another process kept
    locked through the whole wait (:func:`~hcqr_dspy.tracking.store_faults.lock_seconds`), a file that is not an
    MLflow database. A database file this call created and could not fill (a full disk leaves it at 0 bytes) is
    removed.

    Returns:
        The experiment id.

    Raises:
        HCQRError: the store cannot be used (:class:`~hcqr_dspy.errors.DiskFullError` for a full disk,
            :class:`~hcqr_dspy.errors.StoreLockedError` for a lock).
    """
    db = sqlite_file(tracking_uri(path))  # None: a tracking server
    existed = db is None or db.exists()
    try:
        return configure(path)
    except HCQRError:
        raise
    except Exception as exc:  # SQLAlchemy / MlflowException: the store cannot be opened or written
        if not existed and db.exists() and os.path.getsize(db) == 0:
            db.unlink()
        if disk_full(exc):
            raise disk_full_error(exc, f"the MLflow store {store_dir(path)} could not be written") from None
        said = store_faults.store_error(exc, store_faults.WATCH.where)
        if said is not None:
            raise said from None
        first = (str(exc).splitlines() or [""])[0][:300]
        raise HCQRError(
            f"the MLflow store {tracking_uri(path)} cannot be used: {type(exc).__name__}: {first}"
        ) from None


def browse_store(path: str | Path | None, first: str) -> tuple[str, str]:
    """Open an existing store to read it (:func:`existing_store`, then :func:`configure` with ``browse``): a
    read-only one as it is, with nothing created.

    Args:
        path: The store folder (:func:`store_dir`).
        first: What to run first when there is no store (the refusal says it).

    Returns:
        Where the store is (its folder, or the URI) and the experiment id.

    Raises:
        HCQRError: one line: no store there, a store locked by another process through the whole wait
            (:class:`~hcqr_dspy.errors.StoreLockedError`), a file that is not an MLflow database.
    """
    where = existing_store(path, first)
    try:
        return where, configure(path, browse=True)
    except HCQRError:
        raise
    except Exception as exc:  # SQLAlchemy / MlflowException: the store cannot be read
        said = store_faults.store_error(exc, where)
        if said is not None:
            raise said from None
        first_line = (str(exc).splitlines() or [""])[0][:300]
        raise HCQRError(f"the MLflow store {where} cannot be read: {type(exc).__name__}: {first_line}") from None


def check_existing_store(path: str | Path | None = None) -> None:
    """Refuse, in one line, a store that exists and cannot be read (locked through the whole wait, malformed) or
    written (:func:`read_only_error`), before a command that tracks into it writes anything; a store not there yet
    is left for the command to create.

    Raises:
        HCQRError: as :func:`browse_store`; the store is read-only.
    """
    database = sqlite_file(tracking_uri(path))
    if database is not None and database.exists():
        if not writable(database):
            raise read_only_error(database, existing_store(path, ""))
        browse_store(path, "")


@contextmanager
def store_outages(path: str | Path | None = None, saved: Callable[[], str] | None = None) -> Iterator[None]:
    """Turn a store failure met while tracking into one line: a full disk (SQLAlchemy's "database or disk is
    full", an artifact copy's ``ENOSPC``) into :class:`~hcqr_dspy.errors.DiskFullError`, a lock held through the
    whole wait into :class:`~hcqr_dspy.errors.StoreLockedError`, a malformed file into
    :class:`~hcqr_dspy.errors.HCQRError` (:func:`~hcqr_dspy.tracking.store_faults.store_error`). An outage that
    already said so (:class:`~hcqr_dspy.errors.OutageError`: it names what is saved), raised before MLflow failed
    again on the way out (ending the run), is kept as it is. Other errors pass unchanged.

    Args:
        path: The store folder (:func:`store_dir`).
        saved: Says what is saved (``"3/6 questions are saved in ..."``), for the message.
    """
    try:
        yield
    except Exception as exc:
        said = exc.__context__
        while said is not None and not isinstance(said, OutageError):
            said = said.__context__
        if said is not None and not isinstance(exc, HCQRError):
            raise said from None
        if isinstance(exc, HCQRError):
            raise
        what = saved() if saved else "rows written so far are saved"
        error = store_faults.store_error(
            exc, str(store_dir(path)) if sqlite_file(tracking_uri(path)) else tracking_uri(path), what
        )
        if error is not None:
            raise error from None
        raise


@contextmanager
def store_lock(name: str) -> Iterator[None]:
    """An exclusive ``fcntl.flock`` on ``<store>/<name>`` while the block runs, for the active SQLite store
    (MLflow's SQLAlchemy store does not serialize some multi-statement writes between processes); no lock
    for a tracking server, which serializes them itself."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    if not uri.startswith("sqlite:///"):
        yield
        return
    with open(Path(uri[len("sqlite:///") :]).parent / name, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield
