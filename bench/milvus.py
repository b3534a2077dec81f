"""Milvus benchmark: Milvus Lite and a Milvus server against faiss, on the same passage vectors.

Usage:
    python bench/milvus.py [--datasets real,1000000] [--quick] [--repeats 50] [--out bench/results.json]

Datasets:

* ``real``: all ~41k shared passages (``../shared/data/corpus``, repeated ids
  renamed), embedded once with the packaged all-MiniLM-L6-v2 into the
  embedding store (``$HCQR_EMBEDDINGS`` or ``~/.cache/hcqr-dspy/embeddings``;
  about 30 minutes on 2 cores the first time, reused afterwards). Queries:
  the retrieval bench's 8 HCQR-shaped triples (latency) and those 24 queries
  plus 100 MedQA-US questions (recall).
* ``N`` (e.g. ``1000000``): N synthetic passages whose vectors are seeded
  random unit vectors (384-d, Gaussian then normalized), written straight
  into a temporary embedding store (no encoder runs); queries are 100 more
  such vectors (latency triples: consecutive threes of them). Random vectors
  are a hard case for approximate search: their recall is a floor, not what
  text embeddings get.

For each dataset, each engine (faiss, Milvus Lite 3.x embedded, PyPI's
Milvus 2.3.5 standalone server on 127.0.0.1 from ``.venv-milvus``, one fresh
server per build) and each index type (exact: faiss ``Flat`` / Milvus
``FLAT``; graph: faiss ``HNSW32`` / Milvus ``HNSW`` M=32, efConstruction=80,
searched with efSearch / ef = 64, the retrieval bench's settings):

* build passages/s from finished embeddings (insert + index + load; the
  encoding is shared by all and timed once for ``real``);
* p50 / p95 of HCQR's retrieval step on query vectors: one batched search of
  3 queries, k=5 each, fused to 15 (``fuse``, score sum) — the encoder's own
  query time (the same for every engine) is left out;
* recall@15 against exact search (faiss ``Flat`` over the same vectors);
* disk size: the faiss index file; the Milvus Lite ``.db`` folder; the
  server's data folder (etcd, RocksMQ and the segments).

Results are merged into ``--out`` under ``milvus`` after each dataset and
rendered into RESULTS.md. ``--quick``: a 5,000-passage real slice and 100,000
synthetic passages, 20 repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from report import RECALL_K, read_results, shown_path, write_results  # noqa: E402

SHARED_DATA = Path(os.environ.get("HCQR_SHARED_DATA", REPO.parent / "shared" / "data"))
DEFAULT_CORPUS = SHARED_DATA / "corpus"
HNSW = {"M": 32, "efConstruction": 80, "ef": 64}
DIM = 384
SYNTHETIC_CHUNK = 65_536
ENGINES = ("faiss", "milvus-lite", "milvus-server")
INDEXES = ("exact", "hnsw")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


# -- datasets ---------------------------------------------------------------------------------------------
def real_dataset(corpus_path: str, n: int | None, work: Path):
    """The shared corpus (or a seeded slice of n passages), its embedding store and encoded queries."""
    from retrieval import TRIPLES, benchmark_queries

    from hcqr_dspy.retrieval import EmbeddingStore, PassageStore, load_corpus, load_encoder
    from hcqr_dspy.retrieval.store import Passage

    corpus = load_corpus(corpus_path, duplicate_ids="rename", store=work / "real-store")
    if n is not None and n < len(corpus):
        rows = sorted(random.Random(0).sample(range(len(corpus)), n))
        corpus = PassageStore.build(((Passage(p.id, p.title, p.content), f"row {r}") for r in rows for p in [corpus[r]]),
                                    work / "slice-store", source=f"{corpus.source} (seeded slice of {n})")
    encoder = load_encoder(None)
    store = EmbeddingStore.open(corpus, encoder)
    t0 = time.perf_counter()
    filled = store.fill(corpus, encoder, show_progress=True)
    encode_seconds = time.perf_counter() - t0
    triples = [encoder.encode_queries(list(t)) for t in TRIPLES]
    recall_queries = encoder.encode_queries(benchmark_queries())
    info = {"passages": len(corpus), "kind": "real", "source": shown_path(str(corpus_path)),
            "encoder": encoder.spec.name, "encoded_chunks": filled["encoded_chunks"],
            "reused_chunks": filled["reused_chunks"]}
    if filled["encoded_chunks"] == store.n_chunks:
        info["encode_passages_per_second"] = round(len(corpus) / encode_seconds, 1)
    return corpus, store, triples, recall_queries, info


def synthetic_dataset(n: int, work: Path):
    """n synthetic passages with seeded random unit vectors in a temporary embedding store."""
    import numpy as np

    from hcqr_dspy.retrieval import EmbeddingStore, PassageStore, load_encoder
    from hcqr_dspy.retrieval.store import Passage

    corpus = PassageStore.build(((Passage(f"syn-{i}", "", f"synthetic passage {i}"), f"synthetic {i}") for i in range(n)),
                                work / "synthetic-store", source=f"synthetic ({n} passages)")
    # The store is keyed by an encoder's passage side; the packaged one (384-d) names it. Its vectors are random.
    store = EmbeddingStore.open(corpus, load_encoder(None), root=work / "synthetic-embeddings", chunk_size=SYNTHETIC_CHUNK)
    for i in range(store.n_chunks):
        start, stop = store.chunk_rows(i)
        v = np.random.default_rng(i).standard_normal((stop - start, DIM)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        store._write_chunk(i, v)
    q = np.random.default_rng(10**6).standard_normal((102, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    triples = [q[i:i + 3] for i in range(0, 99, 3)]
    return corpus, store, triples, q[:100], {"passages": n, "kind": "synthetic", "vectors": "seeded random unit, 384-d"}


# -- measuring one index ----------------------------------------------------------------------------------
def search_fuse_latency(index, triples, repeats: int) -> dict:
    from hcqr_dspy.retrieval import Hit, fuse

    index.search(triples[0], 5)  # warm-up
    times = []
    for i in range(repeats):
        q = triples[i % len(triples)]
        t0 = time.perf_counter()
        scores, rows = index.search(q, 5)
        fused = fuse([[Hit(str(r), float(s)) for s, r in zip(srow, rrow) if r >= 0] for srow, rrow in zip(scores, rows)],
                     budget=15)
        times.append((time.perf_counter() - t0) * 1000)
        assert 5 <= len(fused) <= 15
    return {"search3_fuse_ms_p50": round(statistics.median(times), 2), "search3_fuse_ms_p95": round(percentile(times, 95), 2)}


def recall(index, queries, truth) -> float:
    k = truth.shape[1]
    _, rows = index.search(queries, k)
    return round(sum(len(set(t) & set(r[r >= 0])) / k for t, r in zip(truth, rows)) / len(truth), 4)


def build_one(engine: str, kind: str, corpus, store, work: Path, label: str) -> tuple[object, dict, object]:
    """Build one index from the embedding store; return (index, figures, server or None)."""
    from hcqr_dspy.retrieval import FaissIndex, MilvusIndex
    from hcqr_dspy.retrieval.milvus_server import LocalMilvusServer

    server = None
    t0 = time.perf_counter()
    if engine == "faiss":
        if kind == "exact":
            index = FaissIndex.build(store, show_progress=False, factory="Flat")
        else:  # built here so that efConstruction is 80 as in Milvus (the factory string would leave faiss's 40)
            import faiss
            import numpy as np

            graph = faiss.IndexHNSWFlat(store.dimension, HNSW["M"], faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efConstruction = HNSW["efConstruction"]
            for _, chunk in store.iter_chunks():
                graph.add(np.ascontiguousarray(chunk, dtype=np.float32))
            index = FaissIndex(graph, f"HNSW{HNSW['M']}")
            index.set_search_options({"efSearch": HNSW["ef"]})
        seconds = time.perf_counter() - t0
        folder = work / f"faiss-{label}-{kind}"
        folder.mkdir()
        index.write(folder)
        size = dir_size(folder)
    else:
        if engine == "milvus-lite":
            uri = str(work / f"lite-{label}-{kind}.db")
        else:
            server = LocalMilvusServer(data_dir=work / f"server-{label}-{kind}")
            uri = server.start()
            t0 = time.perf_counter()
        settings = {"uri": uri, "collection": f"bench_{kind}", "index_type": "FLAT" if kind == "exact" else "HNSW",
                    "index_params": {} if kind == "exact" else {"M": HNSW["M"], "efConstruction": HNSW["efConstruction"]},
                    "search_params": {} if kind == "exact" else {"ef": HNSW["ef"]}}
        index = MilvusIndex.build(store, show_progress=True, corpus=corpus, **settings)
        seconds = time.perf_counter() - t0
        size = dir_size(Path(uri)) if engine == "milvus-lite" else dir_size(server.data_dir / "data")
    figures = {"build_seconds": round(seconds, 2), "build_passages_per_second": round(len(corpus) / seconds, 1),
               "disk_bytes": size}
    if engine != "faiss":
        figures["engine"] = index.collection.engine
    return index, figures, server


def measure_dataset(label: str, corpus, store, triples, recall_queries, info: dict, work: Path, repeats: int,
                    engines: list[str]) -> dict:
    from hcqr_dspy.retrieval import FaissIndex

    exact = FaissIndex.build(store, show_progress=False, factory="Flat")
    _, truth = exact.search(recall_queries, RECALL_K)
    out = {**info, "recall_queries": len(recall_queries), "runs": {}}
    for engine in engines:
        for kind in INDEXES:
            name = f"{engine} {kind}"
            print(f"bench: {label} {name} ...", file=sys.stderr, flush=True)
            index, figures, server = build_one(engine, kind, corpus, store, work, label)
            try:
                figures.update(search_fuse_latency(index, triples, repeats))
                figures[f"recall_at_{RECALL_K}"] = recall(index, recall_queries, truth)
            finally:
                if engine != "faiss":
                    index.collection.close()
                if server is not None:
                    server.stop()
            out["runs"][name] = figures
            print(f"bench: {label} {name}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--datasets", default="real,1000000",
                    help="comma-separated: 'real' (the whole corpus), 'real:N' (a seeded slice) or N synthetic passages")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--quick", action="store_true", help="real:5000 and 100000 synthetic, 20 repeats")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    from hcqr_dspy.retrieval.base import library_versions

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES):
        ap.error(f"--engines takes some of {', '.join(ENGINES)}")
    datasets = ["real:5000", "100000"] if args.quick else [d.strip() for d in args.datasets.split(",") if d.strip()]
    for d in datasets:
        if not (d == "real" or (d.startswith("real:") and d[5:].isdigit() and int(d[5:]) > 0) or (d.isdigit() and int(d) > 0)):
            ap.error(f"--datasets: {d!r} is not 'real', 'real:N' or a positive N")
    if any(d.startswith("real") for d in datasets) and not Path(args.corpus).exists():
        print(f"bench: corpus {args.corpus} is absent: set HCQR_SHARED_DATA or pass --corpus", file=sys.stderr)
        return 2
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    out = Path(args.out)
    try:
        read_results(out)
    except ValueError as exc:
        ap.error(str(exc))
    section = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],  # the machine is shared: other work runs
        "quick": args.quick, "planned": datasets, "datasets": {},
        "versions": library_versions("hcqr-dspy", "faiss-cpu", "pymilvus", "milvus-lite", "numpy"),
    }
    section["versions"]["milvus (server package)"] = "2.3.5"
    repeats = 20 if args.quick else args.repeats
    for d in datasets:
        work = Path(tempfile.mkdtemp(prefix="hcqr-bench-milvus-"))
        try:
            if d.startswith("real"):
                n = int(d[5:]) if ":" in d else None
                data = real_dataset(args.corpus, n, work)
            else:
                data = synthetic_dataset(int(d), work)
            section["datasets"][d] = measure_dataset(d, *data, work=work, repeats=repeats, engines=engines)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_results(out, section, key="milvus")  # after each dataset: an interrupted run keeps what it measured
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
