"""HCQR queries that collapse to fewer distinct ones: the context is topped up to the budget, and the row says so."""

import dspy
from dspy.utils import DummyLM
from programs.program_helpers import ANSWER, PoolRetriever, SpyRetriever, run

from hcqr_dspy.evaluation.metrics import summarize
from hcqr_dspy.evaluation.rows import prediction_row
from hcqr_dspy.programs import HCQR
from hcqr_dspy.retrieval import Corpus, Passage

OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Iron deficiency anemia", "D": "Myasthenia gravis"}
QUESTION = "A 70-year-old woman on digoxin reports nausea and yellow-tinted vision. What explains this?"
# Hypothesis fields that name nothing: every query the hypothesis builds is the hypothesised option's text.
EMPTY_HYPOTHESIS = {
    "discriminating_features": "A; B",
    "reasoning": "r",
    "working_hypothesis": "A",
    "confirming_evidence": "Yes",
}


def role_queries(support: str, distinction: str, key_feature: str) -> dict:
    """The rewrite step's three queries, by role."""
    return {"support_query": support, "distinction_query": distinction, "key_feature_query": key_feature}


# Three copies of one query: two are unusable repeats, so all three are built from the hypothesis (all the same).
SAME_QUERIES = role_queries("digoxin toxicity", "Digoxin toxicity", "digoxin  toxicity")


def corpus(matching: int, other: int = 10) -> Corpus:
    """``matching`` passages about digoxin toxicity and ``other`` about something else."""
    rows = [
        Passage(f"d{i:02d}", f"Digoxin toxicity {i}", f"Digoxin toxicity case {i}: nausea, arrhythmia, halo {i}.")
        for i in range(matching)
    ]
    rows += [
        Passage(f"o{i:02d}", f"Thyroid note {i}", f"Graves disease with exophthalmos, note {i}.") for i in range(other)
    ]
    return Corpus(rows, source=f"top-up-{matching}")


def lm(queries=SAME_QUERIES, hypothesis=EMPTY_HYPOTHESIS):
    return DummyLM(
        {"`support_query`": queries, "`discriminating_features`": hypothesis, "`answer`": ANSWER},
        adapter=dspy.JSONAdapter(),
    )


def row_and_metrics(pred):
    example = dspy.Example(qid="q1", question=QUESTION, options=OPTIONS, answer="A")
    row = prediction_row(example, pred, "hcqr", 0.0)
    return row, summarize([row])


def test_three_identical_queries_are_topped_up_to_fifteen_distinct_passages():
    spy = SpyRetriever(corpus(matching=20))
    pred = run(HCQR(spy), lm())
    assert pred.queries == ["Digoxin toxicity"] * 3 and pred.query_sources == ["hypothesis"] * 3
    # searched once, for the one distinct query, with the three queries' 15 hits
    assert spy.calls == [(["Digoxin toxicity"], 15)]
    ids = [p["id"] for p in pred.passages]
    assert len(ids) == 15 == len(set(ids)) and all(i.startswith("d") for i in ids)
    assert all(p["queries"] == [0, 1, 2] and len(set(p["ranks"])) == 1 for p in pred.passages)  # every role found it
    row, metrics = row_and_metrics(pred)
    assert row["fallbacks"] == {"rewrite_failed": 0, "queries_from_hypothesis": 3, "queries_collapsed": 2}
    assert row["top_up"] == {"distinct_queries": 1, "k_per_query": 15, "searches": 1, "target": 15, "passages": 15}
    assert (metrics["fallback_queries_collapsed_questions"], metrics["fallback_queries_collapsed_total"]) == (1, 2)
    assert "fallback_budget_unfilled_questions" not in metrics


def test_an_index_with_too_few_matches_says_the_budget_was_not_filled():
    spy = SpyRetriever(corpus(matching=9))
    pred = run(HCQR(spy), lm())
    assert spy.calls == [(["Digoxin toxicity"], 15)]
    assert len(pred.passages) == 9  # BM25 matches only the nine digoxin passages
    row, metrics = row_and_metrics(pred)
    assert row["fallbacks"] == {
        "rewrite_failed": 0,
        "queries_from_hypothesis": 3,
        "queries_collapsed": 2,
        "budget_unfilled": 6,
    }
    assert row["top_up"]["passages"] == 9 and row["top_up"]["target"] == 15
    assert metrics["fallback_budget_unfilled_questions"] == 1 and metrics["fallback_budget_unfilled_total"] == 6


def test_two_distinct_queries_whose_hits_overlap_are_searched_deeper_until_the_budget_fills():
    # q1 and q3 are the same text; the pool gives the two distinct queries lists that overlap in all but one passage
    pool = PoolRetriever(corpus(matching=20))
    queries = role_queries("digoxin toxicity nausea", "digoxin versus hypokalemia", "Digoxin toxicity nausea")
    hypothesis = {**EMPTY_HYPOTHESIS, "discriminating_features": "digoxin toxicity nausea"}
    pred = run(HCQR(pool), lm(queries, hypothesis))
    assert pred.queries == ["digoxin toxicity nausea", "digoxin versus hypokalemia", "digoxin toxicity nausea"]
    # 8 hits each leave 9 distinct passages: searched again with 15 each
    assert pool.calls == [(pred.queries[:2], 8), (pred.queries[:2], 15)]
    assert len({p["id"] for p in pred.passages}) == 15
    assert pred.top_up == {"distinct_queries": 2, "k_per_query": 15, "searches": 2, "target": 15, "passages": 15}
    assert pred.fallbacks["queries_collapsed"] == 1 and "budget_unfilled" not in pred.fallbacks
    assert {tuple(p["queries"]) for p in pred.passages} == {(0, 1, 2), (0, 2)}  # roles 0 and 2 share one query


def test_distinct_queries_keep_the_reference_path():
    spy = SpyRetriever(corpus(matching=20))
    queries = role_queries("digoxin toxicity nausea", "digoxin arrhythmia", "halo digoxin")
    pred = run(HCQR(spy), lm(queries))
    assert spy.calls == [(list(queries.values()), 5)] and pred.top_up is None
    assert "queries_collapsed" not in pred.fallbacks and "budget_unfilled" not in pred.fallbacks
