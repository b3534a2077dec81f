"""Scoring a run's question traces costs time linear in their number: MLflow lists the run's traces about once,
not once per batch, and every trace still gets its feedback and the run its means and evaluation-run tag (real
SQLite MLflow store, real ``mlflow.genai.evaluate``; ``mlflow.search_traces`` is spied on, not replaced)."""

import mlflow
import pytest
from mlflow.utils.mlflow_tags import MLFLOW_RUN_TYPE, MLFLOW_RUN_TYPE_GENAI_EVALUATE

from hcqr_dspy.tracking import scorers as scoring
from hcqr_dspy.tracking.question_traces import question
from hcqr_dspy.tracking.scorers import score_rows

OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}
N = 30


def make_row(i):
    valid = i % 7 != 3
    prediction = "ABC"[i % 3] if valid else None
    return {
        "qid": f"q{i}",
        "prediction": prediction,
        "gold": "A",
        "valid": valid,
        "error": None if valid else "no option letter in 'hmm'",
        "reasoning": "because",
        "hypothesis": {"working_hypothesis": "ABC"[i % 2]},
        "option_probs": {"A": 0.5 + i / 100, "B": 0.3 - i / 100, "C": 0.2} if i % 4 else None,
        "lm_calls": 1,
    }


@pytest.fixture
def scored_cheaply(mlflow_store, monkeypatch):
    monkeypatch.setattr(scoring, "SCORE_BATCH", 5)
    real_search = mlflow.search_traces
    listed = []

    def counting_search(*args, **kwargs):
        found = real_search(*args, **kwargs)
        listed.append(len(found))
        return found

    rows = [make_row(i) for i in range(N)]
    with mlflow.start_run() as run:
        for row in rows:
            with question("hcqr", f"Question {row['qid']}?", OPTIONS, {"qid": row["qid"]}) as trace:
                trace.finish(row)
        monkeypatch.setattr(mlflow, "search_traces", counting_search)
        metrics = score_rows(rows)
        monkeypatch.setattr(mlflow, "search_traces", real_search)
    return rows, metrics, sum(listed), run.info.run_id


def test_scoring_lists_the_runs_traces_about_once_not_once_per_batch(scored_cheaply):
    _, _, listed, _ = scored_cheaply
    assert 0 < listed <= 2 * N


def test_every_trace_has_its_feedback_and_the_run_its_means(scored_cheaply):
    rows, metrics, _, run_id = scored_cheaply
    traces = {t.info.tags["qid"]: t for t in mlflow.search_traces(run_id=run_id, return_type="list")}
    assert len(traces) == N
    for row in rows:
        feedback = {a.name: a for a in traces[row["qid"]].info.assessments if a.feedback is not None}
        assert set(feedback) == {"correct", "valid", "hypothesis"} | ({"gold_prob"} if row["option_probs"] else set())
        assert all(f.source.source_type == "CODE" for f in feedback.values())
        assert {f.metadata.get("mlflow.assessment.sourceRunId") for f in feedback.values()} == {run_id}
        assert feedback["correct"].value == (row["prediction"] == "A")
        assert feedback["valid"].value == row["valid"]
    right = sum(r["prediction"] == "A" for r in rows) / N
    probs = [r["option_probs"]["A"] for r in rows if r["option_probs"]]
    expected = {"correct/mean": right, "valid/mean": sum(r["valid"] for r in rows) / N,
                "gold_prob/mean": sum(probs) / len(probs)}  # fmt: skip
    assert metrics == pytest.approx(expected)
    run = mlflow.get_run(run_id)
    assert run.data.metrics == pytest.approx(expected)
    assert run.data.tags[MLFLOW_RUN_TYPE] == MLFLOW_RUN_TYPE_GENAI_EVALUATE  # listed under Evaluation runs
    assert run.inputs.dataset_inputs  # the evaluation's dataset is the run's input
