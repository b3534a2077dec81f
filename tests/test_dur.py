"""Decision-Useful Rate: judge over a run folder (DummyLM), label shares, invalid judgments, role attribution."""

import json

import dspy
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.dur import JUDGMENTS, dur_metrics, judge_run
from hcqr_dspy.evaluate import read_rows
from hcqr_dspy.metrics import hypothesis_changes, summarize
from hcqr_dspy.retrieval import BM25Retriever


def judgment(label, queries, passage_labels=None):
    return {"qid": "x", "label": label, "valid": label is not None, "passage_queries": queries, "passage_labels": passage_labels}


def test_dur_shares_and_invalid_counted_apart():
    js = [
        judgment("ENTAILED", [[0], [1, 2]]),
        judgment("USEFUL", [[0], [2]]),
        judgment("NOT_USEFUL", [[1]]),
        judgment("USEFUL", [[2]]),
        judgment(None, [[0]]),  # judge reply outside the labels
    ]
    m = dur_metrics(js)
    assert m["dur_n"] == 5 and m["dur_invalid"] == 1
    assert m["dur"] == pytest.approx(3 / 4)
    assert (m["dur_entailed"], m["dur_useful"], m["dur_not_useful"]) == (0.25, 0.5, 0.25)
    # among the 3 useful contexts: q1 present in 2, q2 in 1, q3 in 3
    assert (m["dur_role_q1"], m["dur_role_q2"], m["dur_role_q3"]) == pytest.approx((2 / 3, 1 / 3, 1.0))


def test_passage_mode_attributes_to_useful_passages_only():
    js = [judgment("USEFUL", [[0], [1], [2]], ["NOT_USEFUL", "USEFUL", "NOT_USEFUL"])]
    m = dur_metrics(js)
    assert (m["dur_role_q1"], m["dur_role_q2"], m["dur_role_q3"]) == (0.0, 1.0, 0.0)


def test_hypothesis_change_counts():
    def row(h, pred, gold, valid=True):
        return {"hypothesis": {"working_hypothesis": h}, "prediction": pred, "gold": gold, "valid": valid,
                "correct": valid and pred == gold}

    rows = [row("A", "A", "A"), row("A", "A", "B"), row("A", "B", "B"), row("B", "A", "B"), row("C", "D", "B"),
            row("B", None, "B", valid=False), {"hypothesis": None, "prediction": "A", "gold": "A", "valid": True, "correct": True}]
    c = hypothesis_changes(rows)
    assert c == {"with_hypothesis": 6, "hypothesis_correct": 3, "kept_right": 1, "kept_wrong": 1, "fixed": 1,
                 "broke": 1, "changed_wrong_to_wrong": 1, "invalid_answer": 1}
    m = summarize([{**r, "qid": str(i), "stages": {}} for i, r in enumerate(rows)])
    assert m["hypothesis_accuracy"] == 0.5 and m["answer_changed_rate"] == pytest.approx(3 / 6)


@pytest.fixture
def run_folder(tmp_path):
    bench = {
        "d1": {"question": "Yellow vision on digoxin?", "options": {"A": "Digoxin toxicity", "B": "Graves"}, "answer": "A"},
        "d2": {"question": "Ptosis worse at night?", "options": {"A": "Graves", "B": "Myasthenia gravis"}, "answer": "B"},
        "d3": {"question": "No retrieval here?", "options": {"A": "x", "B": "y"}, "answer": "A"},
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"dataset": str(tmp_path / "bench.json")}))
    rows = [
        {"qid": "d1", "passages": [{"id": "p3", "queries": [0, 1]}, {"id": "p1", "queries": [2]}]},
        {"qid": "d2", "passages": [{"id": "p7", "queries": [1]}]},
        {"qid": "d3", "passages": []},
    ]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_judge_run_writes_resumable_judgments(run_folder, tiny_corpus):
    retriever = BM25Retriever(tiny_corpus, show_progress=False)
    lm = DummyLM({"Yellow vision": {"label": "ENTAILED"}, "Ptosis": {"label": "MAYBE"}}, adapter=dspy.JSONAdapter())
    m = judge_run(run_folder, retriever, lm, progress=False)
    js = read_rows(run_folder / JUDGMENTS)
    assert [j["qid"] for j in js] == ["d1", "d2"]  # d3 retrieved nothing: not judged
    assert js[0]["label"] == "ENTAILED" and js[1]["valid"] is False  # MAYBE is not a label
    assert m["dur"] == 1.0 and m["dur_invalid"] == 1
    prompt = lm.history[0]["messages"][-1]["content"]
    assert "Document [1] (Title: Digoxin toxicity)" in prompt and "A. Digoxin toxicity" in prompt
    calls = len(lm.history)
    judge_run(run_folder, retriever, lm, progress=False)  # resumed: nothing left to judge
    assert len(lm.history) == calls
    assert json.loads((run_folder / "dur.json").read_text())["dur_n"] == 2
