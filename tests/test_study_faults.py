"""Faults that could corrupt a long study, made for real against stub OpenAI-compatible servers on 127.0.0.1:
two writers on one run folder (real processes), two servers under one model name (the response cache),
the judge's endpoint, a disk that fills mid-run (a real tmpfs), a store that cannot be used, stale tracebacks."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import dspy
import mlflow
import pytest
from helpers import TINY_ROWS, fill, snippet, write_jsonl
from stub_server import SECRET, Stub
from support import cli_args
from support.cli_args import stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.lock import WRITER_LOCK
from hcqr_dspy.evaluation.run_folder import METRICS, PREDICTIONS, RunFolder

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)

REPO = Path(__file__).resolve().parents[1]


def cli(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def eval_argv(bench, run_dir, stub, *extra):
    return cli_args.eval_argv(bench, run_dir, *stub_args(stub), *extra)


def retrieving_bench(bench):
    """A BM25 index of the tiny corpus in ``bench/idx`` and ``bench/rq.json``: the stub's six questions, worded
    so that BM25 finds passages for them (a run to judge)."""
    from stub_server import OPTIONS

    corpus = write_jsonl(bench / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
    assert main(["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(bench / "idx")]) == 0
    rows = {
        f"q{i}": {
            "question": f"Question number {i}? Digoxin toxicity with yellow vision and nausea.",
            "options": OPTIONS,
            "answer": "ABC"[i % 3],
        }
        for i in range(6)
    }
    (bench / "rq.json").write_text(json.dumps(rows))


def rag_argv(bench, run_dir, stub, *extra):
    return [
        "eval",
        "--method",
        "simple_rag",
        "--dataset",
        str(bench / "rq.json"),
        "--index",
        str(bench / "idx"),
        "--run-dir",
        str(run_dir),
        "--no-mlflow",
        *stub_args(stub),
        *extra,
    ]


def outcomes(metrics):
    """The metrics that do not count cost (seconds, calls and tokens differ when replies come from the cache; the CPU
    contention measured over the seconds differs with them)."""
    return {
        k: v for k, v in metrics.items() if not any(w in k for w in ("seconds", "tokens", "lm_calls", "cpu_pressure"))
    }


# -- one writer per run folder ------------------------------------------------------------------------------------


def test_two_eval_processes_on_one_folder_one_is_refused_the_other_records_each_question_once(bench, tmp_path):
    stub = Stub(delay=0.5)  # 6 questions: the first writer holds the folder for 3 s or more
    run_dir, store = bench / "run", tmp_path / "mlruns"
    argv = [sys.executable, "-m", "hcqr_dspy.cli", *eval_argv(bench, run_dir, stub, "--mlflow-dir", str(store))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    try:
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        stub.stop()
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    [(_, _, refused)] = [r for r in results if r[0] == 2]
    [winner] = [p for p, r in zip(procs, results) if r[0] == 0]
    lines = refused.strip().splitlines()
    assert len(lines) == 1 and "is being written by another process" in lines[0], refused
    assert f"pid {winner.pid} on host " in lines[0] and "`hcqr eval`" in lines[0]
    rows = RunFolder.open(run_dir).rows()  # refuses a question recorded twice
    assert sorted(r["qid"] for r in rows) == [f"q{i}" for i in range(6)]
    assert len(stub.seen) == 1 + 6  # the winner's LM check and questions: the refused process asked nothing
    assert not (run_dir / WRITER_LOCK).exists()  # released and removed at the end
    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.kind = 'evaluation'")
    assert len(runs) == 1  # one MLflow run, not two


def test_a_lock_left_by_a_killed_process_is_taken_over(bench, capsys):
    stub = Stub()
    run_dir = bench / "run"
    run_dir.mkdir()
    # a writer that died holding the lock: its label stays in the file, the kernel dropped its flock
    (run_dir / WRITER_LOCK).write_text(
        json.dumps({"pid": 999999, "host": "gone", "command": "eval", "started": "2000-01-01T00:00:00+00:00"}) + "\n"
    )
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    assert code == 0, err
    assert len(RunFolder.open(run_dir).rows()) == 6 and not (run_dir / WRITER_LOCK).exists()
    stub.stop()


def test_a_refusal_that_comes_before_the_holder_wrote_its_label_still_names_the_holder(tmp_path):
    """The holder takes the ``flock`` and only then writes its label: a refused process reading in between
    waits for the label instead of saying "holder unknown". Here the holder writes it 0.5 s late."""
    from hcqr_dspy.errors import RunError
    from hcqr_dspy.evaluation.lock import WriterLock

    holder_code = (
        "import fcntl, json, sys, time; fh = open(sys.argv[1], 'a+'); fcntl.flock(fh, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(0.5); "
        "fh.write(json.dumps({'pid': 4242, 'host': 'h', 'command': 'eval', 'started': 's'}) + '\\n'); "
        "fh.flush(); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(tmp_path / WRITER_LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunError, match="pid 4242 on host h, `hcqr eval`"):
            WriterLock(tmp_path, "eval").acquire()
    finally:
        holder.kill()
        holder.wait()


def test_a_live_writer_refuses_judge_and_compile_on_its_folder(bench, capsys):
    """In-process holders are re-entrant, so the live writer here is a second process holding the lock."""
    run_dir = bench / "run"
    stub = Stub()
    retrieving_bench(bench)
    code, _, err = cli(capsys, rag_argv(bench, run_dir, stub))
    assert code == 0, err
    prog = bench / "prog"
    prog.mkdir()
    holder_code = (
        "import sys, time; from hcqr_dspy.evaluation.lock import WriterLock; "
        "a = WriterLock(sys.argv[1], 'eval').acquire(); "
        "b = WriterLock(sys.argv[2], 'compile', lock_file=sys.argv[3]).acquire(); "
        "print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(run_dir), str(prog), str(bench / f".{prog.name}.writer.lock")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        seen = len(stub.seen)
        code, _, err = cli(capsys, ["judge", str(run_dir), "--no-mlflow"])
        assert code == 2 and len(err) == 1 and f"pid {holder.pid}" in err[0] and "`hcqr eval`" in err[0]
        code, _, err = cli(
            capsys,
            [
                "compile",
                "--recipe",
                "bootstrap_fewshot",
                "--program",
                "cot",
                "--train",
                str(bench / "qs.json"),
                "--train-size",
                "4",
                "--out",
                str(prog),
                "--no-mlflow",
                *stub_args(stub),
            ],
        )
        assert code == 2 and len(err) == 1 and f"pid {holder.pid}" in err[0] and "`hcqr compile`" in err[0]
        assert len(stub.seen) == seen  # refused before any LM call
    finally:
        holder.kill()
        holder.wait()
        stub.stop()


# -- the response cache knows its server ---------------------------------------------------------------------------


def test_two_servers_under_one_model_name_never_share_cached_replies(bench, capsys, tmp_path):
    first, second = Stub(), Stub(shift=1)  # the same model name, other answers (another checkpoint)
    dspy.configure_cache(disk_cache_dir=str(tmp_path / "dspy-cache"))  # a cache of this test alone
    try:
        # a reply cached by DSPy's own keying (without the endpoint), as an older hcqr-dspy stored it
        old = dspy.LM("openai/stub-model", api_base=first.base, api_key=SECRET, temperature=0.0, max_tokens=1024)
        with dspy.context(lm=old, adapter=dspy.JSONAdapter()):
            dspy.Predict("question -> answer")(question="Question number 1?")
        assert len(first.seen) == 1
        code, _, err = cli(capsys, eval_argv(bench, bench / "one", first, "--no-mlflow"))
        assert code == 0, err
        code, _, err = cli(capsys, eval_argv(bench, bench / "two", second, "--no-mlflow"))
        assert code == 0, err
        one, two = RunFolder.open(bench / "one").rows(), RunFolder.open(bench / "two").rows()
        assert len(second.seen) == 1 + 6  # its LM check, then every question asked of it, none from the cache
        for a, b in zip(one, two):
            n = int(a["qid"][1:])
            assert a["prediction"] == "ABC"[(2 * n) % 3] and b["prediction"] == "ABC"[(2 * n + 1) % 3]
        # the same server again is answered from the cache
        seen = len(second.seen)
        code, _, err = cli(capsys, eval_argv(bench, bench / "three", second, "--no-mlflow"))
        assert code == 0 and len(second.seen) == seen + 1  # the LM check alone (never cached)
        assert [r["prediction"] for r in RunFolder.open(bench / "three").rows()] == [r["prediction"] for r in two]
    finally:
        first.stop()
        second.stop()
        dspy.configure_cache(disk_cache_dir=os.environ["DSPY_CACHEDIR"])


def test_a_server_redeployed_at_the_same_address_with_another_checkpoint_is_never_served_the_old_replies(
    bench, capsys, tmp_path
):
    """DSPy's cache is keyed by the model card the server lists (vLLM's ``root``): the same checkpoint restarted
    there is answered from the cache, another one under the same model name is asked every question."""
    dspy.configure_cache(disk_cache_dir=str(tmp_path / "dspy-cache"))  # a cache of this test alone
    first = Stub()
    stubs = [first]
    try:
        code, _, err = cli(capsys, eval_argv(bench, bench / "one", first, "--no-mlflow"))
        assert code == 0, err
        first.stop()
        stubs.append(restarted := Stub(port=first.port))  # the same checkpoint, restarted at the same address
        code, _, err = cli(capsys, eval_argv(bench, bench / "same", restarted, "--no-mlflow"))
        assert code == 0 and len(restarted.seen) == 1  # the LM check alone (never cached)
        restarted.stop()
        stubs.append(redeployed := Stub(shift=1, port=first.port))  # another checkpoint, same name and address
        code, _, err = cli(capsys, eval_argv(bench, bench / "two", redeployed, "--no-mlflow"))
        assert code == 0 and len(redeployed.seen) == 1 + 6  # its LM check, then every question, none cached
        for a, b in zip(RunFolder.open(bench / "one").rows(), RunFolder.open(bench / "two").rows()):
            n = int(a["qid"][1:])
            assert a["prediction"] == "ABC"[(2 * n) % 3] and b["prediction"] == "ABC"[(2 * n + 1) % 3]
    finally:
        for stub in stubs:
            stub.stop()
        dspy.configure_cache(disk_cache_dir=os.environ["DSPY_CACHEDIR"])


# -- the judge calls the run's own endpoint ------------------------------------------------------------------------


def test_judge_of_a_stub_served_run_calls_that_stub_with_the_runs_key_variable(bench, capsys, monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    stub = Stub()
    retrieving_bench(bench)
    run_dir = bench / "run"
    code, _, err = cli(capsys, rag_argv(bench, run_dir, stub, "--limit", "2"))
    assert code == 0, err
    seen = len(stub.seen)
    code, out, err = cli(capsys, ["judge", str(run_dir), "--no-mlflow"])  # no --judge-lm, --api-base or key flag
    assert code == 0, err
    assert f"judge LM openai/stub-model at {stub.base} (key from $STUB_KEY)" in "\n".join(err)
    judged = stub.seen[seen:]
    assert len(judged) >= 3 and all("ENTAILED" in body for _, body in judged[1:])  # the LM check, then judgments
    assert all(h.get("Authorization") == f"Bearer {SECRET}" for h, _ in judged)
    assert json.loads(out.strip().splitlines()[-1])["judge"]["judge_lm"] == "openai/stub-model"
    stub.stop()


# -- a disk that fills mid-run -------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs mounted on ``tmp_path/disk`` (needs root: mount), unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {done.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_disk_that_fills_mid_run_stops_with_one_line_and_the_resume_matches_an_uninterrupted_run(
    bench, small_disk, capsys
):
    stub = Stub(delay=0.3, reasoning="r" * 6000)  # rows over a 4 KiB page: each needs new space on the disk
    run_dir = small_disk / "run"

    def fill_after_two_rows():
        path = run_dir / PREDICTIONS
        while not path.exists() or path.read_bytes().count(b"\n") < 2:
            time.sleep(0.01)
        fill(small_disk)

    filler = threading.Thread(target=fill_after_two_rows, daemon=True)
    filler.start()
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    filler.join(timeout=30)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hcqr: error: the disk is full (No space left on device") and "Traceback" not in err[0]
    assert "questions are saved in" in err[0] and err[0].endswith("free space and run the same command again to resume")
    saved = RunFolder.open(run_dir).rows()  # whole lines only
    assert 2 <= len(saved) < 6
    if (run_dir / METRICS).exists():
        json.loads((run_dir / METRICS).read_text())  # whole, never half-written
    assert not list(run_dir.glob(".*.tmp"))
    (small_disk / "filler").unlink()  # space freed: the same command resumes
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    assert code == 0, err
    code, _, err = cli(capsys, eval_argv(bench, bench / "uninterrupted", stub, "--no-mlflow"))
    assert code == 0, err
    resumed = json.loads((run_dir / METRICS).read_text())
    assert resumed["n"] == 6 and outcomes(resumed) == outcomes(
        json.loads((bench / "uninterrupted" / METRICS).read_text())
    )
    stub.stop()


def test_an_mlflow_store_on_a_full_disk_is_refused_with_one_line_and_leaves_nothing(bench, small_disk, capsys):
    stub = Stub()
    fill(small_disk)
    run_dir, store = bench / "run", small_disk / "mlruns"
    store.mkdir()
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--mlflow-dir", str(store)))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hcqr: error: the disk is full") and str(store) in err[0]
    assert not (store / "mlflow.db").exists()  # no 0-byte database left behind
    assert not run_dir.exists()  # refused before the run folder was written
    stub.stop()


# -- refused commands leave nothing; stale tracebacks ------------------------------------------------------------


def test_a_refused_mlflow_dir_leaves_no_run_folder(bench, capsys):
    stub = Stub()
    run_dir = bench / "run"
    (bench / "a-file").write_text("not a folder")
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--mlflow-dir", str(bench / "a-file")))
    assert code == 2 and len(err) == 1 and "MLflow" in err[0]
    assert not run_dir.exists()  # no config.json, no sessions.jsonl
    stub.stop()


def test_a_judge_whose_gateway_turns_to_html_stops_as_an_outage_and_resumes(bench, capsys):
    stub = Stub()
    retrieving_bench(bench)
    run_dir = bench / "run"
    code, _, err = cli(capsys, rag_argv(bench, run_dir, stub, "--limit", "2"))
    assert code == 0, err
    # after the judge's LM check, a proxy's page instead of the API's JSON for every request
    stub.switch_after, stub.switch_to = stub.count + 1, "html"
    code, _, err = cli(capsys, ["judge", str(run_dir), "--no-mlflow"])
    assert code == 2 and "Traceback" not in "\n".join(err), err
    assert "the LM stopped answering" in err[-1] and "LMReplyFormatError" in err[-1] and "0/2 judgments" in err[-1]
    assert "this is a bug" not in err[-1] and not (run_dir / "tracebacks").exists()
    stub.mode = "ok"
    code, _, err = cli(capsys, ["judge", str(run_dir), "--no-mlflow"])
    assert code == 0, err
    assert len(RunFolder.open(run_dir).judgments()) == 2
    stub.stop()
