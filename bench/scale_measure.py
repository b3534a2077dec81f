"""The scale bench's measurements of one dataset in this process, around the children's (``scale_children.py``).

:func:`measure_dataset` builds each index type (``types_for``) and BM25 in children, reads their memory figures
there, then times HCQR's retrieval step here (:func:`latency`), scores recall@15 against ``Flat``, sweeps ``nprobe`` /
``efSearch`` (untimed), runs a memory-mapped type again under a memory cap and compares the query runtimes' latency
and top-15 agreement with PyTorch's.
"""

from __future__ import annotations

import gc
import json
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import scale_targets  # noqa: E402  (PQ_BYTES_FRACTION read at call time: a test sets it for the cap)
from report import RECALL_K  # noqa: E402
from scale_children import capped_search, in_child, percentile, recall_of  # noqa: E402
from scale_data import real_queries  # noqa: E402
from scale_targets import AGREEMENT_TARGET  # noqa: E402


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
        cap = int(scale_targets.PQ_BYTES_FRACTION * out["types"]["Flat"]["index_file_bytes"])
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
