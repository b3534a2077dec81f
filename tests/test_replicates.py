"""Replicate compiles as one optimizer arm: runs of one recipe and method that differ only in compile seed are
grouped, and their per-seed effects, pooled effect, two-level bootstrap interval, between-seed SD, MDE and TOST
equal a direct computation on the rows."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import GoldEngine, compile_spec, demo_gold, schema_lm
from scipy import stats
from test_compiled_report import N, write_run

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.optimize.saved import read_meta
from hcqr_dspy.reporting import compare, load_run
from hcqr_dspy.reporting.replicates import (
    Z_80,
    Z_975,
    compile_seed,
    equivalence,
    replicate_groups,
    replicates_table,
    two_level_bootstrap,
)

SEEDS = (0, 1, 2)
QUESTIONS = str(Path(__file__).resolve().parents[1] / "data" / "demo" / "questions.json")


def saved(seed, recipe="bootstrap_fewshot", train="medmcqa"):
    return {"folder": f"/nowhere/seed-{seed}", "recipe": recipe, "seed": seed, "train_dataset": train}


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicates")
    rng = np.random.default_rng(7)
    zs = [bool(x) for x in rng.integers(0, 2, N)]
    p_zs = list(rng.uniform(0.05, 0.95, N))
    out = {"root": root, "zs": (zs, p_zs), "seeds": {}}
    write_run(root / "sr", "simple_rag", zs, p_zs)
    for s in SEEDS:
        c = [not x if (i + s) % 4 == 0 else x for i, x in enumerate(zs)]
        p = list(np.clip(np.array(p_zs) + rng.normal(0.05 * s, 0.1, N), 0.01, 0.99))
        write_run(root / f"sr_bfs_{s}", "simple_rag", c, p, saved(s))
        out["seeds"][s] = (c, p)
    write_run(root / "hcqr", "hcqr", zs, p_zs)
    write_run(root / "hcqr_bfs_0", "hcqr", zs, p_zs, saved(0))
    return out


def load(root, *names):
    return [load_run(root / n) for n in names]


def test_replicate_compiles_of_one_recipe_form_one_arm_and_lone_compiles_an_arm_of_one(arms):
    runs = load(arms["root"], "sr", "sr_bfs_0", "sr_bfs_1", "sr_bfs_2", "hcqr", "hcqr_bfs_0")
    groups = replicate_groups(runs)
    assert {k: [r.path.name for r in v] for k, v in groups.items()} == {
        "simple_rag + bootstrap_fewshot": ["sr_bfs_0", "sr_bfs_1", "sr_bfs_2"],
        "hcqr + bootstrap_fewshot": ["hcqr_bfs_0"],
    }
    assert [compile_seed(r) for r in groups["simple_rag + bootstrap_fewshot"]] == [0, 1, 2]


def test_pooled_effect_interval_sd_and_mde_equal_a_direct_computation(arms):
    zs, p_zs = arms["zs"]
    acc = np.array([[float(c) - float(z) for c, z in zip(arms["seeds"][s][0], zs)] for s in SEEDS])
    got = two_level_bootstrap(acc, resamples=2000, seed=5)
    per_seed = acc.mean(axis=1)
    assert got["pooled"] == pytest.approx(per_seed.mean())
    assert got["between_seed_sd"] == pytest.approx(per_seed.std(ddof=1))
    # the same two-level resampling written out loop by loop
    rng = np.random.default_rng(5)
    seed_draw = rng.integers(0, 3, size=(2000, 3))
    q_draw = rng.integers(0, N, size=(2000, N))
    boot = np.array([np.mean([acc[s][q_draw[b]].mean() for s in seed_draw[b]]) for b in range(2000)])
    assert got["ci_low"] == pytest.approx(np.percentile(boot, 2.5))
    assert got["ci_high"] == pytest.approx(np.percentile(boot, 97.5))
    assert got["se"] == pytest.approx(boot.std(ddof=1))
    assert got["mde"] == pytest.approx((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * boot.std(ddof=1))
    assert Z_975 == pytest.approx(stats.norm.ppf(0.975)) and Z_80 == pytest.approx(stats.norm.ppf(0.8))
    assert got["p_value"] == pytest.approx(2 * stats.norm.sf(abs(per_seed.mean()) / boot.std(ddof=1)))


def test_the_seed_spread_widens_the_interval_beyond_a_question_only_bootstrap():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 0.3, 200)
    alike = np.stack([base + 0.1 for _ in range(4)])
    apart = np.stack([base + shift for shift in (-0.2, 0.0, 0.2, 0.4)])  # same pooled mean, seeds disagree
    a, b = two_level_bootstrap(alike), two_level_bootstrap(apart)
    assert a["pooled"] == pytest.approx(b["pooled"])
    assert a["between_seed_sd"] == pytest.approx(0.0)
    assert b["ci_high"] - b["ci_low"] > 3 * (a["ci_high"] - a["ci_low"])


def test_tost_equals_two_one_sided_normal_tests():
    got = equivalence(0.01, 0.02, 0.05)
    assert got["p_lower"] == pytest.approx(stats.norm.sf((0.01 + 0.05) / 0.02))
    assert got["p_upper"] == pytest.approx(stats.norm.cdf((0.01 - 0.05) / 0.02))
    assert got["p_value"] == pytest.approx(max(got["p_lower"], got["p_upper"]))
    assert equivalence(0.01, 0.02, 0.05)["p_value"] < 0.05 < equivalence(0.04, 0.02, 0.05)["p_value"]


def test_the_table_gives_per_seed_effects_and_says_when_one_seed_leaves_variance_unmeasured(arms):
    runs = load(arms["root"], "sr", "sr_bfs_0", "sr_bfs_1", "sr_bfs_2", "hcqr", "hcqr_bfs_0")
    md, figures = replicates_table(runs, margins={"accuracy": 0.05, "gold_prob": 0.05})
    zs, _ = arms["zs"]
    effects = [np.mean([float(c) - float(z) for c, z in zip(arms["seeds"][s][0], zs)]) for s in SEEDS]
    arm = figures["simple_rag + bootstrap_fewshot"]
    assert arm["accuracy"]["per_seed"] == pytest.approx(effects)
    assert arm["seeds"] == [0, 1, 2] and arm["zero_shot"] == "simple_rag"
    assert f"0: {effects[0] * 100:+.1f}, 1: {effects[1] * 100:+.1f}" in md
    assert "within ±5 points (TOST p " in md and "within ±0.05 (TOST p " in md
    assert "- hcqr + bootstrap_fewshot: one compile seed (hcqr+bootstrap_fewshot): the compile's own variance" in md
    assert "| hcqr + bootstrap_fewshot |" not in md


def test_explicit_groups_are_checked(arms):
    runs = load(arms["root"], "sr", "sr_bfs_0", "sr_bfs_1", "hcqr", "hcqr_bfs_0")
    groups = replicate_groups(runs, {"mine": ["sr_bfs_0", "sr_bfs_1"]})
    assert [r.path.name for r in groups["mine"]] == ["sr_bfs_0", "sr_bfs_1"]
    with pytest.raises(HCQRError, match=r"--group mix: its runs differ in method"):
        replicate_groups(runs, {"mix": ["sr_bfs_0", "hcqr_bfs_0"]})
    with pytest.raises(HCQRError, match=r"'nope' names none of the compared runs"):
        replicate_groups(runs, {"x": ["nope"]})
    with pytest.raises(HCQRError, match=r"run simple_rag is not a saved \(compiled\) program"):
        replicate_groups(runs, {"x": ["sr"]})
    with pytest.raises(HCQRError, match="named twice"):
        replicate_groups(runs, {"x": ["sr_bfs_0", "sr_bfs_0"]})


def test_the_seed_is_read_from_meta_json_when_the_run_record_lacks_it(arms, tmp_path):
    program = tmp_path / "prog"
    program.mkdir()
    (program / "meta.json").write_text(json.dumps({"recipe": {"seed": 3}}))
    zs, p_zs = arms["zs"]
    run = write_run(tmp_path / "r", "simple_rag", zs, p_zs, {"folder": str(program), "recipe": "bootstrap_fewshot"})
    assert compile_seed(load_run(run)) == 3


def test_compare_reports_the_arm_with_numbered_holm_adjusted_p_values_and_tost(arms):
    root = arms["root"]
    report, files = compare(
        [root / n for n in ("sr", "sr_bfs_0", "sr_bfs_1", "sr_bfs_2")], out_dir=root / "cmp", margin=5
    )
    section = report.split("## Replicate compiles: each optimizer arm over its seeds")[1].split("\n## ")[0]
    assert "| simple_rag + bootstrap_fewshot | accuracy, points | 3 | 12 |" in section
    summary = json.loads((root / "cmp" / "comparison.json").read_text())
    pooled = [t for t in summary["tests"] if t["section"] == "replicate compiles"]
    assert [t["test"].split(" (")[0] for t in pooled] == [
        "pooled effect, two-level bootstrap SE",
        "TOST ±5 points",
        "pooled effect, two-level bootstrap SE",
    ]
    arm = summary["replicates"]["simple_rag + bootstrap_fewshot"]
    assert pooled[0]["p_value"] == pytest.approx(arm["accuracy"]["p_value"])
    assert pooled[1]["p_value"] == pytest.approx(arm["accuracy"]["tost"]["p_value"])
    assert f"(#{pooled[0]['number']}; Holm {pooled[0]['p_holm']:.3g})" in section


@pytest.mark.parametrize(
    "args, message",
    [
        (["--group", "x=sr_bfs_0,hcqr_bfs_0"], "--group x: its runs differ in method"),
        (["--group", "x=sr_bfs_0"], "--group x: one run"),
        (["--group", "x=sr_bfs_0,sr_bfs_1", "--group", "x=sr_bfs_2"], "--group x is given twice"),
        (["--group", "=sr_bfs_0"], "expected NAME=RUN,RUN"),
    ],
)
def test_bad_groups_are_one_line_and_write_nothing(arms, capsys, args, message):
    root = arms["root"]
    out = root / "bad-cmp"
    runs = [str(root / n) for n in ("sr", "sr_bfs_0", "sr_bfs_1", "sr_bfs_2", "hcqr", "hcqr_bfs_0")]
    try:
        code = main(["compare", *runs, "--out", str(out), "--no-mlflow", *args])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not out.exists()


def test_a_group_without_its_methods_zero_shot_run_is_refused(arms):
    root = arms["root"]
    with pytest.raises(HCQRError, match="--group x: no zero-shot run of simple_rag"):
        compare(
            [root / n for n in ("hcqr", "sr_bfs_0", "sr_bfs_1")],
            out_dir=root / "c2",
            groups={"x": ["sr_bfs_0", "sr_bfs_1"]},
        )
    assert not (root / "c2").exists()


class DemoSensitiveEngine(GoldEngine):
    """Answers the live question right or wrong by a hash of the question and the whole prompt's text: the
    zero-shot program and each compiled seed (other demos, another prompt) get right a different subset."""

    def fill(self, request, properties):
        prompt = "".join(m.text or "" for m in request.messages)
        self.right = lambda qid: hashlib.sha256((qid + prompt[:4000]).encode()).digest()[0] % 3 != 0
        return super().fill(request, properties)


def test_compare_of_dummy_lm_runs_of_three_compile_seeds_equals_a_direct_computation(demo_bm25, tmp_path):
    """Three seeds of one recipe compiled and answered through the real compile and eval paths (a stub engine),
    against the zero-shot run of their method: the report's per-seed and pooled figures equal those computed
    here from the run folders' rows."""
    from hcqr_dspy.workflows.compile_seeds import run_compile_seeds
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    def lm():
        return schema_lm(engine=DemoSensitiveEngine(demo_gold()))

    spec = compile_spec(demo_bm25, tmp_path / "bfs", method="simple_rag", program_options={"budget": 3})
    run_compile_seeds(spec, [0, 1, 2], track=False, lm=lm())
    trained = set().union(*(read_meta(tmp_path / "bfs" / f"seed-{s}")["train"]["ids"] for s in (0, 1, 2)))
    held_out = [q for q in demo_gold() if q not in trained]
    assert len(held_out) >= 5
    common = dict(dataset=QUESTIONS, ids=held_out, index=str(demo_bm25), lm="openai/unused")
    runs = {"zs": EvalSpec(method="simple_rag", run_dir=str(tmp_path / "zs"), program_options={"budget": 3}, **common)}
    for s in (0, 1, 2):
        runs[s] = EvalSpec(
            method=None, program=str(tmp_path / "bfs" / f"seed-{s}"), run_dir=str(tmp_path / f"s{s}"), **common
        )
    for eval_spec in runs.values():
        run_evaluation(eval_spec, progress=False, track=False, lm=lm())
    report, _ = compare([r.run_dir for r in runs.values()], out_dir=tmp_path / "cmp", margin=10)

    def correct(folder):
        return {
            r["qid"]: float(r["correct"]) for r in map(json.loads, (tmp_path / folder / "predictions.jsonl").open())
        }

    zs = correct("zs")
    matrix = np.array([[correct(f"s{s}")[q] - zs[q] for q in sorted(zs)] for s in (0, 1, 2)])
    assert matrix.std() > 0  # the seeds' prompts answered differently: something to pool
    arm = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["replicates"]["simple_rag + bootstrap_fewshot"]
    assert arm["seeds"] == [0, 1, 2]
    assert arm["accuracy"]["per_seed"] == pytest.approx(list(matrix.mean(axis=1)))
    direct = two_level_bootstrap(matrix)
    for key in ("pooled", "between_seed_sd", "ci_low", "ci_high", "mde", "p_value"):
        assert arm["accuracy"][key] == pytest.approx(direct[key]), key
    assert arm["accuracy"]["between_seed_sd"] == pytest.approx(matrix.mean(axis=1).std(ddof=1))
    tost = equivalence(direct["pooled"], direct["se"], 0.10)
    assert arm["accuracy"]["tost"]["p_value"] == pytest.approx(tost["p_value"])
    section = report.split("## Replicate compiles: each optimizer arm over its seeds")[1].split("\n## ")[0]
    assert "| simple_rag + bootstrap_fewshot | accuracy, points | 3 |" in section and "(TOST p " in section
