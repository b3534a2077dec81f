"""How much a tracked question's trace keeps (``hcqr eval --traces``, ``$HCQR_TRACES``;
hcqr_dspy/tracking/question_traces.py): a light trace has hcqr's own spans without DSPy's, prompts or passage texts,
and is scored; ``off`` records and scores no trace but tracks the run; a level that is none of them is one line,
exit 2, before anything is written."""

import json

import dspy
import mlflow
import pytest
from dspy.utils import DummyLM
from stub_server import Stub
from support.cli_args import eval_argv, stub_args

from hcqr_dspy.cli.main import main
from hcqr_dspy.retrieval import BM25Retriever
from hcqr_dspy.trace_levels import TRACES_VARIABLE
from hcqr_dspy.tracking.evaluation_run import TRACES_TAG
from hcqr_dspy.tracking.stage_spans import LIGHT_TEXT_CHARS
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}
HYPOTHESIS = {"discriminating_features": "f", "reasoning": "r", "working_hypothesis": "A", "confirming_evidence": "e"}
QUERIES = {
    "support_query": "digoxin toxicity yellow vision",
    "distinction_query": "graves disease exophthalmos",
    "key_feature_query": "myasthenia gravis ptosis",
}


def hcqr_lm():
    return DummyLM(
        {
            "`support_query`": QUERIES,
            "`discriminating_features`": HYPOTHESIS,
            "`answer`": {"reasoning": "r", "answer": "A"},
        },
        adapter=dspy.JSONAdapter(),
    )


@pytest.fixture
def setup(tmp_path, tiny_corpus):
    index = BM25Retriever(tiny_corpus, show_progress=False).save(tmp_path / "idx")
    qs = {
        f"t{i}": {"question": f"Case {i}: yellow halos. Diagnosis?", "options": OPTIONS, "answer": "A"}
        for i in range(2)
    }
    (tmp_path / "qs.json").write_text(json.dumps(qs))
    return tmp_path, index


def evaluation(root, index, method, traces, store):
    spec = EvalSpec(
        method=method, dataset=str(root / "qs.json"), index=str(index), lm="openai/dummy", run_dir=str(root / "run")
    )
    return run_evaluation(spec, mlflow_dir=store, progress=False, lm=hcqr_lm(), traces=traces)


def traces_of(run_id):
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    return mlflow.search_traces(locations=[experiment_id], run_id=run_id, return_type="list")


def test_light_traces_keep_hcqr_spans_without_dspy_spans_prompts_or_passage_texts(setup, mlflow_store):
    root, index = setup
    result, _, run_id = evaluation(root, index, "hcqr", "light", mlflow_store)
    traces = traces_of(run_id)
    assert sorted(t.info.tags["qid"] for t in traces) == ["t0", "t1"]
    for trace in traces:
        names = {s.name for s in trace.data.spans}
        assert names == {
            "hcqr",
            "hypothesis",
            "rewrite",
            "retrieval",
            "retrieve q1 (support)",
            "retrieve q2 (distinction)",
            "retrieve q3 (key features)",
            "fusion",
            "answer",
        }  # no DSPy module, adapter or LM spans
        documents = [d for s in trace.data.spans if s.span_type in ("RETRIEVER", "RERANKER") for d in s.outputs]
        assert documents and all(d["page_content"] == "" and d["metadata"]["doc_uri"] for d in documents)
        context = next(s for s in trace.data.spans if s.name == "answer").inputs["context"]
        assert context.endswith(" characters)") and len(context) < LIGHT_TEXT_CHARS + 30
        assert trace.data.spans[0].outputs["answer"] == "A"
    run = mlflow.get_run(run_id)
    assert run.data.tags[TRACES_TAG] == "light" and run.data.metrics["correct/mean"] == 1.0  # light traces are scored
    assert all(r["trace_id"] for r in result.rows)


def test_traces_off_record_no_trace_but_track_the_run(setup, mlflow_store):
    root, index = setup
    result, _, run_id = evaluation(root, index, "simple_rag", "off", mlflow_store)
    assert traces_of(run_id) == [] and not any(r.get("trace_id") for r in result.rows)
    run = mlflow.get_run(run_id)
    assert run.data.tags[TRACES_TAG] == "off" and run.data.metrics["accuracy"] == 1.0
    assert "correct/mean" not in run.data.metrics  # nothing scored


def test_a_trace_level_that_is_none_is_one_line_before_anything_is_written(bench, monkeypatch, capsys):
    stub = Stub()
    monkeypatch.setenv(TRACES_VARIABLE, "verbose")
    code = main(eval_argv(bench, bench / "run", *stub_args(stub), "--mlflow-dir", str(bench / "mlruns")))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"hcqr: error: ${TRACES_VARIABLE}='verbose': choose one of full, light, off"]
    assert not (bench / "run").exists() and not (bench / "mlruns").exists() and stub.count == 0
    monkeypatch.delenv(TRACES_VARIABLE)
    with pytest.raises(SystemExit) as exc:
        main(eval_argv(bench, bench / "run", *stub_args(stub), "--traces", "verbose"))
    assert exc.value.code == 2 and "invalid choice: 'verbose'" in capsys.readouterr().err
    stub.stop()


def test_traces_are_scored_a_batch_at_a_time_and_the_run_gets_the_means_over_all(
    tmp_path, tiny_corpus, mlflow_store, monkeypatch
):
    from hcqr_dspy.tracking import scorers

    monkeypatch.setattr(scorers, "SCORE_BATCH", 2)  # 5 questions: batches of 2, 2 and 1
    index = BM25Retriever(tiny_corpus, show_progress=False).save(tmp_path / "idx")
    qs = {
        f"t{i}": {"question": f"Case {i}: yellow halos?", "options": OPTIONS, "answer": "AB"[i % 2]} for i in range(5)
    }
    (tmp_path / "qs.json").write_text(json.dumps(qs))
    result, _, run_id = evaluation(tmp_path, index, "hcqr", "light", mlflow_store)  # the LM answers A: 3 of 5 right
    run = mlflow.get_run(run_id)
    assert run.data.metrics["correct/mean"] == pytest.approx(0.6) == run.data.metrics["accuracy"]
    assert run.data.metrics["valid/mean"] == 1.0 and len(run.inputs.dataset_inputs) == 1
    for trace in traces_of(run_id):
        assert [a.name for a in trace.info.assessments].count("correct") == 1
