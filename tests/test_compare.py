"""Paired comparison: exact McNemar against a hand-checked example, question-set checks, report and plots."""

import json
import re

import pytest
from helpers import TINY_ROWS, comparison_row, snippet, write_jsonl, write_session

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.reporting import compare, mcnemar_exact
from hcqr_dspy.retrieval import BM25Retriever, load_corpus


def test_mcnemar_hand_checked():
    # 25 paired questions: 10 both right, b=2 (ref right only), c=8 (other right only), 5 both wrong.
    # Exact two-sided p = 2 * P(X <= 2 | X ~ Bin(10, 1/2)) = 2 * (1 + 10 + 45) / 1024 = 0.109375.
    ref, other = {}, {}
    for i in range(25):
        ref[str(i)], other[str(i)] = (
            (True, True) if i < 10 else (True, False) if i < 12 else (False, True) if i < 20 else (False, False)
        )
    t = mcnemar_exact(ref, other)
    assert (t["both_right"], t["b"], t["c"], t["both_wrong"]) == (10, 2, 8, 5)
    assert t["p_value"] == pytest.approx(112 / 1024)
    assert mcnemar_exact(ref, ref)["p_value"] == 1.0


def make_run(folder, method, correct, qids=None, hypothesis=None, dur=None, dataset="bench.json", content="v1"):
    folder.mkdir(parents=True)
    qids = qids or [f"q{i}" for i in range(len(correct))]
    questions = {"count": len(qids), "ids_sha256": "-".join(qids), "content_sha256": f"{content}:{'-'.join(qids)}"}
    (folder / "config.json").write_text(
        json.dumps({"method": method, "lm": {"spec": "local"}, "dataset": dataset, "questions": questions})
    )
    rows = []
    for i, (q, ok) in enumerate(zip(qids, correct)):
        row = comparison_row(q, method, ok)
        if hypothesis:
            row["hypothesis"] = {"working_hypothesis": hypothesis[i]}
        rows.append(row)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_session(folder)
    if dur:
        (folder / "dur.json").write_text(json.dumps(dur))
    return folder


def judgment(qid, label="USEFUL", **controls):
    """A context-mode judgment of question ``qid`` (its one passage found by query 0), as `hcqr judge` writes one."""
    return {
        "qid": qid,
        "mode": "context",
        "label": label,
        "valid": True,
        "error": None,
        "passage_labels": None,
        "passage_queries": [[0]],
        "stages": {},
        "seconds": 1.0,
        **controls,
    }


def give_each_row_a_passage(folder):
    rows = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    for r in rows:
        r["passages"] = [{"id": "p1", "queries": [0]}]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_judgments(folder, judged):
    (folder / "judgments.jsonl").write_text("".join(json.dumps(j) + "\n" for j in judged))


def judgments_for(folder, qids):
    """Write context-mode judgments (USEFUL, controls judged) of ``qids`` into a run folder; give its rows a passage."""
    give_each_row_a_passage(folder)
    write_judgments(folder, [judgment(q, positive_label="USEFUL", negative_label="NOT_USEFUL") for q in qids])


def test_questions_both_runs_got_wrong_with_other_letters_are_answered_differently(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True, False, False, False])
    b = make_run(tmp_path / "b", "hcqr", [True, False, False, False])
    rows = [json.loads(line) for line in (b / "predictions.jsonl").read_text().splitlines()]
    rows[1]["prediction"], rows[2]["prediction"], rows[2]["valid"] = "C", None, False  # other letter; invalid
    (b / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report, _ = compare([a, b], reference="simple_rag", out_dir=tmp_path / "out")
    listed = report.split("## Questions answered differently")[1].split("\n## ")[0]
    assert "| q1 | A | B ✗ | C ✗ |" in listed and "| q2 | A | B ✗ | invalid ✗ |" in listed
    assert "| q0 |" not in listed and "| q3 |" not in listed


def test_report_table_and_plots(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True] * 12 + [False] * 13)
    b = make_run(
        tmp_path / "b",
        "hcqr",
        [True] * 10 + [False] * 2 + [True] * 8 + [False] * 5,
        hypothesis=["A"] * 15 + ["B"] * 10,
        dur={
            "dur_n": 25,
            "dur_invalid": 1,
            "dur": 0.75,
            "dur_entailed": 0.25,
            "dur_useful": 0.5,
            "dur_not_useful": 0.25,
        },
    )
    report, files = compare([a, b], reference="simple_rag", out_dir=tmp_path / "out")
    assert "| simple_rag | 25 | 48.0% |" in report
    # the only test in this report: #1 of a family of one, so its Holm-adjusted p is the raw one
    assert "| hcqr | 25 | 72.0% |" in report and "| 2/8 | 0.109 (#1; Holm 0.109) |" in report and "75.0%" in report
    assert "| q10 | A | A ✓ | B ✗ |" in report and "| q12 | A | B ✗ | A ✓ |" in report  # disagreements
    assert "| q20 |" not in report  # both wrong with the same letter: answered alike
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
    with pytest.raises(
        HCQRError, match=r"different questions.*only in the first: \['x2'\].*only in the second: \['x3'\]"
    ):
        compare([a, b], out_dir=tmp_path / "out")


def test_runs_under_way_are_compared_on_the_questions_all_have_answered(tmp_path, capsys):
    a = make_run(tmp_path / "a", "simple_rag", [True, False, True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True, False, True])
    lines = (b / "predictions.jsonl").read_text().splitlines()
    (b / "predictions.jsonl").write_text("\n".join(lines[:3]) + "\n")  # hcqr has answered q0-q2 so far
    with pytest.raises(HCQRError, match=r"different questions.*--common"):
        compare([a, b], out_dir=tmp_path / "out")
    report, _ = compare([a, b], out_dir=tmp_path / "out", common=True)
    assert report.startswith("# Comparison on 3 questions (reference: simple_rag)")
    assert "answered so far: simple_rag 4, hcqr 3)" in report
    assert "| simple_rag | 3 | 66.7% |" in report and "| hcqr | 3 | 66.7% |" in report
    assert "| q3 |" not in report and "| q1 | A | B ✗ | A ✓ |" in report
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert summary["questions"] == 3 and summary["answered"] == {"simple_rag": 4, "hcqr": 3}
    assert main(["compare", str(a), str(b), "--common", "--no-mlflow", "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    # another question set is still refused, and so are runs with no question in common
    c = make_run(tmp_path / "c", "cot", [True, True, True, True], content="v2")
    with pytest.raises(HCQRError, match="not questions"):
        compare([a, c], out_dir=tmp_path / "out", common=True)
    (a / "predictions.jsonl").write_text((a / "predictions.jsonl").read_text().splitlines()[3] + "\n")
    with pytest.raises(HCQRError, match="no question has been answered by every run"):
        compare([a, b], out_dir=tmp_path / "out", common=True)


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
        give_each_row_a_passage(folder)
    # a judge stopped after 2 of 4 questions: judgments.jsonl only, no dur.json yet
    write_judgments(b, [judgment("q0", "USEFUL"), judgment("q1", "NOT_USEFUL")])
    report, _ = compare([a, b], out_dir=tmp_path / "out")
    assert "| hcqr | 4 | 50.0% | 25.0% | 0 | 50.0% (2/4 judged) |" in report
    assert "DUR of hcqr is not trustworthy: no control judgments" in report  # judged without controls
    assert "| simple_rag | 4 | 50.0% | 25.0% | 0 | – |" in report


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"qid": "q0"}'], "lacks 'valid', 'label' or 'passage_queries'"),
        (["J0", "J0"], "question 'q0' is judged twice"),
        (["J0", "J9"], "judges 1 question\\(s\\) this run does not hold \\(q9\\)"),
    ],
)
def test_judgments_that_cannot_be_the_runs_are_refused(tmp_path, lines, message):
    a = make_run(tmp_path / "a", "simple_rag", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True])
    text = {"J0": json.dumps(judgment("q0")), "J9": json.dumps(judgment("q9"))}
    (b / "judgments.jsonl").write_text("".join(text.get(line, line) + "\n" for line in lines))
    with pytest.raises(HCQRError, match=message):
        compare([a, b], out_dir=tmp_path / "out")


def test_truncated_config_or_dur_file_is_a_clear_error(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True], dur={"dur_n": 2})
    (b / "dur.json").write_text('{"dur_n": 2, "du')
    with pytest.raises(HCQRError, match=r"dur.json:1: not valid JSON"):
        compare([a, b], out_dir=tmp_path / "out")
    (b / "config.json").write_text('{"method": "hc')
    with pytest.raises(HCQRError, match=r"config.json:1: not valid JSON"):
        compare([a, b], out_dir=tmp_path / "out")


def test_runs_over_different_question_files_that_share_ids_are_refused(tmp_path):
    a = make_run(tmp_path / "a", "cot", [True, False], dataset="medqa.json", content="medqa")
    b = make_run(tmp_path / "b", "hcqr", [True, True], dataset="other.json", content="other")
    with pytest.raises(HCQRError, match=r"share question ids but not questions: .*medqa\.json.*other\.json"):
        compare([a, b], out_dir=tmp_path / "out")
    c = make_run(tmp_path / "c", "hcqr", [True, True], dataset="copy-of-medqa.json", content="medqa")
    compare([a, c], out_dir=tmp_path / "out")  # the same questions from another path: compared
    d = make_run(tmp_path / "d", "hcqr", [True], qids=["x0"], dataset="other.json", content="other")
    with pytest.raises(HCQRError, match=r"runs were made over other questions: .*medqa\.json.*other\.json"):
        compare([a, d], out_dir=tmp_path / "out", common=True)  # no id in common: not "share question ids"


def test_non_utf8_predictions_are_one_line(tmp_path, capsys):
    a = make_run(tmp_path / "a", "cot", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True])
    (b / "predictions.jsonl").write_bytes((b / "predictions.jsonl").read_bytes() + b'{"qid": "caf\xe9"}\n')
    assert main(["compare", str(a), str(b), "--no-mlflow", "--out", str(tmp_path / "o")]) == 2
    assert "predictions.jsonl:3: not valid UTF-8" in capsys.readouterr().err


@pytest.fixture
def tiny_bench(tmp_path, tiny_corpus_file):
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    questions = {
        f"t{i}": {"question": q, "options": {"A": a, "B": b}, "answer": "A"}
        for i, (q, a, b) in enumerate(
            [
                ("Nausea and yellow vision in a patient on a cardiac glycoside?", "Digoxin toxicity", "Graves disease"),
                ("Fatigable ptosis improving with edrophonium?", "Myasthenia gravis", "Iron deficiency anemia"),
                (
                    "Lancet-shaped gram-positive diplococci in pneumonia?",
                    "Streptococcus pneumoniae",
                    "Hashimoto thyroiditis",
                ),
                ("Hypersegmented neutrophils and macrocytosis?", "Vitamin B12 deficiency", "Lambert-Eaton syndrome"),
            ]
        )
    }
    dataset = tmp_path / "bench.json"
    dataset.write_text(json.dumps(questions))
    index = tmp_path / "idx"
    BM25Retriever(load_corpus(tiny_corpus_file), show_progress=False).save(index)
    return dataset, index


def run_method(tmp_path, dataset, index, method, lm):
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    spec = EvalSpec(method=method, dataset=str(dataset), index=str(index), lm="dummy/x", run_dir=str(tmp_path / method))
    return run_evaluation(spec, progress=False, track=False, lm=lm)[1]


def test_compare_shows_a_method_that_ran_on_its_fallback_evidence_and_hypothesis_vs_cot(tmp_path, tiny_bench):
    import dspy
    from dspy.utils import DummyLM

    dataset, index = tiny_bench
    answer = {"reasoning": "r", "answer": "A"}
    hypothesis = {
        "discriminating_features": "key finding",
        "reasoning": "r",
        "working_hypothesis": "B",
        "confirming_evidence": "typical presentation",
    }
    # the rewrite step never parses: every HCQR query is built from the hypothesis fields
    hcqr_lm = DummyLM(
        {"`support_query`": {"oops": "x"}, "`discriminating_features`": hypothesis, "`answer`": answer},
        adapter=dspy.JSONAdapter(),
    )
    runs = [
        run_method(tmp_path, dataset, index, "simple_rag", DummyLM({"`answer`": answer}, adapter=dspy.JSONAdapter())),
        run_method(tmp_path, dataset, index, "cot", DummyLM({"`answer`": answer}, adapter=dspy.JSONAdapter())),
        run_method(tmp_path, dataset, index, "hcqr", hcqr_lm),
    ]
    report, files = compare(runs, reference="simple_rag", out_dir=tmp_path / "out")
    assert (
        "| hcqr | queries from hypothesis: 4/4 q (12 in all); rewrite failed: 4/4 q; "
        "queries by source: hypothesis 100% |" in report
    )
    assert "**hcqr ran mostly on its fallback: 100% of its queries were built from the hypothesis" in report
    # evidence: Simple RAG retrieves with the question; the constructed corpus names each gold option in one passage
    evidence = report.split("## Evidence in the context (judge-free)")[1].split("##")[0]
    assert "| simple_rag | 4 | 100.0% |" in evidence and "| hcqr | 4 |" in evidence and "| cot |" not in evidence
    # the hypothesis always said B (gold A): 0/4 right; CoT answered A: 4/4, b = 4, exact p = 2 * 0.5**4; the
    # report's fifth test (two McNemar against the reference, two on evidence before it), Holm: 5 * 0.125 (the
    # smallest p of five, tied with the evidence McNemar's)
    assert "| hcqr | cot | 4 | 0.0% | 100.0% | 4 | 0 | 0.125 (#5; Holm 0.625) |" in report
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert summary["hypothesis_vs_cot"]["hcqr"]["p_value"] == pytest.approx(0.125)
    assert summary["fallbacks"]["hcqr"]["queries_from_hypothesis"] == {"questions": 4, "rate": 1.0, "total": 12}


def test_question_evidence_on_constructed_contexts():
    from hcqr_dspy.evaluation.evidence import evidence_summary, paired_evidence_tests, question_evidence

    options = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Iron deficiency anemia", "D": "yes"}
    both = ["Digoxin toxicities cause yellow vision.", "In Graves' disease, exophthalmos."]
    assert question_evidence(options, "A", both) == {
        "gold_mentioned": True,
        "distractors_mentioned": 1,
        "distractors": 2,
    }
    # every content word in ONE passage: "iron" and "anemia" in different passages is no mention
    split = ["Iron stores are low.", "Deficiency anemia is microcytic."]
    assert question_evidence(options, "C", split)["gold_mentioned"] is False
    assert question_evidence(options, "D", both) is None  # a content-free gold option cannot be measured
    rows = [{"evidence": question_evidence(options, "A", both)}, {"evidence": question_evidence(options, "A", split)}]
    m = evidence_summary(rows)
    assert (m["gold_coverage"], m["distractor_coverage"]) == (0.5, 0.25) and m["evidence_margin"] == 0.25
    ref = {"q1": {"gold_mentioned": False, "distractors_mentioned": 0, "distractors": 2}}
    other = {"q1": {"gold_mentioned": True, "distractors_mentioned": 0, "distractors": 2}}
    t = paired_evidence_tests(ref, other)
    assert (t["gold_b"], t["gold_c"], t["margin_mean_diff"]) == (0, 1, 1.0)


def test_recall_and_ndcg_against_qrels_come_from_ir_measures(tmp_path):
    from hcqr_dspy.evaluation.evidence import load_qrels, qrels_metrics

    (tmp_path / "qrels.json").write_text(json.dumps({"q1": ["p1", "p2"], "q2": {"p9": 1}}))
    qrels = load_qrels(tmp_path / "qrels.json")
    rows = [
        {"qid": "q1", "passages": [{"id": "p3"}, {"id": "p1"}], "dropped_passages": [{"id": "p2"}]},
        {"qid": "q2", "passages": [{"id": "p5"}]},
        {"qid": "q3", "passages": [{"id": "p1"}]},
    ]
    m = qrels_metrics(rows, qrels, k=2)
    # q1: p1 at rank 2 of the fused list (p2 at rank 3, past k=2): recall@2 = 1/2; q2: nothing relevant
    assert m["qrels_n"] == 2 and m["per_query"]["q1"]["recall"] == 0.5 and m["per_query"]["q2"]["recall"] == 0.0
    # nDCG@10 of q1: (1/log2(3) + 1/log2(4)) / (1 + 1/log2(3))
    import math

    assert m["per_query"]["q1"]["ndcg"] == pytest.approx((1 / math.log2(3) + 0.5) / (1 + 1 / math.log2(3)))
    (tmp_path / "bad.json").write_text(json.dumps({"q1": "p1"}))
    with pytest.raises(HCQRError, match="question 'q1' has str"):
        load_qrels(tmp_path / "bad.json")


def test_comparison_run_is_named_after_what_it_compares_links_runs_by_id_and_logs_its_figures(tmp_path, mlflow_store):
    import mlflow

    from hcqr_dspy.tracking import mlflow_runs as tracking
    from hcqr_dspy.tracking.comparison import track_comparison

    ids = {}
    for method in ("simple_rag", "hcqr"):
        with tracking.mlflow_run(f"{method} run", {}, store=mlflow_store, traces=False) as run:
            ids[method] = run.info.run_id
    a = make_run(tmp_path / "a", "simple_rag", [True] * 12 + [False] * 13, dataset="/data/medqa.json")
    b = make_run(
        tmp_path / "b",
        "hcqr",
        [True] * 10 + [False] * 2 + [True] * 8 + [False] * 5,
        dataset="/data/medqa.json",
        dur={
            "dur_n": 25,
            "dur_invalid": 0,
            "dur": 0.75,
            "dur_entailed": 0.25,
            "dur_useful": 0.5,
            "dur_not_useful": 0.25,
        },
    )
    for folder, method in ((a, "simple_rag"), (b, "hcqr")):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "mlflow_run_id": ids[method]}))
    compare([a, b], reference="simple_rag", out_dir=tmp_path / "out")
    run = mlflow.get_run(track_comparison(tmp_path / "out", mlflow_dir=mlflow_store))
    assert run.info.run_name == "compare simple_rag vs hcqr · medqa · local"
    assert run.data.tags["kind"] == "comparison" and run.data.tags["reference"] == "simple_rag"
    assert run.data.tags["runs"] == f"{ids['simple_rag']},{ids['hcqr']}" and run.data.tags["run.hcqr"] == ids["hcqr"]
    m = run.data.metrics
    assert m["accuracy.simple_rag"] == 0.48 and m["accuracy.hcqr"] == 0.72
    assert m["delta_accuracy.hcqr"] == pytest.approx(0.24) and m["mcnemar_p.hcqr"] == pytest.approx(0.109375)
    assert m["dur.hcqr"] == 0.75 and "delta_accuracy.simple_rag" not in m
    assert f"runs/{ids['hcqr']})" in run.data.tags["mlflow.note.content"]
    names = {f.path for f in mlflow.MlflowClient().list_artifacts(run.info.run_id, "comparison")}
    assert "comparison/comparison.md" in names and "comparison/accuracy.png" in names


def test_plots_count_whole_questions_name_dataset_lm_and_n_and_weigh_accuracy_against_cost(tmp_path):
    from PIL import Image

    from hcqr_dspy.reporting import accuracy_vs_cost_figure, dur_figure, hypothesis_changes_figure, load_run

    a = make_run(tmp_path / "a", "simple_rag", [True] * 2 + [False] * 3, dataset="/data/medqa.json")
    b = make_run(
        tmp_path / "b", "hcqr", [True] * 4 + [False], hypothesis=["A", "B", "A", "A", "B"], dataset="/data/medqa.json"
    )
    runs = [load_run(a), load_run(b)]
    two = make_run(tmp_path / "two", "hcqr", [True, False], hypothesis=["A", "A"], dataset="/data/medqa.json")
    fig = hypothesis_changes_figure([load_run(two)])
    ax = fig.axes[0]
    ax.figure.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_yticks())  # 2 questions: no 0.25, 0.5 ... ticks
    assert ax.get_title().endswith("medqa · LM local · n=2")
    fig = accuracy_vs_cost_figure(runs)
    calls, tokens = fig.axes
    assert calls.get_xlabel() == "LM calls per question\n(cached calls included)"
    assert "a cached call counts none" in tokens.get_xlabel() and "medqa · LM local · n=5" in fig._suptitle.get_text()
    points = {c.get_label(): (c.lines[0].get_xdata()[0], c.lines[0].get_ydata()[0]) for c in calls.containers}
    assert points == {"simple_rag": (3.0, 0.4), "hcqr": (3.0, 0.8)}
    assert [c.lines[0].get_xdata()[0] for c in tokens.containers] == [110.0, 110.0]
    # two runs at the same cost: named once each in the figure's legend, no label written over a point
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["simple_rag", "hcqr"]
    assert not calls.texts and not tokens.texts
    # two runs at the same point (same cost, same accuracy) are drawn side by side, not one over the other
    twin = make_run(tmp_path / "twin", "simple_rag", [True] * 2 + [False] * 3, dataset="/data/medqa.json")
    fig = accuracy_vs_cost_figure([runs[0], load_run(twin), runs[1]])
    xs = [c.lines[0].get_xdata()[0] for c in fig.axes[0].containers]
    assert xs[0] < 3.0 < xs[1] and xs[2] == 3.0 and xs[1] - xs[0] == pytest.approx(0.03 * 3.0)
    # DUR bars say how many questions were judged; the judge's control rates are markers on them
    judged = make_run(
        tmp_path / "judged",
        "hcqr",
        [True] * 5,
        dataset="/data/medqa.json",
        dur={
            "dur_n": 4,
            "dur_invalid": 0,
            "dur_useful": 0.25,
            "dur_not_useful": 0.75,
            "dur": 0.25,
            "dur_positive_control": 0.75,
            "dur_negative_control": 0.5,
        },
    )
    old = make_run(
        tmp_path / "old",
        "simple_rag",
        [True] * 5,
        dataset="/data/medqa.json",
        dur={"dur_n": 5, "dur_invalid": 1, "dur_useful": 0.5, "dur_not_useful": 0.5, "dur": 0.5},
    )
    good = make_run(
        tmp_path / "good",
        "cot",
        [True] * 5,
        dataset="/data/medqa.json",
        dur={
            "dur_n": 5,
            "dur_invalid": 0,
            "dur_useful": 0.8,
            "dur_not_useful": 0.2,
            "dur": 0.8,
            "dur_positive_control": 1.0,
            "dur_negative_control": 0.0,
            "dur_on_topic_control": 0.0,
            "dur_on_topic_control_n": 5,
        },
    )
    fig = dur_figure([load_run(judged), load_run(old), load_run(good), load_run(a)])
    ax = fig.axes[0]
    # the first judge called half its negative controls useful (limit 20%), the second had no controls: their bars
    # and names say the judge is not trusted; the third passed all three controls
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "hcqr\n(4 judged)\nJUDGE NOT TRUSTED",
        "simple_rag\n(5 judged)\nJUDGE NOT TRUSTED",
        "cot\n(5 judged)",
    ]
    hatched = {round(p.get_x() + p.get_width() / 2) for p in ax.patches if p.get_hatch()}
    assert hatched == {0, 1}
    markers = {ln.get_label().split(" controls")[0]: (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines}
    # the run judged without controls has none
    assert markers == {"positive": ([0, 2], [0.75, 1.0]), "negative": ([0, 2], [0.5, 0.0]), "on-topic": ([2], [0.0])}
    # written whole: the title fits in the image (bbox_inches="tight"), the plot is among compare's files
    _, files = compare([a, b], out_dir=tmp_path / "out")
    png = next(f for f in files if f.name == "accuracy_vs_cost.png")
    assert Image.open(png).size[0] > 900


def test_a_question_recorded_twice_is_refused_and_same_method_runs_keep_distinct_labels(tmp_path):
    a = make_run(tmp_path / "cot", "cot", [True, False, True])
    b = make_run(tmp_path / "hcqr-b15", "hcqr", [True, True, False])
    c = make_run(tmp_path / "hcqr-b10", "hcqr", [False, True, False])
    report, _ = compare([a, b, c], out_dir=tmp_path / "out", reference=str(a) + "/")  # a trailing slash names it too
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert set(summary["runs"]) == {"cot", "hcqr (local) (hcqr-b15)", "hcqr (local) (hcqr-b10)"}
    assert summary["runs"]["hcqr (local) (hcqr-b10)"]["accuracy"] == pytest.approx(1 / 3)
    (b / "predictions.jsonl").write_text(
        (b / "predictions.jsonl").read_text() + (b / "predictions.jsonl").read_text().splitlines()[-1] + "\n"
    )
    with pytest.raises(HCQRError, match=r"predictions.jsonl: question 'q2' is recorded twice"):
        compare([a, b], out_dir=tmp_path / "out")


def test_hypothesis_vs_cot_names_each_cot_run(tmp_path):
    a = make_run(tmp_path / "cot-a", "cot", [True, True, True, True])
    b = make_run(tmp_path / "cot-b", "cot", [False, False, False, False])
    h = make_run(tmp_path / "hcqr", "hcqr", [True, True, True, True], hypothesis=["A", "A", "B", "B"])
    report, _ = compare([h, a, b], out_dir=tmp_path / "out")
    section = report.split("## Working hypothesis vs CoT")[1]
    assert "| hcqr | cot (local) (cot-a) | 4 | 50.0% | 100.0% |" in section
    assert "| hcqr | cot (local) (cot-b) | 4 | 50.0% | 0.0% |" in section


def test_qrels_for_other_questions_or_without_a_relevant_passage(tmp_path):
    from hcqr_dspy.evaluation.evidence import load_qrels, qrels_metrics

    rows = [{"qid": "q0", "passages": [{"id": "p1"}]}, {"qid": "q1", "passages": [{"id": "p2"}]}]
    # a question whose qrels hold no relevant passage is left out, not scored 0 (trec_eval's convention)
    m = qrels_metrics(rows, {"q0": {"p1": 1}, "q1": {"p2": 0}}, k=1)
    assert (m["qrels_n"], m["recall_at_1"], m["qrels_no_relevant"]) == (1, 1.0, 1)
    (tmp_path / "dec.json").write_text(json.dumps({"q0": {"p1": 1.0}}))
    with pytest.raises(HCQRError, match=r"passage 'p1' has relevance 1.0; relevance must be a whole number"):
        load_qrels(tmp_path / "dec.json")
    a = make_run(tmp_path / "a", "simple_rag", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True])
    for run in (a, b):
        lines = [json.loads(x) for x in (run / "predictions.jsonl").read_text().splitlines()]
        for r, rr in zip(lines, rows):
            r["passages"] = rr["passages"]
        (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "other.json").write_text(json.dumps({"demo-001": ["p1"]}))
    with pytest.raises(HCQRError, match=r"qrels .*other.json mark a relevant passage for none of the 2 compared"):
        compare([a, b], out_dir=tmp_path / "out", qrels=tmp_path / "other.json")
    (tmp_path / "mixed.json").write_text(json.dumps({"q0": ["p1"], "q1": {"p2": 0}}))
    report, _ = compare([a, b], out_dir=tmp_path / "out", qrels=tmp_path / "mixed.json")
    assert "1 question(s) listed there with no relevant passage are left out" in report


def test_runs_with_hypotheses_report_how_often_their_upstream_stages_agree(tmp_path):
    def with_upstream(folder, queries, passages):
        rows = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
        for row, q, p in zip(rows, queries, passages):
            row["queries"], row["passages"] = q, [{"id": i, "score": 1.0} for i in p]
        (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return folder

    base = with_upstream(
        make_run(tmp_path / "hcqr", "hcqr", [True] * 4, hypothesis=["A", "A", "B", "C"]),
        [["x", "y"], ["x"], ["z"], ["w"]],
        [["p1", "p2"], ["p1", "p9"], ["p3"], ["p4"]],
    )
    # q0 all agree; q1 same letter and queries, passages in another order; q2 other queries; q3 other letter
    shown = with_upstream(
        make_run(tmp_path / "shown", "hcqr_show_hypothesis", [True] * 4, hypothesis=["A", "A", "B", "D"]),
        [["x", "y"], ["x"], ["z2"], ["w"]],
        [["p1", "p2"], ["p9", "p1"], ["p3"], ["p4"]],
    )
    cot = make_run(tmp_path / "cot", "cot", [True] * 4)
    report, _ = compare([cot, base, shown], out_dir=tmp_path / "out")
    section = report.split("## Working hypotheses across runs")[1].split("##")[0]
    assert "| hcqr vs hcqr_show_hypothesis | 4 | 3 (75%) | 3 (75%) | 3 (75%) | 1 (25%) |" in section
    assert "cot" not in section
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert summary["upstream_agreement"] == {
        "hcqr vs hcqr_show_hypothesis": {
            "n": 4,
            "same_hypothesis": 3,
            "same_queries": 3,
            "same_passages": 3,
            "same_all": 1,
        }
    }
    # a run of the hypothesis step alone retrieves nothing: only the letters are compared
    alone = make_run(tmp_path / "alone", "hcqr_hypothesis", [True] * 4, hypothesis=["A", "B", "B", "C"])
    report, _ = compare([base, alone], out_dir=tmp_path / "out3")
    assert "| hcqr vs hcqr_hypothesis | 4 | 3 (75%) | – | – | – |" in report
    # one run with hypotheses: no section
    report, _ = compare([cot, base], out_dir=tmp_path / "out2")
    assert "across runs" not in report


def test_durs_judged_on_different_questions_are_warned_and_not_differenced(tmp_path):
    a = make_run(tmp_path / "a", "simple_rag", [True, False, True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True, False, False])
    c = make_run(tmp_path / "c", "cot", [True, True, False, False])
    judgments_for(a, ["q0", "q1"])
    judgments_for(b, ["q0"])  # a judge stopped after one question
    judgments_for(c, ["q0", "q1"])
    report, _ = compare([a, b, c], out_dir=tmp_path / "out")
    assert "DURs were judged on different questions (simple_rag 2, hcqr 1, cot 2 judged)" in report
    diffs = report.split("## Differences from the reference")[1].split("##")[0]
    assert "| hcqr | +0.0 | – | – | +0.0 |" in diffs  # 100% on q0 against 100% on q0-q1: no difference taken
    assert "| cot | +0.0 | – | +0.0 | +0.0 |" in diffs  # the same two questions: differenced
    judgments_for(b, ["q0", "q1"])
    report, _ = compare([a, b, c], out_dir=tmp_path / "out")
    assert "judged on different questions" not in report


def test_an_ambiguous_reference_a_run_folder_as_out_and_stale_plots(tmp_path):
    a = make_run(tmp_path / "a", "cot", [True, False])
    b = make_run(tmp_path / "b", "cot", [False, False])
    h = make_run(tmp_path / "h", "hcqr", [True, True], hypothesis=["A", "B"])
    ambiguous = r"reference 'cot' matches 2 runs .*give the reference run's exact label or its folder's path"
    with pytest.raises(HCQRError, match=ambiguous):
        compare([a, b, h], reference="cot", out_dir=tmp_path / "out")
    with pytest.raises(HCQRError, match=r"--out .*a is a run folder"):
        compare([a, h], out_dir=a)
    assert not (a / "comparison.md").exists()
    index = tmp_path / "idx"
    BM25Retriever(
        load_corpus(write_jsonl(tmp_path / "c.jsonl", [snippet(*r) for r in TINY_ROWS])), show_progress=False
    ).save(index)
    with pytest.raises(HCQRError, match=r"--out .*idx is an index folder \(it holds manifest.json.*the comparison"):
        compare([a, h], out_dir=index)
    assert not (index / "comparison.md").exists()
    compare([a, h], out_dir=tmp_path / "out")
    assert (tmp_path / "out" / "hypothesis_changes.png").exists()
    compare([a, b], out_dir=tmp_path / "out")  # no run with hypotheses: the earlier figure is not left behind
    assert not (tmp_path / "out" / "hypothesis_changes.png").exists()
    assert (tmp_path / "out" / "accuracy.png").exists()


def test_a_malformed_row_or_a_missing_folder_is_one_line(tmp_path):
    a = make_run(tmp_path / "a", "cot", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, True])
    (b / "predictions.jsonl").write_text(
        '{"qid": "q0"}\n' + (b / "predictions.jsonl").read_text().splitlines()[1] + "\n"
    )
    with pytest.raises(
        HCQRError,
        match=r"predictions.jsonl: the row of question 'q0' lacks prediction, valid, correct, "
        r"gold \(not written by `hcqr eval`\)",
    ):
        compare([a, b], out_dir=tmp_path / "out")
    with pytest.raises(HCQRError, match=r"run folder .*nowhere does not exist"):
        compare([a, tmp_path / "nowhere"], out_dir=tmp_path / "out")
    # a run whose rows were emptied, beside the letter distributions rescored for them: it has no question,
    # not "a file copied from another run"
    (b / "option_probs.jsonl").write_text(json.dumps({"qid": "q1", "option_probs": {"A": 1.0, "B": 0.0}}) + "\n")
    (b / "predictions.jsonl").write_text("")
    with pytest.raises(HCQRError, match=r"run .*b has no finished question$"):
        compare([a, b], out_dir=tmp_path / "out")
    # a folder where a file of records goes
    (b / "predictions.jsonl").unlink()
    (b / "predictions.jsonl").mkdir()
    with pytest.raises(HCQRError, match=r"b/predictions.jsonl is a folder, not a file of question records; move it"):
        compare([a, b], out_dir=tmp_path / "out")
    # a link to nothing (its records would be written elsewhere, or lost), a link to itself
    (b / "predictions.jsonl").rmdir()
    (b / "predictions.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(HCQRError, match=r"b/predictions.jsonl is a symbolic link to nothing; remove it"):
        compare([a, b], out_dir=tmp_path / "out")
    (b / "predictions.jsonl").unlink()
    (b / "predictions.jsonl").symlink_to("predictions.jsonl")
    with pytest.raises(HCQRError, match=r"predictions.jsonl: cannot be read \(Too many levels of symbolic links\)"):
        compare([a, b], out_dir=tmp_path / "out")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"queries": [None]}, r"'q1' has queries that are not a list of strings"),
        ({"queries": "one query"}, r"'q1' has queries that are not a list of strings"),
        ({"correct": True}, r"'q1' says correct=True for prediction 'B' and gold 'A'"),
        ({"prediction": "maybe"}, r"'q1' has prediction 'maybe', not an option letter"),
        ({"gold": "", "correct": False}, r"'q1' has gold '', not an option letter"),
        ({"valid": "yes"}, r"'q1' has a `valid` or `correct` that is not true/false"),
        ({"seconds": None}, r"'q1' has no usable cost \(seconds missing; each a finite number of at least 0, as"),
        ({"prompt_tokens": -3, "lm_calls": "3"}, r"'q1' has no usable cost \(lm_calls='3', prompt_tokens=-3; each"),
        (
            {"seconds": float("inf"), "cached_lm_calls": True},
            r"'q1' has no usable cost \(seconds=inf, cached_lm_calls=True; each",
        ),
        ({"lm_calls": 10**400}, r"'q1' has no usable cost \(lm_calls=1000000000000000000000000000000000000000; each"),
        (
            {"stages": {"answer": {"seconds": "abc", "prompt_tokens": 10**400, "lm_calls": 1}}},
            r"'q1' has no usable cost \(stages.answer.seconds='abc', stages.answer.prompt_tokens=10+; each",
        ),
        ({"stages": {"answer": 3}}, r"'q1' has no usable cost \(stages is not a mapping of stages; each"),
        ({"fallbacks": {"rewrite_failed": -1}}, r"'q1' has no usable cost \(fallbacks.rewrite_failed=-1; each"),
    ],
)
def test_a_row_a_comparison_would_misread_is_refused_before_anything_is_written(tmp_path, change, message):
    a = make_run(tmp_path / "a", "cot", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, False])
    first, second = (b / "predictions.jsonl").read_text().splitlines()
    (b / "predictions.jsonl").write_text(first + "\n" + json.dumps({**json.loads(second), **change}) + "\n")
    with pytest.raises(HCQRError, match=r"b/predictions.jsonl: the row of question " + message):
        compare([a, b], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # no plot written before the refusal


@pytest.mark.parametrize("qid", [["x"], {"a": 1}, None, 1.5, True])
def test_a_question_id_that_is_not_text_is_refused_in_one_line(tmp_path, qid, capsys):
    a = make_run(tmp_path / "a", "cot", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, False])
    first, second = (b / "predictions.jsonl").read_text().splitlines()
    (b / "predictions.jsonl").write_text(first + "\n" + json.dumps({**json.loads(second), "qid": qid}) + "\n")
    assert main(["compare", str(a), str(b), "--no-mlflow", "--out", str(tmp_path / "out")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert re.search(r"b/predictions.jsonl:2: its qid is not text or a whole number \(.+\); repair or delete", line)
    assert not (tmp_path / "out").exists()


def test_runs_that_disagree_on_a_gold_answer_are_refused(tmp_path):
    a = make_run(tmp_path / "a", "cot", [True, False])
    b = make_run(tmp_path / "b", "hcqr", [True, False])
    first, second = (b / "predictions.jsonl").read_text().splitlines()
    (b / "predictions.jsonl").write_text(
        first + "\n" + json.dumps({**json.loads(second), "gold": "B", "correct": True}) + "\n"
    )
    with pytest.raises(HCQRError, match=r"question 'q1' has gold 'A' in .*a but 'B' in .*b: the runs do not answer"):
        compare([a, b], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
