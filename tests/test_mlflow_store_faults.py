"""The MLflow store (SQLite, ``--mlflow-dir``) as a dependency that fails, made for real: a second process holding
``BEGIN EXCLUSIVE`` on ``mlflow.db``, ``kill -9`` and SIGTERM of a real ``hcqr eval`` process against the stub
OpenAI-compatible server, a real tmpfs that fills, a truncated copy of the database, a read-only mount served by the
real ``mlflow server`` behind ``hcqr ui``.

After every fault the resume must leave MLflow agreeing with the run folder: each row has a whole trace scored by
``mlflow.genai.evaluate`` and ``correct/mean`` equals the accuracy in ``metrics.json``.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pytest
from helpers import fill, free_port, wait_until_serving
from stub_server import OPTIONS, SECRET, Stub
from support.cli_args import eval_argv, stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.run_folder import METRICS, PREDICTIONS, RunFolder
from hcqr_dspy.tracking.trace_repair import rebuilt_traces

pytestmark = pytest.mark.slow  # real `hcqr eval` processes: a minute or more on 2 cores (scheduled first)

REPO = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r"^\d+/\d+ questions: ")  # the progress lines `hcqr eval` prints as it goes


def said(stderr: str) -> list[str]:
    """The lines of ``stderr`` besides the progress lines."""
    return [line for line in stderr.splitlines() if line.strip() and not PROGRESS.match(line)]


def cli(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, said(captured.err)


def child_eval(bench, run_dir, store, stub, **env):
    """A real `hcqr eval` process (its own interpreter) tracking into ``store``, with ``env`` added."""
    argv = [
        sys.executable,
        "-m",
        "hcqr_dspy.cli",
        *eval_argv(bench, run_dir, *stub_args(stub), "--mlflow-dir", str(store)),
    ]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "PYTHONPATH": path, **env}
    return subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(check, proc, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"hcqr eval ended ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.01)


def rows_written(run_dir) -> int:
    path = Path(run_dir) / PREDICTIONS
    return path.read_bytes().count(b"\n") if path.exists() else 0


class Holder:
    """A second process, started now, that holds ``BEGIN EXCLUSIVE`` on ``database`` (no one else reads or writes
    it) from :meth:`take` until :meth:`release`, at most ``seconds``."""

    CODE = (
        "import sqlite3, sys, time; print('ready', flush=True); sys.stdin.readline(); "
        "c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None); "
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )

    def __init__(self, database: Path, seconds: float = 60.0):
        argv = [sys.executable, "-c", self.CODE, str(database), str(seconds)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def take(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        self.proc.kill()  # the kernel drops its locks
        self.proc.wait()


@contextmanager
def locked(database: Path, seconds: float = 60.0, holder: Holder | None = None):
    """``database`` held locked by a second process (``holder``, or a new :class:`Holder`) for the block."""
    holder = holder or Holder(database, seconds)
    try:
        holder.take()
        yield holder
    finally:
        holder.release()


def assert_mlflow_agrees_with_the_run_folder(store: Path, run_dir: Path) -> None:
    """Every row of ``run_dir`` has a whole trace in its MLflow run, scored ``correct`` as the row is, and the
    run's ``correct/mean`` equals the run folder's accuracy."""
    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    run_id = json.loads((run_dir / "config.json").read_text())["mlflow_run_id"]
    run = mlflow.get_run(run_id)
    metrics = json.loads((run_dir / METRICS).read_text())
    rows = RunFolder.open(run_dir).rows()
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run_id, return_type="list")
    scored = {}
    for trace in traces:
        found = [a for a in trace.info.assessments if a.name == "correct"]
        if found and trace.info.state.value == "OK":
            scored[trace.info.tags["qid"]] = found[-1].value
    assert scored == {r["qid"]: r["correct"] for r in rows}
    assert run.data.metrics["correct/mean"] == pytest.approx(metrics["accuracy"])
    assert len(rows) == metrics["n"] == 6


# -- a lock held by another process ------------------------------------------------------------------------------


def test_a_store_locked_past_the_wait_stops_with_one_line_and_the_resume_rebuilds_the_lost_traces(bench, capsys):
    """MLflow's own wait is 20 s per statement; $HCQR_MLFLOW_LOCK_SECONDS=1 makes an 8 s lock an outage, met while
    questions are still to answer (a question takes 1 s)."""
    stub = Stub(delay=1.0)
    run_dir, store = bench / "run", bench / "mlruns"
    proc = child_eval(bench, run_dir, store, stub, HCQR_MLFLOW_LOCK_SECONDS="1")
    try:
        wait_for(lambda: rows_written(run_dir) >= 2, proc, "two rows")
        with locked(store / "mlflow.db", seconds=8):
            _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = said(err)
    assert proc.returncode == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"hcqr: error: the MLflow store {store} stayed locked by another process for 1 s")
    assert "$HCQR_MLFLOW_LOCK_SECONDS sets how long to wait" in lines[0]
    saved = rows_written(run_dir)
    assert f"{saved}/6 questions are saved in {run_dir / PREDICTIONS}" in lines[0] and 2 <= saved < 6
    assert lines[0].endswith("run the same command again to resume")
    stub.delay = 0.0
    code, _, err = cli(capsys, eval_argv(bench, run_dir, *stub_args(stub), "--mlflow-dir", str(store)))
    assert code == 0, err
    assert any("question traces were missing or unfinished in the MLflow store" in line for line in err), err
    assert "scored 6 question traces" in "\n".join(err)
    assert_mlflow_agrees_with_the_run_folder(store, run_dir)
    stub.stop()


# -- a process killed just after a row ---------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_process_killed_just_after_a_row_leaves_its_trace_to_the_resume(bench, capsys, stop):
    """The third question's row is written while another process holds the store locked, so its trace is still
    queued when the process is stopped (``kill -9``, SIGTERM): the resume rebuilds that trace from the row and
    closes what the store holds of the old one (``IN_PROGRESS`` when some of its spans got there) as ``ERROR``.
    The third question's LM call takes 4 s: the lock is taken within it."""
    stub = Stub(delay=0.3)
    run_dir, store = bench / "run", bench / "mlruns"
    database = store / "mlflow.db"
    proc = child_eval(bench, run_dir, store, stub)
    try:
        wait_for(lambda: rows_written(run_dir) >= 1, proc, "a row")
        stub.delay = 4.0
        holder = Holder(database)  # started before it is needed: it locks at once when told
        wait_for(lambda: stub.count >= 4, proc, "the third question's LM call")  # after the LM check and two
        with locked(database, holder=holder):
            assert rows_written(run_dir) == 2  # locked while the third question waits for its reply
            wait_for(lambda: rows_written(run_dir) >= 3, proc, "the third row")
            proc.send_signal(stop)
            proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -stop
    killed = RunFolder.open(run_dir).rows()[2]
    mlflow.set_tracking_uri(f"sqlite:///{database}")
    assert mlflow.get_trace(killed["trace_id"], silent=True) is None  # not (whole) in the store
    stub.delay = 0.0
    code, _, err = cli(capsys, eval_argv(bench, run_dir, *stub_args(stub), "--mlflow-dir", str(store)))
    assert code == 0, err
    assert "scored 6 question traces" in "\n".join(err), err
    assert_mlflow_agrees_with_the_run_folder(store, run_dir)
    experiment = mlflow.get_experiment_by_name("hcqr-dspy").experiment_id
    traces = mlflow.search_traces(locations=[experiment], include_spans=False, return_type="list")
    [new] = [t.info for t in traces if t.info.tags.get("replaces_trace") == killed["trace_id"]]
    assert new.tags["qid"] == killed["qid"] and new.tags["trace_source"] == "run_folder"
    assert mlflow.get_trace(new.trace_id).data.spans[0].outputs["answer"] == killed["prediction"]
    run_id = json.loads((run_dir / "config.json").read_text())["mlflow_run_id"]
    assert rebuilt_traces(run_id)[killed["qid"]] == new.trace_id  # where `hcqr judge` logs the row's labels
    for old in [t.info for t in traces if t.info.trace_id == killed["trace_id"]]:  # what the store held of it
        assert old.state.value == "ERROR" and old.tags["replaced_by"] == new.trace_id
    # a second resume finds the rebuilt traces: nothing is rebuilt or scored again
    code, _, err = cli(capsys, eval_argv(bench, run_dir, *stub_args(stub), "--mlflow-dir", str(store)))
    assert code == 0 and not any("rebuilt" in line or "scored" in line for line in err), err
    stub.stop()


# -- a store whose disk fills ------------------------------------------------------------------------------------


@contextmanager
def tmpfs(folder: Path, size: str):
    """A real tmpfs of ``size`` mounted on ``folder`` (needs root: mount; skips otherwise), unmounted at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_store_whose_disk_fills_mid_run_stops_with_one_line_and_the_resume_relogs_the_traces(bench, capsys):
    stub = Stub(delay=0.3)
    run_dir = bench / "run"  # on another disk: the rows go on being written
    with tmpfs(bench / "disk", "8m") as disk:
        store = disk / "mlruns"
        proc = child_eval(bench, run_dir, store, stub)
        try:
            wait_for(lambda: rows_written(run_dir) >= 2, proc, "two rows")
            filler = fill(disk)
            _, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        lines = said(err)
        assert proc.returncode == 2 and len(lines) == 1, err[-3000:]  # no SQLAlchemy tracebacks, no prompt text
        assert lines[0].startswith(
            f"hcqr: error: the disk is full (database or disk is full: the MLflow store {store})"
        )
        assert f"/6 questions are saved in {run_dir / PREDICTIONS}" in lines[0]
        assert lines[0].endswith("free space and run the same command again to resume")
        filler.unlink()
        code, _, err = cli(capsys, eval_argv(bench, run_dir, *stub_args(stub), "--mlflow-dir", str(store)))
        assert code == 0, err
        assert "scored 6 question traces" in "\n".join(err), err
        assert_mlflow_agrees_with_the_run_folder(store, run_dir)
    stub.stop()


# -- commands that read a store: locked, malformed, read-only -----------------------------------------------------


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A store holding a tracked evaluation of the stub's six questions (``<root>/run``) and the prompt
    ``demo.answer``; made once for the tests below, which leave it as it is."""
    root = tmp_path_factory.mktemp("tracked")
    rows = {
        f"q{i}": {"question": f"Question number {i}?", "options": OPTIONS, "answer": "ABC"[i % 3]} for i in range(6)
    }
    (root / "qs.json").write_text(json.dumps(rows))
    stub, store = Stub(), root / "mlruns"
    os.environ["STUB_KEY"] = SECRET
    try:
        assert main(eval_argv(root, root / "run", *stub_args(stub), "--mlflow-dir", str(store))) == 0
    finally:
        stub.stop()
        del os.environ["STUB_KEY"]
    mlflow.genai.register_prompt(name="demo.answer", template="Answer {{question}}")
    return store


def test_commands_that_read_a_locked_or_malformed_store_refuse_it_in_one_line(bench, tracked_run, capsys, monkeypatch):
    store = tracked_run
    commands = {
        "prompts": ["prompts", "demo.answer"],
        "served": ["served"],
        "compare": ["compare", str(store.parent / "run"), str(store.parent / "run"), "--out", str(bench / "report")],
        "ui": ["ui", "--port", str(free_port())],
        "eval": eval_argv(bench, bench / "new-run", *stub_args(stub := Stub())),
    }
    monkeypatch.setenv("HCQR_MLFLOW_LOCK_SECONDS", "0.5")
    with locked(store / "mlflow.db"):
        for name, argv in commands.items():
            code, out, err = cli(capsys, [*argv, "--mlflow-dir", str(store)])
            assert code == 2 and len(err) == 1 and not out, (name, err)
            assert err[0] == (
                f"hcqr: error: the MLflow store {store} stayed locked by another process for 0.5 s (database is "
                "locked; $HCQR_MLFLOW_LOCK_SECONDS sets how long to wait); run the same command again once it is free"
            ), name
    broken = bench / "broken"
    broken.mkdir()
    (broken / "mlflow.db").write_bytes((store / "mlflow.db").read_bytes()[:100_000])  # a copy cut short
    for name, argv in commands.items():
        code, out, err = cli(capsys, [*argv, "--mlflow-dir", str(broken)])
        assert code == 2 and len(err) == 1 and not out, (name, err)
        assert err[0].startswith(f"hcqr: error: the MLflow store {broken} is not a whole MLflow database ("), name
    assert not (bench / "report").exists() and not (bench / "new-run").exists()  # refused before writing anything
    stub.stop()


def test_a_read_only_store_is_browsed_by_ui_prompts_and_served(bench, tracked_run, capsys):
    """An archived study on a read-only mount: nothing is created in it, and `hcqr ui` serves it for real."""
    with tmpfs(bench / "archive", "16m") as archive:
        subprocess.run(["cp", "-a", str(tracked_run), str(archive)], check=True)
        store = archive / "mlruns"
        subprocess.run(["mount", "-o", "remount,ro", str(archive)], check=True)
        listed = sorted(p.name for p in store.iterdir())
        code, out, err = cli(capsys, ["prompts", "demo.answer", "--mlflow-dir", str(store)])
        assert code == 0 and out.startswith("demo.answer v1 "), err
        code, out, err = cli(capsys, ["served", "--mlflow-dir", str(store)])
        assert code == 0 and out.strip() == "no served questions", err
        code, _, err = cli(capsys, ["prompts", "hcqr-x", "1", "--alias", "prod", "--mlflow-dir", str(store)])
        assert code == 2 and len(err) == 1 and f"the MLflow store {store} is read-only" in err[0]
        run, copy = tracked_run.parent / "run", bench / "copy"  # `compare` records a run: refused before its report
        shutil.copytree(run, copy)
        argv = ["compare", str(run), str(copy), "--out", str(bench / "report"), "--mlflow-dir", str(store)]
        code, out, err = cli(capsys, argv)
        assert code == 2 and not out and len(err) == 1 and f"the MLflow store {store} is read-only" in err[0], err
        assert not (bench / "report").exists()
        port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, "-m", "hcqr_dspy.cli", "ui", "--mlflow-dir", str(store), "--port", str(port)]
        ui = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            wait_until_serving(f"http://127.0.0.1:{port}/", ui)
            experiment = mlflow.MlflowClient(f"http://127.0.0.1:{port}").get_experiment_by_name("hcqr-dspy")
            runs = mlflow.MlflowClient(f"http://127.0.0.1:{port}").search_runs([experiment.experiment_id])
            assert [r.data.metrics["n"] for r in runs] == [6]
        finally:
            ui.send_signal(signal.SIGTERM)
            ui.wait(timeout=60)
        assert sorted(p.name for p in store.iterdir()) == listed
