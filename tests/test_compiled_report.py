"""`hcqr compare` on zero-shot against compiled programs: each compiled run is paired with the zero-shot run of
its own method (never with the reference of another method), its statistics equal a direct computation, the
compile cost comes from the saved program's meta.json, and the plot is written only when there is a pair."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import comparison_row, write_session
from scipy import stats

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.reporting import compare, compiled_figure, load_run, mcnemar_exact

N = 12


def write_run(folder, method, correct, gold_prob, saved=None, lm="local"):
    """A run folder of ``method`` over questions q0..q{N-1}; ``saved``: the compiled program's folder (or the
    whole ``saved_program`` record when not a path); a ``gold_prob`` of None leaves the question unscored."""
    folder.mkdir(parents=True)
    qids = [f"q{i}" for i in range(N)]
    questions = {"count": N, "ids_sha256": "-".join(qids), "content_sha256": "v1:" + "-".join(qids)}
    config = {"method": method, "lm": {"spec": lm}, "dataset": "bench.json", "questions": questions}
    if isinstance(saved, Path):
        config["saved_program"] = {"folder": str(saved), "optimizer": "BootstrapFewShot", "recipe": "bootstrap_fewshot"}
    elif saved is not None:
        config["saved_program"] = saved
    (folder / "config.json").write_text(json.dumps(config))
    rows = [
        comparison_row(
            q,
            method,
            ok,
            seconds=2.0 if saved else 1.0,
            option_probs=None if p is None else {"A": p, "B": 1 - p},
            gold_prob=p,
        )
        for q, ok, p in zip(qids, correct, gold_prob)
    ]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_session(folder)
    return folder


def saved_program(folder, calls, seconds, cost=None):
    folder.mkdir(parents=True)
    if cost is None:
        cost = {"lm_calls": calls, "cached_lm_calls": 0, "prompt_tokens": 900, "completion_tokens": 100}
        cost["seconds"] = seconds
    (folder / "meta.json").write_text(json.dumps({"compile_cost": cost}))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled")
    rng = np.random.default_rng(3)
    zs_h = [bool(x) for x in rng.integers(0, 2, N)]
    bfs_h = [not x if i % 3 == 0 else x for i, x in enumerate(zs_h)]
    p = {k: list(rng.uniform(0.05, 0.95, N)) for k in ("zh", "ch", "zs", "cs")}
    return {
        "root": root,
        "hcqr": write_run(root / "hcqr", "hcqr", zs_h, p["zh"]),
        "hcqr_bfs": write_run(root / "hcqr_bfs", "hcqr", bfs_h, p["ch"], saved_program(root / "p1", 40, 600)),
        "simple_rag": write_run(root / "sr", "simple_rag", [True] * 6 + [False] * 6, p["zs"]),
        "simple_rag_bfs": write_run(root / "sr_bfs", "simple_rag", [False] * 6 + [True] * 6, p["cs"], root / "gone"),
        "zs_h": zs_h,
        "bfs_h": bfs_h,
        "p": p,
    }


def test_each_compiled_program_is_paired_with_its_own_methods_zero_shot_run(runs):
    out = runs["root"] / "cmp"
    folders = [runs[k] for k in ("simple_rag", "hcqr", "hcqr_bfs", "simple_rag_bfs")]
    report, files = compare(folders, reference="simple_rag", out_dir=out)
    summary = json.loads((out / "comparison.json").read_text())["compiled"]
    assert set(summary) == {"hcqr+bootstrap_fewshot", "simple_rag+bootstrap_fewshot"}
    h = summary["hcqr+bootstrap_fewshot"]
    assert h["zero_shot"] == "hcqr"  # not the report's reference (simple_rag)
    diff = np.array(runs["bfs_h"], dtype=float) - np.array(runs["zs_h"], dtype=float)
    assert h["accuracy_diff"]["mean_diff"] == pytest.approx(diff.mean())
    ci = stats.bootstrap(
        (diff,), np.mean, n_resamples=10_000, method="BCa", random_state=np.random.default_rng(0)
    ).confidence_interval
    assert (h["accuracy_diff"]["ci_low"], h["accuracy_diff"]["ci_high"]) == pytest.approx((ci.low, ci.high))
    ids = [f"q{i}" for i in range(N)]
    expected = mcnemar_exact(dict(zip(ids, runs["zs_h"])), dict(zip(ids, runs["bfs_h"])))
    assert h["mcnemar"] == expected
    gold = np.array(runs["p"]["ch"]) - np.array(runs["p"]["zh"])
    assert h["gold_prob_diff"]["mean_diff"] == pytest.approx(gold.mean())
    assert h["gold_prob_diff"]["wilcoxon_p"] == pytest.approx(stats.wilcoxon(gold).pvalue)
    assert h["compile_cost"]["lm_calls"] == 40
    s = summary["simple_rag+bootstrap_fewshot"]
    assert s["zero_shot"] == "simple_rag" and s["mcnemar"]["b"] == 6 and s["mcnemar"]["c"] == 6
    assert s["compile_cost"] is None  # its saved folder is gone: said, not invented
    assert "## Zero-shot against compiled programs (paired within each method)" in report
    assert "| hcqr | hcqr+bootstrap_fewshot | 12 |" in report and "| 40 calls, 1,000 tokens, 600 s |" in report
    assert "| simple_rag | simple_rag+bootstrap_fewshot | 12 | 50.0% → 50.0% | +0.0" in report
    assert f"not known ({runs['root'] / 'gone' / 'meta.json'} missing)" in report
    assert "### hcqr+bootstrap_fewshot vs hcqr" in report  # the program diff against its own zero-shot run
    assert (out / "compiled.png").is_file() and out / "compiled.png" in files


def test_no_pair_no_table_and_no_plot(runs):
    out = runs["root"] / "cmp_none"
    report, files = compare([runs["simple_rag"], runs["hcqr_bfs"]], out_dir=out)
    assert "Not paired (no single zero-shot run" in report and "| method | compiled |" not in report
    assert not (out / "compiled.png").exists()
    assert json.loads((out / "comparison.json").read_text())["compiled"] == {}
    report, files = compare([runs["simple_rag"], runs["hcqr"]], out_dir=out)  # nothing compiled: no section
    assert "Zero-shot against compiled" not in report


def test_a_compiled_run_is_paired_only_with_a_zero_shot_run_of_the_same_lm_and_never_by_guess(runs):
    root = runs["root"]
    zs_h, p = runs["zs_h"], runs["p"]
    other_lm = write_run(root / "hcqr_7b", "hcqr", [True] * N, p["zh"], lm="openai/qwen-7b")
    report, _ = compare([other_lm, runs["hcqr_bfs"], runs["hcqr"]], out_dir=root / "cmp_lm")
    assert "| hcqr (local) | hcqr+bootstrap_fewshot | 12 |" in report  # not the 7B run given first
    twin = write_run(root / "hcqr_twin", "hcqr", zs_h, p["zh"])
    report, _ = compare([runs["hcqr_bfs"], runs["hcqr"], twin], out_dir=root / "cmp_twin")
    assert "Not paired (no single zero-shot run" in report and "hcqr+bootstrap_fewshot." in report
    assert "| method | compiled |" not in report  # no pair: no table
    report, _ = compare([twin, runs["hcqr_bfs"], runs["hcqr"]], out_dir=root / "cmp_ref")  # the reference decides
    assert "| hcqr (local) (hcqr_twin) | hcqr+bootstrap_fewshot | 12 |" in report


def test_partial_gold_probabilities_and_bad_program_records_are_said(runs):
    root = runs["root"]
    half = [None if i % 2 else x for i, x in enumerate(runs["p"]["ch"])]
    bad_cost = saved_program(root / "p_bad", 0, 0, cost={"lm_calls": "15", "seconds": 3})
    partial = write_run(root / "hcqr_half", "hcqr", runs["bfs_h"], half, bad_cost)
    report, _ = compare([runs["hcqr"], partial], out_dir=root / "cmp_half")
    assert "(n=6)" in report and "not known (no compile cost recorded)" in report
    broken = write_run(root / "hcqr_str", "hcqr", runs["bfs_h"], runs["p"]["ch"], saved="programs/hcqr-bfs")
    with pytest.raises(HCQRError, match="config.json's saved_program is not a saved-program record"):
        compare([runs["hcqr"], broken], out_dir=root / "cmp_str")


def test_the_optimizers_gain_on_one_method_is_paired_against_its_gain_on_the_other(runs):
    root = runs["root"]
    folders = [runs[k] for k in ("simple_rag", "hcqr", "hcqr_bfs", "simple_rag_bfs")]
    report, _ = compare(folders, reference="simple_rag", out_dir=root / "cmp_gain")
    gains = json.loads((root / "cmp_gain" / "comparison.json").read_text())["compiled_gain_difference"]
    assert list(gains) == ["hcqr+bootstrap_fewshot vs simple_rag+bootstrap_fewshot"]  # the reference's method second
    g = gains["hcqr+bootstrap_fewshot vs simple_rag+bootstrap_fewshot"]
    gain_h = np.array(runs["bfs_h"], dtype=float) - np.array(runs["zs_h"], dtype=float)
    gain_s = np.array([-1.0] * 6 + [1.0] * 6)  # simple_rag: right on the first six, compiled on the last six
    diff = gain_h - gain_s
    assert g["questions"] == N and g["accuracy_gain_first"] == pytest.approx(gain_h.mean())
    assert g["accuracy_gain_diff"]["mean_diff"] == pytest.approx(diff.mean())
    ci = stats.bootstrap(
        (diff,), np.mean, n_resamples=10_000, method="BCa", random_state=np.random.default_rng(0)
    ).confidence_interval
    assert (g["accuracy_gain_diff"]["ci_low"], g["accuracy_gain_diff"]["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert g["accuracy_gain_diff"]["wilcoxon_p"] == pytest.approx(stats.wilcoxon(diff[diff != 0]).pvalue)
    p = {k: np.array(v) for k, v in runs["p"].items()}
    gold = (p["ch"] - p["zh"]) - (p["cs"] - p["zs"])
    assert g["gold_prob_gain_diff"]["mean_diff"] == pytest.approx(gold.mean())
    assert "## Optimizer gain against optimizer gain (difference in differences)" in report
    row = "| hcqr+bootstrap_fewshot vs hcqr | simple_rag+bootstrap_fewshot vs simple_rag | bootstrap_fewshot on ? (?) |"
    assert row in report
    fig = compiled_figure([load_run(f) for f in folders])  # the difference of gains is the figure's third row
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert ticks[2] == "gain of hcqr+bootstrap_fewshot\n- gain of simple_rag+bootstrap_fewshot"
    marks = [line.get_xdata()[0] for line in fig.axes[1].lines if len(line.get_xdata()) == 1]
    assert any(m == pytest.approx(diff.mean()) for m in marks) and any(m == pytest.approx(gold.mean()) for m in marks)
    assert g["compiled_with"] == "bootstrap_fewshot on ? (?)"  # the fixture's records name no training set
    # the reference's method goes second whichever order the runs were given in, also when the reference is the
    # method's compiled run
    for reference in ("hcqr", "hcqr+bootstrap_fewshot"):
        report, _ = compare(folders[1:] + folders[:1], reference=reference, out_dir=root / "cmp_gain_ref")
        gains = json.loads((root / "cmp_gain_ref" / "comparison.json").read_text())["compiled_gain_difference"]
        flipped = gains["simple_rag+bootstrap_fewshot vs hcqr+bootstrap_fewshot"]["accuracy_gain_diff"]["mean_diff"]
        assert flipped == pytest.approx(-diff.mean())


def test_the_plot_takes_the_reports_reference_whatever_order_the_runs_are_given_in(runs, monkeypatch):
    from hcqr_dspy.reporting import plots

    drawn = {}
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, out: drawn.setdefault(out.name, fig) and save(fig, out))
    given = [runs[k] for k in ("hcqr", "hcqr_bfs", "simple_rag", "simple_rag_bfs")]  # hcqr first
    compare(given, reference="simple_rag", out_dir=runs["root"] / "cmp_plot_ref")
    ticks = [t.get_text() for t in drawn["compiled.png"].axes[1].get_yticklabels()]
    assert ticks[-1] == "gain of hcqr+bootstrap_fewshot\n- gain of simple_rag+bootstrap_fewshot"  # as the report


def test_no_gain_against_gain_across_recipes_or_within_one_method(runs):
    root = runs["root"]
    mipro = {"folder": str(root / "gone"), "optimizer": "MIPROv2", "recipe": "mipro_light"}
    sr_mipro = write_run(root / "sr_mipro", "simple_rag", [True] * N, runs["p"]["cs"], saved=mipro)
    report, _ = compare([runs["simple_rag"], runs["hcqr"], runs["hcqr_bfs"], sr_mipro], out_dir=root / "cmp_recipes")
    summary = json.loads((root / "cmp_recipes" / "comparison.json").read_text())
    assert len(summary["compiled"]) == 2 and summary["compiled_gain_difference"] == {}
    assert (
        "Not set against each other: hcqr+bootstrap_fewshot and simple_rag+mipro_light: compiled differently "
        "(bootstrap_fewshot on ? (?); mipro_light on ? (?))." in report
    )
    bfs_medqa = {"folder": str(root / "gone"), "recipe": "bootstrap_fewshot", "train_dataset": "medqa"}
    sr_medqa = write_run(root / "sr_medqa", "simple_rag", [True] * N, runs["p"]["cs"], saved={**bfs_medqa})
    report, _ = compare([runs["simple_rag"], runs["hcqr"], runs["hcqr_bfs"], sr_medqa], out_dir=root / "cmp_train")
    assert "compiled differently (bootstrap_fewshot on ? (?); bootstrap_fewshot on medqa (?))" in report
    report, _ = compare([runs["hcqr"], runs["hcqr_bfs"], runs["simple_rag"]], out_dir=root / "cmp_one")
    assert "difference in differences" not in report


def test_the_comparison_run_in_mlflow_carries_the_compiled_pairs_and_the_gain_difference(runs, mlflow_store):
    import mlflow

    from hcqr_dspy.tracking.comparison import track_comparison

    out = runs["root"] / "cmp_mlflow"
    compare(
        [runs[k] for k in ("simple_rag", "hcqr", "hcqr_bfs", "simple_rag_bfs")], reference="simple_rag", out_dir=out
    )
    run = mlflow.get_run(track_comparison(out, mlflow_dir=mlflow_store))
    m, summary = run.data.metrics, json.loads((out / "comparison.json").read_text())
    h = summary["compiled"]["hcqr+bootstrap_fewshot"]
    assert m["compiled.delta_accuracy.hcqr_bootstrap_fewshot"] == pytest.approx(h["accuracy_diff"]["mean_diff"])
    assert m["compiled.mde_gold_prob.hcqr_bootstrap_fewshot"] == pytest.approx(h["gold_prob_diff"]["mde"])
    assert m["compiled.delta_accuracy.simple_rag_bootstrap_fewshot"] == 0.0
    g = summary["compiled_gain_difference"]["hcqr+bootstrap_fewshot vs simple_rag+bootstrap_fewshot"]
    key = "hcqr_bootstrap_fewshot vs simple_rag_bootstrap_fewshot"
    assert m[f"gain_difference.accuracy.{key}"] == pytest.approx(g["accuracy_gain_diff"]["mean_diff"])
    assert m[f"gain_difference.gold_prob.{key}"] == pytest.approx(g["gold_prob_gain_diff"]["mean_diff"])
    note = run.data.tags["mlflow.note.content"]
    assert "| hcqr+bootstrap_fewshot | hcqr | 12 |" in note
    assert "Gain of hcqr+bootstrap_fewshot over hcqr minus gain of simple_rag+bootstrap_fewshot over simple_rag" in note
    d = g["accuracy_gain_diff"]  # the figures in points, with the interval, as the report prints them
    assert (
        f"12 questions: {d['mean_diff'] * 100:+.1f} [{d['ci_low'] * 100:+.1f}, {d['ci_high'] * 100:+.1f}] points"
        in note
    )


def test_long_labels_stay_within_mlflows_metric_name_limit_and_apart(runs, mlflow_store):
    import mlflow

    from hcqr_dspy.tracking.comparison import _metric_key, track_comparison

    a, b = "x" * 240 + "a" * 20, "x" * 240 + "b" * 20
    assert len(_metric_key(a)) == 250 and _metric_key(a) != _metric_key(b) and _metric_key("short") == "short"
    root = runs["root"]
    long_name = "hcqr_bfs_" + "v" * 180  # two compiled hcqr runs of one recipe: labels take the folder's name
    twin = write_run(root / long_name, "hcqr", runs["zs_h"], runs["p"]["ch"], saved_program(root / "p_long", 9, 9))
    folders = [runs["simple_rag"], runs["hcqr"], runs["hcqr_bfs"], twin, runs["simple_rag_bfs"]]
    compare(folders, reference="simple_rag", out_dir=root / "cmp_long")
    run = mlflow.get_run(track_comparison(root / "cmp_long", mlflow_dir=mlflow_store))
    assert max(len(k) for k in run.data.metrics) == 250
    with pytest.raises(HCQRError, match="'hcqr\\+bootstrap_fewshot' matches 2 runs"):  # its label made unique
        compare(folders, reference="hcqr+bootstrap_fewshot", out_dir=root / "cmp_long")


def test_a_difference_drawn_without_its_interval_is_hollow_and_the_axis_says_why(tmp_path):
    scored = [0.6, 0.5, 0.4, 0.7, 0.3] + [None] * (N - 5)  # p(gold) on 5 questions: too few pairs for an interval
    zero = write_run(tmp_path / "zs", "simple_rag", [True, False] * (N // 2), scored)
    compiled = write_run(tmp_path / "c", "simple_rag", [True] * N, [p and p + 0.1 for p in scored], saved=tmp_path)
    fig = compiled_figure([load_run(zero), load_run(compiled)])
    axis = fig.axes[1]
    assert "hollow: no interval (under 10 paired questions)" in axis.get_xlabel()
    points = {line.get_color(): line for line in axis.lines if len(line.get_xdata()) == 1}
    assert points["#DD8452"].get_markerfacecolor() == "white"  # Δ p(gold): 5 pairs, a point alone
    assert points["#4C72B0"].get_markerfacecolor() != "white"  # Δ accuracy: 12 pairs, drawn with its interval
    full = [0.5] * N
    fig = compiled_figure(
        [
            load_run(write_run(tmp_path / "zs2", "cot", [False] * N, full)),
            load_run(write_run(tmp_path / "c2", "cot", [True] * N, [0.6] * N, saved=tmp_path)),
        ]
    )
    assert "hollow" not in fig.axes[1].get_xlabel()


def test_a_compile_measured_under_contention_says_so_beside_its_cost(runs):
    root = runs["root"]
    cost = {"lm_calls": 40, "cached_lm_calls": 0, "prompt_tokens": 900, "completion_tokens": 100, "seconds": 600}
    calm = saved_program(root / "p_calm", 0, 0, cost={**cost, "cpu_pressure": 0.03})
    busy = saved_program(root / "p_busy", 0, 0, cost={**cost, "cpu_pressure": 0.42})
    for name, program in (("calm", calm), ("busy", busy)):
        compiled = write_run(root / f"hcqr_{name}", "hcqr", runs["bfs_h"], runs["p"]["ch"], program)
        report, _ = compare([runs["hcqr"], compiled], out_dir=root / f"cmp_{name}")
        said = "| 40 calls, 1,000 tokens, 600 s (under CPU contention: 42%) |"
        assert (said in report) == (name == "busy")
        assert "| 40 calls, 1,000 tokens, 600 s |" in report or name == "busy"
