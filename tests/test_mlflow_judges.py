"""MLflow's built-in retrieval judges (`hcqr judge --mlflow-scorers`) on tracked runs made here against the stub
OpenAI-compatible server (stub_server.py answers their JSON prompt): RetrievalRelevance and RetrievalGroundedness run
through MLflow's own code, their feedback read back from the traces with MLflow's API, a rerun judges nothing again,
failed calls are counted and judged again, `hcqr compare` summarises them per run; and the refusals (a judge LM that
cannot be reached, a run without tracking or traces), one line each with nothing written. A local judge LM, served
for the judging: test_mlflow_judges_local.py."""

import json

import mlflow
import pytest
from helpers import TINY_ROWS, snippet, write_jsonl
from stub_server import OPTIONS, Stub
from support.cli_args import stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.mlflow_record import MLFLOW_JUDGES_FILE
from hcqr_dspy.tracking.retrieval_judges import FEEDBACK_SOURCE

pytestmark = pytest.mark.slow  # four tracked evaluations and their judging: about a minute on 2 cores


def cli(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tracked runs in one store over two questions that BM25 answers with p1, p2 (anemia) and p3 (yellow vision):
    Simple RAG (one RETRIEVER span of those three passages), HCQR (three spans, p3 each: the stub's queries),
    another Simple RAG left unjudged, one with --traces off and one with --no-mlflow; the stub keeps running."""
    root = tmp_path_factory.mktemp("mlflow-judges")
    mp = pytest.MonkeyPatch()
    from stub_server import SECRET

    mp.setenv("STUB_KEY", SECRET)
    corpus = write_jsonl(root / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
    assert main(["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(root / "idx")]) == 0
    questions = {
        f"q{i}": {"question": f"Question number {i}? Anemia, or yellow vision?", "options": OPTIONS, "answer": "A"}
        for i in range(2)
    }
    (root / "qs.json").write_text(json.dumps(questions))
    stub = Stub()
    store = root / "mlruns"

    def evaluate(name, method, *extra):
        argv = ["eval", "--method", method, "--dataset", str(root / "qs.json"), "--index", str(root / "idx")]
        assert main([*argv, "--run-dir", str(root / name), *stub_args(stub), *extra]) == 0
        return root / name

    made = {
        "simple_rag": evaluate("simple_rag", "simple_rag", "--mlflow-dir", str(store)),
        "hcqr": evaluate("hcqr", "hcqr", "--mlflow-dir", str(store)),
        "untouched": evaluate("untouched", "simple_rag", "--mlflow-dir", str(store)),
        "no_traces": evaluate("no_traces", "simple_rag", "--mlflow-dir", str(store), "--traces", "off"),
        "untracked": evaluate("untracked", "simple_rag", "--no-mlflow"),
    }
    yield root, store, stub, made
    stub.stop()
    mp.undo()


def judge_argv(run_dir, stub, store, *extra, lm="openai/stub-model"):
    return ["judge", str(run_dir), "--mlflow-scorers", *extra, "--mlflow-dir", str(store)] + [
        "--judge-lm",
        lm,
        "--api-base",
        stub.base,
        "--api-key-env",
        "STUB_KEY",
    ]


def ours(trace, name):
    return [
        a
        for a in trace.info.assessments
        if a.name == name and (a.metadata or {}).get("source") == FEEDBACK_SOURCE and a.error is None
    ]


def test_mlflow_judges_label_each_trace_once_and_the_values_are_read_back(runs, capsys):
    root, store, stub, made = runs
    before = len(stub.seen)
    code, out, err = cli(capsys, judge_argv(made["simple_rag"], stub, store))
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # per question: RetrievalRelevance asks once per passage (3), RetrievalGroundedness once per span (1); a probe first
    assert len(stub.seen) - before == 1 + 2 * (3 + 1)
    assert result["counts"] == {"judged": 4, "already": 0, "no_passages": 0, "failed": 0}
    assert result["mlflow_judges"]["retrieval_relevance"] == {"mean": pytest.approx(1 / 3), "se": 0.0, "n": 2}
    assert result["mlflow_judges"]["retrieval_groundedness"]["mean"] == 0.0
    folder = RunFolder.open(made["simple_rag"])
    for row in folder.rows():  # MLflow's own API: each passage's feedback on the question's trace
        trace = mlflow.get_trace(row["trace_id"])
        relevance = ours(trace, "retrieval_relevance")
        assert sorted(str(a.value) for a in relevance) == ["no", "no", "yes"]
        assert all(
            a.source.source_type == "LLM_JUDGE" and a.source.source_id == "openai:/stub-model" for a in relevance
        )
        assert all(a.metadata["judge_lm"] == "openai/stub-model" and a.span_id for a in relevance)
        assert [a.value for a in ours(trace, "retrieval_relevance/precision")] == [pytest.approx(1 / 3)]
        assert [str(a.value) for a in ours(trace, "retrieval_groundedness")] == ["no"]
        assert trace.info.assessments[0].name == "answer"  # the gold expectation is still there
    record = folder.read_json(MLFLOW_JUDGES_FILE)
    assert {q: v["retrieval_relevance"] for q, v in record["questions"].items()} == {
        "q0": pytest.approx(1 / 3),
        "q1": pytest.approx(1 / 3),
    }
    metrics = mlflow.get_run(folder.mlflow_run_id).data.metrics
    assert metrics["retrieval_relevance/mean"] == pytest.approx(1 / 3)
    assert metrics["retrieval_groundedness/mean"] == 0.0
    before = len(stub.seen)  # judged again: every trace holds this judge's feedback, only the probe is asked
    code, out, err = cli(capsys, judge_argv(made["simple_rag"], stub, store))
    assert code == 0, err
    assert len(stub.seen) - before == 1
    assert json.loads(out.strip().splitlines()[-1])["counts"]["already"] == 4
    trace = mlflow.get_trace(folder.rows()[0]["trace_id"])
    assert len(ours(trace, "retrieval_relevance")) == 3  # nothing logged twice


def test_failed_judge_calls_are_counted_and_judged_again(runs, capsys):
    root, store, stub, made = runs
    judge = "openai/stub-two"  # a judge of its own: what another test's judge logged is replaced, never "already"
    stub.switch_after, stub.switch_to = stub.count + 1, "empty"  # the probe is answered, then every reply is empty
    try:
        code, out, err = cli(capsys, judge_argv(made["hcqr"], stub, store, "groundedness", lm=judge))
    finally:
        stub.mode, stub.switch_after = "ok", None
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["counts"]["failed"] == 2 and result["counts"]["judged"] == 0
    assert any("2 MLflow judge call(s) failed" in line for line in err)
    folder = RunFolder.open(made["hcqr"])
    trace = mlflow.get_trace(folder.rows()[0]["trace_id"])
    [failed] = [a for a in trace.info.assessments if a.name == "retrieval_groundedness"]
    assert failed.error.error_code == "JUDGE_FAILED"
    code, out, err = cli(capsys, judge_argv(made["hcqr"], stub, store, "groundedness", lm=judge))  # retried
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["counts"] == {
        "judged": 2,
        "already": 0,
        "no_passages": 0,
        "failed": 0,
    }
    trace = mlflow.get_trace(folder.rows()[0]["trace_id"])
    assert [str(a.value) for a in trace.info.assessments if a.name == "retrieval_groundedness"] == ["no"] * 3


def test_compare_summarises_the_mlflow_judges_per_run(runs, capsys):
    root, store, stub, made = runs
    for name in ("simple_rag", "hcqr"):
        code, _, err = cli(capsys, judge_argv(made[name], stub, store))
        assert code == 0, err
    out = root / "comparison"
    code, _, err = cli(capsys, ["compare", str(made["simple_rag"]), str(made["hcqr"]), "--out", str(out)])
    assert code == 0, err
    report = (out / "comparison.md").read_text()
    assert "## MLflow retrieval judges" in report
    assert "| simple_rag | 33.3% ± 0.0% (n 2) | 0.0% ± 0.0% (n 2) |" in report
    assert "| hcqr | 100.0% ± 0.0% (n 2) | 0.0% ± 0.0% (n 2) |" in report  # the stub's queries all find p3
    figures = json.loads((out / "comparison.json").read_text())["mlflow_judges"]
    assert figures["hcqr"]["retrieval_relevance"]["mean"] == 1.0
    assert figures["simple_rag"]["judges"] == {
        "retrieval_relevance": ["openai/stub-model"],
        "retrieval_groundedness": ["openai/stub-model"],
    }


def test_a_judge_lm_that_cannot_be_used_or_a_run_without_traces_is_one_line_and_nothing_is_written(runs, capsys):
    root, store, stub, made = runs
    dead = Stub()
    dead.stop()  # nothing listens at its address now
    untouched = made["untouched"]
    files = {p.name: p.read_bytes() for p in untouched.iterdir() if p.is_file()}
    seen = len(stub.seen)
    argv = ["judge", str(untouched), "--mlflow-scorers", "--mlflow-dir", str(store), "--judge-lm", "openai/other"]
    cases = {
        "unreachable": (argv + ["--api-base", dead.base], "cannot be used by MLflow's judges"),
        "untracked": (judge_argv(made["untracked"], stub, store), "the run was not tracked in MLflow"),
        "no traces": (judge_argv(made["no_traces"], stub, store), "none of its question traces is in the store"),
        "bad name": (judge_argv(untouched, stub, store, "relevance,recall"), "choose from relevance, groundedness"),
    }
    for case, (command, said) in cases.items():
        code, out, err = cli(capsys, command)
        assert code == 2, (case, err)
        assert len(err) == 1 and err[0].startswith("hcqr: error: ") and said in err[0], (case, err)
        assert out == "", case
    assert f"at {dead.base} (no key variable)" in cli(capsys, cases["unreachable"][0])[2][0]
    assert len(stub.seen) == seen  # no judge call was made
    assert {p.name: p.read_bytes() for p in untouched.iterdir() if p.is_file()} == files
    for row in RunFolder.open(untouched).rows():
        assert [
            a.name for a in mlflow.get_trace(row["trace_id"]).info.assessments if a.name.startswith("retrieval")
        ] == []
    assert "retrieval_relevance/mean" not in mlflow.get_run(RunFolder.open(untouched).mlflow_run_id).data.metrics


def test_a_folder_given_as_the_judge_lms_gguf_file_is_named_a_folder(tmp_path):
    from hcqr_dspy.errors import LMSpecError
    from hcqr_dspy.lm import parse_lm_spec
    from hcqr_dspy.tracking.judge_server import model_file

    (tmp_path / "judge.gguf").mkdir()
    with pytest.raises(LMSpecError, match="judge.gguf is a folder, not a file"):
        model_file(parse_lm_spec(f"gguf:{tmp_path / 'judge.gguf'}"))
