"""Scoring a run's question traces costs time linear in their number and memory bounded by its batch: the run's
traces are never listed, rows and traces are read a batch at a time, and every trace still gets its feedback and the
run its means, evaluation-run tag and dataset input (real SQLite MLflow store; ``mlflow.search_traces``,
``mlflow.genai.evaluate`` and the per-batch scoring are spied on, not replaced)."""

import mlflow
import pytest
from mlflow.tracking import MlflowClient
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
    monkeypatch.setattr(scoring, "LINK_BATCH", 2)  # MLflow's limit is 100 a request: batches span several requests
    real_search, real_log_scores, real_link = mlflow.search_traces, scoring._log_scores, MlflowClient.link_traces_to_run
    listed, evaluated, batches, linked = [], [], [], []
    pulled = 0  # rows the scoring has read so far

    def counting_search(*args, **kwargs):
        found = real_search(*args, **kwargs)
        listed.append(len(found))
        return found

    def counting_log_scores(traces, *args):
        batches.append((len(traces), pulled))  # the batch's size, and the rows read when it is scored
        return real_log_scores(traces, *args)

    def counting_link(self, trace_ids, run_id):
        linked.append(len(trace_ids))
        return real_link(self, trace_ids, run_id)

    def lazily(rows):
        nonlocal pulled
        for row in rows:
            pulled += 1
            yield row

    rows = [make_row(i) for i in range(N)]
    with mlflow.start_run() as run:
        for row in rows:
            with question("hcqr", f"Question {row['qid']}?", OPTIONS, {"qid": row["qid"]}) as trace:
                trace.finish(row)
        monkeypatch.setattr(mlflow, "search_traces", counting_search)
        monkeypatch.setattr(mlflow.genai, "evaluate", lambda *a, **k: evaluated.append(1))
        monkeypatch.setattr(scoring, "_log_scores", counting_log_scores)
        monkeypatch.setattr(MlflowClient, "link_traces_to_run", counting_link)
        metrics = score_rows(lazily(rows))
        monkeypatch.setattr(mlflow, "search_traces", real_search)
    return rows, metrics, (listed, evaluated, batches, linked), run.info.run_id


def test_scoring_never_lists_the_runs_traces_and_reads_rows_and_traces_a_batch_at_a_time(scored_cheaply):
    _, _, (listed, evaluated, batches, linked), _ = scored_cheaply
    assert listed == [] and evaluated == []  # no listing of the run's traces, no mlflow.genai.evaluate (which lists)
    assert [size for size, _ in batches] == [5] * (N // 5)
    # when batch k is scored, the rows read are those of batches 1..k: never more than one batch ahead
    assert [read for _, read in batches] == [5 * (k + 1) for k in range(N // 5)]
    assert linked == [2, 2, 1] * (N // 5)  # each batch linked to the run, LINK_BATCH traces a request


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


def test_the_runs_named_dataset_is_its_input_without_its_records_being_loaded(mlflow_store, monkeypatch):
    """A run of N questions is recorded as an evaluation of its own dataset (name, digest) without reading the
    dataset's N records back from the store (``EvaluationDataset.to_df``, spied on): scoring's memory stays the
    batch's."""
    import dspy
    from mlflow.genai.datasets.evaluation_dataset import EvaluationDataset

    from hcqr_dspy.tracking.datasets import questions_dataset

    loads = []
    real_to_df = EvaluationDataset.to_df

    def counting_to_df(self, *args, **kwargs):
        loads.append(self.name)
        return real_to_df(self, *args, **kwargs)

    rows = [make_row(i) for i in range(6)]
    questions = [
        dspy.Example(qid=r["qid"], question=f"Question {r['qid']}?", options=OPTIONS, answer="A").with_inputs(
            "question", "options"
        )
        for r in rows
    ]
    with mlflow.start_run() as run:
        dataset = questions_dataset(questions, "demo-0123456789ab", run.info.experiment_id)
        for row in rows:
            with question("hcqr", f"Question {row['qid']}?", OPTIONS, {"qid": row["qid"]}) as trace:
                trace.finish(row)
        monkeypatch.setattr(EvaluationDataset, "to_df", counting_to_df)
        score_rows(rows, dataset, digest="d1g35t00")
    assert loads == []
    inputs = mlflow.get_run(run.info.run_id).inputs.dataset_inputs
    assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [("demo-0123456789ab", "d1g35t00")]
    assert mlflow.get_run(run.info.run_id).data.tags[MLFLOW_RUN_TYPE] == MLFLOW_RUN_TYPE_GENAI_EVALUATE
