"""Folders whose records cannot be lost, made for real against the stub OpenAI-compatible server on 127.0.0.1: a run
folder given as another tool's folder (or the other way round), a run folder that lost its ``config.json``, a
finished compile overwritten, a killed compile's MLflow run, and write probes on a full disk (a real tmpfs)."""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlflow
import pytest
from stub_server import OPTIONS, Stub
from support.cli_args import stub_args
from test_study_faults import REPO, cli, eval_argv, fill, small_disk  # noqa: F401 (small_disk is a fixture)

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.run_folder import CONFIG, PREDICTIONS, SESSIONS, RunFolder
from hcqr_dspy.optimize.saved import META_FILE, STATE_FILE

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)


def compile_argv(bench, out, stub, *extra):
    """`hcqr compile` of CoT with the shipped bootstrap_fewshot recipe on four of the bench's ``train.json``."""
    return [
        "compile",
        *("--recipe", "bootstrap_fewshot", "--program", "cot", "--train", str(bench / "train.json")),
        *("--train-size", "4", "--val-size", "0", "--out", str(out), *stub_args(stub), *extra),
    ]


def training_questions(bench):
    """Six questions the stub answers, worded afresh so that no reply comes from DSPy's cache."""
    nonce = uuid.uuid4().hex
    rows = {
        f"{i:04d}": {"question": f"Question number {i}? ({nonce})", "options": OPTIONS, "answer": "ABC"[(i * 2) % 3]}
        for i in range(6)
    }
    (bench / "train.json").write_text(json.dumps(rows))


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_dir_that_is_another_tools_folder_and_an_index_out_that_holds_a_run_are_refused(bench, capsys):
    stub = Stub()
    corpus = bench / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "title": "Digoxin", "content": "Digoxin toxicity: yellow vision."}))
    assert main(["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(bench / "idx")]) == 0
    for name in ("a", "b"):
        code, _, err = cli(capsys, eval_argv(bench, bench / name, stub, "--limit", "2", "--no-mlflow"))
        assert code == 0, err
    code, _, err = cli(
        capsys, ["compare", str(bench / "a"), str(bench / "b"), "--out", str(bench / "cmp"), "--no-mlflow"]
    )
    assert code == 0, err
    training_questions(bench)
    code, _, err = cli(capsys, compile_argv(bench, bench / "prog", stub, "--no-mlflow"))
    assert code == 0, err
    seen = len(stub.seen)
    for folder, kind, marker, command in [
        ("idx", "an index folder", "manifest.json", "hcqr index"),
        ("prog", "a saved program folder", "meta.json", "hcqr compile"),
        ("cmp", "a comparison folder", "comparison.md", "hcqr compare"),
    ]:
        before = listing(bench / folder)
        code, _, err = cli(capsys, eval_argv(bench, bench / folder, stub, "--limit", "2", "--no-mlflow"))
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"hcqr: error: --run-dir {bench / folder} is {kind} (it holds {marker}")
        assert f"written by `{command}`); write the run to a folder of its own" in err[0]
        assert listing(bench / folder) == before  # no config.json, sessions.jsonl or lock left in it
    assert len(stub.seen) == seen  # refused before the LM was asked
    # an index folder that holds a run's records (written there before this was refused): `hcqr index --out` keeps them
    for name in (CONFIG, PREDICTIONS, SESSIONS):
        (bench / "idx" / name).write_bytes((bench / "a" / name).read_bytes())
    before = listing(bench / "idx")
    code, _, err = cli(capsys, ["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(bench / "idx")])
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"hcqr: error: --out {bench / 'idx'} is a run folder (it holds {CONFIG}, {PREDICTIONS}, {SESSIONS}, written "
        "by `hcqr eval`); write the index to a folder of its own"
    )
    assert listing(bench / "idx") == before
    code, _, err = cli(capsys, ["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(bench / "a")])
    assert code == 2 and len(err) == 1 and "is a run folder" in err[0], err
    assert len(RunFolder.open(bench / "a").rows()) == 2
    stub.stop()


def test_a_run_folder_with_rows_but_no_config_is_refused_never_resumed_under_other_settings(bench, capsys):
    stub = Stub()
    run_dir = bench / "run"
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--limit", "4", "--no-mlflow"))
    assert code == 0, err
    (run_dir / CONFIG).unlink()
    before, seen = listing(run_dir), len(stub.seen)
    # other settings: more questions, another budget (a flag cot refuses is not used: --max-tokens)
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--limit", "6", "--max-tokens", "300", "--no-mlflow"))
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"hcqr: error: run folder {run_dir} holds the records of a run ({PREDICTIONS}: 4 rows, {SESSIONS}) but no "
        f"{CONFIG}, so the settings they were made with are unknown and they cannot be resumed; put its {CONFIG} "
        "back, or give --run-dir another folder"
    )
    assert listing(run_dir) == before and len(stub.seen) == seen  # nothing written, no LM asked
    # a session record alone (a run stopped before its first row) is a run's record too
    (run_dir / PREDICTIONS).write_text("")
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    assert code == 2 and len(err) == 1 and f"holds the records of a run ({SESSIONS}) but no {CONFIG}" in err[0], err
    stub.stop()


def test_compile_refuses_to_overwrite_a_finished_program_unless_told_to_replace_it(bench, capsys):
    stub = Stub()
    training_questions(bench)
    prog = bench / "prog"
    code, _, err = cli(capsys, compile_argv(bench, prog, stub, "--no-mlflow"))
    assert code == 0, err
    before, seen = listing(prog), len(stub.seen)
    code, _, err = cli(capsys, compile_argv(bench, prog, stub, "--no-mlflow", "--seed", "3"))
    assert code == 2 and len(err) == 1, err
    created = json.loads((prog / META_FILE).read_text())["created"]
    assert err[0] == (
        f"hcqr: error: --out {prog} holds a finished saved program ({META_FILE}, {STATE_FILE}: cot, recipe "
        f"bootstrap_fewshot, seed 0, saved {created}); give --replace to compile over it, or choose another --out"
    )
    assert listing(prog) == before and len(stub.seen) == seen  # refused before any LM call
    code, _, err = cli(capsys, compile_argv(bench, prog, stub, "--no-mlflow", "--seed", "3", "--replace"))
    assert code == 0, err
    assert json.loads((prog / META_FILE).read_text())["recipe"]["seed"] == 3
    code, _, err = cli(capsys, compile_argv(bench, bench / "seeds", stub, "--no-mlflow", "--seeds", "0,1", "--replace"))
    assert code == 2 and err == ["hcqr: error: --replace applies to one compile; --seeds skips the seeds saved already"]
    stub.stop()


def test_a_killed_compiles_mlflow_run_is_closed_as_failed_by_the_next_compile_into_its_folder(bench, capsys, tmp_path):
    stub = Stub(delay=1.0)  # four training questions: the compile asks for 4 s or more
    training_questions(bench)
    prog, store = bench / "prog", tmp_path / "mlruns"
    argv = [sys.executable, "-m", "hcqr_dspy.cli", *compile_argv(bench, prog, stub, "--mlflow-dir", str(store))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while stub.count < 2 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # its MLflow run is open while the optimizer asks the LM
        assert child.poll() is None and stub.count >= 2, child.communicate()
    finally:
        child.kill()
        child.communicate()
    from hcqr_dspy.tracking.store import configure

    configure(store)
    [stale] = mlflow.search_runs(
        search_all_experiments=True, filter_string="tags.kind = 'compile'", output_format="list"
    )
    assert stale.info.status == "RUNNING"  # a killed process never ends its run
    stub.delay = 0.0
    code, _, err = cli(capsys, compile_argv(bench, prog, stub, "--mlflow-dir", str(store)))
    assert code == 0, err
    assert mlflow.get_run(stale.info.run_id).info.status == "FAILED"
    assert (
        f"hcqr: note: MLflow run {stale.info.run_id} of an earlier compile into {prog} was left running (the "
        "process was stopped); closed as FAILED"
    ) in err
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.kind = 'compile'", output_format="list")
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"]
    stub.stop()


def test_write_probes_on_a_full_disk_leave_nothing_behind(bench, small_disk, capsys):  # noqa: F811
    stub = Stub()
    filler = fill(small_disk)
    run_dir = small_disk / "run"
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    assert code == 2 and len(err) == 1 and "No space left on device" in err[0], err
    assert not run_dir.exists()  # no .write-test-<pid> probe, no folder
    training_questions(bench)
    code, _, err = cli(capsys, compile_argv(bench, small_disk / "prog", stub, "--no-mlflow"))
    assert code == 2 and len(err) == 1 and "No space left on device" in err[0], err
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    # 8 KiB free: the probe, the lock's label and config.json fit, the session record does not
    with filler.open("r+b") as fh:
        fh.truncate(filler.stat().st_size - 8192)
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hcqr: error: the disk is full (No space left on device") and str(run_dir) in err[0]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no config.json, no 0-byte sessions.jsonl
    filler.unlink()  # space freed: the same command runs
    code, _, err = cli(capsys, eval_argv(bench, run_dir, stub, "--no-mlflow"))
    assert code == 0, err
    assert len(RunFolder.open(run_dir).rows()) == 6
    stub.stop()


def test_a_run_inside_an_index_or_program_folder_is_refused_and_a_rebuild_keeps_what_the_index_did_not_write(
    bench, capsys
):
    stub = Stub()
    corpus = bench / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "title": "Digoxin", "content": "Digoxin toxicity: yellow vision."}))
    idx = bench / "idx"
    index_argv = ["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(idx)]
    assert main(index_argv) == 0
    capsys.readouterr()
    prog = bench / "prog"  # the files that mark a saved program folder
    prog.mkdir()
    (prog / META_FILE).write_text("{}")
    (prog / STATE_FILE).write_text("{}")
    seen = len(stub.seen)
    for parent, kind, held, command in [
        (idx, "an index folder", "manifest.json", "hcqr index"),
        (prog, "a saved program folder", f"{META_FILE}, {STATE_FILE}", "hcqr compile"),
    ]:
        before = listing(parent)
        code, _, err = cli(capsys, eval_argv(bench, parent / "runs" / "sub", stub, "--limit", "2", "--no-mlflow"))
        assert code == 2 and len(err) == 1, err
        assert err[0] == (
            f"hcqr: error: --run-dir {parent / 'runs' / 'sub'} is inside {parent}, {kind} (it holds {held}, written "
            f"by `{command}`); write the run to a folder of its own, outside it"
        )
        assert listing(parent) == before and not (parent / "runs").exists()
    assert len(stub.seen) == seen  # refused before the LM was asked
    code, _, err = cli(capsys, ["index", *index_argv[1:-1], str(idx / "inner")])  # an index inside another
    assert code == 2 and len(err) == 1 and f"is inside {idx}, an index folder" in err[0], err
    # a run folder and a note put inside the index (by hand, or before this was refused): a rebuild keeps both
    code, _, err = cli(capsys, eval_argv(bench, bench / "a", stub, "--limit", "2", "--no-mlflow"))
    assert code == 0, err
    (idx / "runs").mkdir()
    (bench / "a").rename(idx / "runs" / "a")
    (idx / "notes.txt").write_text("why this index")
    for foreign, kind in [(idx / "notes.txt", "file"), (idx / "runs", "folder")]:
        before = listing(idx)
        code, _, err = cli(capsys, index_argv)
        assert code == 2 and len(err) == 1, err
        assert err[0] == (
            f"hcqr: error: index {idx} holds the {kind} {foreign}, which `hcqr index` did not write, and a rebuild "
            f"replaces the whole folder; move it out of {idx} or give --out another folder"
        )
        assert listing(idx) == before
        os.rename(foreign, bench / foreign.name)
    assert len(RunFolder.open(bench / "runs" / "a").rows()) == 2
    assert main(index_argv) == 0  # an index holding only its own files is rebuilt
    assert sorted(p.name for p in bench.iterdir() if p.name.startswith(".idx")) == []
    stub.stop()
