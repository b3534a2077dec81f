"""The scale bench's measurements that need a fresh process: ``python bench/scale_children.py KIND ARGS``.

A build's peak RSS, what ``load_index`` plus one search adds to RSS, the resident bytes of an index structure and a
search under a memory cap each need a process that did nothing before the measured step. Each child prints its
figures as one JSON line: :func:`in_child` runs one and reads them back, :func:`capped_search` runs the capped one
inside a cgroup v1 memory limit it makes. The ``/proc``, cgroup and page-cache helpers they read are here too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).parent))
from report import RECALL_K  # noqa: E402


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


def recall_of(truth, rows) -> float:
    """Mean recall@15 of hit rows (faiss row numbers, -1 = none) against Flat's rows for the same queries."""
    return round(sum(len(set(t) & set(r[r >= 0])) / RECALL_K for t, r in zip(truth, rows)) / len(truth), 4)


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
    """Run one child (``KIND ARGS``: see :data:`CHILDREN`) in a fresh process and return the figures it printed."""
    run = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"bench child {args} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


CHILDREN = {
    "build": child_build,
    "bm25": child_bm25,
    "load": child_load,
    "structure": child_structure,
    "capped": child_capped,
}


def main(argv: list[str]) -> int:
    kind, *rest = argv
    print(json.dumps(CHILDREN[kind](*rest)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
