"""What a reviewer finds in MLflow after a tracked HCQR evaluation, read back through MLflow's client:
named spans with one RETRIEVER span per query, trace tags, the gold answer as an expectation,
correctness / validity / hypothesis outcome as feedback, the questions as an evaluation dataset and
the run's input, the evaluation scored with mlflow.genai.evaluate; and DUR labels on the traces."""

import json
from pathlib import Path

import dspy
import mlflow
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.retrieval import BM25Retriever
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

HYPOTHESIS = {
    "discriminating_features": "yellow vision",
    "reasoning": "glycoside",
    "working_hypothesis": "A",
    "confirming_evidence": "hypokalemia worsens it",
}
QUERIES = {
    "support_query": "digoxin toxicity yellow vision",
    "distinction_query": "graves disease exophthalmos",
    "key_feature_query": "myasthenia gravis ptosis",
}
OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}


def hcqr_lm(answer="B"):
    # DummyLM answers with the first entry whose key occurs in the last message.
    return DummyLM(
        {
            "`support_query`": QUERIES,
            "`discriminating_features`": HYPOTHESIS,
            "`answer`": {"reasoning": "r", "answer": answer},
        },
        adapter=dspy.JSONAdapter(),
    )


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tiny_corpus):
    """An HCQR evaluation of three questions (gold B, A, B; the LM always answers B, hypothesis A)."""
    root = tmp_path_factory.mktemp("traces")
    index = BM25Retriever(tiny_corpus, show_progress=False).save(root / "idx")
    questions = {
        f"t{i}": {
            "question": f"Case {i}: an elderly patient sees yellow halos. Diagnosis?",
            "options": OPTIONS,
            "answer": gold,
        }
        for i, gold in enumerate("BAB")
    }
    (root / "qs.json").write_text(json.dumps(questions))
    store = root / "mlruns"
    spec = EvalSpec(
        method="hcqr", dataset=str(root / "qs.json"), index=str(index), lm="openai/dummy", run_dir=str(root / "run")
    )
    result, run_dir, run_id = run_evaluation(spec, mlflow_dir=store, progress=False, lm=hcqr_lm())
    return {"result": result, "run_dir": run_dir, "run_id": run_id, "store": store, "root": root, "index": index}


def traces_of(run_id):
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    return mlflow.search_traces(locations=[experiment_id], run_id=run_id, return_type="list")


def assessments(trace, kind):
    return {
        a.name: (a.value if kind == "feedback" else a.expectation.value)
        for a in trace.info.assessments
        if getattr(a, kind, None) is not None and a.valid is not False
    }


def test_each_question_trace_carries_tags_named_spans_and_retriever_documents(tracked_run):
    traces = traces_of(tracked_run["run_id"])
    assert sorted(t.info.tags["qid"] for t in traces) == ["t0", "t1", "t2"]
    rows = {r["qid"]: r for r in tracked_run["result"].rows}
    for trace in traces:
        tags = trace.info.tags
        qid = tags["qid"]
        assert rows[qid]["trace_id"] == trace.info.trace_id
        assert (tags["method"], tags["dataset"], tags["lm"], tags["program"]) == (
            "hcqr",
            "qs",
            "openai/dummy",
            "zero-shot",
        )
        assert tags["run_folder"] == str(tracked_run["run_dir"].resolve())
        names = [s.name for s in trace.data.spans]
        assert trace.data.spans[0].name == "hcqr" and trace.data.spans[0].parent_id is None
        assert {"hypothesis", "rewrite", "retrieval", "fusion", "answer"} <= set(names)
        retrievers = [s for s in trace.data.spans if s.span_type == "RETRIEVER"]
        assert [s.name for s in retrievers] == [
            "retrieve q1 (support)",
            "retrieve q2 (distinction)",
            "retrieve q3 (key features)",
        ]
        assert [s.inputs["query"] for s in retrievers] == list(QUERIES.values())
        retrieval = next(s for s in trace.data.spans if s.name == "retrieval")
        assert all(s.parent_id == retrieval.span_id for s in retrievers)
        # which query found which passage: the support query found the digoxin passage first
        first = retrievers[0].outputs[0]
        assert first["id"] == "p3" and first["metadata"]["title"] == "Digoxin toxicity"
        assert first["page_content"].startswith("Nausea, yellow-green vision") and first["metadata"]["score"] > 0
        assert retrievers[2].outputs[0]["id"] == "p7"
        # the answer span holds the context the answer step saw, passages in the row's order
        answer = next(s for s in trace.data.spans if s.name == "answer")
        shown = [p["id"] for p in rows[qid]["passages"]]
        assert answer.inputs["context"].count("Document [") == len(shown)
        assert trace.data.spans[0].outputs["answer"] == "B"
        # each stage's LM call is one CHAT_MODEL span below it; DSPy's modules and adapters record none
        hypothesis = next(s for s in trace.data.spans if s.name == "hypothesis")
        [call] = [s for s in trace.data.spans if s.parent_id == hypothesis.span_id]
        assert (call.name, call.span_type) == ("LM dummy", "CHAT_MODEL") and call.inputs["messages"]
        assert not {"Predict.forward", "HCQR.forward", "LM.__call__"} & set(names)


def test_gold_answer_is_an_expectation_and_outcomes_are_feedback(tracked_run):
    gold = {"t0": "B", "t1": "A", "t2": "B"}
    for trace in traces_of(tracked_run["run_id"]):
        qid = trace.info.tags["qid"]
        assert assessments(trace, "expectation") == {"answer": gold[qid]}
        feedback = assessments(trace, "feedback")
        assert feedback["valid"] is True
        assert feedback["correct"] is (gold[qid] == "B")
        # hypothesis A, answer B: right hypothesis broken (t1), wrong hypothesis fixed (t0, t2)
        assert feedback["hypothesis"] == ("broke" if gold[qid] == "A" else "fixed")


def test_wrong_hcqr_answers_can_be_filtered_in_the_store(tracked_run):
    experiment_id = mlflow.get_run(tracked_run["run_id"]).info.experiment_id
    wrong = mlflow.search_traces(
        locations=[experiment_id],
        run_id=tracked_run["run_id"],
        return_type="list",
        filter_string="tag.method = 'hcqr' AND feedback.correct = 'false'",
    )
    assert [t.info.tags["qid"] for t in wrong] == ["t1"]


def test_run_is_an_evaluation_of_its_questions_dataset(tracked_run):
    run = mlflow.get_run(tracked_run["run_id"])
    assert run.info.run_name == "hcqr · qs · openai/dummy"
    assert run.data.tags["mlflow.runType"] == "genai_evaluate"
    assert run.data.metrics["correct/mean"] == pytest.approx(2 / 3) == run.data.metrics["accuracy"]
    assert run.data.metrics["valid/mean"] == 1.0
    experiment = mlflow.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.note.content"].startswith("Hypothesis-Conditioned Query Rewriting")
    view = json.loads(experiment.tags["mlflow.sharedViewState.hcqr-key-metrics"])  # the runs table's key columns
    assert view["selectedColumns"][:5] == [
        "metrics.`accuracy`",
        "metrics.`accuracy_se`",
        "metrics.`invalid_rate`",
        "metrics.`dur`",
        "metrics.`mean_lm_calls`",
    ]
    assert "runs?viewStateShareKey=hcqr-key-metrics" in experiment.tags["mlflow.note.content"]
    inputs = [d.dataset.name for d in run.inputs.dataset_inputs]
    assert len(inputs) == 1 and inputs[0].startswith("qs-")
    [dataset] = mlflow.genai.datasets.search_datasets(
        experiment_ids=[run.info.experiment_id], filter_string=f"name = '{inputs[0]}'"
    )
    records = dataset.to_df()
    assert sorted(r["answer"] for r in records["expectations"]) == ["A", "B", "B"]
    assert {r["question"] for r in records["inputs"]} == {
        f"Case {i}: an elderly patient sees yellow halos. Diagnosis?" for i in range(3)
    }


def test_rerun_answers_nothing_new_and_scores_nothing_twice(tracked_run):
    spec = EvalSpec(
        method="hcqr",
        dataset=str(tracked_run["root"] / "qs.json"),
        index=str(tracked_run["index"]),
        lm="openai/dummy",
        run_dir=str(tracked_run["run_dir"]),
    )
    result, _, run_id = run_evaluation(spec, mlflow_dir=tracked_run["store"], progress=False, lm=hcqr_lm())
    assert run_id == tracked_run["run_id"] and result.ran == 0
    for trace in traces_of(run_id):
        names = [a.name for a in trace.info.assessments]
        assert names.count("correct") == 1 and names.count("answer") == 1


def judge_lm(label="USEFUL"):
    return DummyLM(
        {"`label`": {"reasoning": f"the context supports it ({label})", "label": label}}, adapter=dspy.JSONAdapter()
    )


def test_dur_labels_land_on_the_question_traces_and_the_judge_calls_are_traced(tracked_run):
    from hcqr_dspy.workflows.judge import judge_and_track

    run_id = tracked_run["run_id"]
    metrics = judge_and_track(
        tracked_run["run_dir"], judge_lm="openai/judge", lm=judge_lm(), mlflow_dir=tracked_run["store"], progress=False
    )
    assert metrics["dur"] == 1.0 and mlflow.get_run(run_id).data.metrics["dur"] == 1.0
    judged = {j["qid"]: j for j in RunFolder(tracked_run["run_dir"]).judgments()}
    for trace in traces_of(run_id):
        dur = [a for a in trace.info.assessments if a.name == "dur"]
        assert len(dur) == 1 and dur[0].value == "USEFUL" and "supports it" in dur[0].rationale
        assert (dur[0].source.source_type, dur[0].source.source_id) == ("LLM_JUDGE", "openai/judge")
        assert assessments(trace, "feedback")["dur_positive_control"] == "USEFUL"
        # the judge's own trace: tagged with the question and the judged run, holding the judge's LM calls
        judge_trace = mlflow.get_trace(dur[0].metadata["judge_trace_id"])
        assert judge_trace.info.tags["kind"] == "dur_judge" and judge_trace.info.tags["judged_run_id"] == run_id
        assert judge_trace.info.tags["qid"] == trace.info.tags["qid"]
        assert {"judge", "controls"} <= {s.name for s in judge_trace.data.spans}
        # the context and the positive and negative controls, and the on-topic control where one could be built
        built = bool(judged[trace.info.tags["qid"]]["on_topic_passages"])
        assert sum(s.span_type == "CHAT_MODEL" for s in judge_trace.data.spans) == 3 + built
    # judging again (resumed: nothing new) logs no second label
    judge_and_track(
        tracked_run["run_dir"], judge_lm="openai/judge", lm=judge_lm(), mlflow_dir=tracked_run["store"], progress=False
    )
    assert all([a.name for a in t.info.assessments].count("dur") == 1 for t in traces_of(run_id))
    # judged again with other settings, as the refusal says (delete the judgments): the labels and the
    # settings are replaced (MLflow params could not change: the settings are tags)
    for name in ("judgments.jsonl", "dur.json"):
        (Path(tracked_run["run_dir"]) / name).unlink()
    judge_and_track(
        tracked_run["run_dir"],
        judge_lm="openai/judge",
        lm=judge_lm("ENTAILED"),
        reasoning=False,
        mlflow_dir=tracked_run["store"],
        progress=False,
    )
    assert mlflow.get_run(run_id).data.tags["dur.reasoning"] == "False"
    for trace in traces_of(run_id):
        dur = [a for a in trace.info.assessments if a.name == "dur"]
        assert [a.value for a in dur] == ["ENTAILED"] and dur[0].metadata["reasoning"] == "False"
        assert [a.name for a in trace.info.assessments].count("dur_positive_control") == 1


def test_the_dur_judge_is_an_mlflow_scorer(tracked_run):
    from hcqr_dspy.tracking.scorers import dur_scorer

    traces = traces_of(tracked_run["run_id"])
    with mlflow.start_run(run_name="dur scorer") as run:
        mlflow.genai.evaluate(data=traces, scorers=[dur_scorer(judge_lm("ENTAILED"), judge_lm="openai/judge")])
    scored = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")
    assert len(scored) == 3
    for trace in scored:
        labels = [
            a.value
            for a in trace.info.assessments
            if a.name == "dur" and (a.metadata or {}).get("mlflow.assessment.sourceRunId") == run.info.run_id
        ]
        assert labels == ["ENTAILED"]
