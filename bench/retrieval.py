"""Retrieval benchmark: index build cost and growth with corpus size, fused 3-query search latency, exact vs HNSW.

Usage:
    python bench/retrieval.py [--corpus PATH] [--sizes 1000,10000,full] [--quick] [--out bench/results.json]

For each corpus size (seeded random slices of the real corpus, and the whole
of it), in order:

* index build, each in its own process (so that its peak RSS is its own):
  BM25 and dense build seconds, passages/s, peak RSS, index size; for dense
  also the encoder's raw ``SentenceTransformer.encode`` throughput on the same
  passages (same batch size, normalized), and the build/raw ratio (1.0 = the
  index adds nothing over encoding);
* HCQR's retrieval step for dense, BM25 and hybrid (RRF of the two): one
  batched ``search([q1, q2, q3], k=5)`` + ``fuse(budget=15)``, encoder loaded,
  p50/p95 over ``--repeats`` query triples;
* faiss exact (``IndexFlatIP``) against approximate HNSW
  (``IndexHNSWFlat``, M=32, efConstruction=80, efSearch=64, inner product):
  HNSW build seconds, search latency, and recall@15 of HNSW against exact
  over the benchmark's queries plus 100 MedQA-US questions.

Results are merged into ``--out`` under ``retrieval`` and rendered to RESULTS.md
(with bench/pipeline.py's section when present) after each corpus size, so an
interrupted run keeps the sizes it finished (marked partial). ``--quick``
measures the 1k slice only with 20 repeats; ``--render`` only re-renders
RESULTS.md from ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
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
from report import HNSW, RECALL_K, read_results, render, shown_path, write_results  # noqa: E402

SHARED_DATA = Path(os.environ.get("HCQR_SHARED_DATA", REPO.parent / "shared" / "data"))
DEFAULT_CORPUS = SHARED_DATA / "corpus"
BATCH_SIZE = 64

# Query triples shaped like HCQR's (support, distinction, key features), written here.
TRIPLES = [
    (
        "digoxin toxicity visual changes hyperkalemia",
        "digoxin toxicity versus hypokalemia arrhythmia",
        "yellow vision nausea elderly heart failure",
    ),
    (
        "Graves disease TSH receptor antibody",
        "Graves disease versus toxic multinodular goiter",
        "exophthalmos pretibial myxedema tremor",
    ),
    (
        "iron deficiency anemia low ferritin",
        "iron deficiency versus anemia of chronic disease",
        "microcytic anemia menorrhagia fatigue",
    ),
    (
        "myasthenia gravis acetylcholine receptor",
        "myasthenia gravis versus Lambert-Eaton syndrome",
        "ptosis diplopia worse end of day",
    ),
    (
        "Kawasaki disease coronary aneurysm",
        "Kawasaki disease versus scarlet fever",
        "fever conjunctivitis strawberry tongue child",
    ),
    (
        "nephrotic syndrome minimal change disease",
        "minimal change versus membranous nephropathy",
        "periorbital edema proteinuria child",
    ),
    (
        "vitamin B12 deficiency neurologic signs",
        "B12 versus folate deficiency methylmalonic acid",
        "macrocytic anemia paresthesia vegan",
    ),
    (
        "pheochromocytoma catecholamine metanephrines",
        "pheochromocytoma versus carcinoid syndrome",
        "episodic headache sweating palpitations hypertension",
    ),
]


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def peak_rss_mb() -> float:
    """This process's peak resident set size, MB.

    On Linux it is ``VmHWM`` of ``/proc/self/status``: the high-water mark of
    this process's own memory map. ``getrusage(RUSAGE_SELF).ru_maxrss`` is not
    used there because Linux carries it over from the parent through fork and
    exec, so a child started by a parent holding 1 GB would report at least
    1 GB (proc(5), getrusage(2)). Elsewhere, ``ru_maxrss`` (KB on Linux-like
    systems; bytes on macOS, converted).
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


# -- child processes ------------------------------------------------------------------------------
def child_build(corpus_file: str, kind: str, out: str) -> dict:
    """Build one index (in a fresh process) and report its cost."""
    from hcqr_dspy.retrieval import build_retriever, load_corpus

    corpus = load_corpus(corpus_file)
    with tempfile.TemporaryDirectory() as embeddings:  # fresh: the build encodes every passage, none reused
        t0 = time.perf_counter()
        options = {"batch_size": BATCH_SIZE, "embeddings_dir": embeddings} if kind == "dense" else {}
        retriever = build_retriever(corpus, kind, show_progress=False, **options)
        seconds = time.perf_counter() - t0
    retriever.save(out)
    return {
        "build_seconds": round(seconds, 2),
        "passages_per_second": round(len(corpus) / seconds, 1),
        "peak_rss_mb": peak_rss_mb(),
        "index_bytes": dir_size(Path(out)),
    }


def child_raw_encode(corpus_file: str) -> dict:
    """The encoder's own throughput on the same passage texts the dense index encodes."""
    from hcqr_dspy.retrieval import load_corpus
    from hcqr_dspy.retrieval.encoder import load_encoder

    corpus = load_corpus(corpus_file)
    model = load_encoder(None).model
    texts = list(corpus.texts())
    t0 = time.perf_counter()
    model.encode(
        texts, batch_size=BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    seconds = time.perf_counter() - t0
    return {"raw_encode_seconds": round(seconds, 2), "raw_passages_per_second": round(len(texts) / seconds, 1)}


def in_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bench child {args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- measurements in this process -----------------------------------------------------------------
def latency(retriever, repeats: int) -> dict:
    from hcqr_dspy.retrieval import fuse

    retriever.search(list(TRIPLES[0]), k=5)  # warm-up
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fused = fuse(retriever.search(list(TRIPLES[i % len(TRIPLES)]), k=5), budget=15)
        times.append((time.perf_counter() - t0) * 1000)
        assert len(fused) <= 15  # (a tiny corpus may hold no hit for a triple: still a timed search)
    return {
        "search3_fuse_ms_p50": round(statistics.median(times), 2),
        "search3_fuse_ms_p95": round(percentile(times, 95), 2),
    }


def exact_vs_hnsw(dense, queries: list[str], repeats: int) -> dict:
    """Recall@15 of an HNSW index against the exact one, on the same embeddings; build and search costs."""
    import faiss
    import numpy as np

    exact = dense.index.index  # the faiss IndexFlatIP inside the dense retriever's vector index
    emb = exact.reconstruct_n(0, exact.ntotal)
    t0 = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(emb.shape[1], HNSW["M"], faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = HNSW["efConstruction"]
    hnsw.add(emb)
    build = time.perf_counter() - t0
    hnsw.hnsw.efSearch = HNSW["efSearch"]
    q = dense.encoder.encode_queries(queries, batch_size=BATCH_SIZE)
    k = min(RECALL_K, exact.ntotal)
    _, truth = exact.search(q, k)
    _, approx = hnsw.search(q, k)
    recall = float(np.mean([len(set(t) & set(a)) / k for t, a in zip(truth, approx)]))
    timings = {}
    for name, index in (("exact", exact), ("hnsw", hnsw)):
        times = []
        for i in range(repeats):
            batch = q[(3 * i) % len(q) : (3 * i) % len(q) + 3]
            t0 = time.perf_counter()
            index.search(batch, 5)
            times.append((time.perf_counter() - t0) * 1000)
        timings[f"{name}_search3_ms_p50"] = round(statistics.median(times), 3)
    return {
        "hnsw": dict(HNSW),
        "hnsw_build_seconds": round(build, 2),
        "queries": len(queries),
        f"recall_at_{RECALL_K}": round(recall, 4),
        **timings,
    }


def benchmark_queries() -> list[str]:
    queries = [q for t in TRIPLES for q in t]
    medqa = SHARED_DATA / "benchmark" / "medqa.json"
    if medqa.is_file():
        rows = json.loads(medqa.read_text())
        queries += [rows[k]["question"] for k in sorted(rows)[:100]]
    return queries


def measure_size(passages, label: str, workdir: Path, repeats: int) -> dict:
    from hcqr_dspy.retrieval import HybridRetriever, load_index

    folder = workdir / label
    folder.mkdir(parents=True, exist_ok=True)
    corpus_file = folder / "corpus.jsonl"
    with corpus_file.open("w", encoding="utf-8") as fh:
        for p in passages:
            fh.write(json.dumps({"id": p.id, "title": p.title, "content": p.content}) + "\n")
    out: dict = {"passages": len(passages), "retrievers": {}}
    for kind in ("bm25", "dense"):
        print(f"bench: {label} {kind} build ...", file=sys.stderr, flush=True)
        out["retrievers"][kind] = in_child("build", str(corpus_file), kind, str(folder / kind))
    print(f"bench: {label} raw encode ...", file=sys.stderr, flush=True)
    raw = in_child("raw", str(corpus_file))
    dense_m = out["retrievers"]["dense"]
    dense_m.update(raw, build_over_raw=round(dense_m["passages_per_second"] / raw["raw_passages_per_second"], 3))
    bm25 = load_index(folder / "bm25")
    dense = load_index(folder / "dense", corpus=bm25.corpus)
    for kind, retriever in (("bm25", bm25), ("dense", dense), ("hybrid", HybridRetriever([dense, bm25]))):
        out["retrievers"].setdefault(kind, {}).update(latency(retriever, repeats))
    out["ann"] = exact_vs_hnsw(dense, benchmark_queries(), repeats)
    print(json.dumps({label: out}), file=sys.stderr, flush=True)
    return out


def parse_sizes(text: str) -> list[str]:
    """``"1000,10000,full"`` -> ``["1000", "10000", "full"]``; each a positive integer or ``full``.

    Raises:
        ValueError: an empty, zero, negative or non-numeric size.
    """
    sizes = [s.strip() for s in text.split(",")]
    for size in sizes:
        if size != "full" and not (size.isdigit() and int(size) > 0):
            raise ValueError(
                f"--sizes {text!r}: each size must be a positive number of passages or 'full', got {size!r}"
            )
    return list(dict.fromkeys(sizes))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--sizes", default="1000,10000,full", help="comma-separated slice sizes; 'full' = the whole corpus")
    ap.add_argument("--quick", action="store_true", help="the 1k slice only, 20 repeats")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument("--render", action="store_true", help="only re-render RESULTS.md from --out")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.render:
        out = Path(args.out)
        if not out.is_file():
            print(
                f"bench: {out} is {'a folder' if out.is_dir() else 'absent'}: "
                "pass the results file (run the benchmark first)",
                file=sys.stderr,
            )
            return 2
        try:
            results = read_results(out)
            if not any(results.get(k) for k in ("retrieval", "pipeline")):
                raise ValueError(f"{out} holds no retrieval or pipeline results")
            report = render(results)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            print(
                f"bench: cannot render {out}: "
                f"{exc if isinstance(exc, ValueError) else f'not written by this bench ({exc!r})'}",
                file=sys.stderr,
            )
            return 2
        out.with_name("RESULTS.md").write_text(report)
        print(f"bench: re-rendered {out.with_name('RESULTS.md')}", file=sys.stderr)
        return 0
    if args.child:
        kind, *rest = args.child
        print(json.dumps(child_build(*rest) if kind == "build" else child_raw_encode(*rest)))
        return 0
    if not Path(args.corpus).exists():
        print(
            f"bench: corpus {args.corpus} is absent: set HCQR_SHARED_DATA to the shared data folder or pass --corpus",
            file=sys.stderr,
        )
        return 2
    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.retrieval import load_corpus
    from hcqr_dspy.retrieval.retriever_base import library_versions

    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        sizes = ["1000"] if args.quick else parse_sizes(args.sizes)
        read_results(Path(args.out))  # an unreadable --out would lose the measurements at the end: refuse it now
    except ValueError as exc:
        ap.error(str(exc))
    repeats = 20 if args.quick else args.repeats
    try:
        corpus = load_corpus(args.corpus, duplicate_ids="rename")
    except HCQRError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    passages = list(corpus)
    section = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "corpus": shown_path(args.corpus),
        "corpus_passages": len(passages),
        "quick": args.quick,
        "sizes": {},
        "planned_sizes": [],
        "versions": library_versions("hcqr-dspy", "faiss-cpu", "bm25s", "sentence-transformers", "torch", "numpy"),
    }
    out = Path(args.out)
    for size in sizes:
        n = len(passages) if size == "full" else min(int(size), len(passages))
        if str(n) not in section["planned_sizes"]:  # e.g. 10000 and full on a corpus under 10k passages
            section["planned_sizes"].append(str(n))
    with tempfile.TemporaryDirectory() as tmp:
        for label in section["planned_sizes"]:
            n = int(label)
            chosen = (
                passages
                if n == len(passages)
                else [passages[i] for i in sorted(random.Random(0).sample(range(len(passages)), n))]
            )
            section["sizes"][label] = measure_size(chosen, label, Path(tmp), repeats)
            write_results(out, section)  # after each size: an interrupted run keeps what it measured
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
