"""Optimizer arms set against each other, and arms tested pooled: the contrast of two arms' pooled effects and its
two-level bootstrap equal a direct computation, and a report tests each arm of two or more seeds once per outcome,
never each seed apart (a lone compile is still tested as one run)."""

import json

import numpy as np
import pytest
from test_compiled_report import N, write_run

from hcqr_dspy.reporting import compare
from hcqr_dspy.reporting.arm_contrasts import contrast_bootstrap
from hcqr_dspy.reporting.family import SEED_OF_ARM
from hcqr_dspy.reporting.replicates import Z_80, Z_975


def saved(seed, recipe):
    return {"folder": f"/nowhere/{recipe}/seed-{seed}", "recipe": recipe, "seed": seed, "train_dataset": "medmcqa"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Zero-shot Simple RAG and HCQR, three bootstrap_fewshot seeds of each, two labeled_fewshot seeds of Simple RAG
    and one lone compile of another recipe, over N questions."""
    root = tmp_path_factory.mktemp("arms")
    rng = np.random.default_rng(11)
    runs = {}

    def run(name, method, correct, probs, program=None):
        write_run(root / name, method, [bool(x) for x in correct], list(probs), program)
        runs[name] = (np.array(correct, dtype=float), np.array(probs))

    for method in ("simple_rag", "hcqr"):
        run(method, method, rng.integers(0, 2, N), rng.uniform(0.05, 0.95, N))
        for s in range(3):
            run(
                f"{method}_bfs_{s}",
                method,
                rng.integers(0, 2, N),
                rng.uniform(0.05, 0.95, N),
                saved(s, "bootstrap_fewshot"),
            )
    for s in range(2):
        run(
            f"sr_labeled_{s}",
            "simple_rag",
            rng.integers(0, 2, N),
            rng.uniform(0.05, 0.95, N),
            saved(s, "labeled_fewshot"),
        )
    run("sr_mipro_0", "simple_rag", rng.integers(0, 2, N), rng.uniform(0.05, 0.95, N), saved(0, "mipro_instructions"))
    return root, runs


def effects(runs, zero_shot, names, outcome):
    """Each run's per-question effect, the questions in the report's order (their ids sorted: q0, q1, q10, ...)."""
    k = 0 if outcome == "accuracy" else 1
    order = sorted(range(N), key=lambda i: f"q{i}")
    return np.array([(runs[n][k] - runs[zero_shot][k])[order] for n in names])


def test_the_contrast_of_two_arms_equals_a_direct_two_level_resampling():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.1, 0.3, (4, 30)), rng.normal(0.0, 0.3, (2, 30))
    got = contrast_bootstrap(a, b, resamples=1500, seed=9)
    assert got["contrast"] == pytest.approx(a.mean() - b.mean())  # equal-length rows: mean of seed means
    # the same resampling written out loop by loop: one question draw shared, each arm's seeds drawn apart
    draw = np.random.default_rng(9)
    q = draw.integers(0, 30, size=(1500, 30))
    sa, sb = draw.integers(0, 4, size=(1500, 4)), draw.integers(0, 2, size=(1500, 2))
    boot = np.array(
        [np.mean([a[s][q[i]].mean() for s in sa[i]]) - np.mean([b[s][q[i]].mean() for s in sb[i]]) for i in range(1500)]
    )
    assert got["se"] == pytest.approx(boot.std(ddof=1))
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((np.percentile(boot, 2.5), np.percentile(boot, 97.5)))
    assert got["mde"] == pytest.approx((Z_975 + Z_80) * boot.std(ddof=1))
    from scipy import stats

    assert got["p_value"] == pytest.approx(2 * stats.norm.sf(abs(got["contrast"]) / boot.std(ddof=1)))
    with pytest.raises(ValueError, match="over 30 and 29 questions"):
        contrast_bootstrap(a, b[:, :29])


def test_a_report_tests_each_arm_pooled_and_sets_arms_against_each_other(study, tmp_path):
    root, runs = study
    names = ["simple_rag", *(f"simple_rag_bfs_{s}" for s in range(3)), "sr_labeled_0", "sr_labeled_1", "sr_mipro_0"]
    names += ["hcqr", *(f"hcqr_bfs_{s}" for s in range(3))]
    report, _ = compare([root / n for n in names], out_dir=tmp_path / "cmp", margin=5, margin_pgold=0.05)
    summary = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    tests = summary["tests"]
    # no test names one seed of an arm of two or more seeds; the lone mipro compile is still tested as a run
    seed_labels = [label for label in summary["runs"] if "bootstrap_fewshot (local)" in label or "labeled" in label]
    assert len(seed_labels) == 8 and not [t for t in tests if any(s in t["label"] for s in seed_labels)]
    lone = [t for t in tests if t["label"] == "simple_rag+mipro_instructions vs simple_rag: accuracy"]
    assert [t["test"] for t in lone] == ["exact McNemar", "TOST (paired t), margin ±5 points"]
    assert SEED_OF_ARM in report and "tested pooled over its seeds" in report
    assert {t["section"] for t in tests} >= {"replicate compiles", "arm against arm", "comparison with the reference"}
    # the contrasts: recipe (same method) and method (same recipe); never across both
    contrasts = summary["arm_contrasts"]
    assert {k: v["differ_in"] for k, v in contrasts.items()} == {
        "simple_rag + bootstrap_fewshot vs simple_rag + labeled_fewshot": "recipe",
        "simple_rag + bootstrap_fewshot vs hcqr + bootstrap_fewshot": "method",
    }
    sr_bfs = [f"simple_rag_bfs_{s}" for s in range(3)]
    for outcome in ("accuracy", "gold_prob"):
        recipe = contrasts["simple_rag + bootstrap_fewshot vs simple_rag + labeled_fewshot"][outcome]
        direct = contrast_bootstrap(
            effects(runs, "simple_rag", sr_bfs, outcome),
            effects(runs, "simple_rag", ["sr_labeled_0", "sr_labeled_1"], outcome),
        )
        for key in ("contrast", "ci_low", "ci_high", "se", "mde", "p_value"):
            assert recipe[key] == pytest.approx(direct[key]), (outcome, key)
        method = contrasts["simple_rag + bootstrap_fewshot vs hcqr + bootstrap_fewshot"][outcome]
        gains = contrast_bootstrap(
            effects(runs, "simple_rag", sr_bfs, outcome),
            effects(runs, "hcqr", [f"hcqr_bfs_{s}" for s in range(3)], outcome),
        )
        assert method["contrast"] == pytest.approx(gains["contrast"]) and method["se"] == pytest.approx(gains["se"])
    arm_tests = [t for t in tests if t["section"] == "arm against arm"]
    assert len(arm_tests) == 8  # two contrasts x two outcomes x (difference, TOST)
    first = arm_tests[0]
    assert first["p_value"] == pytest.approx(
        contrasts["simple_rag + bootstrap_fewshot vs simple_rag + labeled_fewshot"]["accuracy"]["p_value"]
    )
    section = report.split("## Optimizer arm against optimizer arm")[1].split("\n## ")[0]
    assert f"(#{first['number']}; Holm {first['p_holm']:.3g})" in section and "| 3 + 2 | 12 |" in section


def test_one_arm_has_nothing_to_be_set_against(study, tmp_path):
    root, _ = study
    names = ["simple_rag", *(f"simple_rag_bfs_{s}" for s in range(3))]
    report, _ = compare([root / n for n in names], out_dir=tmp_path / "cmp")
    assert "## Optimizer arm against optimizer arm" not in report
    assert json.loads((tmp_path / "cmp" / "comparison.json").read_text())["arm_contrasts"] == {}


def test_mlflow_logs_a_mcnemar_p_only_for_a_run_the_report_tests_alone(study, tmp_path, mlflow_store):
    import mlflow

    from hcqr_dspy.tracking.comparison import track_comparison

    root, _ = study
    names = ["simple_rag", *(f"simple_rag_bfs_{s}" for s in range(3)), "sr_mipro_0"]
    compare([root / n for n in names], out_dir=tmp_path / "cmp")
    summary = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    lone = "simple_rag+mipro_instructions"
    assert list(summary["mcnemar"]) == [lone]  # the seeds of the arm are tested pooled, not alone
    run = mlflow.get_run(track_comparison(tmp_path / "cmp", mlflow_dir=mlflow_store))
    logged = sorted(k for k in run.data.metrics if k.startswith("mcnemar_p."))
    assert logged == ["mcnemar_p.simple_rag_mipro_instructions"]  # the metric key's form of the label
    assert run.data.metrics["mcnemar_p.simple_rag_mipro_instructions"] == pytest.approx(
        summary["mcnemar"][lone]["p_value"]
    )
    note = run.data.tags["mlflow.note.content"]
    seed_rows = [
        line for line in note.splitlines() if line.startswith("| simple_rag+bootstrap_fewshot") and " pts | " in line
    ]
    assert len(seed_rows) == 3 and all(SEED_OF_ARM in line for line in seed_rows)


def test_comparison_json_says_which_compiled_pairs_and_tosts_the_report_tests(study, tmp_path):
    root, _ = study
    names = ["simple_rag", *(f"simple_rag_bfs_{s}" for s in range(3)), "sr_mipro_0"]
    compare([root / n for n in names], out_dir=tmp_path / "cmp", margin=5, margin_pgold=0.05)
    summary = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    lone = "simple_rag+mipro_instructions"
    tested = {label: f["tested"] for label, f in summary["compiled"].items()}
    assert tested.pop(lone) is True and len(tested) == 3 and not any(tested.values())
    # a TOST is flagged tested exactly when the family holds it (a test printed in two sections is one member)
    numbered = {t["label"] for t in summary["tests"] if t["margin"] is not None}
    for tost in summary["equivalence"]:
        assert tost["tested"] == (tost["label"] in numbered), tost["label"]
    assert any(t["tested"] for t in summary["equivalence"]) and not all(t["tested"] for t in summary["equivalence"])
