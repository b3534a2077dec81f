"""Paired comparison: exact McNemar against a hand-checked example, question-set checks, report and plots."""

import json

import pytest

from hcqr_dspy.cli import main
from hcqr_dspy.compare import compare, mcnemar_exact
from hcqr_dspy.errors import HCQRError


def test_mcnemar_hand_checked():
    # 25 paired questions: 10 both right, b=2 (ref right only), c=8 (other right only), 5 both wrong.
    # Exact two-sided p = 2 * P(X <= 2 | X ~ Bin(10, 1/2)) = 2 * (1 + 10 + 45) / 1024 = 0.109375.
    ref, other = {}, {}
    for i in range(25):
        ref[str(i)], other[str(i)] = (True, True) if i < 10 else (True, False) if i < 12 else (False, True) if i < 20 else (False, False)
    t = mcnemar_exact(ref, other)
    assert (t["both_right"], t["b"], t["c"], t["both_wrong"]) == (10, 2, 8, 5)
    assert t["p_value"] == pytest.approx(112 / 1024)
    assert mcnemar_exact(ref, ref)["p_value"] == 1.0


def make_run(folder, method, correct, qids=None, hypothesis=None, dur=None):
    folder.mkdir(parents=True)
    qids = qids or [f"q{i}" for i in range(len(correct))]
    (folder / "config.json").write_text(json.dumps({"method": method, "lm": {"spec": "local"}}))
    rows = []
    for i, (q, ok) in enumerate(zip(qids, correct)):
        row = {"qid": q, "method": method, "prediction": "A" if ok else "B", "gold": "A", "valid": True,
               "correct": ok, "stages": {}, "lm_calls": 3, "prompt_tokens": 100, "completion_tokens": 10, "seconds": 1.0}
        if hypothesis:
            row["hypothesis"] = {"working_hypothesis": hypothesis[i]}
        rows.append(row)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if dur:
        (folder / "dur.json").write_text(json.dumps(dur))
    return folder


def test_report_table_and_plots(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True] * 12 + [False] * 13)
    b = make_run(tmp_path / "b", "hcqr", [True] * 10 + [False] * 2 + [True] * 8 + [False] * 5,
                 hypothesis=["A"] * 15 + ["B"] * 10,
                 dur={"dur_n": 25, "dur_invalid": 1, "dur": 0.75, "dur_entailed": 0.25, "dur_useful": 0.5, "dur_not_useful": 0.25})
    report, files = compare([a, b], reference="simple_rag", out_dir=tmp_path / "out")
    assert "| simple_rag | 25 | 48.0% |" in report
    assert "| hcqr | 25 | 72.0% |" in report and "| 2/8 | 0.109 |" in report and "75.0%" in report
    assert "| q10 | A | A ✓ | B ✗ |" in report and "| q12 | A | B ✗ | A ✓ |" in report  # disagreements
    # hypothesis (gold A): q0-q14 "A" (right), q15-q24 "B" (wrong). Kept right: q0-q9 and q12-q14 = 13;
    # broke: q10-q11; fixed: q15-q19; kept wrong: q20-q24. Hypothesis accuracy 15/25, changed 7/25.
    assert "| hcqr | 25 | 60.0% | 28.0% | 13 | 5 | 5 | 2 | 0 | 0 |" in report
    assert "| simple_rag | 25 |" not in report.split("## Working hypothesis")[1].split("## Runs")[0]
    names = {f.name for f in files}
    assert {"comparison.md", "comparison.json", "accuracy.png", "dur.png", "hypothesis_changes.png"} <= names
    assert all(f.stat().st_size > 1000 for f in files if f.suffix == ".png")
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert summary["mcnemar"]["hcqr"]["p_value"] == pytest.approx(0.109375)


def test_cache_note_and_bad_out_and_the_same_run_twice(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True, False, True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True, False, False])
    rows = [json.loads(line) for line in (b / "predictions.jsonl").read_text().splitlines()]
    rows[0].update(lm_calls=0, cached_lm_calls=3, prompt_tokens=0, completion_tokens=0)  # wholly from the cache
    rows[1].update(lm_calls=2, cached_lm_calls=1)  # partly
    (b / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report, _ = compare([a, b], out_dir=tmp_path / "out")
    assert "Compare costs with care for: hcqr (2/4 questions with cached calls, 1 wholly from the cache)." in report
    assert "simple_rag (" not in report.split("Compare costs with care for:")[1].split("\n")[0]
    (tmp_path / "file").write_text("x")
    with pytest.raises(HCQRError, match=r"--out .*file exists and is not a folder"):
        compare([a, b], out_dir=tmp_path / "file")
    with pytest.raises(HCQRError, match=r"run folder .*a is given twice"):
        compare([a, tmp_path / "x" / ".." / "a"], out_dir=tmp_path / "out")


def test_refuses_runs_on_different_questions(tmp_path):
    a = make_run(tmp_path / "a", "cot", [True, False], qids=["x1", "x2"])
    b = make_run(tmp_path / "b", "hcqr", [True, False], qids=["x1", "x3"])
    with pytest.raises(HCQRError, match=r"different questions.*only in the first: \['x2'\].*only in the second: \['x3'\]"):
        compare([a, b], out_dir=tmp_path / "out")


def test_cli_compare_errors_exit_2(tmp_path, capsys):
    a = make_run(tmp_path / "a", "cot", [True, False], qids=["x1", "x2"])
    assert main(["compare", str(a), str(tmp_path), "--no-mlflow"]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    b = make_run(tmp_path / "b", "hcqr", [True], qids=["x1"])
    assert main(["compare", str(a), str(b), "--no-mlflow", "--out", str(tmp_path / "o")]) == 2
    assert "different questions" in capsys.readouterr().err
    c = make_run(tmp_path / "c", "hcqr", [False, False], qids=["x1", "x2"])
    assert main(["compare", str(a), str(c), "--reference", "nope", "--no-mlflow", "--out", str(tmp_path / "o")]) == 2
    assert "reference 'nope' is none of" in capsys.readouterr().err
    assert main(["compare", str(a), str(a), "--no-mlflow", "--out", str(tmp_path / "o")]) == 2
    assert "is given twice" in capsys.readouterr().err


def test_partly_judged_run_shows_dur_from_its_judgments_and_how_many_were_judged(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True, False, True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True, False, False])
    for folder in (a, b):
        rows = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
        for r in rows:
            r["passages"] = [{"id": "p1", "queries": [0]}]
        (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a judge stopped after 2 of 4 questions: judgments.jsonl only, no dur.json yet
    judged = [{"qid": q, "mode": "context", "label": lab, "valid": True, "error": None, "passage_labels": None,
               "passage_queries": [[0]], "stages": {}, "seconds": 1.0} for q, lab in (("q0", "USEFUL"), ("q1", "NOT_USEFUL"))]
    (b / "judgments.jsonl").write_text("".join(json.dumps(j) + "\n" for j in judged))
    report, _ = compare([a, b], out_dir=tmp_path / "out")
    assert "| hcqr | 4 | 50.0% | 25.0% | 0 | 50.0% (2/4 judged) |" in report
    assert "| simple_rag | 4 | 50.0% | 25.0% | 0 | – |" in report


@pytest.mark.parametrize("lines, message", [
    (['{"qid": "q0"}'], "lacks 'valid', 'label' or 'passage_queries'"),
    (["J0", "J0"], "question 'q0' is judged twice"),
    (["J0", "J9"], "judges 1 question\\(s\\) this run does not hold \\(q9\\)"),
])
def test_judgments_that_cannot_be_the_runs_are_refused(tmp_path, lines, message):
    a = make_run(tmp_path / "a", "simple_rag", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True])
    judgment = {"mode": "context", "label": "USEFUL", "valid": True, "error": None, "passage_labels": None,
                "passage_queries": [[0]], "stages": {}, "seconds": 1.0}
    text = {"J0": json.dumps({"qid": "q0", **judgment}), "J9": json.dumps({"qid": "q9", **judgment})}
    (b / "judgments.jsonl").write_text("".join(text.get(line, line) + "\n" for line in lines))
    with pytest.raises(HCQRError, match=message):
        compare([a, b], out_dir=tmp_path / "out")


def test_truncated_config_or_dur_file_is_a_clear_error(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True], dur={"dur_n": 2})
    (b / "dur.json").write_text('{"dur_n": 2, "du')
    with pytest.raises(HCQRError, match=r"dur.json is unreadable"):
        compare([a, b], out_dir=tmp_path / "out")
    (b / "config.json").write_text('{"method": "hc')
    with pytest.raises(HCQRError, match=r"config.json is unreadable"):
        compare([a, b], out_dir=tmp_path / "out")
