"""Judge controls that bite: the on-topic control on the demo data, scripted judges that pass or fail it, the
hand-labelled set and the judge's agreement with it, and how `hcqr compare` reports and flags them."""

import json
import re

import dspy
import pytest
from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.utils import DummyLM

from hcqr_dspy.cli import main
from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import DataError, HCQRError
from hcqr_dspy.evaluation.evidence import content_stems, mentions
from hcqr_dspy.evaluation.fingerprints import question_fingerprint
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.agreement import (
    AGREEMENT_FILE,
    agreement,
    agreement_flags,
    default_labelled_set,
    load_labelled_set,
)
from hcqr_dspy.judge.controls import CONTROL_LIMITS, control_flags, on_topic_contexts
from hcqr_dspy.judge.dur_metrics import dur_metrics, wilson_interval
from hcqr_dspy.judge.labels import LABELS, USEFUL_LABELS
from hcqr_dspy.reporting import compare
from hcqr_dspy.resources import shipped_dir
from hcqr_dspy.retrieval import BM25Retriever, load_corpus
from hcqr_dspy.workflows.judge import judge_and_track, judge_labelled

DEMO = shipped_dir("demo")
FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.S)


@pytest.fixture(scope="module")
def demo():
    """The demo questions (by id), a BM25 retriever over the demo corpus, and the demo qrels."""
    questions = {q.qid: q for q in load_questions(DEMO / "questions.json")}
    retriever = BM25Retriever(load_corpus(DEMO / "corpus.jsonl"), show_progress=False)
    return questions, retriever, json.loads((DEMO / "qrels.json").read_text())


class _RuleEngine(DummyEngine):
    """DummyLM's engine, its reply chosen per prompt by the owner's rule."""

    def _complete_messages(self, messages):
        fields = dict(FIELD.findall(messages[-1]["content"]))
        options = dict(line.split(". ", 1) for line in fields["options"].splitlines())
        gold = fields["correct_answer"].split(". ", 1)[1]
        context = fields.get("context") or fields["passage"]
        documents = [d for d in re.split(r"\n(?=Document \[\d+\] )", context) if d.strip()]
        self.owner.answers = {"": {"reasoning": "by rule", "label": self.owner.rule(options, gold, documents)}}
        return super()._complete_messages(messages)


class ScriptedJudge(DummyLM):
    """A judge LM answering every DUR prompt by ``rule(options, gold option text, documents) -> label``."""

    def __init__(self, rule):
        super().__init__({}, adapter=dspy.JSONAdapter())
        self.rule = rule
        self._engine_spec = _RuleEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)


def reads_the_answer(options, gold, documents):
    """Useful only when a document holds the gold option: passes every control."""
    return "USEFUL" if mentions(gold, documents) else "NOT_USEFUL"


def swayed_by_the_topic(options, gold, documents):
    """Useful whenever a document discusses any of the options: passes the positive and negative controls (another
    question's context names none of this question's options) and fails the on-topic one."""
    return "USEFUL" if any(mentions(text, documents) for text in options.values()) else "NOT_USEFUL"


def graded(options, gold, documents):
    """Three labels: ENTAILED when a document holds the gold option, USEFUL when one shares a word with it."""
    if mentions(gold, documents):
        return "ENTAILED"
    return "USEFUL" if any(content_stems(gold) & content_stems(d) for d in documents) else "NOT_USEFUL"


def demo_run(path, method, demo, qids=None):
    """A finished run folder over the demo questions whose contexts are each question's qrels passages (the first
    question answered wrong, the others right)."""
    questions, _, qrels = demo
    chosen = [q for q in load_questions(DEMO / "questions.json") if qids is None or q.qid in qids]
    config = {"method": method, "dataset": str(DEMO / "questions.json"), "questions": question_fingerprint(chosen)}
    folder = RunFolder.create(path, config)
    for i, q in enumerate(chosen):
        wrong = "B" if q.answer == "A" else "A"
        folder.predictions.append(
            {
                "qid": q.qid,
                "method": method,
                "prediction": wrong if i == 0 else q.answer,  # one wrong answer: no accuracy of 100%
                "gold": q.answer,
                "valid": True,
                "correct": i != 0,
                "stages": {},
                "lm_calls": 1,
                "prompt_tokens": 10,
                "completion_tokens": 1,
                "seconds": 1.0,
                "passages": [{"id": p, "queries": [0]} for p in qrels[q.qid]],
            }
        )
    folder.release()
    return folder.path


def test_the_on_topic_control_is_retrieved_with_a_distractor_and_holds_no_gold_evidence(demo):
    questions, retriever, qrels = demo
    controls = on_topic_contexts(retriever, [(qid, q, 15) for qid, q in questions.items()])
    deciding = {}  # the contexts the hand-labelled set calls ENTAILED or USEFUL (without their noise passage)
    for item in load_labelled_set():
        if item.label in USEFUL_LABELS:
            passages = item.passages[:1] if item.kind == "gold_with_noise" else item.passages
            deciding.setdefault(item.qid, []).append(set(passages))
    on_topic = 0
    for qid, q in questions.items():
        c = controls[qid]
        assert c["error"] is None and len(c["passages"]) == len(c["documents"]) == 15
        assert c["option"] in q.options and c["option"] != q.answer  # a distractor, never the gold option
        texts = [retriever.get(p).text for p in c["passages"]]
        assert not mentions(q.options[q.answer], texts)  # no passage holds the gold option
        assert not any(ctx <= set(c["passages"]) for ctx in deciding.get(qid, [])), qid  # no deciding context
        on_topic += bool(set(c["passages"]) & set(qrels[qid]) or mentions(q.options[c["option"]], texts[:5]))
    # seeded: the same control again
    assert on_topic_contexts(retriever, [(qid, q, 15) for qid, q in questions.items()]) == controls
    # on topic: most controls hold a passage relevant to the question or naming the distractor in their top 5
    assert on_topic >= 14, on_topic


def test_a_yes_no_question_gets_no_on_topic_control(demo):
    _, retriever, _ = demo
    q = dspy.Example(qid="yn", question="Is digoxin a glycoside?", options={"A": "yes", "B": "no"}, answer="A")
    c = on_topic_contexts(retriever, [("yn", q, 3)])["yn"]
    assert c["passages"] == [] and "no content words" in c["error"]


@pytest.mark.parametrize(
    "rule, flagged",
    [(reads_the_answer, False), (swayed_by_the_topic, True)],
    ids=["passes all three controls", "fails only the on-topic control"],
)
def test_compare_flags_a_judge_that_fails_only_the_on_topic_control(tmp_path, demo, rule, flagged):
    _, retriever, _ = demo
    runs = [demo_run(tmp_path / m, m, demo) for m in ("simple_rag", "hcqr")]
    for run in runs:
        judge_and_track(run, judge_lm="scripted", lm=ScriptedJudge(rule), retriever=retriever, track=False)
    d = dur_metrics(RunFolder(runs[1]).judgments())
    assert d["dur_positive_control"] == 1.0 and d["dur_negative_control"] == 0.0  # passes the old controls
    assert d["dur_on_topic_control_n"] == 20 and d["dur"] >= 0.9
    assert (d["dur_on_topic_control"] > CONTROL_LIMITS["on_topic_max"]) == flagged
    report, _ = compare(runs, out_dir=tmp_path / "out")
    table = report.split("## DUR judge controls")[1].split("\n\n")[1]
    row = next(line for line in table.splitlines() if line.startswith("| hcqr |"))
    topic = round(d["dur_on_topic_control"] * 20)
    lo, hi = wilson_interval(20 - topic, 20)
    assert f"| {(20 - topic) / 20:.0%} ({20 - topic}/20) [{lo:.0%}–{hi:.0%}] |" in row  # on-topic accuracy
    assert "| 100% (20/20) [84%–100%] | 100% (20/20) [84%–100%] |" in row  # positive, negative
    warned = "DUR of hcqr is not trustworthy: the judge calls" in report and "of on-topic controls" in report
    assert warned == flagged
    assert ("not trustworthy" in report) == flagged
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())["judge_controls"]["hcqr"]
    assert summary["controls"]["on_topic"]["correct"] == 20 - topic and bool(summary["flags"]) == flagged


def test_a_dur_the_judge_cannot_separate_from_its_on_topic_controls_is_flagged():
    def judged(label, on_topic):
        return {"label": label, "valid": True, "passage_queries": [[0]], "positive_label": "USEFUL"} | {
            "negative_label": "NOT_USEFUL",
            "on_topic_label": on_topic,
        }

    # on-topic controls called useful 2/20 (10%, within the 20% limit; Wilson 95% CI 2.8%-30.1%)
    topic = ["USEFUL"] * 2 + ["NOT_USEFUL"] * 18
    low = dur_metrics([judged("USEFUL" if i < 5 else "NOT_USEFUL", t) for i, t in enumerate(topic)])  # DUR 25%
    assert control_flags(low) == [
        "the judge cannot separate the real contexts from on-topic controls: DUR 25% is within reach of its "
        "useful-rate on on-topic controls, 10% [95% CI 3%-30%], n=20"
    ]
    high = dur_metrics([judged("USEFUL" if i < 8 else "NOT_USEFUL", t) for i, t in enumerate(topic)])  # DUR 40%
    assert control_flags(high) == []


def test_an_old_judged_folder_loads_and_reports_the_on_topic_control_as_not_judged(tmp_path, demo):
    runs = [demo_run(tmp_path / m, m, demo, qids={"demo-001", "demo-002"}) for m in ("simple_rag", "hcqr")]
    # a judgment as `hcqr judge` wrote it before the on-topic control existed
    old = {"mode": "context", "valid": True, "error": None, "passage_labels": None, "passage_queries": [[0]]}
    old |= {"judge_lm": "old", "reasoning": True, "controls": True, "control_seed": 0, "label": "USEFUL"}
    old |= {"positive_label": "USEFUL", "negative_label": "NOT_USEFUL"}
    lines = [json.dumps({**old, "qid": q}) + "\n" for q in ("demo-001", "demo-002")]
    (runs[1] / "judgments.jsonl").write_text("".join(lines))
    report, _ = compare(runs, out_dir=tmp_path / "out")
    row = next(line for line in report.splitlines() if line.startswith("| hcqr | 100.0%"))
    assert "| – (not judged) | not measured |" in row
    assert "DUR of hcqr is not trustworthy: no on-topic control judgments (judged before the on-topic control" in report
    # another judge is refused, not mixed into the old judgments
    with pytest.raises(HCQRError, match="judgments made with other settings"):
        judge_and_track(runs[1], judge_lm="new", lm=ScriptedJudge(reads_the_answer), retriever=demo[1], track=False)


def test_the_same_judge_adds_the_on_topic_control_to_old_judgments_and_keeps_their_labels(tmp_path, demo):
    run = demo_run(tmp_path / "hcqr", "hcqr", demo, qids={"demo-001", "demo-002", "demo-003"})
    old = {"mode": "context", "valid": True, "error": None, "passage_labels": None, "passage_queries": [[0]]}
    old |= {"judge_lm": "old", "reasoning": True, "controls": True, "control_seed": 0, "label": "NOT_USEFUL"}
    old |= {"positive_label": "USEFUL", "negative_label": "NOT_USEFUL", "seconds": 2.0}
    qids = ["demo-001", "demo-002", "demo-003"]
    (run / "judgments.jsonl").write_text("".join(json.dumps({**old, "qid": q}) + "\n" for q in qids))
    # an earlier session added demo-002's control before it stopped: resumed, not judged again
    earlier = {"qid": "demo-002", "on_topic_label": "ENTAILED", "on_topic_rationale": "kept", "on_topic_option": "C"}
    earlier |= {"on_topic_passages": ["x"], "on_topic_error": None, "on_topic_seconds": 1.0}
    (run / "judgments_on_topic.jsonl").write_text(json.dumps(earlier) + "\n")
    judge = ScriptedJudge(lambda options, gold, documents: "USEFUL")
    judge_and_track(run, judge_lm="old", lm=judge, retriever=demo[1], track=False)
    assert len(judge.history) == 2  # one call per question still without its control; nothing else judged again
    judged = RunFolder(run).judgments()
    assert [j["label"] for j in judged] == ["NOT_USEFUL"] * 3  # recorded labels kept (this judge says USEFUL)
    assert all(j["controls"] == "positive,negative,on_topic" and j["on_topic_added"] for j in judged)
    assert [j["on_topic_label"] for j in judged] == ["USEFUL", "ENTAILED", "USEFUL"]
    assert judged[1]["seconds"] == 3.0 and judged[0]["on_topic_option"] in "ABCD"
    assert not (run / "judgments_on_topic.jsonl").exists()
    assert json.loads((run / "dur.json").read_text())["dur_on_topic_control_n"] == 3
    judge_and_track(run, judge_lm="old", lm=judge, retriever=demo[1], track=False)  # done: nothing to judge
    assert len(judge.history) == 2


def test_the_shipped_labelled_set_loads_and_a_bad_one_is_one_line(tmp_path):
    items = load_labelled_set()
    assert default_labelled_set().name == "demo_contexts.jsonl" and 30 <= len(items) <= 40
    counts = {label: sum(i.label == label for i in items) for label in LABELS}
    assert min(counts.values()) >= 10 and len({i.id for i in items}) == len(items)
    assert {i.kind for i in items if i.label == "NOT_USEFUL"} >= {"on_topic_undeciding", "distractor_evidence"}
    assert all(i.reason.strip() and i.documents[0].startswith("Document [1] (Title: ") for i in items)
    bad = tmp_path / "bad.jsonl"
    good = json.loads(default_labelled_set().read_text().splitlines()[0])
    for line, message in [
        ({**good, "label": "MAYBE"}, r"bad.jsonl:1: label 'MAYBE' is not one of"),
        ({**good, "passages": ["nope"]}, r"bad.jsonl:1: passages must be a non-empty list of ids"),
        ({**good, "qid": "demo-999"}, r"bad.jsonl:1: question 'demo-999' is not in the question file"),
    ]:
        bad.write_text(json.dumps(line) + "\n")
        with pytest.raises(DataError, match=message):
            load_labelled_set(bad)


def test_agreement_on_the_labelled_set_matches_a_direct_statsmodels_computation(tmp_path, demo):
    from statsmodels.stats.inter_rater import cohens_kappa, to_table
    from statsmodels.stats.proportion import proportion_confint

    record = judge_labelled("scripted", lm=ScriptedJudge(graded), progress=False)
    items = load_labelled_set()
    hand = [i.label for i in items]
    judged = [graded(i.options, i.options[i.answer], list(i.documents)) for i in items]  # the same rule, directly
    assert [r["judge_label"] for r in record["items"]] == judged and record["invalid"] == 0
    correct = sum(h == j for h, j in zip(hand, judged))
    assert (record["n"], record["correct"]) == (len(items), correct)
    assert record["accuracy_ci"] == pytest.approx(list(proportion_confint(correct, len(items), method="wilson")))
    codes = [[LABELS.index(h), LABELS.index(j)] for h, j in zip(hand, judged)]
    direct = cohens_kappa(to_table(codes, bins=3)[0])
    assert record["kappa"] == pytest.approx(direct.kappa) and record["kappa_se"] == pytest.approx(direct.std_kappa)
    assert record["kappa_ci"] == pytest.approx([direct.kappa_low, direct.kappa_upp])
    sklearn = pytest.importorskip("sklearn.metrics")
    assert record["kappa"] == pytest.approx(sklearn.cohen_kappa_score(hand, judged))
    binary = [["useful" if x in USEFUL_LABELS else "not" for x in pair] for pair in zip(hand, judged)]
    assert record["useful"]["kappa"] == pytest.approx(sklearn.cohen_kappa_score(*zip(*binary)))
    pairs = list(zip(hand, judged))
    assert record["confusion"]["NOT_USEFUL"]["ENTAILED"] == pairs.count(("NOT_USEFUL", "ENTAILED"))
    # a judge that calls everything USEFUL agrees no better than chance (kappa 0)
    always = agreement(hand, ["USEFUL"] * len(hand))
    assert always["kappa"] == pytest.approx(0.0, abs=1e-9)
    assert "no better than chance" in agreement_flags(always)[0]
    # an invalid reply is counted apart, never as a label
    assert agreement(["USEFUL", "NOT_USEFUL"], [None, "NOT_USEFUL"])["invalid"] == 1


def test_judge_with_a_labelled_set_records_the_agreement_and_compare_reports_it(tmp_path, demo, capsys):
    _, retriever, _ = demo
    runs = [demo_run(tmp_path / m, m, demo, qids={"demo-001", "demo-004", "demo-011"}) for m in ("cot_rag", "hcqr")]
    judge = ScriptedJudge(reads_the_answer)
    metrics = judge_and_track(
        runs[1], judge_lm="scripted", lm=judge, retriever=retriever, track=False, labelled_set=default_labelled_set()
    )
    record = json.loads((runs[1] / AGREEMENT_FILE).read_text())
    assert metrics["judge_agreement"]["kappa"] == record["kappa"] and len(record["items"]) == record["n"]
    assert record["judge"] == {"judge_lm": "scripted", "mode": "context", "reasoning": True}
    report, _ = compare(runs, out_dir=tmp_path / "out")
    row = next(line for line in report.splitlines() if line.startswith("| hcqr | 100.0%"))
    assert f"({record['correct']}/{record['valid']})" in row and f"κ {record['kappa']:.2f}" in row
    # measured with another judge: shown as such, not credited to this run's judge
    (runs[1] / AGREEMENT_FILE).write_text(json.dumps({**record, "judge": {**record["judge"], "judge_lm": "other"}}))
    report, _ = compare(runs, out_dir=tmp_path / "out")
    assert "measured with another judge (judge_lm=other" in report
    # the command line: nothing to judge, and the labelled set alone without a judge LM, are one line each
    assert main(["judge", "--no-mlflow"]) == 2
    assert "give run folders to judge, or --labelled-set" in capsys.readouterr().err
    assert main(["judge", "--labelled-set", "--no-mlflow"]) == 2
    assert "--labelled-set without run folders needs --judge-lm" in capsys.readouterr().err
    assert main(["judge", str(runs[0]), "--labelled-set", str(tmp_path / "none.jsonl"), "--no-mlflow"]) == 2
    assert "none.jsonl: cannot read it" in capsys.readouterr().err


def old_judged_run(tmp_path, demo, qids=("demo-001", "demo-002", "demo-003")):
    """A run folder judged before the on-topic control existed (labels NOT_USEFUL)."""
    run = demo_run(tmp_path / "hcqr", "hcqr", demo, qids=set(qids))
    old = {"mode": "context", "valid": True, "error": None, "passage_labels": None, "passage_queries": [[0]]}
    old |= {"judge_lm": "old", "reasoning": True, "controls": True, "control_seed": 0, "label": "NOT_USEFUL"}
    old |= {"positive_label": "USEFUL", "negative_label": "NOT_USEFUL", "seconds": 2.0}
    (run / "judgments.jsonl").write_text("".join(json.dumps({**old, "qid": q}) + "\n" for q in qids))
    return run


ADDED = {"qid": "demo-002", "on_topic_label": "USEFUL", "on_topic_rationale": "r", "on_topic_option": "C"}
ADDED |= {"on_topic_passages": [], "on_topic_error": None, "on_topic_seconds": 1.0}


@pytest.mark.parametrize(
    "records, message",
    [
        (
            [{k: v for k, v in ADDED.items() if k != "on_topic_seconds"}],
            r"\(record 1, question 'demo-002'\) lacks on_topic_seconds",
        ),
        ([{**ADDED, "on_topic_label": 42}], r"label 42 is not one of ENTAILED, USEFUL, NOT_USEFUL"),
        ([ADDED, {**ADDED, "on_topic_label": "ENTAILED"}], r"\(record 2, question 'demo-002'\) is the second record"),
        ([{**ADDED, "on_topic_passages": "p1"}], r"on_topic_passages a list"),
    ],
    ids=["field missing", "not a label", "twice", "passages not a list"],
)
def test_malformed_added_controls_are_refused_before_any_lm_call(tmp_path, demo, records, message):
    run = old_judged_run(tmp_path, demo)
    (run / "judgments_on_topic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    before = (run / "judgments.jsonl").read_bytes()
    judge = ScriptedJudge(reads_the_answer)
    with pytest.raises(HCQRError, match=message):
        judge_and_track(run, judge_lm="old", lm=judge, retriever=demo[1], track=False)
    assert judge.history == [] and (run / "judgments.jsonl").read_bytes() == before


def test_a_last_judgment_without_its_newline_keeps_its_labels(tmp_path, demo):
    run = old_judged_run(tmp_path, demo)
    path = run / "judgments.jsonl"
    path.write_bytes(path.read_bytes()[:-1])  # the final newline lost (an editor)
    judge = ScriptedJudge(lambda options, gold, documents: "USEFUL")
    judge_and_track(run, judge_lm="old", lm=judge, retriever=demo[1], track=False)
    judged = RunFolder(run).judgments()
    assert [j["qid"] for j in judged] == ["demo-001", "demo-002", "demo-003"] and len(judge.history) == 3
    assert [j["label"] for j in judged] == ["NOT_USEFUL"] * 3 and all(j["on_topic_added"] for j in judged)


def test_a_malformed_judgments_file_is_refused_before_the_judge_lm_is_reached(tmp_path, demo, monkeypatch):
    run = old_judged_run(tmp_path, demo)
    (run / "judgments_on_topic.jsonl").write_text(json.dumps({**ADDED, "on_topic_label": 42}) + "\n")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    with pytest.raises(HCQRError, match=r"judgments_on_topic.jsonl \(record 1, question 'demo-002'\): label 42"):
        judge_and_track(
            run, judge_lm="openai/nothing", api_base="http://127.0.0.1:9/v1", retriever=demo[1], track=False
        )
