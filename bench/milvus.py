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
* ``N`` (e.g. ``1000000``): N synthetic passages made from the real
  passages and their real embeddings (``bench/scale_data.py``: new ids,
  recombined texts, mixed and noised vectors; no encoder runs), the same set
  ``bench/scale.py`` measures faiss on; searched with the same real queries.

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
# The local Milvus server (tests/support/milvus_server.py) is test support, shared with the tests: put tests/ last on
# the path so that `from support.milvus_server import ...` finds it and nothing of tests/ shadows a bench module.
sys.path.append(str(REPO / "tests"))
from report import RECALL_K, read_results, shown_path, write_results  # noqa: E402
from scale_data import DEFAULT_CORPUS, DEFAULT_WORK, load_real, real_queries, synthesize  # noqa: E402

HNSW = {"M": 32, "efConstruction": 80, "ef": 64}
ENGINES = ("faiss", "milvus-lite", "milvus-server")
INDEXES = ("exact", "hnsw")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


# -- datasets (bench/scale_data.py: the same real and synthetic sets as bench/scale.py) -------------------------
def real_dataset(corpus_path: str, n: int | None, work: Path):
    """The shared corpus (or a seeded slice of n passages), its embedding store and encoded queries."""
    from hcqr_dspy.retrieval import load_encoder

    corpus, store, info = load_real(corpus_path, work, n)
    triples, recall_queries = real_queries()
    encoder = load_encoder(None)
    info["source"] = shown_path(str(corpus_path))
    return corpus, store, [encoder.encode_queries(t) for t in triples], encoder.encode_queries(recall_queries), info


def synthetic_dataset(n: int, corpus_path: str, work: Path):
    """n synthetic passages made from the real ones (bench/scale_data.py), searched with the real queries."""
    from hcqr_dspy.retrieval import load_encoder

    real_corpus, real_store, _ = load_real(corpus_path, work)
    corpus, store, info = synthesize(n, real_corpus, real_store, work)
    triples, recall_queries = real_queries()
    encoder = load_encoder(None)
    return corpus, store, [encoder.encode_queries(t) for t in triples], encoder.encode_queries(recall_queries), info


# -- measuring one index ----------------------------------------------------------------------------------
def search_fuse_latency(index, triples, repeats: int) -> dict:
    from hcqr_dspy.retrieval import Hit, fuse

    index.search(triples[0], 5)  # warm-up
    times = []
    for i in range(repeats):
        q = triples[i % len(triples)]
        t0 = time.perf_counter()
        scores, rows = index.search(q, 5)
        fused = fuse(
            [[Hit(str(r), float(s)) for s, r in zip(srow, rrow) if r >= 0] for srow, rrow in zip(scores, rows)],
            budget=15,
        )
        times.append((time.perf_counter() - t0) * 1000)
        assert 5 <= len(fused) <= 15
    return {
        "search3_fuse_ms_p50": round(statistics.median(times), 2),
        "search3_fuse_ms_p95": round(percentile(times, 95), 2),
    }


def recall(index, queries, truth) -> float:
    k = truth.shape[1]
    _, rows = index.search(queries, k)
    return round(sum(len(set(t) & set(r[r >= 0])) / k for t, r in zip(truth, rows)) / len(truth), 4)


def build_one(engine: str, kind: str, corpus, store, work: Path, label: str) -> tuple[object, dict, object]:
    """Build one index from the embedding store; return (index, figures, server or None)."""
    from support.milvus_server import LocalMilvusServer

    from hcqr_dspy.retrieval import FaissIndex, MilvusIndex

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
        settings = {
            "uri": uri,
            "collection": f"bench_{kind}",
            "index_type": "FLAT" if kind == "exact" else "HNSW",
            "index_params": {} if kind == "exact" else {"M": HNSW["M"], "efConstruction": HNSW["efConstruction"]},
            "search_params": {} if kind == "exact" else {"ef": HNSW["ef"]},
        }
        index = MilvusIndex.build(store, show_progress=True, corpus=corpus, **settings)
        seconds = time.perf_counter() - t0
        size = dir_size(Path(uri)) if engine == "milvus-lite" else dir_size(server.data_dir / "data")
    figures = {
        "build_seconds": round(seconds, 2),
        "build_passages_per_second": round(len(corpus) / seconds, 1),
        "disk_bytes": size,
    }
    if engine != "faiss":
        figures["engine"] = index.collection.engine
    return index, figures, server


def measure_dataset(
    label: str,
    corpus,
    store,
    triples,
    recall_queries,
    info: dict,
    work: Path,
    repeats: int,
    engines: list[str],
    indexes: tuple[str, ...] = INDEXES,
) -> dict:
    from hcqr_dspy.retrieval import FaissIndex

    exact = FaissIndex.build(store, show_progress=False, factory="Flat")
    _, truth = exact.search(recall_queries, RECALL_K)
    out = {**info, "recall_queries": len(recall_queries), "runs": {}}
    for engine in engines:
        for kind in indexes:
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
    ap.add_argument(
        "--datasets",
        default="real,1000000",
        help="comma-separated: 'real' (the whole corpus), 'real:N' (a seeded slice) or N synthetic passages",
    )
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--indexes", default=",".join(INDEXES), help="index types per engine: exact, hnsw")
    ap.add_argument("--quick", action="store_true", help="real:5000 and 100000 synthetic, 20 repeats")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument(
        "--work", default=str(DEFAULT_WORK), help="folder of the prepared datasets (shared with bench/scale.py)"
    )
    ap.add_argument(
        "--pause-study",
        default=None,
        metavar="SCRIPT",
        help="a script taking stop|cont, run around each dataset's timed measurements",
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    from hcqr_dspy.retrieval.retriever_base import library_versions

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES):
        ap.error(f"--engines takes some of {', '.join(ENGINES)}")
    indexes = tuple(i.strip() for i in args.indexes.split(",") if i.strip())
    if not indexes or set(indexes) - set(INDEXES):
        ap.error(f"--indexes takes some of {', '.join(INDEXES)}")
    datasets = ["real:5000", "100000"] if args.quick else [d.strip() for d in args.datasets.split(",") if d.strip()]
    for d in datasets:
        if not (
            d == "real"
            or (d.startswith("real:") and d[5:].isdigit() and int(d[5:]) > 0)
            or (d.isdigit() and int(d) > 0)
        ):
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
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],  # the machine is shared: other work runs
        "quick": args.quick,
        "planned": datasets,
        "datasets": {},
        "versions": library_versions("hcqr-dspy", "faiss-cpu", "pymilvus", "milvus-lite", "numpy"),
    }
    section["versions"]["milvus (server package)"] = "2.3.5"
    repeats = 20 if args.quick else args.repeats
    previous = read_results(out).get("milvus") or {}
    if previous.get("quick") == args.quick:  # a run of other datasets keeps the ones measured before (each dated)
        kept = {k: v for k, v in previous.get("datasets", {}).items() if k not in datasets and "kind" in v}
        section["datasets"].update(kept)
        section["planned"] = [*kept, *datasets]
        section["study_paused_seconds"] = previous.get("study_paused_seconds", 0)
    prepared = Path(args.work)
    prepared.mkdir(parents=True, exist_ok=True)
    for d in datasets:
        if d.startswith("real"):
            data = real_dataset(args.corpus, int(d[5:]) if ":" in d else None, prepared)
        else:
            data = synthetic_dataset(int(d), args.corpus, prepared)
        work = Path(tempfile.mkdtemp(prefix="hcqr-bench-milvus-", dir=prepared))  # this run's indexes and servers
        if args.pause_study:
            subprocess.run([args.pause_study, "stop"], check=False)
        t0 = time.perf_counter()
        try:
            data[-1]["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
            data[-1]["study_paused"] = bool(args.pause_study)
            data[-1]["date"] = datetime.now(UTC).isoformat(timespec="seconds")
            section["datasets"][d] = measure_dataset(
                d, *data, work=work, repeats=repeats, engines=engines, indexes=indexes
            )
        finally:
            if args.pause_study:
                subprocess.run([args.pause_study, "cont"], check=False)
            if args.pause_study:  # only time the study was actually stopped counts
                section["study_paused_seconds"] = round(
                    section.get("study_paused_seconds", 0) + time.perf_counter() - t0, 1
                )
            shutil.rmtree(work, ignore_errors=True)
        write_results(out, section, key="milvus")  # after each dataset: an interrupted run keeps what it measured
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
