"""MLflow tracking: the store, one MLflow run per evaluation, and what a reviewer sees first.

The store is an SQLite database ``<dir>/mlflow.db`` with artifacts under
``<dir>/artifacts`` (MLflow 3's file store is in maintenance mode), where
``<dir>`` is ``--mlflow-dir`` or ``$HCQR_MLFLOW_DIR`` or ``./mlruns``; an
explicit ``$MLFLOW_TRACKING_URI`` wins. Each run logs the full configuration
as params, the metrics of :func:`hcqr_dspy.metrics.summarize`, the run
folder's ``config.json``, ``predictions.jsonl`` and ``metrics.json`` as
artifacts, and DSPy traces through ``mlflow.dspy.autolog()`` (each question's
trace is built by :mod:`hcqr_dspy.traces` and scored by :mod:`hcqr_dspy.scorers`).
A resumed evaluation continues its MLflow run (its id is kept in ``config.json``).
Also here: the question set as an MLflow evaluation dataset
(:func:`questions_dataset`), run descriptions (:func:`describe_run`), and the
UI (:func:`serve_ui`, ``hcqr ui``).
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from hcqr_dspy.errors import HCQRError

DEFAULT_DIR = "mlruns"
EXPERIMENT = "hcqr-dspy"
# The experiment's description (MLflow shows the ``mlflow.note.content`` tag as Markdown on the experiment page).
EXPERIMENT_DESCRIPTION = """Hypothesis-Conditioned Query Rewriting (HCQR) for retrieval-augmented multiple-choice QA, \
run by hcqr-dspy as DSPy programs.

* **Runs** — one per evaluation (`hcqr eval`, `hcqr predict`, experiment cells), named
  `method · dataset · LM · zero-shot|compiled:<recipe>`; [the runs table with the key metrics](#/experiments/{experiment_id}/runs?viewStateShareKey={view})
  (`accuracy`, `accuracy_se`, `invalid_rate`, `dur`, `mean_lm_calls`); compile runs (`kind=compile`) and
  comparisons (`kind=comparison`, their runs linked by run id).
* **Traces** — one per question: named stage spans (hypothesis, rewrite, one RETRIEVER span per query, fusion,
  answer), tags `qid`, `method`, `dataset`, `run_folder`, `lm`, `program`; the gold answer as the expectation
  `answer`, and feedback `correct`, `valid`, `hypothesis` (kept/fixed/broke), `dur` (DUR judge). Filter e.g.
  `tags.method = 'hcqr'` and `feedback.correct = 'false'`.
* **Evaluation runs / Datasets** — each run's questions as an MLflow evaluation dataset, scored with
  `mlflow.genai.evaluate`.
* **Models** — compiled programs registered with `hcqr compile --register NAME`, served with `mlflow models serve`.
"""
# The metrics a reader looks at first: logged by every evaluation run (and shown first by `hcqr` tables).
KEY_METRICS = ("accuracy", "accuracy_se", "invalid_rate", "dur", "mean_lm_calls")
# A saved view of the experiment's runs table with those metrics as its columns. MLflow's UI keeps "shared
# views" as experiment tags `mlflow.sharedViewState.<key>` (a JSON of the table's state; column keys are
# `metrics.`name`` / `tags.`name`` / `attributes.`name``) and opens one with `?viewStateShareKey=<key>`.
KEY_VIEW = "hcqr-key-metrics"
KEY_VIEW_STATE = {
    "selectedColumns": [*(f"metrics.`{m}`" for m in KEY_METRICS), "tags.`program`", "attributes.`Dataset`"],
    "orderByKey": "attributes.start_time", "orderByAsc": False,
}


def store_dir(path: str | Path | None = None) -> Path:
    """The tracking folder: the argument, ``$HCQR_MLFLOW_DIR`` or ``./mlruns``."""
    return Path(path or os.environ.get("HCQR_MLFLOW_DIR") or DEFAULT_DIR).resolve()


def tracking_uri(path: str | Path | None = None) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<store_dir>/mlflow.db``."""
    if os.environ.get("MLFLOW_TRACKING_URI") and path is None:
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{store_dir(path) / 'mlflow.db'}"


def configure(path: str | Path | None = None, experiment: str = EXPERIMENT) -> str:
    """Point MLflow at the store and select (creating if needed) the experiment.

    The experiment gets its description (:data:`EXPERIMENT_DESCRIPTION`, unless it has one) and the
    saved view of its runs table with the key metrics as columns (:data:`KEY_VIEW`), and becomes the
    active experiment (traces made outside a run, such as the DUR judge's, are recorded there).

    Several processes may start on one new store at once (parallel
    evaluations): MLflow creates and migrates the SQLite schema on first use,
    and two processes doing it together fail ("table ... already exists").
    The first use is therefore serialized with an exclusive ``fcntl.flock``
    on ``<store>/.init.lock``; afterwards SQLite's own locking suffices.
    (With ``$MLFLOW_TRACKING_URI`` pointing at a tracking server, the server
    does this and the lock is moot.) POSIX only (``fcntl``).

    Returns:
        The experiment id.

    Raises:
        HCQRError: the store folder cannot be created.
    """
    import fcntl

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    folder = store_dir(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".init.lock", "a")
    except OSError as exc:
        raise HCQRError(f"cannot create MLflow folder {folder}: {exc.strerror}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        mlflow.set_tracking_uri(tracking_uri(path))
        found = mlflow.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            experiment_id = mlflow.create_experiment(
                experiment, artifact_location=(folder / "artifacts" / experiment).as_uri())
        client = mlflow.MlflowClient()
        tags = client.get_experiment(experiment_id).tags
        if "mlflow.note.content" not in tags:  # a description a user wrote is kept
            client.set_experiment_tag(experiment_id, "mlflow.note.content",
                                      EXPERIMENT_DESCRIPTION.format(experiment_id=experiment_id, view=KEY_VIEW))
        view = json.dumps(KEY_VIEW_STATE)
        if tags.get(f"mlflow.sharedViewState.{KEY_VIEW}") != view:
            client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{KEY_VIEW}", view)
    mlflow.set_experiment(experiment_id=experiment_id)  # traces made outside a run (judge calls) go here too
    return experiment_id


def key_metrics_url(experiment_id: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """The address of the runs table with :data:`KEY_METRICS` as its columns, on a UI at ``host:port``."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs?viewStateShareKey={KEY_VIEW}"


def existing_run_id(run_id: str | None, path: str | Path | None = None) -> str | None:
    """``run_id`` if the store at ``path`` holds that run, else ``None`` (with a warning).

    A run folder remembers its MLflow run to resume it; if the store was
    moved or deleted, the evaluation is tracked in a new run instead.
    """
    if not run_id:
        return None
    import sys

    import mlflow

    configure(path)
    try:
        mlflow.get_run(run_id)
        return run_id
    except Exception:
        print(f"hcqr: note: MLflow run {run_id} is not in {tracking_uri(path)}; tracking in a new run", file=sys.stderr)
        return None


def open_store(path: str | Path | None = None) -> str:
    """:func:`configure` the store, refusing one that cannot be used with one line, before a command writes
    anything else: a folder that cannot be created, a full disk, a file that is not an MLflow database. A
    database file this call created and could not fill (a full disk leaves it at 0 bytes) is removed.

    Returns:
        The experiment id.

    Raises:
        HCQRError: the store cannot be used (:class:`~hcqr_dspy.errors.DiskFullError` for a full disk).
    """
    from hcqr_dspy.run_folder import disk_full, disk_full_error

    db = store_dir(path) / "mlflow.db"
    existed = db.exists()
    try:
        return configure(path)
    except HCQRError:
        raise
    except Exception as exc:  # SQLAlchemy / MlflowException: the store cannot be opened or written
        if not existed and db.exists() and os.path.getsize(db) == 0:
            db.unlink()
        if disk_full(exc):
            raise disk_full_error(exc, f"the MLflow store {store_dir(path)} could not be written") from None
        first = (str(exc).splitlines() or [""])[0][:300]
        raise HCQRError(f"the MLflow store {tracking_uri(path)} cannot be used: {type(exc).__name__}: {first}") from None


@contextmanager
def store_outages(path: str | Path | None = None) -> Iterator[None]:
    """Turn a full disk met while tracking (SQLAlchemy's "database or disk is full", an artifact copy's
    ``ENOSPC``) into the one-line :class:`~hcqr_dspy.errors.DiskFullError`; a stop that already said so
    (it names what is saved) is kept as it is. Other errors pass unchanged."""
    from hcqr_dspy.errors import DiskFullError
    from hcqr_dspy.run_folder import disk_full, disk_full_error

    try:
        yield
    except Exception as exc:
        said = exc
        while said is not None and not isinstance(said, DiskFullError):
            said = said.__context__
        if said is not None:
            raise said from None
        if not isinstance(exc, HCQRError) and disk_full(exc):
            raise disk_full_error(exc, f"rows written so far are saved; the MLflow store is {store_dir(path)}") from None
        raise


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> MLflow params (``a.b`` keys, values as strings, 6000 chars max)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = str(value)[:6000]
    return out


@contextmanager
def mlflow_run(
    run_name: str,
    params: dict[str, Any],
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
    store: str | Path | None = None,
    experiment: str = EXPERIMENT,
    traces: bool = True,
) -> Iterator[Any]:
    """Start (or resume, given ``run_id``) an MLflow run with params and tags.

    Started while another run is active (an experiment's parent run), it is
    a nested child run.

    Args:
        run_name: Display name.
        params: Configuration, flattened into params (logged once; a resumed
            run keeps its params).
        tags: Extra tags (method, dataset ...).
        run_id: Resume this run instead of starting a new one.
        store: Tracking folder (see :func:`store_dir`).
        experiment: MLflow experiment name.
        traces: Record DSPy traces with ``mlflow.dspy.autolog()``.

    Yields:
        The active ``mlflow.ActiveRun``.
    """
    import mlflow

    experiment_id = configure(store, experiment)
    nested = mlflow.active_run() is not None  # a cell of an experiment: child of its parent run
    with dspy_tracing(traces):
        if run_id:
            run = mlflow.start_run(run_id=run_id, nested=nested)
        else:
            run = mlflow.start_run(run_name=run_name, experiment_id=experiment_id, tags=tags or {}, nested=nested)
            mlflow.log_params(flatten(params))
        with run:
            yield run


@contextmanager
def dspy_tracing(enabled: bool = True) -> Iterator[None]:
    """Record DSPy module and LM calls as MLflow spans (``mlflow.dspy.autolog(log_traces=True)``) inside the
    block; at its end autologging is turned off and the traces, exported in the background, are written."""
    if not enabled:
        yield
        return
    import mlflow
    import mlflow.dspy

    mlflow.dspy.autolog(log_traces=True, silent=True)
    try:
        yield
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)
        mlflow.flush_trace_async_logging()


def log_metrics(metrics: dict[str, float]) -> None:
    """Log numeric metrics to the active run."""
    import mlflow

    mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})


def log_run_folder(folder) -> None:
    """Log a run folder's record files (:meth:`hcqr_dspy.run_folder.RunFolder.files`) as artifacts
    of the active run (under ``run/``).

    Args:
        folder: A :class:`~hcqr_dspy.run_folder.RunFolder` or its path.
    """
    import mlflow

    from hcqr_dspy.run_folder import RunFolder

    folder = folder if isinstance(folder, RunFolder) else RunFolder(folder)
    for f in folder.files():
        mlflow.log_artifact(str(f), artifact_path="run")


# Signals that stop `hcqr ui` (SIGKILL cannot be caught: the server then gets SIGTERM from the kernel, below).
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
STOP_GRACE_SECONDS = 5.0


def serve_ui(path: str | Path | None = None, host: str = "127.0.0.1", port: int = 5000, workers: int = 1) -> int:
    """Run the MLflow UI (``mlflow server``) for the store at ``path`` until it exits or this process is stopped.

    The server runs in its own process group (session): MLflow starts a uvicorn parent with worker
    processes, so stopping only the process we started would leave the workers serving. On any of
    :data:`STOP_SIGNALS`, and on any exit of this function, the whole group gets SIGTERM, then SIGKILL
    after :data:`STOP_GRACE_SECONDS`. On Linux the server also gets SIGTERM if this process dies
    (``PR_SET_PDEATHSIG``), so even a SIGKILL of ``hcqr ui`` does not leave it running.
    MLflow's server-side job runner (online scoring, judges run from the UI) is turned off
    (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``): it starts seven more worker processes.

    The port is checked first (:func:`check_port`). A server that exits without being stopped is a
    failure: MLflow's server exits 0 when uvicorn cannot bind its port (taken between the check and
    the bind), and otherwise it stops only when told to.

    Returns:
        0 when it was stopped by a signal.

    Raises:
        HCQRError: the port cannot be bound (:func:`check_port`), or the server stopped by itself
            (its exit code, and whether another program holds the port now).
    """
    import signal
    import subprocess

    check_port(host, port)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(ui_command(path, host, port, workers), env=env, start_new_session=True,
                            preexec_fn=_die_with_parent)
    stopped: list[int] = []

    def on_signal(signum, _frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = {name: signal.signal(getattr(signal, name), on_signal) for name in STOP_SIGNALS if hasattr(signal, name)}
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
        stop_process_group(proc)
    if stopped:
        return 0
    try:
        check_port(host, port)
        why = "its log is above"
    except HCQRError as exc:
        why = str(exc)
    raise HCQRError(f"the MLflow server for {host}:{port} stopped by itself (exit code {code}): {why}")


def check_port(host: str, port: int) -> None:
    """Refuse to serve on ``host:port`` when this machine cannot bind it: another program listens there, the
    host is not one of this machine's addresses, or the port needs privileges. The socket is bound as
    uvicorn binds it (IPv6 when ``host`` holds a ``:``, ``SO_REUSEADDR`` set, so a port left in TIME_WAIT is
    free) and closed at once.

    Raises:
        HCQRError: one line naming the host and port and what to do.
    """
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except socket.gaierror as exc:
        raise HCQRError(f"cannot serve on {host}:{port}: {host!r} is not a known host name ({exc.strerror}); "
                        "give --host an address of this machine") from None
    except OverflowError:
        raise HCQRError(f"cannot serve on {host}:{port}: a port is 1 to 65535") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise HCQRError(f"port {port} on {host} is already in use by another program; stop it or choose another "
                            "--port") from None
        raise HCQRError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def ui_command(path: str | Path | None = None, host: str = "127.0.0.1", port: int = 5000, workers: int = 1) -> list[str]:
    """The ``mlflow server`` command line of :func:`serve_ui`."""
    import sys

    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri(path),
            "--host", host, "--port", str(port), "--workers", str(workers)]


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the parent dies (no-op elsewhere)."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except OSError:
            pass


def stop_process_group(proc, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process group led by ``proc`` (started with ``start_new_session=True``), wait up
    to ``grace`` seconds for its leader, then SIGKILL whatever is left of the group."""
    import signal
    import subprocess

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return  # the group is empty
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def questions_dataset(questions, name: str, experiment_id: str):
    """The MLflow evaluation dataset of a question set (``mlflow.genai.datasets``), created on first use.

    One record per question: inputs ``question`` and ``options``, the expectation ``answer`` (the gold
    letter, when the question has one) and the tag ``qid``. The same question set reuses its dataset.

    Args:
        questions: The questions (``dspy.Example`` with ``qid``, ``question``, ``options``, ``answer``).
        name: The dataset's name: the benchmark's name and the question set's content fingerprint
            (``medqa-1a2b3c4d5e6f``), so that another sample is another dataset.
        experiment_id: The experiment it belongs to.

    Returns:
        The ``mlflow.genai.datasets.EvaluationDataset``.
    """
    from mlflow.genai import datasets

    def find():
        found = datasets.search_datasets(experiment_ids=[experiment_id], filter_string=f"name = '{name}'", max_results=1)
        return found[0] if found else None

    dataset = find()
    if dataset is not None and dataset.has_records():
        return dataset
    with store_lock(".datasets.lock"):  # two processes filling one new dataset break its unique records
        dataset = find()
        if dataset is not None and dataset.has_records():
            return dataset
        return _fill_dataset(dataset, questions, name, experiment_id, find)


@contextmanager
def store_lock(name: str) -> Iterator[None]:
    """An exclusive ``fcntl.flock`` on ``<store>/<name>`` while the block runs, for the active SQLite store
    (MLflow's SQLAlchemy store does not serialize some multi-statement writes between processes); no lock
    for a tracking server, which serializes them itself."""
    import fcntl

    import mlflow

    uri = mlflow.get_tracking_uri()
    if not uri.startswith("sqlite:///"):
        yield
        return
    with open(Path(uri[len("sqlite:///"):]).parent / name, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield


def _fill_dataset(dataset, questions, name: str, experiment_id: str, find):
    from mlflow.genai import datasets

    if dataset is None:
        try:
            dataset = datasets.create_dataset(name=name, experiment_id=experiment_id, tags={"source": "hcqr-dspy"})
        except Exception:  # another process created it first (unique name): use that one
            dataset = find()
            if dataset is None:
                raise
    dataset.merge_records([
        {"inputs": {"question": q.question, "options": dict(q.options)},
         **({"expectations": {"answer": q.answer}} if q.answer is not None else {}),
         "tags": {"qid": str(q.qid)}}
        for q in questions
    ])
    return dataset


def run_link(run_id: str) -> str | None:
    """A Markdown link to a run of this store for MLflow's UI (``#/experiments/<id>/runs/<id>``); ``None`` if absent."""
    import mlflow

    try:
        run = mlflow.get_run(run_id)
    except Exception:  # MlflowException: not in this store
        return None
    return f"[{run.info.run_name or run_id}](#/experiments/{run.info.experiment_id}/runs/{run_id})"


def describe_run(run_id: str, config: dict[str, Any], kind: str = "evaluation") -> None:
    """Set an evaluation run's description (MLflow's ``mlflow.note.content``, Markdown) and, for a saved
    (compiled) program, the tag ``compile_run_id`` linking the run that compiled it.

    Args:
        run_id: The run.
        config: The run folder's configuration (:func:`hcqr_dspy.run.resolve`).
        kind: ``evaluation`` (gold answers) or ``prediction`` (unlabelled questions).
    """
    import mlflow

    client = mlflow.MlflowClient()
    q = config.get("questions") or {}
    lines = [f"**{config['method']}** on {q.get('count')} questions of `{config['dataset']}` "
             f"({'scored against gold answers' if kind == 'evaluation' else 'no gold answers: predictions only'}), "
             f"LM `{(config.get('lm') or {}).get('spec')}`."]
    saved = config.get("saved_program")
    if saved:
        compile_id = saved.get("compile_run_id")
        link = run_link(compile_id) if compile_id else None
        lines.append(f"Program: compiled with recipe `{saved.get('recipe')}` ({saved.get('optimizer')}) on "
                     f"{saved.get('train_count')} {saved.get('train_dataset')} questions, from `{saved.get('source')}`; "
                     + (f"compile run {link}." if link else f"compile run `{compile_id}` (not in this store)." if compile_id
                        else "no compile run recorded."))
        if compile_id:
            client.set_tag(run_id, "compile_run_id", compile_id)
    else:
        lines.append("Program: zero-shot (the method's own instructions, no demos).")
    client.set_tag(run_id, "mlflow.note.content", "\n\n".join(lines))
