"""bench/scale.py on a small synthetic dataset: every index type measured in its own children and rendered."""

import json
import sys

import pytest
from helpers import load_bench_module

from hcqr_dspy.evaluation.cpu_pressure import cpu_stall_us

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)


def test_scale_bench_measures_types_and_renders_targets(tmp_path, tiny_corpus_file, monkeypatch):
    """bench/scale.py on 3,000 synthetic passages (Flat, HNSW, IVF-SQ8, IVF-PQ+refine, BM25; the real corpus and plain
    IVF-PQ are left to `make bench`), then Flat and refine alone again: the other types keep their figures."""
    module = load_bench_module("scale")
    target_constants = sys.modules["scale_targets"]  # as bench/scale.py imported it: the cap and the targets read it
    out = tmp_path / "results.json"
    # at 3,000 passages 1/8 of Flat (0.55 MB) is below faiss's own tables; the cap's mechanics are what is tested here
    monkeypatch.setattr(target_constants, "PQ_BYTES_FRACTION", 2.0)
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
    if cpu_stall_us() is None:  # no PSI here: nothing measured, never a guess
        assert all(p["cpu_pressure"] is None for p in phases.values())
    else:
        assert all(0 <= p["cpu_pressure"] <= 1 for p in phases.values())
        assert "CPU contention " in (tmp_path / "RESULTS.md").read_text()
    report = (tmp_path / "RESULTS.md").read_text()
    assert "IVF-PQ with exact re-ranking: recall@15 >= 0.9" in report and "| 3,000 synthetic | HNSW | 16: " in report
    assert "| 3,000 synthetic | IVF-SQ8 | 256 | 1: " in report
    assert "| 3,000 synthetic | Flat | `Flat` |" in report and "### MedCorp extrapolation" in report
    assert "HNSW recall@15 >= 0.97" in report
    if capped["capped_ok"]:
        assert "| 3,000 synthetic | IVF-PQ+refine | " + f"{cap_mb} | {capped['capped_peak_mb']} |" in report

    # again, Flat and refine only, with a cap too small for the index: the process is killed and that is recorded
    monkeypatch.setattr(target_constants, "PQ_BYTES_FRACTION", 1e-4)
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
