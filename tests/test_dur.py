"""Decision-Useful Rate: judge over a run folder (DummyLM), controls, label shares, invalid judgments, roles."""

import json

import dspy
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.metrics import hypothesis_changes, summarize
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.controls import control_flags, negative_control_pairs, positive_control_document
from hcqr_dspy.judge.dur_metrics import dur_metrics
from hcqr_dspy.judge.run_judging import judge_run
from hcqr_dspy.retrieval import BM25Retriever


def judgment(label, queries, passage_labels=None, positive=None, negative=None, on_topic=None):
    return {
        "qid": "x",
        "label": label,
        "valid": label is not None,
        "passage_queries": queries,
        "passage_labels": passage_labels,
        "positive_label": positive,
        "negative_label": negative,
        "on_topic_label": on_topic,
    }


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


def test_control_rates_and_flags():
    good = [judgment("USEFUL", [[0]], positive="ENTAILED", negative="NOT_USEFUL", on_topic="NOT_USEFUL")] * 9
    good.append(judgment("USEFUL", [[0]], positive="NOT_USEFUL", negative="USEFUL", on_topic="NOT_USEFUL"))
    m = dur_metrics(good)
    assert (m["dur_positive_control"], m["dur_negative_control"], m["dur_on_topic_control"]) == (0.9, 0.1, 0.0)
    assert m["dur_on_topic_control_n"] == 10
    assert control_flags(m) == []
    lenient = dur_metrics(
        [judgment("USEFUL", [[0]], positive="USEFUL", negative="USEFUL", on_topic="NOT_USEFUL") for _ in range(4)]
    )
    assert control_flags(lenient) == [
        "the judge calls 100% of negative controls (another question's context) useful (> 20%)"
    ]
    never = dict(positive="NOT_USEFUL", negative="NOT_USEFUL", on_topic="NOT_USEFUL")
    blind = dur_metrics([judgment("NOT_USEFUL", [[0]], **never)] * 4)
    assert "positive controls" in control_flags(blind)[0]
    assert control_flags(dur_metrics([judgment("USEFUL", [[0]])])) == [
        "no control judgments (judged without controls): the judge is unchecked"
    ]
    # judged before the on-topic control existed: the two old controls pass, the new one is unchecked
    old = dur_metrics([judgment("USEFUL", [[0]], positive="USEFUL", negative="NOT_USEFUL")] * 4)
    assert "dur_on_topic_control" not in old
    assert control_flags(old) == [
        "no on-topic control judgments (judged before the on-topic control existed): the judge is unchecked on "
        "on-topic contexts that do not decide the question"
    ]


def test_hypothesis_change_counts():
    def row(h, pred, gold, valid=True):
        return {
            "hypothesis": {"working_hypothesis": h},
            "prediction": pred,
            "gold": gold,
            "valid": valid,
            "correct": valid and pred == gold,
        }

    rows = [
        row("A", "A", "A"),
        row("A", "A", "B"),
        row("A", "B", "B"),
        row("B", "A", "B"),
        row("C", "D", "B"),
        row("B", None, "B", valid=False),
        {"hypothesis": None, "prediction": "A", "gold": "A", "valid": True, "correct": True},
    ]
    c = hypothesis_changes(rows)
    assert c == {
        "with_hypothesis": 6,
        "hypothesis_correct": 3,
        "kept_right": 1,
        "kept_wrong": 1,
        "fixed": 1,
        "broke": 1,
        "changed_wrong_to_wrong": 1,
        "invalid_answer": 1,
    }
    m = summarize([{**r, "qid": str(i), "stages": {}} for i, r in enumerate(rows)])
    assert m["hypothesis_accuracy"] == 0.5 and m["answer_changed_rate"] == pytest.approx(3 / 6)


def test_positive_control_states_the_gold_option_and_negative_controls_are_a_derangement():
    doc = positive_control_document("Yellow vision on digoxin?", {"A": "Digoxin toxicity", "B": "Graves"}, "A")
    assert (
        doc.startswith("Document [1] (Title: Digoxin toxicity)") and "the correct answer is A. Digoxin toxicity" in doc
    )
    rows = [{"qid": f"q{i}", "passages": [{"id": f"p{i}"}]} for i in range(6)]
    pairs = negative_control_pairs(rows, lambda qid, row: False)
    assert sorted(pairs) == sorted(pairs.values()) and all(q != d for q, d in pairs.items())
    assert pairs == negative_control_pairs(rows, lambda qid, row: False)  # seeded
    # a donor whose context mentions the question's gold option is skipped
    avoid = negative_control_pairs(rows, lambda qid, row: row["qid"] == pairs[qid])
    assert all(avoid[q] != pairs[q] and avoid[q] != q for q in avoid)
    assert negative_control_pairs(rows[:1], lambda q, r: False) == {"q0": None}


@pytest.fixture
def run_folder(tmp_path):
    bench = {
        "d1": {
            "question": "Yellow vision on digoxin?",
            "options": {"A": "Digoxin toxicity", "B": "Graves"},
            "answer": "A",
        },
        "d2": {
            "question": "Ptosis worse at night?",
            "options": {"A": "Graves", "B": "Myasthenia gravis"},
            "answer": "B",
        },
        "d3": {"question": "No retrieval here?", "options": {"A": "x", "B": "y"}, "answer": "A"},
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    folder = RunFolder.create(tmp_path / "run", {"method": "hcqr", "dataset": str(tmp_path / "bench.json")})
    rows = [
        # p3 shown whole, p1 shown cut to 10 characters of content, p4 fused but dropped by the token budget
        {
            "qid": "d1",
            "passages": [{"id": "p3", "queries": [0, 1]}, {"id": "p1", "queries": [2], "shown_chars": 10}],
            "dropped_passages": [{"id": "p4", "queries": [2]}],
        },
        {"qid": "d2", "passages": [{"id": "p7", "queries": [1]}]},
        {"qid": "d3", "passages": []},
    ]
    for r in rows:
        folder.predictions.append(r)
    return folder.path


def test_judge_sees_exactly_the_shown_context_and_judges_controls(run_folder, tiny_corpus):
    retriever = BM25Retriever(tiny_corpus, show_progress=False)
    lm = DummyLM(
        {
            "the correct answer is": {"reasoning": "it says so", "label": "ENTAILED"},
            "Yellow vision": {"reasoning": "glycoside", "label": "ENTAILED"},
            "Ptosis": {"reasoning": "?", "label": "MAYBE"},
        },
        adapter=dspy.JSONAdapter(),
    )
    m = judge_run(run_folder, retriever, lm, judge_lm="dummy", progress=False)
    js = RunFolder(run_folder).judgments()
    assert [j["qid"] for j in js] == ["d1", "d2"]  # d3 retrieved nothing: not judged
    assert js[0]["label"] == "ENTAILED" and js[0]["rationale"] == "glycoside"
    assert js[1]["valid"] is False  # MAYBE is not a label
    assert (js[0]["judge_lm"], js[0]["mode"], js[0]["reasoning"]) == ("dummy", "context", True)
    assert js[0]["negative_from"] == "d2" and js[1]["negative_from"] == "d1"
    # the controls' reasoning is kept too, so a judge that calls a negative control useful can be checked
    assert {js[0]["positive_rationale"], js[0]["negative_rationale"]} <= {"it says so", "glycoside"}
    assert m["dur"] == 1.0 and m["dur_invalid"] == 1 and m["dur_positive_control"] == 1.0
    # the on-topic control: retrieved with d1's distractor (B. Graves), at most as many passages as d1 showed,
    # none naming the gold option (p3, Digoxin toxicity, the top hit for the question, is left out)
    assert (js[0]["on_topic_option"], js[0]["on_topic_error"]) == ("B", None)
    assert js[0]["on_topic_passages"] == ["p4"]
    assert (js[0]["on_topic_label"], js[0]["on_topic_rationale"]) == ("ENTAILED", "glycoside")
    assert m["dur_on_topic_control"] == 1.0 and m["dur_on_topic_control_n"] == 1  # d2's control reply was MAYBE
    prompts = [h["messages"][-1]["content"] for h in lm.history]
    d1 = next(p for p in prompts if "Yellow vision" in p and "Document [1] (Title: Digoxin toxicity)" in p)
    assert (
        "Document [2] (Title: Iron deficiency anemia) Microcytic" in d1
    )  # cut where the answer step's context was cut
    assert "Microcytic hypochromic" not in d1
    assert "Graves disease" not in d1  # p4 was dropped by the budget: the model never saw it
    calls = len(lm.history)
    judge_run(run_folder, retriever, lm, judge_lm="dummy", progress=False)  # resumed: nothing left to judge
    assert len(lm.history) == calls
    # one judge session recorded (the one that judged), after the 3 predictions and before any judgment
    assert [
        (s["command"], s["predictions_before"], s["judgments_before"]) for s in RunFolder(run_folder).sessions()
    ] == [("judge", 3, 0)]
    assert json.loads((run_folder / "dur.json").read_text())["judge"]["judge_lm"] == "dummy"
    with pytest.raises(HCQRError, match="judgments made with other settings"):
        judge_run(run_folder, retriever, lm, judge_lm="dummy", reasoning=False, progress=False)


def test_a_judge_that_always_says_useful_is_flagged(run_folder, tiny_corpus, tmp_path):
    retriever = BM25Retriever(tiny_corpus, show_progress=False)
    lm = DummyLM([{"reasoning": "fine", "label": "USEFUL"}] * 20, adapter=dspy.JSONAdapter())
    m = judge_run(run_folder, retriever, lm, progress=False)
    assert m["dur"] == 1.0 and m["dur_negative_control"] == 1.0
    assert any("negative controls" in f for f in control_flags(m))


def sampled_runs(tmp_path, answered: dict[str, int]):
    """Runs over one seeded 6-of-8 question sample (as `hcqr eval --limit 6` records it), each with its first
    ``answered[name]`` questions answered with a context."""
    from hcqr_dspy.data import load_questions, select
    from hcqr_dspy.evaluation.fingerprints import question_fingerprint

    bench = {
        f"q{i}": {"question": f"Question {i}?", "options": {"A": f"alpha {i}", "B": f"beta {i}"}, "answer": "A"}
        for i in range(8)
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    sample = select(load_questions(tmp_path / "bench.json"), limit=6, seed=4)
    record = {**question_fingerprint(sample), "limit": 6, "seed": 4}
    folders = {}
    for name, n in answered.items():
        folder = RunFolder.create(
            tmp_path / name, {"method": "hcqr", "dataset": str(tmp_path / "bench.json"), "questions": record}
        )
        for i, q in enumerate(sample[:n]):
            folder.predictions.append({"qid": q.qid, "passages": [{"id": f"p{i + 1}", "queries": [0]}]})
        folders[name] = folder
    return [q.qid for q in sample], folders


def test_a_judged_sample_is_drawn_from_the_whole_question_sample_so_runs_at_any_stage_share_it(tmp_path, tiny_corpus):
    from hcqr_dspy.judge.run_judging import judged_sample

    sample, runs = sampled_runs(tmp_path, {"done": 6, "under_way": 2})
    picked = judged_sample(runs["done"], limit=3, seed=1)
    assert picked == judged_sample(runs["under_way"], limit=3, seed=1)  # the same 3 however far each run has got
    assert len(picked["ids"]) == 3 and set(picked["ids"]) <= set(sample)
    assert picked["ids"] == [q for q in sample if q in picked["ids"]]  # run order
    assert judged_sample(runs["done"], limit=3, seed=2)["ids"] != picked["ids"]  # the seed matters
    assert judged_sample(runs["done"]) is None  # no sample asked: judge all

    lm = DummyLM([{"reasoning": "r", "label": "USEFUL"}] * 30, adapter=dspy.JSONAdapter())
    m = judge_run(runs["done"], BM25Retriever(tiny_corpus, show_progress=False), lm, progress=False, limit=3, seed=1)
    js = runs["done"].judgments()
    assert [j["qid"] for j in js] == picked["ids"]  # only the sample is judged
    assert {j["negative_from"] for j in js} <= set(picked["ids"])  # negative controls from the sample's contexts
    assert m["dur_n"] == 3 and m["sample"]["n"] == 3 and m["sample"]["ids"] == picked["ids"]
    assert m["sample"]["run_answered_with_context"] == 6
    assert json.loads((runs["done"].path / "dur.json").read_text())["sample"]["limit"] == 3


def test_a_bad_judged_sample_is_one_line(tmp_path, tiny_corpus):
    from hcqr_dspy.judge.run_judging import judged_sample

    sample, runs = sampled_runs(tmp_path, {"run": 1})
    lm = DummyLM([{"reasoning": "r", "label": "USEFUL"}] * 30, adapter=dspy.JSONAdapter())
    retriever = BM25Retriever(tiny_corpus, show_progress=False)
    with pytest.raises(HCQRError, match=r"question id\(s\) nope are not in"):
        judged_sample(runs["run"], ids=[sample[0], "nope"])
    with pytest.raises(HCQRError, match="list of question ids to judge is empty"):
        judged_sample(runs["run"], ids=[])
    with pytest.raises(HCQRError, match=r"none of the 2 questions chosen to judge has been answered"):
        judge_run(runs["run"], retriever, lm, progress=False, ids=sample[1:3])
    # a run made with an explicit id list: its sample cannot be rebuilt from limit and seed
    config = {**runs["run"].config, "questions": {**runs["run"].questions_record, "limit": None}}
    (runs["run"].path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HCQRError, match=r"question sample cannot be rebuilt .*name the questions with --ids"):
        judged_sample(RunFolder(runs["run"].path), limit=2)
    assert RunFolder(runs["run"].path).judgments() == []  # nothing judged by any refused call


def test_passage_mode_keeps_each_passage_s_reasoning_and_the_deciding_one(run_folder, tiny_corpus):
    lm = DummyLM(
        {
            "the correct answer is": {"reasoning": "stated", "label": "ENTAILED"},
            "Title: Digoxin toxicity": {"reasoning": "names the glycoside", "label": "ENTAILED"},
            "Title: Iron deficiency": {"reasoning": "unrelated", "label": "NOT_USEFUL"},
            "Myasthenia": {"reasoning": "ptosis", "label": "USEFUL"},
        },
        adapter=dspy.JSONAdapter(),
    )
    judge_run(run_folder, BM25Retriever(tiny_corpus, show_progress=False), lm, mode="passage", progress=False)
    d1 = RunFolder(run_folder).judgments()[0]
    assert d1["passage_labels"] == ["ENTAILED", "NOT_USEFUL"]
    assert d1["passage_rationales"] == ["names the glycoside", "unrelated"]
    assert (d1["label"], d1["rationale"]) == ("ENTAILED", "names the glycoside")  # the passage that decided the label
