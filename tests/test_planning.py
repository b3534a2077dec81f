"""Planning from an optimizer arm's variance: the ANOVA variance components equal the textbook mean-square formulas
and recover known components, the planned SE matches the spread of simulated pooled effects, the questions needed
invert the planned MDE, and a report plans each pooled arm without adding a test to its family."""

import json

import numpy as np
import pytest
from test_arm_contrasts import effects, saved, study  # noqa: F401 - study is a fixture
from test_compiled_report import N, write_run

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.reporting import compare
from hcqr_dspy.reporting.planning import (
    Z_TOST,
    Z,
    planned_mde,
    planned_se,
    questions_needed,
    seeds_needed,
    variance_components,
)


def simulate(rng, k, n, var_seed, var_question, var_residual, draws=1):
    a = rng.normal(0, np.sqrt(var_seed), (draws, k, 1))
    b = rng.normal(0, np.sqrt(var_question), (draws, 1, n))
    e = rng.normal(0, np.sqrt(var_residual), (draws, k, n))
    return 0.05 + a + b + e


def test_the_components_are_the_mean_square_estimators_and_recover_known_ones():
    rng = np.random.default_rng(5)
    d = simulate(rng, 4, 30, 0.01, 0.09, 0.04)[0]
    k, n = d.shape
    # the mean squares of the additive two-way fit, from statsmodels
    import pandas as pd
    from statsmodels.formula.api import ols
    from statsmodels.stats.anova import anova_lm

    frame = pd.DataFrame({"d": d.ravel(), "seed": np.repeat(np.arange(k), n), "q": np.tile(np.arange(n), k)})
    table = anova_lm(ols("d ~ C(seed) + C(q)", frame).fit())
    ms = table["sum_sq"] / table["df"]
    ms_seed, ms_question, ms_e = ms["C(seed)"], ms["C(q)"], ms["Residual"]
    got = variance_components(d)
    assert (got["seeds"], got["questions"]) == (4, 30)
    assert got["var_seed"] == pytest.approx(max(0, (ms_seed - ms_e) / n))
    assert got["var_question"] == pytest.approx((ms_question - ms_e) / k)
    assert got["var_residual"] == pytest.approx(ms_e)
    big = variance_components(simulate(np.random.default_rng(6), 40, 1500, 0.01, 0.09, 0.04)[0])
    assert big["var_seed"] == pytest.approx(0.01, rel=0.5)
    assert big["var_question"] == pytest.approx(0.09, rel=0.1)
    assert big["var_residual"] == pytest.approx(0.04, rel=0.05)
    with pytest.raises(ValueError, match="2 or more seeds and questions, got 1 x 30"):
        variance_components(d[:1])


def test_the_planned_se_is_the_spread_of_pooled_effects_and_the_questions_needed_invert_the_mde():
    true = {"var_seed": 0.0005, "var_question": 0.09, "var_residual": 0.04}
    pooled = simulate(np.random.default_rng(7), 4, 100, *true.values(), draws=4000).mean(axis=(1, 2))
    assert planned_se(true, 4, 100) == pytest.approx(pooled.std(ddof=1), rel=0.05)
    assert planned_mde(true, 4, 100) == pytest.approx(Z * planned_se(true, 4, 100))
    for margin, z in ((0.05, Z), (0.05, Z_TOST), (0.08, Z)):
        n = questions_needed(true, 4, margin, z)
        assert z * planned_se(true, 4, n) <= margin < z * planned_se(true, 4, n - 1)
    # the seeds' own variance alone over the margin: no number of questions, only more seeds
    seedy = {**true, "var_seed": 0.01}
    assert questions_needed(seedy, 2, 0.05) is None
    k = seeds_needed(seedy, 0.05)
    assert questions_needed(seedy, k, 0.05) is not None and questions_needed(seedy, k - 1, 0.05) is None


def test_a_report_plans_each_pooled_arm_and_tests_nothing_more(study, tmp_path):  # noqa: F811
    root, runs = study
    names = ["simple_rag", *(f"simple_rag_bfs_{s}" for s in range(3)), "sr_labeled_0", "sr_labeled_1"]
    report, _ = compare([root / n for n in names], out_dir=tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "comparison.json").read_text())
    assert "— (no margin given)" in report.split("## Planning: more seeds or more questions")[1].split("\n## ")[0]
    # margins wide enough for these 12 questions' noise: a number of questions exists for each
    report, _ = compare([root / n for n in names], out_dir=tmp_path / "cmp", margin=40, margin_pgold=0.3)
    summary = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    plan = summary["planning"]
    assert set(plan) == {"simple_rag + bootstrap_fewshot", "simple_rag + labeled_fewshot"}
    d = effects(runs, "simple_rag", [f"simple_rag_bfs_{s}" for s in range(3)], "accuracy")
    direct = variance_components(d)
    entry = plan["simple_rag + bootstrap_fewshot"]["accuracy"]
    for key in ("var_seed", "var_question", "var_residual"):
        assert entry[key] == pytest.approx(direct[key])
    assert entry["mde"] == pytest.approx(planned_mde(direct, 3, d.shape[1]))
    assert entry["mde_quadruple_questions"] == pytest.approx(planned_mde(direct, 3, 4 * d.shape[1]))
    assert entry["questions_for_tost"]["6"] == questions_needed(direct, 6, 0.4, Z_TOST) is not None
    assert entry["questions_for_margin"]["3"] == questions_needed(direct, 3, 0.4) < entry["questions_for_tost"]["3"]
    section = report.split("## Planning: more seeds or more questions")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| simple_rag + bootstrap_fewshot | acc"))
    n3, t3 = questions_needed(direct, 3, 0.4), questions_needed(direct, 3, 0.4, Z_TOST)
    assert f"| {entry['mde'] * 100:.1f} |" in row and f"±40 points: {n3:,} / {t3:,} at 3 seeds" in row

    # planning is no test: the family is that of the margins alone
    def key(t):
        return (t["section"], t["label"], t["test"])

    assert not [t for t in summary["tests"] if "plan" in t["section"]]
    assert {key(t) for t in summary["tests"] if t["margin"] is None} == {key(t) for t in plain["tests"]}


def test_an_arm_of_too_few_questions_or_without_spread_is_not_planned(tmp_path):
    rows, probs = [i % 2 == 0 for i in range(N)], [0.3 + 0.05 * i for i in range(N)]
    runs = [write_run(tmp_path / "zs", "simple_rag", rows, probs)]
    runs += [write_run(tmp_path / f"s{s}", "simple_rag", rows, probs, saved(s, "bootstrap_fewshot")) for s in (0, 1)]
    report, _ = compare(runs, out_dir=tmp_path / "same", margin=5)
    section = report.split("## Planning: more seeds or more questions")[1].split("\n## ")[0]
    assert section.count("not planned: the differences have no spread | — | — | — | — | — |") == 2
    plan = json.loads((tmp_path / "same" / "comparison.json").read_text())["planning"]
    assert plan["simple_rag + bootstrap_fewshot"]["accuracy"]["why_not"] == "no spread"
    for run in runs:  # one question left in every run
        predictions = run / "predictions.jsonl"
        predictions.write_text(predictions.read_text().splitlines()[0] + "\n")
    report, _ = compare(runs, out_dir=tmp_path / "one")
    assert "| 2 x 1 | not planned: 1 question(s) shared |" in report


def test_an_arm_holding_one_compile_seed_twice_is_refused(tmp_path):
    rows = [i % 2 == 0 for i in range(N)]
    zero = write_run(tmp_path / "zs", "simple_rag", rows, [0.5] * N)
    again = [
        write_run(tmp_path / f"s{i}", "simple_rag", rows, [0.6] * N, saved(0, "bootstrap_fewshot")) for i in (0, 1)
    ]
    with pytest.raises(
        HCQRError, match=r"optimizer arm simple_rag \+ bootstrap_fewshot: runs .* are both compile seed 0"
    ):
        compare([zero, *again], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_mde_over_the_outcomes_range_reads_undetectable(tmp_path):
    # two seeds that disagree on nearly every question: the seed component alone puts the MDE past 100 points
    right = [True] * N
    wrong = [i == 0 for i in range(N)]
    almost = [i != 1 for i in range(N)]
    probs = [0.5] * N
    runs = [write_run(tmp_path / "zs", "simple_rag", right, probs)]
    runs += [
        write_run(tmp_path / f"s{s}", "simple_rag", rows, probs, saved(s, "bootstrap_fewshot"))
        for s, rows in ((0, wrong), (1, almost))
    ]
    report, _ = compare(runs, out_dir=tmp_path / "out")
    entry = json.loads((tmp_path / "out" / "comparison.json").read_text())["planning"]
    accuracy = entry["simple_rag + bootstrap_fewshot"]["accuracy"]
    assert accuracy["mde"] > 1 and accuracy["mde_quadruple_questions"] > 1
    section = report.split("## Planning: more seeds or more questions")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| simple_rag + bootstrap_fewshot | acc"))
    cells = [c.strip() for c in row.split("|")[5:9]]
    # more questions do not shrink the seeds' part; twice the seeds do, under the range
    assert accuracy["mde_double_seeds"] < 1
    assert cells == ["undetectable", f"{accuracy['mde_double_seeds'] * 100:.1f}", "undetectable", "undetectable"], row
