"""Retrieval benchmark: index build cost and HCQR-style 3-query search latency.

Usage:
    python bench/retrieval.py [--corpus PATH] [--out bench/results.json] [--repeats 50]

For each retriever (dense, BM25, hybrid) over the corpus: build time,
passages/s, index size on disk, load time (with the corpus in memory, and
with the corpus re-read from the manifest), then the latency of one batched
``search([q1, q2, q3], k=5)`` followed by ``fuse(budget=15)`` (the HCQR
retrieval step, encoder already loaded), p50/p95 over ``--repeats`` query
triples. Results are merged into ``--out`` under the key ``retrieval`` and
rendered to RESULTS.md beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hcqr_dspy.retrieval import HybridRetriever, build_retriever, fuse, load_corpus, load_index  # noqa: E402
from hcqr_dspy.retrieval.base import library_versions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("HCQR_SHARED_DATA", REPO.parent / "shared" / "data"))
DEFAULT_CORPUS = SHARED_DATA / "corpus" / "textbooks"

# Query triples shaped like HCQR's (support, distinction, key features), written here.
TRIPLES = [
    ("digoxin toxicity visual changes hyperkalemia", "digoxin toxicity versus hypokalemia arrhythmia", "yellow vision nausea elderly heart failure"),
    ("Graves disease TSH receptor antibody", "Graves disease versus toxic multinodular goiter", "exophthalmos pretibial myxedema tremor"),
    ("iron deficiency anemia low ferritin", "iron deficiency versus anemia of chronic disease", "microcytic anemia menorrhagia fatigue"),
    ("myasthenia gravis acetylcholine receptor", "myasthenia gravis versus Lambert-Eaton syndrome", "ptosis diplopia worse end of day"),
    ("Kawasaki disease coronary aneurysm", "Kawasaki disease versus scarlet fever", "fever conjunctivitis strawberry tongue child"),
    ("nephrotic syndrome minimal change disease", "minimal change versus membranous nephropathy", "periorbital edema proteinuria child"),
    ("vitamin B12 deficiency neurologic signs", "B12 versus folate deficiency methylmalonic acid", "macrocytic anemia paresthesia vegan"),
    ("pheochromocytoma catecholamine metanephrines", "pheochromocytoma versus carcinoid syndrome", "episodic headache sweating palpitations hypertension"),
]


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def bench_kind(corpus, kind: str, workdir: Path, repeats: int, built: dict) -> dict:
    if kind == "hybrid" and {"dense", "bm25"} <= built.keys():
        # RRF over the dense and BM25 indexes already built: its build cost is theirs summed.
        retriever = HybridRetriever([built["dense"][0], built["bm25"][0]])
        build = built["dense"][1] + built["bm25"][1]
    else:
        t0 = time.perf_counter()
        retriever = build_retriever(corpus, kind, show_progress=False)
        build = time.perf_counter() - t0
    built[kind] = (retriever, build)
    folder = retriever.save(workdir / kind)
    t0 = time.perf_counter()
    retriever = load_index(folder, corpus=corpus)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_index(folder)  # corpus re-read from the manifest's source and fingerprinted
    load_with_corpus = time.perf_counter() - t0
    retriever.search(list(TRIPLES[0]), k=5)  # warm-up
    latencies = []
    for i in range(repeats):
        triple = list(TRIPLES[i % len(TRIPLES)])
        t0 = time.perf_counter()
        fused = fuse(retriever.search(triple, k=5), budget=15)
        latencies.append((time.perf_counter() - t0) * 1000)
        assert 1 <= len(fused) <= 15
    def describe(hit):
        p = retriever.get(hit.passage_id)
        return f"{p.title} [{p.id}] {' '.join(p.content.split())[:70]}"

    top3 = {t[0]: [describe(h) for h in retriever.search([t[0]], k=3)[0]] for t in TRIPLES[:3]}
    return {
        "build_seconds": round(build, 2),
        "passages_per_second": round(len(corpus) / build, 1),
        "index_bytes": dir_size(folder),
        "load_seconds": round(load, 3),
        "load_with_corpus_seconds": round(load_with_corpus, 3),
        "search3_fuse_ms_p50": round(statistics.median(latencies), 2),
        "search3_fuse_ms_p95": round(percentile(latencies, 95), 2),
        "repeats": repeats,
        "top3_titles": top3,
    }


def render(results: dict) -> str:
    r = results["retrieval"]
    lines = [
        "# hcqr-dspy benchmark results",
        "",
        f"Measured {r['date']} on {r['machine']}; written by `make bench` (bench/retrieval.py).",
        "",
        f"## Retrieval over `{r['corpus']}` ({r['passages']} passages)",
        "",
        "| retriever | build s | passages/s | index size | load s (+ corpus reload) | 3-query search + fuse p50 ms | p95 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, m in r["retrievers"].items():
        lines.append(
            f"| {kind} | {m['build_seconds']} | {m['passages_per_second']} | {m['index_bytes'] / 1e6:.1f} MB | "
            f"{m['load_seconds']} ({m['load_with_corpus_seconds']}) | {m['search3_fuse_ms_p50']} | {m['search3_fuse_ms_p95']} |"
        )
    lines += ["", "Top 3 passages (title [id] start of text) per query:", ""]
    for kind, m in r["retrievers"].items():
        for q, titles in m["top3_titles"].items():
            lines.append(f"- {kind} — *{q}*:")
            lines += [f"  {i}. {t}" for i, t in enumerate(titles, start=1)]
    lines += ["", f"Peak RSS of the benchmark process: {r['peak_rss_mb']} MB.", "",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--kinds", default="bm25,dense,hybrid", help="retrievers to measure, in order")
    args = ap.parse_args(argv)
    if not Path(args.corpus).exists():
        print(f"bench: corpus {args.corpus} is absent: set HCQR_SHARED_DATA to the shared data folder or pass --corpus",
              file=sys.stderr)
        return 2
    corpus = load_corpus(args.corpus)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    section = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "corpus": str(Path(args.corpus).resolve().relative_to(REPO.parent)) if Path(args.corpus).resolve().is_relative_to(REPO.parent) else args.corpus,
        "passages": len(corpus),
        "retrievers": {},
        "versions": library_versions("hcqr-dspy", "faiss-cpu", "bm25s", "sentence-transformers", "torch", "numpy"),
    }
    built: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            print(f"bench: {kind} ...", file=sys.stderr, flush=True)
            section["retrievers"][kind] = bench_kind(corpus, kind, Path(tmp), args.repeats, built)
            print(json.dumps({kind: section["retrievers"][kind]}), file=sys.stderr)
    section["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    results["retrieval"] = section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_name("RESULTS.md").write_text(render(results))
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
