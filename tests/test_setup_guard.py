"""A strict setup refuses, before a question is answered, to add rows on another setup than the run folders recorded:
`hcqr eval --strict-setup` against its own folder's sessions, an experiment file's `strict_setup` against every cell's;
the field that differs is named in one line and nothing is written."""

import json
import shutil
from importlib import metadata

import pytest
from helpers import compile_spec
from stub_server import Stub
from test_compile_seeds import gold_lm
from test_faults import spec
from test_setups import evaluate, other_versions, own_cache, session, stub_lm  # noqa: F401 - a fixture

from hcqr_dspy.cli import main
from hcqr_dspy.errors import ProgramFormatError, SetupMismatchError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.optimize.saved import read_meta
from hcqr_dspy.reporting.runs import load_run
from hcqr_dspy.reporting.setups import arm_setup, mixed_fields
from hcqr_dspy.workflows.compile_seeds import run_compile_seeds
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.setup_guard import check_same_setup


def write_sessions(folder, *records):
    folder.mkdir(parents=True)
    (folder / "sessions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_the_first_field_that_differs_from_any_recorded_session_is_named(tmp_path):
    same = write_sessions(tmp_path / "same", session(1, 0))
    check_same_setup(session(9, 0), [same, tmp_path / "no-such-folder"])  # one setup; a folder never run: nothing
    judged = write_sessions(tmp_path / "judged", {**session(1, 0, engine={"build": "portable"}), "command": "judge"})
    check_same_setup(session(9, 0), [judged])  # a judge's session answered no question of the run
    later = write_sessions(tmp_path / "later", session(1, 0), session(2, 3, engine={"n_ubatch": 256}))
    with pytest.raises(
        SetupMismatchError, match=r"this session's n_ubatch is 512, but .*later \(session 2\) recorded 256"
    ):
        check_same_setup(session(9, 0), [same, later])
    # the first field in the report's order: the model file before the build, the build before the batch size
    with pytest.raises(SetupMismatchError, match=r"this session's llama.cpp build is portable, but .*later"):
        check_same_setup(session(9, 0, engine={"build": "portable", "n_ubatch": 128}), [later])
    with pytest.raises(SetupMismatchError, match=r"this session's model file is cdcdcdcdcdcd, but .*recorded ababab"):
        check_same_setup(session(9, 0, engine={"build": "portable", "model_sha256": "cd" * 32}), [later])
    # threads are compared with flash attention on only, as compare does
    two = write_sessions(tmp_path / "two", session(1, 0, engine={"n_threads": 2, "flash_attn": False}))
    check_same_setup(session(9, 0, engine={"n_threads": 16, "flash_attn": False}), [two])
    with pytest.raises(SetupMismatchError, match=r"flash_attn is on, but"):
        check_same_setup(session(9, 0, engine={"n_threads": 2}), [two])
    # an endpoint's session shares only dspy with an in-process one: nothing else is compared
    card = {"id": "m", "root": "/ckpt"}
    check_same_setup(session(9, 0, engine=None, endpoint=card), [same])


def test_eval_strict_setup_refuses_a_resume_on_another_setup(bench, own_cache, monkeypatch, capsys):  # noqa: F811
    stub = Stub()
    try:
        evaluate(bench, stub, "run", stub_lm(stub))
        folder = RunFolder(bench / "run")
        lines = folder.predictions.path.read_text().splitlines()
        folder.predictions.path.write_text("\n".join(lines[:4]) + "\n")  # killed after four questions
        before = (folder.predictions.path.read_text(), (bench / "run" / "sessions.jsonl").read_text())
        real = metadata.version("dspy")
        argv = ["eval", "--method", "cot", "--dataset", str(bench / "qs.json"), "--lm", "openai/stub-model"]
        argv += ["--api-base", stub.base, "--api-key-env", "STUB_KEY", "--run-dir", str(bench / "run"), "--no-mlflow"]
        with monkeypatch.context() as m:
            other_versions(m)  # resumed after an upgrade of dspy
            capsys.readouterr()
            assert main([*argv, "--strict-setup"]) == 2
            [line] = capsys.readouterr().err.strip().splitlines()
            assert line.startswith("hcqr: error: strict setup: this session's dspy is 3.9.0, but ")
            assert f"run (session 1) recorded {real}" in line and "nothing was written" in line
            asked = stub.count
            with pytest.raises(SetupMismatchError, match=r"dspy is 3.9.0"):
                run_evaluation(
                    spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub), strict_setup=True
                )
            assert stub.count == asked  # refused before any question
            assert before == (folder.predictions.path.read_text(), (bench / "run" / "sessions.jsonl").read_text())
            # not strict: resumed on the other setup and recorded so (the run is mixed, which compare flags)
            run_evaluation(spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub))
            assert len(folder.rows()) == 6 and [s["packages"]["dspy"] for s in folder.sessions()] == [real, "3.9.0"]
            # a finished run answers nothing: a strict rerun is not refused
            run_evaluation(spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub), strict_setup=True)
        # a folder already mixed: a strict resume on either setup is refused
        folder.predictions.path.write_text("\n".join(folder.predictions.path.read_text().splitlines()[:5]) + "\n")
        with pytest.raises(SetupMismatchError, match=rf"dspy is {real}, but .*run \(session 2\) recorded 3.9.0"):
            run_evaluation(spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub), strict_setup=True)
    finally:
        stub.stop()


def test_a_resume_with_other_questions_in_flight_is_refused_strict_and_mixed_otherwise(bench, own_cache):  # noqa: F811
    stub = Stub()
    try:
        evaluate(bench, stub, "run", stub_lm(stub))  # one question at a time
        folder = RunFolder(bench / "run")
        lines = folder.predictions.path.read_text().splitlines()
        folder.predictions.path.write_text("\n".join(lines[:4]) + "\n")
        [first] = folder.sessions()
        assert first["questions_in_flight"] == 1
        four = spec(bench, stub, "run", num_threads=4)
        with pytest.raises(SetupMismatchError, match=r"questions in flight is 4, but .*run \(session 1\) recorded 1;"):
            run_evaluation(four, progress=False, track=False, lm=stub_lm(stub), strict_setup=True)
        run_evaluation(four, progress=False, track=False, lm=stub_lm(stub))  # not strict: recorded, and mixed
        assert [s["questions_in_flight"] for s in folder.sessions()] == [1, 4]
        assert mixed_fields(arm_setup(load_run(bench / "run"))) == ["questions in flight"]
    finally:
        stub.stop()


def test_a_resume_on_a_server_upgraded_in_place_is_refused_strict_and_not_served_from_the_cache(bench, own_cache):  # noqa: F811
    stub = Stub(version="0.10.1")  # vLLM 0.10.1 serving the same checkpoint under the same name
    try:
        evaluate(bench, stub, "run", stub_lm(stub))
        folder = RunFolder(bench / "run")
        lines = folder.predictions.path.read_text().splitlines()
        folder.predictions.path.write_text("\n".join(lines[:4]) + "\n")
        [first] = folder.sessions()
        assert first["endpoint"]["server_version"] == "0.10.1"
        stub.version = "0.11.0"  # upgraded; its model card is unchanged
        with pytest.raises(SetupMismatchError, match=r"endpoint server version is 0.11.0, but .*recorded 0.10.1;"):
            run_evaluation(spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub), strict_setup=True)
        asked = stub.count
        run_evaluation(spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub))  # mixed, recorded
        assert stub.count - asked == 2  # the two questions left were asked anew, not served from 0.10.1's replies
        assert [s["endpoint"]["server_version"] for s in folder.sessions()] == ["0.10.1", "0.11.0"]
        assert mixed_fields(arm_setup(load_run(bench / "run"))) == ["endpoint server version"]
    finally:
        stub.stop()


def test_compile_seeds_strict_setup_refuses_the_seeds_left_on_another_setup(demo_bm25, tmp_path, monkeypatch, capsys):
    root = tmp_path / "bfs"
    run_compile_seeds(compile_spec(demo_bm25, root), [0], track=False, lm=gold_lm())
    real = metadata.version("dspy")
    with monkeypatch.context() as m:
        other_versions(m)  # the seeds left, compiled after an upgrade of dspy
        with pytest.raises(SetupMismatchError, match=rf"dspy is 3.9.0, but .*bfs/seed-0 recorded {real}"):
            run_compile_seeds(compile_spec(demo_bm25, root), [0, 1], track=False, lm=gold_lm(), strict_setup=True)
        assert sorted(p.name for p in root.iterdir()) == ["seed-0"]  # nothing written
        done = run_compile_seeds(compile_spec(demo_bm25, root), [0, 1], track=False, lm=gold_lm())
    assert [s["status"] for s in done["seeds"]] == ["skipped", "compiled"]  # not strict: compiled, and recorded so
    assert read_meta(root / "seed-1")["compile_setup"]["session"]["packages"]["dspy"] == "3.9.0"
    # every seed saved in the folder is checked, asked for now or not: seed 1 (on 3.9.0) refuses seed 2 here
    with pytest.raises(SetupMismatchError, match=r"dspy is .*, but .*bfs/seed-1 recorded 3.9.0"):
        run_compile_seeds(compile_spec(demo_bm25, root), [0, 2], track=False, lm=gold_lm(), strict_setup=True)
    shutil.rmtree(root / "seed-1")
    # on the saved seeds' setup: compiled
    done = run_compile_seeds(compile_spec(demo_bm25, root), [0, 2], track=False, lm=gold_lm(), strict_setup=True)
    assert [s["status"] for s in done["seeds"]] == ["skipped", "compiled"]
    # a seed served cached replies of an unrecorded setup cannot be checked
    meta = json.loads((root / "seed-2" / "meta.json").read_text())
    meta["compile_setup"]["cached_setups"] = [{"setup": "unrecorded", "calls": 3}]
    (root / "seed-2" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SetupMismatchError, match=r"seed-2 was served cached replies of an unrecorded setup"):
        run_compile_seeds(compile_spec(demo_bm25, root), [3], track=False, lm=gold_lm(), strict_setup=True)
    # a seed served a reply made under another setup is on that setup too
    other = {**meta["compile_setup"]["session"], "packages": {"dspy": "3.8.0"}}
    meta["compile_setup"]["cached_setups"] = [{"setup": "abcd", "calls": 1, "record": other}]
    (root / "seed-2" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SetupMismatchError, match=r"seed-2 \(a cached reply it was served\) recorded 3.8.0"):
        run_compile_seeds(compile_spec(demo_bm25, root), [3], track=False, lm=gold_lm(), strict_setup=True)
    shutil.rmtree(root / "seed-2")
    # a meta.json malformed in itself is no interrupted save: refused, never compiled over, strict or not
    meta = json.loads((root / "seed-0" / "meta.json").read_text())
    (root / "seed-0" / "meta.json").write_text(json.dumps({**meta, "compile_setup": "abc"}))
    saved = (root / "seed-0" / "program.json").read_bytes()
    with pytest.raises(ProgramFormatError, match=r"compile_setup.*not left so by an interrupted save: repair it"):
        run_compile_seeds(compile_spec(demo_bm25, root), [0, 1], track=False, lm=gold_lm())
    assert (root / "seed-0" / "program.json").read_bytes() == saved and not (root / "seed-1").exists()
    # a saved seed without a record cannot be checked
    del meta["compile_setup"]
    (root / "seed-0" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SetupMismatchError, match=r"saved program .*seed-0 records no compile setup"):
        run_compile_seeds(compile_spec(demo_bm25, root), [0, 3], track=False, lm=gold_lm(), strict_setup=True)
    assert not (root / "seed-3").exists()
    argv = ["compile", "--recipe", "bootstrap_fewshot", "--train", "q.json", "--out", str(tmp_path / "x")]
    capsys.readouterr()
    assert main([*argv, "--strict-setup"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "hcqr: error: --strict-setup applies to --seeds: it checks the seeds left against the seeds saved"


def test_rows_no_session_wrote_cannot_be_checked_and_a_bad_row_is_refused_before_the_lm(bench, capsys):
    stub = Stub()
    try:
        evaluate(bench, stub, "run", stub_lm(stub))
        folder = RunFolder(bench / "run")
        rows = folder.predictions.path.read_text().splitlines()
        folder.predictions.path.write_text("\n".join(rows[:4]) + "\n")
        (bench / "run" / "sessions.jsonl").write_text("")  # the session record lost: four rows of unknown setup
        asked = stub.count
        with pytest.raises(SetupMismatchError, match=r"4 row\(s\) of .*run were written before any recorded"):
            run_evaluation(spec(bench, stub, "run"), progress=False, track=False, lm=stub_lm(stub), strict_setup=True)
        assert stub.count == asked and len(folder.predictions.path.read_text().splitlines()) == 4
        # a row edited by hand is refused in one line before the LM is asked, strict or not
        first = json.loads(rows[0])
        folder.predictions.path.write_text("\n".join([json.dumps({**first, "cpu_pressure": "abc"}), *rows[1:4]]) + "\n")
        argv = ["eval", "--method", "cot", "--dataset", str(bench / "qs.json"), "--lm", "openai/stub-model"]
        argv += ["--api-base", stub.base, "--api-key-env", "STUB_KEY", "--run-dir", str(bench / "run"), "--no-mlflow"]
        capsys.readouterr()
        assert main(argv) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert "the row of question 'q0' has cpu_pressure='abc', not a share from 0 to 1" in line
        assert stub.count == asked and len(folder.predictions.path.read_text().splitlines()) == 4
    finally:
        stub.stop()
