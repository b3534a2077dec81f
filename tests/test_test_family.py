"""`hcqr compare`'s family of tests: every p-value the report prints is numbered in the order it is printed, the
report states the family's size, each Holm-adjusted value equals statsmodels' `multipletests` on the same raw
p-values, each TOST p equals two one-sided t-tests computed here with scipy, the verdicts read as the tests
decide, and a bad margin is refused in one line with nothing written."""

import json
import math
import re

import numpy as np
import pytest
from helpers import comparison_row
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.reporting import compare
from hcqr_dspy.reporting.family import collecting, p_text
from hcqr_dspy.reporting.stats import discordant_mde, tost_paired


def write_run(folder, method, correct, gold_prob=None, saved=None):
    """A run folder of ``method`` over questions q0..q{n-1} (gold A), with the gold option's probability per
    question when ``gold_prob`` is given; ``saved``: the folder of the saved program it answered with."""
    folder.mkdir(parents=True)
    qids = [f"q{i}" for i in range(len(correct))]
    questions = {"count": len(qids), "ids_sha256": "-".join(qids), "content_sha256": "v1:" + "-".join(qids)}
    config = {"method": method, "lm": {"spec": "local"}, "dataset": "bench.json", "questions": questions}
    if saved is not None:
        config["saved_program"] = {"folder": str(saved), "optimizer": "BootstrapFewShot", "recipe": "bootstrap_fewshot"}
    (folder / "config.json").write_text(json.dumps(config))
    probs = gold_prob if gold_prob is not None else [None] * len(correct)
    rows = [
        comparison_row(q, method, ok, **({} if p is None else {"option_probs": {"A": p, "B": 1 - p}, "gold_prob": p}))
        for q, ok, p in zip(qids, correct, probs)
    ]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def exact_mcnemar(ref, other):
    table = [
        [sum(a and b for a, b in zip(ref, other)), sum(a and not b for a, b in zip(ref, other))],
        [sum(b and not a for a, b in zip(ref, other)), sum(not a and not b for a, b in zip(ref, other))],
    ]
    return mcnemar(table, exact=True).pvalue


def tost_by_hand(ref, other, margin):
    """Schuirmann's two one-sided tests on the paired differences, each a one-sample t-test (scipy)."""
    d = np.asarray(other, dtype=float) - np.asarray(ref, dtype=float)
    low = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    high = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return max(low, high)


def log_odds(p):
    p = np.clip(np.asarray(p), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def body(report):
    """The report without the two family sections it puts near the top (they restate every test)."""
    head, rest = report.split("## What this report supports", 1)
    return head + rest.split("\n## ", 2)[2]


# 40 questions: the reference right on q0-q19; the other run loses q0-q2 (b = 3) and gains q20-q28 (c = 9).
N = 40
REF = [i < 20 for i in range(N)]
OTHER = [(i < 20 and i > 2) or 20 <= i < 29 for i in range(N)]
RNG = np.random.default_rng(7)
P_REF = list(RNG.uniform(0.1, 0.9, N))
P_OTHER = list(np.clip(np.array(P_REF) + RNG.normal(0.005, 0.02, N), 0.01, 0.99))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("family")
    ref = write_run(root / "ref", "simple_rag", REF, P_REF)
    other = write_run(root / "other", "hcqr", OTHER, P_OTHER)
    report, _ = compare([ref, other], out_dir=root / "cmp", margin=20, margin_pgold=0.1)
    summary = json.loads((root / "cmp" / "comparison.json").read_text())
    return root, ref, other, report, summary


def test_each_printed_p_value_is_numbered_and_holm_adjusted_over_the_whole_family(two_runs):
    root, _, _, report, summary = two_runs
    raw = [
        exact_mcnemar(REF, OTHER),  # the reference table, printed first
        stats.wilcoxon(np.array(P_OTHER) - np.array(P_REF)).pvalue,  # the gold-probability table
        stats.wilcoxon(log_odds(P_OTHER) - log_odds(P_REF)).pvalue,
        tost_by_hand(np.array(REF, float), np.array(OTHER, float), 0.20),  # the equivalence section, after them
        tost_by_hand(P_REF, P_OTHER, 0.1),
    ]
    reject, holm, _, _ = multipletests(raw, alpha=0.05, method="holm")
    tests = summary["tests"]
    assert [t["number"] for t in tests] == [1, 2, 3, 4, 5]
    assert [t["p_value"] for t in tests] == pytest.approx(raw)
    assert [t["p_holm"] for t in tests] == pytest.approx(list(holm))
    assert [t["reject"] for t in tests] == list(reject) == [False, False, False, False, True]
    assert [(t["section"], t["label"], t["test"]) for t in tests] == [
        ("comparison with the reference", "hcqr vs simple_rag: accuracy", "exact McNemar"),
        ("gold-option probability", "hcqr vs simple_rag: p(gold)", "Wilcoxon signed-rank"),
        ("gold-option probability", "hcqr vs simple_rag: log-odds of p(gold)", "Wilcoxon signed-rank"),
        ("comparison with the reference", "hcqr vs simple_rag: accuracy", "TOST (paired t), margin ±20 points"),
        ("gold-option probability", "hcqr vs simple_rag: p(gold)", "TOST (paired t), margin ±0.1"),
    ]
    assert "## Tests in this report (family of 5; Holm-adjusted)" in report
    assert report.index("## What this report supports") < report.index("## Differences from the reference")
    for t, p, h in zip(tests[:3], raw, holm):  # each where its table prints it, and in the list of tests
        assert f"{p:.3g} (#{t['number']}; Holm {h:.3g})" in body(report)
        assert f"| {t['number']} | {t['section']} | {t['label']} | {t['test']} | {p:.3g} | {h:.3g} | no |" in report
    assert "| 3/9 | " + f"{raw[0]:.3g} (#1; Holm {holm[0]:.3g}) |" in report
    assert "\x00" not in report  # no placeholder left
    # the Markdown written is the report returned
    assert (root / "cmp" / "comparison.md").read_text() == report


def test_tost_verdicts_and_what_the_report_supports(two_runs):
    _, _, _, report, summary = two_runs
    acc, gold = summary["tests"][3], summary["tests"][4]
    equivalence = report.split("## Equivalence within the margin (TOST, paired)")[1].split("\n## ")[0]
    assert (
        f"| hcqr vs simple_rag: accuracy | comparison with the reference | 40 | +15.0 points | not shown equivalent "
        f"within ±20 points (TOST p {acc['p_value']:.3g}, #4; Holm {acc['p_holm']:.3g}) |" in equivalence
    )
    assert (
        f"equivalent within ±0.1 (TOST p {gold['p_value']:.3g}, #5; Holm {gold['p_holm']:.3g}) |" in equivalence
        and "| not shown equivalent within ±0.1" not in equivalence
    )
    supports = report.split("## What this report supports")[1].split("\n## ")[0]
    d = np.array(OTHER, float) - np.array(REF, float)
    power = TTestPower().solve_power(nobs=N, alpha=0.05, power=0.8, alternative="two-sided")
    mde = power * d.std(ddof=1) * 100
    first = summary["tests"][0]
    assert (
        "| comparison with the reference | hcqr vs simple_rag: accuracy | inconclusive: not significant after Holm "
        f"(p_adj {first['p_holm']:.3g}, #1); effects under the MDE ({mde:.1f} points) could be missed; not shown "
        f"equivalent within ±20 points (TOST, p_adj {acc['p_holm']:.3g}, #4) |" in supports
    )
    assert (
        "| gold-option probability | hcqr vs simple_rag: p(gold) | equivalent within ±0.1 "
        f"(TOST, p_adj {gold['p_holm']:.3g}, #5) |" in supports
    )
    # the log-odds difference has no margin: inconclusive, never "no effect"
    log_mde = power * (log_odds(P_OTHER) - log_odds(P_REF)).std(ddof=1)
    assert f"effects under the MDE ({log_mde:.2f} log-odds) could be missed |" in supports
    assert "no effect |" not in report and "does not help" not in report


def test_a_significant_difference_is_said_after_holm_and_without_a_margin_there_is_no_tost(tmp_path):
    ref = write_run(tmp_path / "ref", "simple_rag", [i < 5 for i in range(N)])
    better = write_run(tmp_path / "better", "hcqr", [i < 35 for i in range(N)])  # b = 0, c = 30
    same = write_run(tmp_path / "same", "cot", [i < 5 for i in range(N)])  # no discordant pair
    report, _ = compare([ref, better, same], out_dir=tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "comparison.json").read_text())
    raw = [exact_mcnemar([i < 5 for i in range(N)], [i < 35 for i in range(N)]), 1.0]
    _, holm, _, _ = multipletests(raw, method="holm")
    assert [t["p_holm"] for t in summary["tests"]] == pytest.approx(list(holm))
    assert f"| hcqr vs simple_rag: accuracy | significant after Holm (p_adj {holm[0]:.3g}, #1) |" in report
    assert (
        f"| cot vs simple_rag: accuracy | inconclusive: not significant after Holm (p_adj {holm[1]:.3g}, #2); the "
        "paired differences have no spread, so no MDE |" in report
    )
    assert "TOST" not in body(report) and summary["equivalence"] == [] and summary["margins"] == {}
    report, _ = compare([ref, same], out_dir=tmp_path / "out_margin", margin=5)  # identical answers: no t statistic
    assert (
        "| cot vs simple_rag: accuracy | comparison with the reference | 40 | +0.0 points | not testable (no " in report
    )
    assert "(family of 1; Holm-adjusted)" in report  # the McNemar test alone


def test_every_tested_difference_of_a_compiled_comparison_is_numbered_in_print_order(tmp_path):
    rng = np.random.default_rng(3)
    n = 16
    correct = {k: [bool(x) for x in rng.integers(0, 2, n)] for k in ("sr", "h", "hb", "sb")}
    probs = {k: list(rng.uniform(0.05, 0.95, n)) for k in correct}
    program = tmp_path / "program"
    program.mkdir()
    (program / "meta.json").write_text(json.dumps({}))
    folders = {
        "sr": write_run(tmp_path / "sr", "simple_rag", correct["sr"], probs["sr"]),
        "h": write_run(tmp_path / "h", "hcqr", correct["h"], probs["h"]),
        "hb": write_run(tmp_path / "hb", "hcqr", correct["hb"], probs["hb"], saved=program),
        "sb": write_run(tmp_path / "sb", "simple_rag", correct["sb"], probs["sb"], saved=program),
    }
    report, _ = compare(list(folders.values()), out_dir=tmp_path / "out", margin=5, margin_pgold=0.05)
    tests = json.loads((tmp_path / "out" / "comparison.json").read_text())["tests"]
    # 3 McNemar against the reference, 6 Wilcoxon in the gold table, 2 McNemar + 2 Wilcoxon for the compiled pairs,
    # 2 Wilcoxon for the gain against gain, and a TOST for each of the 10 accuracy and p(gold) differences; less
    # the compiled Simple RAG's McNemar, Wilcoxon and two TOSTs, which the reference's sections already hold (its
    # zero-shot run is the reference): one test printed twice is one member
    assert len(tests) == 21 and f"## Tests in this report (family of {len(tests)}; Holm-adjusted)" in report
    printed = [int(k) for k in re.findall(r"#(\d+); Holm", body(report))]
    assert sorted(set(printed)) == list(range(1, 22))  # every test is printed ...
    assert list(dict.fromkeys(printed)) == list(range(1, 22))  # ... and numbered in the order it is printed
    twice = [t for t in tests if t["label"] == "simple_rag+bootstrap_fewshot vs simple_rag: accuracy"]
    assert len(twice) == 2 and {t["test"].split()[0] for t in twice} == {"exact", "TOST"}
    assert body(report).count(f"(#{twice[0]['number']}; Holm") == 2  # in both sections, under one number
    _, holm, _, _ = multipletests([t["p_value"] for t in tests], alpha=0.05, method="holm")
    assert [t["p_holm"] for t in tests] == pytest.approx(list(holm))
    label = {"sr": "simple_rag", "h": "hcqr", "hb": "hcqr+bootstrap_fewshot", "sb": "simple_rag+bootstrap_fewshot"}
    pairs = [("sr", "h"), ("sr", "hb"), ("sr", "sb"), ("h", "hb")]  # the reference's, then compiled
    tosts = [t for t in tests if t["margin"] is not None]
    expected = []
    for base, other in pairs:
        expected.append(tost_by_hand(np.array(correct[base], float), np.array(correct[other], float), 0.05))
        expected.append(tost_by_hand(probs[base], probs[other], 0.05))
    assert [t["label"] for t in tosts][::2] == [f"{label[o]} vs {label[b]}: accuracy" for b, o in pairs]
    assert [t["p_value"] for t in tosts] == pytest.approx(expected)


def test_tost_paired_is_two_one_sided_t_tests_and_the_accuracy_mde_comes_from_the_discordant_pairs():
    rng = np.random.default_rng(11)
    ref, other = rng.uniform(0, 1, 30), rng.uniform(0, 1, 30)
    t = tost_paired(ref, other, 0.2)
    d = other - ref
    assert t["low_p"] == pytest.approx(stats.ttest_1samp(d, -0.2, alternative="greater").pvalue)
    assert t["high_p"] == pytest.approx(stats.ttest_1samp(d, 0.2, alternative="less").pvalue)
    assert t["p_value"] == pytest.approx(tost_by_hand(ref, other, 0.2)) and t["mean_diff"] == pytest.approx(d.mean())
    assert tost_paired([1, 0, 1], [1, 0, 1], 0.1)["p_value"] is None  # no spread: no t statistic
    assert tost_paired([1], [0], 0.1)["reason"] == "fewer than two pairs"
    diffs = np.array([1] * 9 + [-1] * 3 + [0] * 28, dtype=float)
    power = TTestPower().solve_power(nobs=40, alpha=0.05, power=0.8, alternative="two-sided")
    assert discordant_mde(3, 9, 40) == pytest.approx(power * diffs.std(ddof=1))
    assert discordant_mde(0, 0, 40) is None


def test_a_p_value_never_printed_is_no_member_and_numbers_follow_the_text():
    with collecting() as family:
        late = p_text(0.01, section="s", label="late", test="t")
        early = p_text(0.04, section="s", label="early", test="t")
        p_text(0.5, section="s", label="dropped", test="t")
    assert p_text(0.123, section="s", label="x", test="t") == "0.123"  # outside a report: the raw value alone
    text, tests = family.finish(f"# title\n\nfirst {early}, then {late}\n\n## Section\n\n{early} again")
    assert [(t["number"], t["label"]) for t in tests] == [(1, "early"), (2, "late")]
    _, holm, _, _ = multipletests([0.04, 0.01], method="holm")
    assert f"first 0.04 (#1; Holm {holm[0]:.3g}), then 0.01 (#2; Holm {holm[1]:.3g})" in text
    assert text.endswith(f"## Section\n\n0.04 (#1; Holm {holm[0]:.3g}) again")
    assert "(family of 2; Holm-adjusted)" in text and "dropped" not in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"margin": 0}, "--margin must be percentage points from 0.01 to 100, got 0"),
        ({"margin": -5}, "got -5"),
        ({"margin": 100.5}, "got 100.5"),
        ({"margin": "5"}, "got '5'"),
        ({"margin": math.nan}, "got nan"),
        ({"margin": True}, "got True"),
        ({"margin_pgold": 0.0}, "--margin-pgold must be a probability from 0.0001 to 1, got 0.0"),
        ({"margin": 1e-200}, "got 1e-200"),  # below a hundredth of a point: nothing a study resolves
        ({"margin_pgold": 5e-324}, "got 5e-324"),
        ({"margin_pgold": 1.5}, "got 1.5"),
        ({"margin_pgold": -0.1}, "got -0.1"),
    ],
)
def test_a_bad_margin_is_refused_before_anything_is_written(tmp_path, kwargs, message):
    a = write_run(tmp_path / "a", "simple_rag", REF)
    b = write_run(tmp_path / "b", "hcqr", OTHER)
    with pytest.raises(HCQRError, match=re.escape(message)):
        compare([a, b], out_dir=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--margin", "abc", "expected percentage points from 0.01 to 100, got 'abc'"),
        ("--margin", "0", "got '0'"),
        ("--margin", "-3", "got '-3'"),
        ("--margin", "101", "got '101'"),
        ("--margin", "inf", "got 'inf'"),
        ("--margin-pgold", "0", "expected a probability from 0.0001 to 1, got '0'"),
        ("--margin", "5e-324", "got '5e-324'"),
        ("--margin-pgold", "1.01", "got '1.01'"),
        ("--margin-pgold", "x", "got 'x'"),
    ],
)
def test_the_cli_refuses_a_bad_margin_naming_it(tmp_path, capsys, flag, value, message):
    a = write_run(tmp_path / "a", "simple_rag", REF)
    b = write_run(tmp_path / "b", "hcqr", OTHER)
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(a), str(b), "--out", str(tmp_path / "out"), "--no-mlflow", f"{flag}={value}"])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and f"argument {flag}: " in errors[0] and message in errors[0]
    assert not (tmp_path / "out").exists()


def test_the_comparison_run_in_mlflow_logs_the_family(two_runs, mlflow_store):
    import mlflow

    from hcqr_dspy.tracking.comparison import track_comparison

    root, _, _, _, summary = two_runs
    run = mlflow.get_run(track_comparison(root / "cmp", mlflow_dir=mlflow_store))
    tests = summary["tests"]
    assert run.data.params["test_family_size"] == "5"
    for t in tests:
        assert run.data.metrics[f"test_p.{t['number']}"] == pytest.approx(t["p_value"])
        assert run.data.metrics[f"test_p_holm.{t['number']}"] == pytest.approx(t["p_holm"])
    assert run.data.metrics["mcnemar_p_holm.hcqr"] == pytest.approx(tests[0]["p_holm"])
    note = run.data.tags["mlflow.note.content"]
    assert f"| {tests[0]['p_value']:.3g} (#1; Holm {tests[0]['p_holm']:.3g}) |" in note
    assert "Tests in the report (family of 5; Holm-adjusted):" in note
