"""A question's trace reads as an outcome: the Traces tab's request/response previews are the question and
``<letter>: <reasoning>``, and the gold-option probability is a ``gold_prob`` feedback with the letter
distribution as its rationale (real MLflow store, real ``mlflow.genai.evaluate`` through ``score_rows``)."""

import mlflow
import pytest

from hcqr_dspy.tracking.question_traces import question
from hcqr_dspy.tracking.scorers import score_rows

QUESTION = "An elderly patient on digoxin sees yellow halos. Diagnosis?"
OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}


def traced_row(qid, row):
    with question("cot", QUESTION, OPTIONS, {"qid": qid, "method": "cot"}) as trace:
        trace.finish(row)
    return row


@pytest.fixture
def scored(mlflow_store):
    rows = [
        {"qid": "p1", "prediction": "A", "gold": "A", "valid": True, "reasoning": "Yellow  halos\nmean digoxin.",
         "option_probs": {"A": 0.7, "B": 0.2, "C": 0.1}, "lm_calls": 1},
        {"qid": "p2", "prediction": "B", "gold": "A", "valid": True, "reasoning": "thyroid", "option_probs": None,
         "lm_calls": 1},
        {"qid": "p3", "prediction": None, "gold": "C", "valid": False, "error": "no option letter in 'hmm'",
         "reasoning": None, "option_probs": {"A": 0.5, "B": 0.25, "C": 0.25}, "lm_calls": 1},
    ]  # fmt: skip
    with mlflow.start_run() as run:
        for row in rows:
            traced_row(row["qid"], row)
        metrics = score_rows(rows)
    traces = {t.info.tags["qid"]: t for t in mlflow.search_traces(run_id=run.info.run_id, return_type="list")}
    return metrics, traces


def feedback(trace, name):
    return next((a for a in trace.info.assessments if a.name == name and a.feedback is not None), None)


def test_the_traces_tab_shows_the_question_and_the_letter_with_its_reasoning(scored):
    _, traces = scored
    assert traces["p1"].info.request_preview == QUESTION
    assert traces["p1"].info.response_preview == "A: Yellow halos mean digoxin."
    assert traces["p3"].info.response_preview == "invalid: no option letter in 'hmm'"


def test_the_gold_option_probability_is_feedback_with_the_distribution(scored):
    metrics, traces = scored
    p1 = feedback(traces["p1"], "gold_prob")
    assert p1.value == pytest.approx(0.7)
    assert p1.rationale == "gold A; p(A)=0.700, p(B)=0.200, p(C)=0.100"
    assert feedback(traces["p3"], "gold_prob").value == pytest.approx(0.25)  # an invalid reply still has a p(gold)
    assert feedback(traces["p2"], "gold_prob") is None  # no distribution (an LM without log-probabilities)
    assert metrics["gold_prob/mean"] == pytest.approx((0.7 + 0.25) / 2)
