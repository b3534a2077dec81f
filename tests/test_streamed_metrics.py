"""An evaluation holds no list of its rows: the loop keeps their ids alone, the metrics are summed one row at a time
from ``predictions.jsonl`` and equal the list-based computation they replace (invalid rows, stages, fallbacks,
evidence, hypotheses, unlabelled rows, rows without ``gold_prob``), and the result reads its rows from the folder on
demand. Real run folders, a real DSPy program over DummyLM."""

import math
import random
from collections import defaultdict

import dspy
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.data import check_question
from hcqr_dspy.evaluation.answering import evaluate
from hcqr_dspy.evaluation.evidence import evidence_summary
from hcqr_dspy.evaluation.loop import run_resumable
from hcqr_dspy.evaluation.metrics import MetricsAccumulator, hypothesis_changes, summarize
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.programs import CoT

OPTIONS = {"A": "alpha", "B": "beta", "C": "gamma"}


def list_fallbacks(rows):
    """The list-based fallback summary the accumulator replaces (every row in memory)."""
    rows, out = list(rows), {}
    n = len(rows)
    for name in sorted({k for r in rows for k in (r.get("fallbacks") or {})}):
        counts = [int((r.get("fallbacks") or {}).get(name) or 0) for r in rows]
        questions = sum(c > 0 for c in counts)
        out[name] = {"questions": questions, "rate": questions / n, "total": sum(counts)}
    sources = [s for r in rows for s in (r.get("query_sources") or [])]
    for source in sorted(set(sources)):
        out[f"query_share_{source}"] = sources.count(source) / len(sources)
    return out


def list_summary(rows):
    """The list-based summary the accumulator replaces: each figure computed over the full list of rows."""
    rows = list(rows)
    n = len(rows)
    out = {"n": n}
    labelled = [r for r in rows if r.get("gold") is not None]
    if labelled:
        correct = sum(bool(r["correct"]) for r in labelled)
        acc = correct / len(labelled)
        out.update(correct=correct, accuracy=acc, accuracy_se=math.sqrt(acc * (1 - acc) / len(labelled)))
    if len(labelled) < n:
        out["labelled"] = len(labelled)
    invalid = sum(not r["valid"] for r in rows)
    out.update(invalid=invalid, invalid_rate=invalid / n)
    for field in ("lm_calls", "cached_lm_calls", "prompt_tokens", "completion_tokens", "seconds"):
        out[f"mean_{field}"] = sum(r.get(field) or 0 for r in rows) / n
    measured = [r for r in rows if r.get("cpu_pressure") is not None]
    measured_seconds = sum(r.get("seconds") or 0 for r in measured)
    if measured_seconds > 0:  # the share of the measured rows' seconds some task waited for a CPU
        stalled = sum(r["cpu_pressure"] * (r.get("seconds") or 0) for r in measured)
        out.update(mean_cpu_pressure=stalled / measured_seconds, cpu_pressure_rows=len(measured))
    per_stage = defaultdict(lambda: defaultdict(float))
    for r in rows:
        for name, st in (r.get("stages") or {}).items():
            for field, value in st.items():
                per_stage[name][field] += value or 0
    out.update({f"{s}_mean_{f}": t / n for s, fields in per_stage.items() for f, t in fields.items()})
    for r in rows:
        if not r["valid"]:
            key = f"invalid_{r.get('invalid_stage') or 'unknown'}_{r.get('invalid_cause') or 'unknown'}"
            out[key] = out.get(key, 0) + 1
    for name, f in list_fallbacks(rows).items():
        out.update({name: f} if name.startswith("query_share_") else {f"fallback_{name}_{k}": v for k, v in f.items()})
    out.update(evidence_summary(rows))
    invalid_h = sum(1 for r in rows if (r.get("fallbacks") or {}).get("hypothesis_failed"))
    if invalid_h:
        out["hypothesis_invalid"] = invalid_h
    c = hypothesis_changes(rows)
    if c["with_hypothesis"]:
        out["hypothesis_accuracy"] = c["hypothesis_correct"] / c["with_hypothesis"]
        out["answer_changed_rate"] = (c["fixed"] + c["broke"] + c["changed_wrong_to_wrong"]) / c["with_hypothesis"]
        out.update({f"hypothesis_{k}": v for k, v in c.items() if k not in ("with_hypothesis", "hypothesis_correct")})
    return out


def varied_row(i):
    """Rows of every kind the summary counts: invalid ones by stage and cause, unlabelled ones, fallbacks, evidence
    (with and without distractors), a hypothesis or none, option_probs or none, missing and ``None`` costs."""
    valid = i % 5 != 2
    gold = None if i % 11 == 4 else "ABC"[i % 3]
    prediction = "ABC"[(i * 7) % 3] if valid else None
    row = {
        "qid": f"q{i:03d}",
        "prediction": prediction,
        "valid": valid,
        "gold": gold,
        "correct": None if gold is None else (valid and prediction == gold),
        "lm_calls": 1 + i % 3,
        "prompt_tokens": 100 + i,
        "completion_tokens": None if i % 6 == 0 else 20 + i % 9,
        "seconds": 0.1 + i / 7,
        "cpu_pressure": None if i % 4 == 3 else (i % 10) / 10,  # measured or not (a kernel without PSI)
        "stages": {
            "answer": {"seconds": i / 13, "lm_calls": 1},
            **({"hypothesis": {"seconds": None}} if i % 2 else {}),
        },
        "fallbacks": {"hypothesis_failed": 1} if i % 9 == 1 else {"queries_collapsed": i % 3, "context_cut": i % 2},
        "query_sources": ["rewrite", "rewrite", "hypothesis" if i % 4 else "question"],
        "evidence": None
        if i % 7 == 0
        else {
            "gold_mentioned": i % 2 == 0,
            "distractors_mentioned": i % 3,
            "distractors": 0 if i % 8 == 0 else 2,
        },  # fmt: skip
        "hypothesis": None if i % 9 == 1 else {"working_hypothesis": "ABC"[i % 2]},
        "option_probs": None if i % 4 else {"A": 0.5, "B": 0.3, "C": 0.2},
    }
    if not valid:
        row.update(invalid_stage="answer" if i % 3 else None, invalid_cause="unparseable" if i % 2 else "truncated")
    if i % 10 == 3:
        del row["lm_calls"]  # a cost field absent counts 0
    return row


@pytest.fixture
def folder(tmp_path):
    folder = RunFolder.create(tmp_path / "run", {"method": "hcqr", "dataset": "bench.json"})
    for i in range(60):
        folder.predictions.append(varied_row(i))
    yield folder
    folder.release()


def assert_same_figures(got, expected, ordered=True):
    assert (list(got) if ordered else set(got)) == (list(expected) if ordered else set(expected))
    for key, value in expected.items():
        assert got[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key


def test_the_streamed_metrics_equal_the_list_based_ones_in_any_row_order(folder):
    expected = list_summary(folder.rows())
    assert {"labelled", "hypothesis_invalid", "invalid_answer_unparseable", "invalid_unknown_truncated"} <= set(
        expected
    )
    assert_same_figures(summarize(folder.iter_rows()), expected)
    assert_same_figures(folder.write_metrics(), expected)  # metrics.json, the file streamed
    shuffled = folder.rows()
    random.Random(0).shuffle(shuffled)
    acc = MetricsAccumulator()
    for row in shuffled:
        acc.add(row)
    assert_same_figures(acc.metrics(), expected, ordered=False)  # rows finish in any order: the same figures
    assert acc.fallbacks() == list_fallbacks(shuffled)  # counts and their ratios: exact
    assert summarize([]) == {"n": 0}


def test_an_evaluation_keeps_no_list_of_rows_and_reads_them_from_its_folder(tmp_path):
    qs = [
        check_question(f"q{i}", {"question": f"Question number {i}?", "options": OPTIONS, "answer": "ABC"[i % 3]}, "t")
        for i in range(8)
    ]
    lm = DummyLM(
        {f"Question number {i}?": {"reasoning": "r", "answer": "A" if i % 2 else "junk"} for i in range(8)},
        adapter=dspy.JSONAdapter(),
    )
    folder = RunFolder.create(tmp_path / "run", {"method": "cot", "dataset": "bench.json"})
    try:
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            first = evaluate(CoT(), qs[:5], folder, "cot", progress=False)
            result = evaluate(CoT(), qs, folder, "cot", progress=False)  # resumes the first five
    finally:
        folder.release()
    assert (first.ran, result.resumed, result.ran, result.saved) == (5, 5, 3, 8)
    assert not any(isinstance(v, list) and v and isinstance(v[0], dict) for v in vars(result).values())  # ids only
    assert result.metrics == pytest.approx(list_summary(folder.rows()))
    assert [r["qid"] for r in result.rows] == [q.qid for q in qs]  # run order, read from the folder
    assert sorted(r["qid"] for r in result.iter_rows()) == sorted(q.qid for q in qs)


def test_the_loop_returns_no_records_when_told_not_to_collect_them(tmp_path):
    table = RunFolder(tmp_path).predictions

    def work(qid):
        return {"qid": qid, "valid": True}

    rows, resumed, ran = run_resumable(table, ["a", "b"], str, work, (), progress=False, collect=False)
    assert (rows, resumed, ran) == ([], 0, 2) and [r["qid"] for r in table.read()] == ["a", "b"]
    rows, resumed, ran = run_resumable(table, ["a", "b", "c"], str, work, (), progress=False)
    assert ([r["qid"] for r in rows], resumed, ran) == (["a", "b", "c"], 2, 1)
