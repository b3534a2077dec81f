"""Faults survived, against a stub OpenAI-compatible server on 127.0.0.1 (no network, no real LM):
an endpoint that refuses connections or times out mid-run, huge and empty replies, a read-only or full
disk, concurrent evaluations in one MLflow store; and API keys that never reach a record."""

import json
import socket
import time
from pathlib import Path

import mlflow
import pytest
from stub_server import OPTIONS, SECRET, Stub
from support.cli_args import eval_argv, stub_args

from hcqr_dspy.errors import LMUnavailableError, RunError
from hcqr_dspy.evaluation.run_folder import PREDICTIONS, RunFolder
from hcqr_dspy.lm import build_lm
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)


def read_rows(path):
    return RunFolder(path.parent).rows()


def stub_lm(stub, **kw):
    return build_lm("openai/stub-model", api_base=stub.base, api_key_env="STUB_KEY", cache=False, num_retries=1, **kw)


def spec(bench, stub, name, **kw):
    return EvalSpec(
        method="cot",
        dataset=str(bench / "qs.json"),
        lm="openai/stub-model",
        api_base=stub.base,
        api_key_env="STUB_KEY",
        run_dir=str(bench / name),
        **kw,
    )


def untimed(m):
    """Metrics without durations and the CPU contention measured over them (they differ between two runs)."""
    return {k: v for k, v in m.items() if "seconds" not in k and "cpu_pressure" not in k}


def test_endpoint_refusing_connections_mid_run_stops_then_resume_matches_a_fresh_run(bench, mlflow_store):
    stub = Stub(down_after=3)
    with pytest.raises(LMUnavailableError, match=r"3/6 questions are saved .*run the same command again"):
        run_evaluation(spec(bench, stub, "run"), mlflow_dir=mlflow_store, progress=False, lm=stub_lm(stub))
    assert [r["qid"] for r in read_rows(bench / "run" / PREDICTIONS)] == ["q0", "q1", "q2"]
    with socket.socket() as s:  # really down: connections are refused
        assert s.connect_ex(("127.0.0.1", stub.port)) != 0

    back = Stub()  # the endpoint comes back (on another port: the same model, so the same run config)
    s = spec(bench, back, "run")
    s.api_base = stub.base  # the run's configuration is unchanged; only the transport moved
    resumed, _, _ = run_evaluation(s, mlflow_dir=mlflow_store, progress=False, lm=stub_lm(back))
    assert resumed.resumed == 3 and resumed.ran == 3 and back.count == 3
    fresh, _, _ = run_evaluation(spec(bench, back, "fresh"), mlflow_dir=mlflow_store, progress=False, lm=stub_lm(back))
    assert untimed(resumed.metrics) == untimed(fresh.metrics)
    assert [(r["qid"], r["prediction"]) for r in resumed.rows] == [(r["qid"], r["prediction"]) for r in fresh.rows]
    back.stop()


def test_endpoint_timing_out_stops_cleanly(bench, mlflow_store):
    stub = Stub()
    stub.mode = "slow"
    lm = stub_lm(stub)
    lm.kwargs["timeout"] = 0.5
    t0 = time.perf_counter()
    with pytest.raises(LMUnavailableError, match=r"0/6 questions are saved"):
        run_evaluation(spec(bench, stub, "run"), mlflow_dir=mlflow_store, progress=False, lm=lm)
    assert time.perf_counter() - t0 < 30  # retried with backoff, then stopped: it did not hang
    assert stub.count >= 2  # the first try and at least one retry
    stub.stop()


@pytest.mark.parametrize("mode", ["huge", "empty"])
def test_huge_or_empty_replies_are_invalid_answers_not_crashes(bench, mlflow_store, mode):
    stub = Stub()
    stub.mode = mode
    result, run_dir, _ = run_evaluation(
        spec(bench, stub, mode), mlflow_dir=mlflow_store, progress=False, lm=stub_lm(stub)
    )
    assert result.metrics["n"] == 6 and result.metrics["invalid"] == 6
    rows = read_rows(run_dir / PREDICTIONS)
    assert all(r["prediction"] is None and r["error"] for r in rows)
    assert max(len(line) for line in (run_dir / PREDICTIONS).read_text().splitlines()) < 20_000  # no 1 MB rows
    stub.stop()


def test_full_or_read_only_run_folder_fails_before_any_lm_call(bench, mlflow_store, monkeypatch):
    import hcqr_dspy.evaluation.records as ev

    stub = Stub()
    real = Path.write_text

    def full(self, *a, **kw):
        if ".write-test-" in self.name:
            raise OSError(28, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(ev.Path, "write_text", full)
    with pytest.raises(RunError, match="No space left on device"):
        run_evaluation(spec(bench, stub, "full"), mlflow_dir=mlflow_store, progress=False, lm=stub_lm(stub))

    def read_only(self, *a, **kw):
        if ".write-test-" in self.name:
            raise OSError(30, "Read-only file system")
        return real(self, *a, **kw)

    monkeypatch.setattr(ev.Path, "write_text", read_only)
    with pytest.raises(RunError, match="Read-only file system"):
        run_evaluation(spec(bench, stub, "ro"), mlflow_dir=mlflow_store, progress=False, lm=stub_lm(stub))
    assert stub.count == 0
    stub.stop()


def _evaluate_in_process(args):
    bench, base, name, store = args
    import os

    os.environ["STUB_KEY"] = SECRET
    from hcqr_dspy.lm import build_lm
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    s = EvalSpec(
        method="cot",
        dataset=f"{bench}/qs.json",
        lm="openai/stub-model",
        api_base=base,
        api_key_env="STUB_KEY",
        run_dir=f"{bench}/{name}",
    )
    lm = build_lm("openai/stub-model", api_base=base, api_key_env="STUB_KEY", cache=False, num_retries=1)
    result, _, run_id = run_evaluation(s, mlflow_dir=store, progress=False, lm=lm)
    return result.metrics["n"], run_id


def test_concurrent_evaluations_share_one_mlflow_store(bench, tmp_path_factory):
    import multiprocessing

    store = tmp_path_factory.mktemp("shared-store")
    stub = Stub()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        out = pool.map(_evaluate_in_process, [(str(bench), stub.base, f"p{i}", str(store)) for i in range(3)])
    assert [n for n, _ in out] == [6, 6, 6] and len({run_id for _, run_id in out}) == 3
    from hcqr_dspy.tracking import store as tracking

    tracking.configure(store)
    for _, run_id in out:
        run = mlflow.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.metrics["n"] == 6
    stub.stop()


def test_api_key_never_written_to_records_mlflow_logs_or_saved_programs(bench, mlflow_store, capfd, caplog):
    import uuid

    from hcqr_dspy.optimize.saved import save_program
    from hcqr_dspy.programs import CoT

    stub = Stub()
    # built from the spec (not passed in), the way `hcqr eval` builds it; fresh question texts so that
    # DSPy's response cache cannot answer in the stub's place
    nonce = uuid.uuid4().hex
    rows = {
        f"q{i}": {"question": f"Question number {i}? ({nonce})", "options": OPTIONS, "answer": "A"} for i in range(2)
    }
    (bench / "qs.json").write_text(json.dumps(rows))
    _, run_dir, run_id = run_evaluation(spec(bench, stub, "run"), mlflow_dir=mlflow_store, progress=False)
    auth = [v for h, _ in stub.seen for k, v in h.items() if k.lower() == "authorization"]
    assert auth and all(v == f"Bearer {SECRET}" for v in auth)  # the key was used ...
    save_program(CoT(), bench / "prog", lm={"spec": "openai/stub-model", "api_key_env": "STUB_KEY"})
    places = [p for p in list(bench.rglob("*")) + list(Path(mlflow_store).rglob("*")) if p.is_file()]
    assert any(p.suffix == ".db" for p in places) and any(p.name == PREDICTIONS for p in places)
    for path in places:  # ... but written nowhere: run folder, saved program, MLflow database and artifacts
        assert SECRET.encode() not in path.read_bytes(), path
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    assert SECRET not in json.dumps(run.data.params) and run.data.params["lm.api_key_env"] == "STUB_KEY"
    out, err = capfd.readouterr()
    assert SECRET not in out + err + caplog.text
    stub.stop()


def test_api_key_never_reaches_a_tracked_compile(bench, mlflow_store):
    """A real `run_compile` with the LM built from its spec and key variable: the saved program, the MLflow
    params, artifacts and logged model must not hold the key."""
    import uuid

    from hcqr_dspy.workflows.compile import CompileSpec, run_compile

    nonce = uuid.uuid4().hex
    rows = {
        f"{i:04d}": {"question": f"Question number {i}? ({nonce})", "options": OPTIONS, "answer": "ABC"[(i * 2) % 3]}
        for i in range(6)
    }
    (bench / "train.json").write_text(json.dumps(rows))
    stub = Stub()
    spec = CompileSpec(
        recipe=str(Path(__file__).resolve().parents[1] / "optimizers" / "bootstrap_fewshot.yaml"),
        method="cot",
        train=str(bench / "train.json"),
        index=None,
        out=str(bench / "programs" / "cot"),
        lm="openai/stub-model",
        api_base=stub.base,
        api_key_env="STUB_KEY",
        train_size=6,
        val_size=0,
    )
    out = run_compile(spec, mlflow_dir=mlflow_store)
    assert stub.count >= 1 and out["model_uri"]
    places = [p for p in list(bench.rglob("*")) + list(Path(mlflow_store).rglob("*")) if p.is_file()]
    assert any(p.name == "program.json" for p in places) and any(p.name == "MLmodel" for p in places)
    for path in places:
        assert SECRET.encode() not in path.read_bytes(), path
    stub.stop()


def test_cli_ask_and_eval_run_a_saved_program(bench, mlflow_store, capsys):
    """`hcqr ask --program` and `hcqr eval --program` through the CLI, against the stub endpoint."""
    import uuid

    from hcqr_dspy.cli import main
    from hcqr_dspy.optimize.recipes import load_recipe
    from hcqr_dspy.optimize.saved import save_program
    from hcqr_dspy.programs import CoT

    stub = Stub()
    program = CoT()
    # a fresh instruction text, so that DSPy's response cache (kept across runs) cannot answer for the stub
    program.answer.signature = program.answer.signature.with_instructions(
        f"Compiled instructions: answer carefully. ({uuid.uuid4().hex})"
    )
    save_program(
        program, bench / "prog", optimizer="BootstrapFewShot", recipe=load_recipe("bootstrap_fewshot").record()
    )
    lm = stub_args(stub)
    assert (
        main(
            [
                "ask",
                "--program",
                str(bench / "prog"),
                "--question",
                "Question number 1?",
                "--option",
                "A=x",
                "--option",
                "B=y",
                "--option",
                "C=z",
                *lm,
            ]
        )
        == 0
    )  # the stub answers question 1 with C
    out = capsys.readouterr().out
    assert "saved cot" in out and "optimizer BootstrapFewShot" in out and "C. z" in out
    assert any("Compiled instructions" in body for _, body in stub.seen)
    assert (
        main(
            [
                "eval",
                "--program",
                str(bench / "prog"),
                "--dataset",
                str(bench / "qs.json"),
                "--mlflow-dir",
                str(mlflow_store),
                "--run-dir",
                str(bench / "run"),
                *lm,
            ]
        )
        == 0
    )
    config = RunFolder.open(bench / "run").config
    assert config["method"] == "cot" and config["saved_program"]["recipe"] == "bootstrap_fewshot"
    assert (
        main(
            [
                "eval",
                "--program",
                str(bench / "prog"),
                "--method",
                "hcqr",
                "--dataset",
                str(bench / "qs.json"),
                "--run-dir",
                str(bench / "run2"),
                "--no-mlflow",
                *lm,
            ]
        )
        == 2
    )
    assert "saved 'cot' program, not 'hcqr'" in capsys.readouterr().err
    stub.stop()


def cli(capsys, argv):
    from hcqr_dspy.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


def test_an_lm_that_cannot_be_used_stops_before_anything_is_written(bench, capsys):
    run_dir = bench / "run"
    code, err = cli(capsys, eval_argv(bench, run_dir, "--lm", "openai-typo/x", "--no-mlflow"))  # a typo of the provider
    assert code == 2 and len(err) == 1 and "LiteLLM cannot route this model name" in err[0]
    assert not run_dir.exists()
    stub = Stub()
    stub.mode = "auth"  # the endpoint refuses the key
    code, err = cli(capsys, eval_argv(bench, run_dir, *stub_args(stub), "--no-mlflow"))
    assert code == 2 and len(err) == 1 and "cannot be used" in err[0] and SECRET not in err[0]
    assert not run_dir.exists()
    code, err = cli(capsys, eval_argv(bench, run_dir, "--lm", "gguf:/nonexistent/model.gguf", "--no-mlflow"))
    assert code == 2 and "GGUF file /nonexistent/model.gguf not found" in err[0] and not run_dir.exists()
    stub.mode = "ok"  # corrected: the same folder runs, nothing had to be deleted
    code, _ = cli(capsys, eval_argv(bench, run_dir, *stub_args(stub), "--no-mlflow"))
    assert code == 0 and len(read_rows(run_dir / PREDICTIONS)) == 6
    stub.stop()


def test_ask_fails_like_eval_when_the_endpoint_is_down(bench, capsys):
    stub = Stub()
    stub.stop()  # nothing listens there any more
    code, err = cli(
        capsys,
        [
            "ask",
            "--method",
            "cot",
            "--question",
            "Question number 1?",
            "--option",
            "A=alpha",
            "--option",
            "B=beta",
            *stub_args(stub),
        ],
    )
    errors = [line for line in err if line.startswith("hcqr: error:")]
    assert code == 2 and err[-1] == errors[0] and len(errors) == 1 and "cannot be used" in errors[0]
    assert err[0] == "loading the model openai/stub-model ..."  # it said what it was doing when the LM failed
    code, err = cli(
        capsys, ["ask", "--method", "cot", "--question", "Which?", "--option", "A=alpha", "--option", "A=beta"]
    )
    assert code == 2 and "--option A is given twice" in err[0]


def test_ask_says_what_it_is_doing_and_shows_each_passage_with_its_score_and_first_words(bench, capsys, demo_bm25):
    from hcqr_dspy.cli import main

    stub = Stub()

    code = main(
        [
            "ask",
            "--index",
            str(demo_bm25),
            "--question",
            "Question number 1? Yellow vision on digoxin.",
            "--option",
            "A=alpha",
            "--option",
            "B=beta",
            "--option",
            "C=gamma",
            *stub_args(stub),
            "--width",
            "40",
        ]
    )
    out, err = capsys.readouterr()
    stub.stop()
    assert code == 0, err
    steps = [line.strip() for line in err.splitlines()]
    assert steps[0] == f"loading the index {demo_bm25} ..." and steps[2] == "loading the model openai/stub-model ..."
    done = [s.split(" done")[0] for s in steps if " done in " in s]
    assert done == ["hypothesis", "rewrite", "retrieval", "answer"]
    assert "hypothesis done in" in err and "(1 LM call)" in err
    lines = out.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("Passages (")))
    passage = lines[first + 1]
    assert passage.startswith("  [ 1]") and "(found by q" in passage and float(passage.split("]", 1)[1].split()[0]) > 0
    snippet_line = lines[first + 2].strip()
    assert 0 < len(snippet_line) <= 44 and snippet_line.endswith(" ...")
    assert lines[-3:-1] == ["Answer", "  C. gamma"]


@pytest.fixture(scope="module")
def demo_bm25(tmp_path_factory):
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    out = tmp_path_factory.mktemp("demo") / "bm25"
    corpus = Path(__file__).resolve().parents[1] / "data" / "demo" / "corpus.jsonl"
    BM25Retriever(load_corpus(corpus), show_progress=False).save(out)
    return out


@pytest.mark.parametrize("extra, k, fused", [(["--k-per-query", "7"], 7, 14), ([], 8, 15)])
def test_k_per_query_reaches_an_ablation_and_its_default_is_hcqrs(bench, capsys, demo_bm25, extra, k, fused):
    """hcqr_no_support sends two queries: k per query each (at most 2k candidates fused, at most 15 kept)."""
    stub = Stub()
    run_dir = bench / f"ablation-{k}"
    options = ("--index", str(demo_bm25), *stub_args(stub), "--no-mlflow", "--limit", "2", *extra)
    argv = eval_argv(bench, run_dir, *options, method="hcqr_no_support")
    code, err = cli(capsys, argv)
    assert code == 0, err
    assert RunFolder.open(run_dir).config["program"]["k_per_query"] == k
    for row in read_rows(run_dir / PREDICTIONS):
        assert row["query_sources"] == ["rewrite", "rewrite"]
        fused_here = row["passages"] + row["dropped_passages"]
        assert len(fused_here) <= fused and max(r for p in fused_here for r in p["ranks"]) == k
    stub.stop()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "cot", "--fusion", "rrf"], "--fusion does not apply to method 'cot'"),
        (["--method", "simple_rag", "--k-per-query", "3"], "--k-per-query does not apply to method 'simple_rag'"),
        (["--method", "query_rewrite", "--k-per-query", "3"], "--k-per-query does not apply to method 'query_rewrite'"),
    ],
)
def test_a_flag_that_does_not_apply_is_refused(bench, capsys, demo_bm25, extra, message):
    argv = [
        "eval",
        "--dataset",
        str(bench / "qs.json"),
        "--index",
        str(demo_bm25),
        "--lm",
        "local:smollm2-135m",
        "--run-dir",
        str(bench / "r"),
        "--no-mlflow",
        *extra,
    ]
    code, err = cli(capsys, argv)
    assert code == 2 and len(err) == 1 and message in err[0] and not (bench / "r").exists()
