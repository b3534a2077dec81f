"""`hcqr compare` on the gold-option probability: each statistic against a direct scipy/statsmodels computation.

Two CoT runs made with DummyLM over eight demo questions; their letter distributions are written as
`hcqr rescore` writes them (option_probs.jsonl), from seeded random numbers.
"""

import json
import math
from collections import Counter

import dspy
import numpy as np
import pytest
from dspy.utils import DummyLM
from scipy import stats
from statsmodels.stats.power import TTestPower

from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.reporting.report import compare
from hcqr_dspy.resources import shipped_dir
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

N = 10


def cot_run(path, letters):
    spec = EvalSpec(
        method="cot",
        dataset=str(shipped_dir("demo") / "questions.json"),
        lm="openai/dummy",
        limit=len(letters),
        run_dir=str(path),
    )
    lm = DummyLM([{"reasoning": "r", "answer": x} for x in letters], adapter=dspy.JSONAdapter())
    run_evaluation(spec, lm=lm, track=False, progress=False)
    return RunFolder.open(path)


def write_distributions(folder, seed):
    """Seeded letter distributions, as `hcqr rescore` records them; returns {qid: gold probability}."""
    rng = np.random.default_rng(seed)
    gold = {}
    with open(folder.path / "option_probs.jsonl", "w", encoding="utf-8") as f:
        for row in folder.rows():
            letters = sorted(folder.load_questions()[row["qid"]].options)
            p = rng.dirichlet(np.ones(len(letters)))
            probs = {x: float(v) for x, v in zip(letters, p)}
            gold[row["qid"]] = probs[row["gold"]]
            record = {"qid": row["qid"], "option_probs": probs, "gold_prob": gold[row["qid"]]}
            f.write(json.dumps({**record, "option_probs_absent": None, "scored_by": "test"}) + "\n")
    return gold


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    root = tmp_path_factory.mktemp("gold")
    ref = cot_run(root / "ref", (["A", "B", "C", "D"] * 3)[:N])
    other = cot_run(root / "other", ["C"] * N)
    gold_ref, gold_other = write_distributions(ref, 1), write_distributions(other, 2)
    compare([str(ref.path), str(other.path)], out_dir=root / "cmp")
    summary = json.loads((root / "cmp" / "comparison.json").read_text())
    md = (root / "cmp" / "comparison.md").read_text()
    return ref, other, gold_ref, gold_other, summary, md


def test_the_gold_probability_difference_matches_scipy(comparison):
    ref, other, gold_ref, gold_other, summary, md = comparison
    qids = sorted(gold_ref)
    diff = np.array([gold_other[q] - gold_ref[q] for q in qids])
    figures = summary["gold_probability"]["cot (openai/dummy) (other)"]["gold_prob_diff"]
    assert figures["n"] == N
    assert figures["mean_diff"] == pytest.approx(diff.mean())
    ci = stats.bootstrap(
        (diff,), np.mean, n_resamples=10_000, method="BCa", random_state=np.random.default_rng(0)
    ).confidence_interval
    assert (figures["ci_low"], figures["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert figures["wilcoxon_p"] == pytest.approx(stats.wilcoxon(diff).pvalue)
    d = TTestPower().solve_power(nobs=N, alpha=0.05, power=0.8, alternative="two-sided")
    assert figures["mde"] == pytest.approx(d * diff.std(ddof=1))
    odds = summary["gold_probability"]["cot (openai/dummy) (other)"]["log_odds_diff"]
    lo = np.array(
        [math.log(gold_other[q] / (1 - gold_other[q])) - math.log(gold_ref[q] / (1 - gold_ref[q])) for q in qids]
    )
    assert odds["mean_diff"] == pytest.approx(lo.mean())
    assert odds["wilcoxon_p"] == pytest.approx(stats.wilcoxon(lo).pvalue)
    assert "Gold-option probability (paired)" in md


def test_accuracy_mde_brier_and_baselines_match_direct_computation(comparison):
    ref, other, gold_ref, gold_other, summary, md = comparison
    correct_ref = {r["qid"]: r["correct"] for r in ref.rows()}
    correct_other = {r["qid"]: r["correct"] for r in other.rows()}
    acc = np.array([int(correct_other[q]) - int(correct_ref[q]) for q in sorted(correct_ref)])
    d = TTestPower().solve_power(nobs=N, alpha=0.05, power=0.8, alternative="two-sided")
    assert summary["gold_probability"]["cot (openai/dummy) (other)"]["accuracy_mde"] == pytest.approx(
        d * acc.std(ddof=1)
    )

    records = [json.loads(line) for line in open(other.path / "option_probs.jsonl", encoding="utf-8")]
    golds = {r["qid"]: r["gold"] for r in other.rows()}
    brier = np.mean([sum((p - (x == golds[r["qid"]])) ** 2 for x, p in r["option_probs"].items()) for r in records])
    assert summary["calibration"]["cot (openai/dummy) (other)"]["brier"] == pytest.approx(brier)

    gold_letters = Counter(golds.values())
    letter, count = max(sorted(gold_letters.items()), key=lambda kv: kv[1])
    baselines = summary["baselines"]
    assert (baselines["majority_letter"], baselines["majority_accuracy"]) == (letter, count / N)
    options = {q: len(e.options) for q, e in ref.load_questions().items()}
    assert baselines["uniform_accuracy"] == pytest.approx(np.mean([1 / options[q] for q in golds]))
    assert baselines["letters"]["cot (openai/dummy) (other)"] == {"C": N}
    assert f"always answering **{letter}**" in md


def test_mdes_over_the_outcomes_range_read_undetectable_as_elsewhere_in_the_report(tmp_path):
    """Three questions: no paired difference within the range of a 0/1 or probability outcome is detectable."""
    ref, other = cot_run(tmp_path / "ref", ["A", "B", "C"]), cot_run(tmp_path / "other", ["D", "C", "A"])
    for folder, golds in ((ref, [0.02, 0.98, 0.02]), (other, [0.98, 0.02, 0.98])):  # differences +-0.96
        with open(folder.path / "option_probs.jsonl", "w", encoding="utf-8") as f:
            for row, gold in zip(folder.rows(), golds):
                others = [x for x in sorted(folder.load_questions()[row["qid"]].options) if x != row["gold"]]
                probs = {row["gold"]: gold, **{x: (1 - gold) / len(others) for x in others}}
                record = {"qid": row["qid"], "option_probs": probs, "gold_prob": gold, "option_probs_absent": None}
                f.write(json.dumps({**record, "scored_by": "test"}) + "\n")
    compare([str(ref.path), str(other.path)], out_dir=tmp_path / "cmp")
    figures = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["gold_probability"]
    label = "cot (openai/dummy) (other)"
    assert figures[label]["gold_prob_diff"]["mde"] > 1 and figures[label]["accuracy_mde"] > 1
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    section = md[md.index("Gold-option probability (paired)") :]
    line = next(x for x in section.splitlines() if x.startswith(f"| {label} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == cells[-1] == "undetectable", cells


@pytest.mark.parametrize("correct", [0, 7, 20])
def test_the_wilson_interval_holds_its_point_at_the_extremes(correct):
    from types import SimpleNamespace

    from hcqr_dspy.reporting.stats import wilson_interval

    low, high = wilson_interval(SimpleNamespace(metrics={"correct": correct, "n": 20}))
    assert low <= correct / 20 <= high


def test_a_malformed_or_foreign_rescoring_record_is_refused_naming_the_file():
    from hcqr_dspy.errors import RunError
    from hcqr_dspy.evaluation.option_probs import with_option_probs

    rows = [{"qid": "q1", "gold": "A"}]
    good = {"qid": "q1", "option_probs": {"A": 0.7, "B": 0.3}, "gold_prob": 0.7}
    assert with_option_probs(rows, [good], "f.jsonl")[0]["gold_prob"] == 0.7
    for probs in ({"E": 5.0, "A": 0.1}, {"A": 0.5, "B": 0.1}, {"a": 1.0}, [0.5, 0.5]):
        with pytest.raises(RunError, match="f.jsonl: question 'q1': option_probs is not a distribution"):
            with_option_probs(rows, [{**good, "option_probs": probs}], "f.jsonl")
    with pytest.raises(RunError, match="f.jsonl scores 1 question"):
        with_option_probs(rows, [good, {**good, "qid": "q9"}], "f.jsonl")
