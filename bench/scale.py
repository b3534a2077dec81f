"""Retrieval at scale: faiss index types at the real ~41k and a synthetic 1M corpus, \
query runtimes, MedCorp extrapolation.

Usage:
    python bench/scale.py [--datasets real,1000000] [--types Flat,HNSW,IVF-PQ,IVF-SQ8,IVF-PQ+refine,BM25] [--repeats 50]
                          [--runtimes torch,onnx,onnx-int8,openvino,openvino-bf16] [--quick] [--out bench/results.json]

Datasets (``bench/scale_data.py``): ``real`` is the shared corpus, embedded
once into the embedding store; ``N`` is N synthetic passages made from the
real passages and their real embeddings (new ids, recombined texts, mixed
and noised vectors; no encoder runs). Both are searched with the same real
queries: the retrieval bench's 8 HCQR-shaped triples (latency) and those 24
queries plus 100 MedQA-US questions (recall).

For each dataset and index type (``TYPES``: faiss ``index_factory`` strings
and their search options):

* build, in its own process, from the finished embeddings (nothing is
  encoded): seconds, passages/s, peak RSS of the build;
* bytes per passage of the index structure on disk (the faiss file) and in
  RAM (resident memory the index adds in a fresh process, read by the
  product's reader and searched once with every recall query: for the
  memory-mapped ``IVF-PQ+refine``, only the pages those searches touched);
* peak RSS of ``load_index`` plus one 3-query search in a fresh process
  (corpus included: the passage store is memory-mapped), against the target:
  at most 300 MB beyond the encoder's own footprint and the index structure's
  own bytes; the same for a BM25 index;
* p50 / p95 of HCQR's retrieval step (``search`` of 3 queries, k=5 each,
  fused to 15, query encoding included, PyTorch runtime);
* recall@15 against ``Flat`` on the real queries, and (untimed) by
  ``nprobe`` for IVF types and by ``efSearch`` for HNSW;
* memory-mapped types only (``IVF-PQ+refine``): every recall query searched
  again with the process's memory capped at 1/8 of Flat's index bytes (a
  cgroup v1 memory limit, the index file first evicted from the page cache,
  so every page the search needs is read and charged under the cap): recall,
  latency, peak charged memory and major page faults under the cap.

Query runtimes, side by side on the real corpus (``Flat`` and ``HNSW``):
p50 / p95 of the same step and of the query encoding alone, and the top-15
agreement of each runtime's hits with PyTorch's (mean share of common ids
over the recall queries); a runtime is kept only at 0.99 or more.

MedCorp extrapolation: RAM and disk for 54M passages per index type from
the measured bytes per passage (384-d all-MiniLM-L6-v2 vectors; MedCPT's
768-d would double Flat, HNSW and SQ8, not PQ's fixed code size).

Timed phases (builds, latencies) should run on an idle machine. Results are
merged into ``--out`` under ``scale`` after each dataset and rendered into
RESULTS.md; for each timed phase the load average at its start and the CPU
time other processes used during it are recorded. ``--types`` re-measures
some types of a dataset (``Flat``, the recall reference, always): the other
types keep their earlier figures, each dated.
``--quick``: a 5,000-passage real slice and 50,000 synthetic passages, 10
repeats.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from report import RECALL_K, beyond_structure_mb, read_results, write_results  # noqa: E402
from scale_data import DEFAULT_CORPUS, DEFAULT_WORK, load_real, real_queries, synthesize  # noqa: E402

MEDCORP_PASSAGES = 54_000_000  # MedCorp: PubMed 23.9M + Wikipedia 29.9M + StatPearls + Textbooks snippets (MedRAG)
RAM_BUDGET_GB = 16
RSS_OVERHEAD_TARGET_MB = 300
AGREEMENT_TARGET = 0.99
HNSW_RECALL_TARGET = 0.97
PQ_RECALL_TARGET = 0.90
PQ_BYTES_FRACTION = 1 / 8
LATENCY_TARGET_MS = 15.0


def types_for(n: int) -> dict[str, dict]:
    """Index types by name: faiss factory and search options, with IVF lists scaled to the corpus (~sqrt(n) x 1-2)."""
    nlist = 256 if n <= 100_000 else 1024
    nprobe = 16 if n <= 100_000 else 32
    return {
        "Flat": {"factory": "Flat", "search": {}},
        "HNSW": {"factory": "HNSW32", "search": {"efSearch": 128}},
        "IVF-PQ": {"factory": f"IVF{nlist},PQ96", "search": {"nprobe": nprobe}},
        "IVF-SQ8": {"factory": f"IVF{nlist},SQ8", "search": {"nprobe": nprobe}},
        # PQ codes searched in RAM, the top k x k_factor re-scored exactly from the memory-mapped full vectors
        "IVF-PQ+refine": {"factory": f"IVF{nlist},PQ96,RFlat", "search": {"nprobe": 64, "k_factor": 8}},
    }


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def proc_status(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> None:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``, proc(5))."""
    Path("/proc/self/clear_refs").write_text("5")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: every state but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (``os.times``)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory-controller folder when it is writable (a child cgroup can be made), else None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return folder if folder.is_dir() and os.access(folder, os.W_OK) else None
    return None


def evict_from_page_cache(path: Path) -> None:
    """Drop a file's cached pages (``posix_fadvise(POSIX_FADV_DONTNEED)``), so the next reads come from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- child processes ------------------------------------------------------------------------------------------
def child_build(store_folder: str, embeddings_root: str, factory: str, out: str) -> dict:
    """Build one faiss index from finished embeddings (fresh process: its peak RSS is the build's own)."""
    from hcqr_dspy.retrieval import DenseRetriever, PassageStore, load_encoder

    corpus = PassageStore.open(store_folder)
    encoder = load_encoder(None)
    t0 = time.perf_counter()
    retriever = DenseRetriever(
        corpus,
        encoder=encoder,
        backend_options={"factory": factory},
        embeddings_dir=embeddings_root,
        show_progress=False,
    )
    retriever.save(out)
    seconds = time.perf_counter() - t0
    assert retriever.build_stats["encoded_chunks"] == 0, "the benchmark's builds must encode nothing"
    return {
        "build_seconds": round(seconds, 2),
        "build_passages_per_second": round(len(corpus) / seconds, 1),
        "build_peak_rss_mb": round(proc_status("VmHWM"), 1),
    }


def child_bm25(store_folder: str, out: str) -> dict:
    from hcqr_dspy.retrieval import BM25Retriever, PassageStore

    corpus = PassageStore.open(store_folder)
    t0 = time.perf_counter()
    BM25Retriever(corpus, show_progress=False).save(out)
    seconds = time.perf_counter() - t0
    return {
        "build_seconds": round(seconds, 2),
        "build_passages_per_second": round(len(corpus) / seconds, 1),
        "build_peak_rss_mb": round(proc_status("VmHWM"), 1),
    }


def child_load(index: str, kind: str, search_options: str) -> dict:
    """RSS of ``load_index`` + one 3-query search in a fresh process, beyond the encoder's own footprint.

    Baseline: after the imports and (dense) after loading the encoder and embedding one query. Then the peak
    (VmHWM, reset at the baseline) through ``load_index`` and one fused search; the faiss structure's own
    resident bytes are measured apart (:func:`child_structure`).
    """
    import faiss  # noqa: F401  (imported before the baseline, as load_index would)
    from retrieval import TRIPLES

    from hcqr_dspy.retrieval import fuse, load_encoder, load_index

    if kind == "dense":
        load_encoder(None).encode_queries(["warm up"])
    baseline = proc_status("VmRSS")
    reset_peak_rss()
    t0 = time.perf_counter()
    retriever = load_index(index, search_options=json.loads(search_options))
    load_seconds = time.perf_counter() - t0
    fused = fuse(retriever.search(list(TRIPLES[0]), k=5), budget=15)
    assert fused
    peak = proc_status("VmHWM")
    out = {
        "baseline_rss_mb": round(baseline, 1),
        "load_search_peak_rss_mb": round(peak, 1),
        "load_search_added_mb": round(peak - baseline, 1),
        "load_seconds": round(load_seconds, 2),
    }
    return out


def child_structure(index: str, queries: str, search_options: str) -> dict:
    """Resident memory the index structure adds in a fresh process: read by the product's reader (memory-mapped
    for refine types), then after searching every recall query once (the pages a mapped index's searches touch)."""
    import faiss  # noqa: F401  (imported before the baseline)
    import numpy as np

    from hcqr_dspy.retrieval import read_manifest
    from hcqr_dspy.retrieval.vector_index import FaissIndex

    q = np.load(queries)
    before, anon, file = proc_status("VmRSS"), proc_status("RssAnon"), proc_status("RssFile")
    structure = FaissIndex.read(Path(index), read_manifest(index)["vector_index"])
    read_mb = proc_status("VmRSS") - before
    structure.set_search_options(json.loads(search_options))
    structure.search(q, RECALL_K)
    assert structure.ntotal > 0
    # resident = anonymous (the heap: what read_index copied) + file-backed (mapped pages, reclaimable page cache)
    return {
        "structure_read_mb": round(read_mb, 1),
        "structure_ram_mb": round(proc_status("VmRSS") - before, 1),
        "structure_anon_mb": round(proc_status("RssAnon") - anon, 1),
        "structure_file_mb": round(proc_status("RssFile") - file, 1),
        "memory_mapped": structure.describe()["memory_mapped"],
    }


def child_capped(index: str, queries: str, truth: str, search_options: str, cgroup: str) -> dict:
    """Search every recall query, one at a time, inside a memory-capped cgroup (made by the parent).

    The index file is evicted from the page cache first and the process joins the cgroup after its imports and
    before reading the index, so the structure, every page the searches fault in and the search buffers are all
    charged against the cap; past it the kernel reclaims page cache, and the process is killed if it cannot.
    """
    import resource

    import faiss  # noqa: F401  (imported before joining)
    import numpy as np

    from hcqr_dspy.retrieval import read_manifest
    from hcqr_dspy.retrieval.vector_index import FAISS_FILE, FaissIndex

    q, reference = np.load(queries), np.load(truth)
    record = read_manifest(index, verify_files=False)["vector_index"]  # (verifying would read the whole file first)
    evict_from_page_cache(Path(index) / FAISS_FILE)
    Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    structure = FaissIndex.read(Path(index), record)
    structure.set_search_options(json.loads(search_options))
    times, hits = [], []
    for i in range(len(q)):
        t0 = time.perf_counter()
        _, rows = structure.search(q[i : i + 1], RECALL_K)
        times.append((time.perf_counter() - t0) * 1000)
        hits.append(rows[0])
    return {
        "capped_recall": recall_of(reference, hits),
        "capped_query_ms_p50": round(statistics.median(times), 2),
        "capped_query_ms_p95": round(percentile(times, 95), 2),
        "capped_peak_mb": round(int(Path(cgroup, "memory.max_usage_in_bytes").read_text()) / 2**20, 1),
        "capped_limit_hits": int(Path(cgroup, "memory.failcnt").read_text()),
        "capped_major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults,
    }


def capped_search(index: Path, queries_file: Path, truth_file: Path, search_options: dict, cap_bytes: int) -> dict:
    """Run :func:`child_capped` under a cgroup v1 memory limit of ``cap_bytes``; the cgroup is removed after."""
    out = {"cap_mb": round(cap_bytes / 2**20, 1)}
    base = memory_cgroup()
    if base is None:
        return {**out, "capped_ok": False, "capped_error": "not measured: no writable cgroup v1 memory controller"}
    cgroup = base / f"hcqr-bench-capped-{os.getpid()}"
    try:
        cgroup.mkdir()
    except OSError as exc:
        return {
            **out,
            "capped_ok": False,
            "capped_error": f"not measured: cannot make a cgroup in {base} ({exc.strerror})",
        }
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(cap_bytes))
        run = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                "capped",
                str(index),
                str(queries_file),
                str(truth_file),
                json.dumps(search_options),
                str(cgroup),
            ],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            why = (
                "killed (out of memory under the cap)"
                if run.returncode == -9
                else (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
            )
            return {**out, "capped_ok": False, "capped_error": why}
        return {**out, "capped_ok": True, **json.loads(run.stdout.strip().splitlines()[-1])}
    finally:
        for _ in range(50):  # the child has exited; cgroup v1 moves its leftover page-cache charges to the parent
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            print(f"bench: could not remove the cgroup {cgroup}; remove it with rmdir", file=sys.stderr)


def in_child(*args: str) -> dict:
    run = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"bench child {args} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# -- measurements in this process -----------------------------------------------------------------------------
def latency(retriever, triples, repeats: int) -> dict:
    from hcqr_dspy.retrieval import fuse

    retriever.search(triples[0], k=5)  # warm-up
    times, encode = [], []
    for i in range(repeats):
        q = triples[i % len(triples)]
        t0 = time.perf_counter()
        fused = fuse(retriever.search(q, k=5), budget=15)
        times.append((time.perf_counter() - t0) * 1000)
        assert fused
        t0 = time.perf_counter()
        retriever.encoder.encode_queries(q, batch_size=len(q))
        encode.append((time.perf_counter() - t0) * 1000)
    return {
        "search3_fuse_ms_p50": round(statistics.median(times), 2),
        "search3_fuse_ms_p95": round(percentile(times, 95), 2),
        "encode3_ms_p50": round(statistics.median(encode), 2),
    }


def recall_of(truth, rows) -> float:
    """Mean recall@15 of hit rows (faiss row numbers, -1 = none) against Flat's rows for the same queries."""
    return round(sum(len(set(t) & set(r[r >= 0])) / RECALL_K for t, r in zip(truth, rows)) / len(truth), 4)


def recall(retriever, query_vectors, truth) -> float:
    return recall_of(truth, retriever.index.search(query_vectors, RECALL_K)[1])


def nprobe_sweep(index: Path, query_vectors, truth, options: dict | None = None) -> dict[str, float]:
    """recall@15 against Flat of an IVF index at nprobe = 1, 2, 4 ... up to every list (exhaustive over the lists),
    its other search options (a refine index's k_factor) kept."""
    import faiss

    from hcqr_dspy.retrieval import load_index

    retriever = load_index(index, search_options={k: v for k, v in (options or {}).items() if k != "nprobe"})
    nlist = faiss.extract_index_ivf(retriever.index.index).nlist
    out, nprobe = {}, 1
    while True:
        retriever.index.set_search_options({"nprobe": nprobe})
        out[str(nprobe)] = recall(retriever, query_vectors, truth)
        if nprobe >= nlist:
            return out
        nprobe = min(nprobe * 2, nlist)


def ef_sweep(index: Path, query_vectors, truth) -> dict[str, float]:
    """recall@15 against Flat of an HNSW index at efSearch = 16, 32 ... 1024."""
    from hcqr_dspy.retrieval import load_index

    retriever = load_index(index)
    out = {}
    for ef in (16, 32, 64, 128, 256, 512, 1024):
        retriever.index.set_search_options({"efSearch": ef})
        out[str(ef)] = recall(retriever, query_vectors, truth)
    return out


def add_sweeps(label: str, index: Path, m: dict, query_vectors, truth) -> None:
    """Add the recall-only sweeps that apply to a measured type ``m`` (by its search options): ``recall_by_nprobe``
    for IVF types, ``recall_by_efSearch`` for HNSW."""
    sweeps = {
        "nprobe": lambda: nprobe_sweep(index, query_vectors, truth, m["search_options"]),
        "efSearch": lambda: ef_sweep(index, query_vectors, truth),
    }
    for option, sweep in sweeps.items():
        if option in m["search_options"]:
            m[f"recall_by_{option}"] = sweep()
            print(
                f"bench: {label} {index.name} recall@{RECALL_K} by {option}: {m[f'recall_by_{option}']}",
                file=sys.stderr,
                flush=True,
            )


def agreement(reference_hits, hits) -> float:
    """Mean share of top-k ids two runs have in common, per query."""
    return round(
        sum(
            len({h.passage_id for h in a} & {h.passage_id for h in b}) / max(len(a), 1)
            for a, b in zip(reference_hits, hits)
        )
        / len(hits),
        4,
    )


def measure_dataset(
    label: str,
    corpus,
    store,
    info: dict,
    work: Path,
    repeats: int,
    types: list[str],
    runtimes: list[str],
    pause,
    earlier: dict | None = None,
) -> dict:
    """Measure ``types`` (``Flat`` always, ``BM25`` when listed) of one dataset; from ``earlier`` (this dataset's
    previous measurement) the types not listed keep their figures and dates, and the query runtimes theirs when
    ``runtimes`` is empty."""
    import numpy as np

    from hcqr_dspy.retrieval import load_encoder, load_index

    triples, recall_queries = real_queries()
    n = len(corpus)
    spec = types_for(n)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    earlier = earlier or {}
    kept = {
        name: {"date": earlier.get("date"), **m} for name, m in earlier.get("types", {}).items() if name not in types
    }
    keeps = kept or ("BM25" not in types and "bm25" in earlier) or (earlier.get("runtimes") and not runtimes)
    out = {
        "date": now,
        **info,
        "recall_queries": len(recall_queries),
        "types": {},  # earlier phases stay while their figures do
        "timed_phases": [{"date": earlier.get("date"), **p} for p in earlier.get("timed_phases", [])] if keeps else [],
    }
    folder = work / f"indexes-{label}"
    folder.mkdir(parents=True, exist_ok=True)
    dense = [t for t in spec if t in types]  # Flat first
    for name in dense + (["BM25"] if "BM25" in types else []):
        shutil.rmtree(folder / name, ignore_errors=True)
    store_folder, emb_root = str(corpus.folder), str(store.folder.parent)
    q_vectors = load_encoder(None).encode_queries(recall_queries)
    queries_file = folder / "recall-queries.npy"
    np.save(queries_file, q_vectors)
    with pause(out, f"{label}: builds"):
        for name in dense:
            print(f"bench: {label} build {name} ({spec[name]['factory']}) ...", file=sys.stderr, flush=True)
            out["types"][name] = {
                "date": now,
                "factory": spec[name]["factory"],
                "search_options": spec[name]["search"],
                **in_child("build", store_folder, emb_root, spec[name]["factory"], str(folder / name)),
            }
        if "BM25" in types:
            print(f"bench: {label} build BM25 ...", file=sys.stderr, flush=True)
            out["bm25"] = {"date": now, **in_child("bm25", store_folder, str(folder / "BM25"))}
    for name, m in out["types"].items():
        disk = (folder / name / "faiss.index").stat().st_size
        m.update(
            index_file_bytes=disk,
            disk_bytes_per_passage=round(disk / n, 1),
            **in_child("load", str(folder / name), "dense", json.dumps(spec[name]["search"])),
            **in_child("structure", str(folder / name), str(queries_file), json.dumps(spec[name]["search"])),
        )
        m["ram_bytes_per_passage"] = round(m["structure_ram_mb"] * 2**20 / n, 1)
    if "BM25" in types:
        bm25_bytes = dir_size(folder / "BM25" / "bm25")
        out["bm25"].update(
            index_bytes=bm25_bytes,
            disk_bytes_per_passage=round(bm25_bytes / n, 1),
            **in_child("load", str(folder / "BM25"), "bm25", "{}"),
        )
    elif "bm25" in earlier:
        out["bm25"] = {"date": earlier.get("date"), **earlier["bm25"]}
    out["passage_store_bytes"] = dir_size(Path(store_folder))
    flat = load_index(folder / "Flat")
    _, truth = flat.index.search(q_vectors, RECALL_K)
    truth_file = folder / "recall-truth.npy"
    np.save(truth_file, truth)
    with pause(out, f"{label}: search latency"):
        for name, m in out["types"].items():
            retriever = load_index(folder / name, search_options=spec[name]["search"])
            m.update(latency(retriever, triples, repeats))
            m[f"recall_at_{RECALL_K}"] = recall(retriever, q_vectors, truth)
            print(f"bench: {label} {name}: {json.dumps(m)}", file=sys.stderr, flush=True)
    del retriever  # a mapped index still open here would keep its pages cached (and uncharged) for the capped child
    gc.collect()
    mapped = [name for name, m in out["types"].items() if m["memory_mapped"]]
    if mapped:
        cap = int(PQ_BYTES_FRACTION * out["types"]["Flat"]["index_file_bytes"])
        with pause(out, f"{label}: memory-capped search"):
            for name in mapped:
                m = out["types"][name]
                m["capped"] = capped_search(folder / name, queries_file, truth_file, spec[name]["search"], cap)
                print(f"bench: {label} {name} capped: {json.dumps(m['capped'])}", file=sys.stderr, flush=True)
    for name, m in out["types"].items():  # recall only (untimed): what visiting more IVF lists / HNSW candidates buys
        add_sweeps(label, folder / name, m, q_vectors, truth)
    if "BM25" in types:
        out["bm25"].update(latency_bm25(folder / "BM25", triples, repeats))
    out["types"] = {name: out["types"].get(name) or kept[name] for name in spec if name in out["types"] or name in kept}
    if earlier.get("runtimes") and not (runtimes and info["kind"] == "real"):
        out["runtimes"] = earlier["runtimes"]
        out["runtimes_date"] = earlier.get("runtimes_date", earlier.get("date"))
    if runtimes and info["kind"] == "real":
        out["runtimes"], out["runtimes_date"] = {}, now
        reference = flat.search(recall_queries, RECALL_K)
        with pause(out, f"{label}: query runtimes"):
            for runtime in runtimes:
                for name in ("Flat", "HNSW"):
                    if name not in out["types"] or not (folder / name).is_dir():
                        continue
                    retriever = load_index(folder / name, search_options=spec[name]["search"], encoder_backend=runtime)
                    figures = latency(retriever, triples, repeats)
                    if name == "Flat":
                        figures["top15_agreement_with_torch"] = agreement(
                            reference, retriever.search(recall_queries, RECALL_K)
                        )
                        figures["kept"] = figures["top15_agreement_with_torch"] >= AGREEMENT_TARGET
                    out["runtimes"][f"{runtime} {name}"] = figures
                    print(
                        f"bench: {label} runtime {runtime} {name}: {json.dumps(figures)}", file=sys.stderr, flush=True
                    )
    return out


def latency_bm25(index: Path, triples, repeats: int) -> dict:
    from hcqr_dspy.retrieval import fuse, load_index

    retriever = load_index(index)
    retriever.search(triples[0], k=5)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fuse(retriever.search(triples[i % len(triples)], k=5), budget=15)
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "search3_fuse_ms_p50": round(statistics.median(times), 2),
        "search3_fuse_ms_p95": round(percentile(times, 95), 2),
    }


def medcorp(datasets: dict) -> dict:
    """RAM and disk for 54M passages per index type, from the largest measured dataset's bytes per passage."""
    label = max(datasets, key=lambda d: datasets[d]["passages"])
    d = datasets[label]
    out = {"from": label, "passages": MEDCORP_PASSAGES, "ram_budget_gb": RAM_BUDGET_GB, "types": {}}
    for name, m in d["types"].items():
        c = m.get("capped") or {}
        # a memory-mapped type that kept its recall under a memory cap needs at most the cap, whatever it left resident
        per_passage = (
            c["cap_mb"] * 2**20 / d["passages"]
            if c.get("capped_ok") and c["capped_major_faults"] > 0 and c["capped_recall"] >= m[f"recall_at_{RECALL_K}"]
            else m["ram_bytes_per_passage"]
        )
        ram = per_passage * MEDCORP_PASSAGES / 1e9
        out["types"][name] = {
            "ram_gb": round(ram, 1),
            "index_disk_gb": round(m["disk_bytes_per_passage"] * MEDCORP_PASSAGES / 1e9, 1),
            "fits": ram <= RAM_BUDGET_GB,
            "ram_from": "memory cap" if per_passage != m["ram_bytes_per_passage"] else "resident",
        }
    out["passage_store_disk_gb"] = round(d["passage_store_bytes"] / d["passages"] * MEDCORP_PASSAGES / 1e9, 1)
    if "bm25" in d:
        out["bm25_disk_gb"] = round(d["bm25"]["disk_bytes_per_passage"] * MEDCORP_PASSAGES / 1e9, 1)
    return out


def targets(section: dict) -> list[dict]:
    """Each target of issue 12 point 6 with the measured figure and whether it is met."""
    rows = []
    for label, d in section["datasets"].items():
        t = d["types"]
        if d["passages"] >= 1_000_000:
            for name, m in t.items():
                rows.append(
                    {
                        "target": f"{label}: load + search adds <= {RSS_OVERHEAD_TARGET_MB} MB beyond encoder and "
                        f"structure ({name}"
                        f"{', memory-mapped: only its heap bytes subtracted' if m.get('memory_mapped') else ''})",
                        "measured": f"{beyond_structure_mb(m)} MB",
                        "met": beyond_structure_mb(m) <= RSS_OVERHEAD_TARGET_MB,
                    }
                )
            added = d.get("bm25", {}).get(
                "load_search_added_mb"
            )  # memory-mapped: all of it counted, nothing subtracted
            rows.append(
                {
                    "target": f"{label}: load + search adds <= {RSS_OVERHEAD_TARGET_MB} MB beyond encoder and "
                    "structure (BM25, memory-mapped: all resident growth counted)",
                    "measured": f"{added} MB" if added is not None else "not measured",
                    "met": added is not None and added <= RSS_OVERHEAD_TARGET_MB,
                }
            )
        if "IVF-PQ" in t and "Flat" in t:
            frac = t["IVF-PQ"]["disk_bytes_per_passage"] / t["Flat"]["disk_bytes_per_passage"]
            rows.append(
                {
                    "target": f"{label}: IVF-PQ bytes/passage <= 1/8 of Flat",
                    "measured": f"1/{1 / frac:.1f}",
                    "met": frac <= PQ_BYTES_FRACTION,
                }
            )
            r = t["IVF-PQ"][f"recall_at_{RECALL_K}"]
            sweep = t["IVF-PQ"].get("recall_by_nprobe", {})
            best = max(sweep.items(), key=lambda kv: (kv[1], -int(kv[0])), default=None)
            at = t["IVF-PQ"]["search_options"].get("nprobe")
            measured = f"{r} at nprobe={at}" + (
                f"; best {best[1]} at nprobe={best[0]} of {max(map(int, sweep))}" if best else ""
            )
            rows.append(
                {
                    "target": f"{label}: IVF-PQ recall@15 >= {PQ_RECALL_TARGET}",
                    "measured": measured,
                    "met": max(r, best[1] if best else r) >= PQ_RECALL_TARGET,
                }
            )
        if "IVF-PQ+refine" in t and "Flat" in t:
            m = t["IVF-PQ+refine"]
            r = m[f"recall_at_{RECALL_K}"]
            disk = f"disk: {m['disk_bytes_per_passage'] / t['Flat']['disk_bytes_per_passage']:.2f} x Flat's"
            c = m.get("capped")
            if c and c["capped_ok"]:
                # the whole process's memory after its imports is capped at Flat's bytes / 8: structure, mapped pages
                # faulted in, search buffers; a run that keeps its recall under the cap needs no more RAM than that
                measured = (
                    f"all {d['recall_queries']} recall queries ran with the process capped at {c['cap_mb']} MB "
                    f"(1/8 of Flat's index bytes, cgroup memory limit; index file evicted from the page cache "
                    f"first): recall {c['capped_recall']} (uncapped {r}), peak charged {c['capped_peak_mb']} MB, "
                    f"{c['capped_major_faults']} major faults, {c['capped_query_ms_p50']} ms p50 per query; "
                    f"uncapped, the searches left {m['structure_ram_mb']} MB resident; {disk}"
                )
                met = c["capped_recall"] >= r and c["capped_major_faults"] > 0  # > 0: its pages were read under the cap
            else:
                frac = m["ram_bytes_per_passage"] / t["Flat"]["ram_bytes_per_passage"]
                measured = (
                    f"1/{1 / frac:.1f} (resident after the recall queries; of it {m['structure_anon_mb']} MB "
                    f"anonymous, {m['structure_file_mb']} MB mapped file pages; {disk}"
                    + (f"; capped run: {c['capped_error']}" if c else "")
                    + ")"
                )
                met = frac <= PQ_BYTES_FRACTION
            rows.append(
                {
                    "target": f"{label}: IVF-PQ with exact re-ranking from the memory-mapped vectors: RAM "
                    "bytes/passage <= 1/8 of Flat's",
                    "measured": measured,
                    "met": met,
                }
            )
            opts = ", ".join(f"{k}={v}" for k, v in m["search_options"].items())
            rows.append(
                {
                    "target": f"{label}: IVF-PQ with exact re-ranking: recall@15 >= {PQ_RECALL_TARGET}",
                    "measured": f"{r} at {opts}",
                    "met": r >= PQ_RECALL_TARGET,
                }
            )
        if "HNSW" in t:
            r = t["HNSW"][f"recall_at_{RECALL_K}"]
            sweep = t["HNSW"].get("recall_by_efSearch", {})
            best = min(((int(ef), v) for ef, v in sweep.items() if v >= HNSW_RECALL_TARGET), default=None)
            at = t["HNSW"]["search_options"].get("efSearch")
            measured = f"{r} at efSearch={at}" + (
                f"; {best[1]} at efSearch={best[0]}" if best and best[0] != at else ""
            )
            rows.append(
                {
                    "target": f"{label}: HNSW recall@15 >= {HNSW_RECALL_TARGET}",
                    "measured": measured,
                    "met": r >= HNSW_RECALL_TARGET or best is not None,
                }
            )
        if d["kind"] == "real":
            best = min(((f"{name} (torch)", m["search3_fuse_ms_p50"]) for name, m in t.items()), key=lambda x: x[1])
            for key, m in d.get("runtimes", {}).items():
                if (
                    m.get("kept")
                    or key.split()[0] == "torch"
                    or d["runtimes"].get(f"{key.split()[0]} Flat", {}).get("kept")
                ) and m["search3_fuse_ms_p50"] < best[1]:
                    best = (key, m["search3_fuse_ms_p50"])
            rows.append(
                {
                    "target": f"{label}: 3-query fused dense retrieval p50 <= {LATENCY_TARGET_MS} ms "
                    "(best kept setting)",
                    "measured": f"{best[1]} ms ({best[0]})",
                    "met": best[1] <= LATENCY_TARGET_MS,
                }
            )
    if section.get("medcorp"):
        fits = [n for n, m in section["medcorp"]["types"].items() if m["fits"]]
        rows.append(
            {
                "target": f"MedCorp (54M): an index type fits in <= {RAM_BUDGET_GB} GB RAM",
                "measured": ", ".join(f"{n} {section['medcorp']['types'][n]['ram_gb']} GB" for n in fits) or "none",
                "met": bool(fits),
            }
        )
    return rows


class Pauser:
    """Record each timed phase's load average at its start, its length and the CPU seconds other processes used
    during it (the machine's busy time less this process tree's); with ``--pause-study``, stop the lead's background
    study for the phase (``/work/logs/study-pause.sh stop``) and always resume it after."""

    def __init__(self, command: str | None):
        self.command = command
        self.paused_seconds = 0.0

    def __call__(self, out: dict, phase: str):
        pauser = self

        class Phase:
            def __enter__(self):
                if pauser.command:
                    subprocess.run([pauser.command, "stop"], check=False)
                    time.sleep(1)
                self.t0, self.busy, self.own = time.perf_counter(), busy_cpu_seconds(), own_cpu_seconds()
                from hcqr_dspy.evaluation.cpu_pressure import PressureWindow

                self.pressure = PressureWindow()
                out["timed_phases"].append(
                    {
                        "phase": phase,
                        "date": datetime.now(UTC).isoformat(timespec="seconds"),
                        "load_average_at_start": load_average(),
                        "study_paused": bool(pauser.command),
                    }
                )
                return self

            def __exit__(self, *exc):
                seconds = time.perf_counter() - self.t0
                other = (busy_cpu_seconds() - self.busy) - (own_cpu_seconds() - self.own)
                out["timed_phases"][-1].update(
                    seconds=round(seconds, 1),
                    other_cpu_seconds=round(max(other, 0.0), 1),
                    cpu_pressure=self.pressure.share(),  # the share of the phase some task waited for a CPU (PSI)
                )
                if pauser.command:
                    subprocess.run([pauser.command, "cont"], check=False)
                    pauser.paused_seconds += seconds
                return False

        return Phase()


def sweep_only(out: Path, work: Path, datasets: list[str]) -> int:
    """Add ``recall_by_nprobe`` / ``recall_by_efSearch`` to measured datasets from their saved indexes (untimed;
    nothing is rebuilt)."""
    from hcqr_dspy.retrieval import load_encoder, load_index

    section = read_results(out).get("scale") or {}
    _, recall_queries = real_queries()
    q_vectors = load_encoder(None).encode_queries(recall_queries)
    for d in datasets:
        measured = section.get("datasets", {}).get(d)
        folder = work / f"indexes-{d.replace(':', '-')}"
        if measured is None or not (folder / "Flat").is_dir():
            print(f"bench: {d} has no measurement in {out} or no indexes in {folder}", file=sys.stderr)
            return 2
        _, truth = load_index(folder / "Flat").index.search(q_vectors, RECALL_K)
        for name, m in measured["types"].items():
            add_sweeps(d, folder / name, m, q_vectors, truth)
    section["targets"] = targets(section)
    write_results(out, section, key="scale")
    return 0


def rederive(out: Path) -> int:
    """Recompute what is derived from the measured figures (MedCorp extrapolation, targets) and re-render."""
    section = read_results(out).get("scale")
    if not section:
        print(f"bench: {out} has no scale section", file=sys.stderr)
        return 2
    section["medcorp"] = medcorp(section["datasets"])
    section["targets"] = targets(section)
    write_results(out, section, key="scale")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument(
        "--datasets", default="real,1000000", help="comma-separated: 'real', 'real:N' (seeded slice) or N synthetic"
    )
    ap.add_argument(
        "--types",
        default="Flat,HNSW,IVF-PQ,IVF-SQ8,IVF-PQ+refine,BM25",
        help="types to (re-)measure; a dataset measured before keeps its other types' figures",
    )
    ap.add_argument(
        "--runtimes",
        default="torch,onnx,onnx-int8,openvino,openvino-bf16",
        help="query runtimes compared on the real corpus",
    )
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="real:5000 and 50000 synthetic, 10 repeats")
    ap.add_argument("--work", default=str(DEFAULT_WORK), help="folder of the prepared datasets and indexes (reused)")
    ap.add_argument(
        "--pause-study",
        default=None,
        metavar="SCRIPT",
        help="a script taking stop|cont, run around every timed phase (e.g. /work/logs/study-pause.sh)",
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument(
        "--sweep-only",
        action="store_true",
        help="only add recall@15 by nprobe to datasets already in --out, from their indexes kept in --work",
    )
    ap.add_argument(
        "--rederive",
        action="store_true",
        help="only recompute the MedCorp extrapolation and the targets from the figures in --out (nothing measured)",
    )
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        fn = {
            "build": child_build,
            "bm25": child_bm25,
            "load": child_load,
            "structure": child_structure,
            "capped": child_capped,
        }[kind]
        print(json.dumps(fn(*rest)))
        return 0
    from hcqr_dspy.retrieval.retriever_base import library_versions

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    if not types or set(types) - {*types_for(1), "BM25"} or "Flat" not in types:
        ap.error(f"--types takes Flat (the reference) and some of {', '.join([*types_for(1), 'BM25'])}")
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    datasets = ["real:5000", "50000"] if args.quick else [d.strip() for d in args.datasets.split(",") if d.strip()]
    for d in datasets:
        if not (d == "real" or (d.startswith("real:") and d[5:].isdigit()) or d.isdigit()):
            ap.error(f"--datasets: {d!r} is not 'real', 'real:N' or N")
    if not Path(args.corpus).exists():
        print(f"bench: corpus {args.corpus} is absent: set HCQR_SHARED_DATA or pass --corpus", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        read_results(out)
    except ValueError as exc:
        ap.error(str(exc))
    repeats = 10 if args.quick else args.repeats
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pause = Pauser(args.pause_study)
    section = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "quick": args.quick,
        "planned": datasets,
        "datasets": {},
        "versions": library_versions(
            "hcqr-dspy", "faiss-cpu", "bm25s", "sentence-transformers", "torch", "onnxruntime", "openvino", "numpy"
        ),
    }
    previous = read_results(out).get("scale") or {}
    earlier = previous.get("datasets", {}) if previous.get("quick") == args.quick else {}
    if previous.get("quick") == args.quick:  # a run of other datasets keeps the ones measured before (each dated)
        kept = {k: v for k, v in previous.get("datasets", {}).items() if k not in datasets}
        section["datasets"].update(kept)
        section["planned"] = [*kept, *datasets]
        section["study_paused_seconds"] = previous.get("study_paused_seconds", 0)
    if args.sweep_only:
        return sweep_only(out, work, datasets)
    if args.rederive:
        return rederive(out)
    real = None
    for d in datasets:
        if d.startswith("real"):
            real = load_real(args.corpus, work, int(d[5:]) if ":" in d else None)
            corpus, store, info = real
        else:
            if real is None or real[0].folder is None or len(real[0]) < 1000:
                real = load_real(args.corpus, work)
            corpus, store, info = synthesize(int(d), real[0], real[1], work)
        section["datasets"][d] = {
            **measure_dataset(
                d.replace(":", "-"),
                corpus,
                store,
                info,
                work,
                repeats,
                types,
                runtimes if d.startswith("real") else [],
                pause,
                earlier.get(d),
            )
        }
        before = list(previous.get("datasets", {}))  # a re-measured dataset keeps its place in the report
        place = lambda label, before=before: before.index(label) if label in before else len(before)  # noqa: E731
        section["datasets"] = dict(sorted(section["datasets"].items(), key=lambda kv: place(kv[0])))
        section["planned"] = sorted(section["planned"], key=place)
        section["medcorp"] = medcorp(section["datasets"])
        section["targets"] = targets(section)
        section["study_paused_seconds"] = round(section.get("study_paused_seconds", 0) + pause.paused_seconds, 1)
        pause.paused_seconds = 0.0
        write_results(out, section, key="scale")  # after each dataset: an interrupted run keeps what it measured
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
