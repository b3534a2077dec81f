"""The benchmark's report: every figure the results file holds is rendered, and a partial run says so."""

import json
from pathlib import Path

import pytest
from helpers import load_bench_module

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "retrieval.py"


def load_bench():
    return load_bench_module("retrieval")


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
    pipeline = load_bench_module("pipeline")
    dataset, bad = tmp_path / "medqa.json", tmp_path / "results.json"
    dataset.write_text("{}")
    bad.write_text('{"pipeline": ')
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(["--dataset", str(dataset), "--out", str(bad), "--lm", "openai/never-called"])
    assert exit_.value.code == 2 and "is not a readable results file" in capsys.readouterr().err
    assert bad.read_text() == '{"pipeline": '


def test_milvus_bench_measures_every_engine_on_the_same_vectors_and_renders(tmp_path, tiny_corpus_file):
    """bench/milvus.py on 300 synthetic passages made from the tiny corpus, faiss and Milvus Lite (the server is left
    to `make bench`)."""
    module = load_bench_module("milvus")
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

    data = load_bench_module("scale_data")
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
    parity = load_bench_module("parity")
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
