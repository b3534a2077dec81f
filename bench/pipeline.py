"""Pipeline benchmark: what a question costs with CoT, Simple RAG and HCQR on a local model, cold and warm.

Usage:
    python bench/pipeline.py [--lm local:qwen2.5-coder-0.5b] [--n 10] [--index DIR] [--out bench/results.json]

On a fixed sample of ``--n`` MedQA-US questions (seeded, seed 0), with a
fresh DSPy cache in a temporary folder: LM calls, prompt and completion
tokens and seconds per question and per stage for each method, and HCQR's
cost relative to Simple RAG as ratios. Then the same runs again with the
cache warm: a repeated run must make no LM call (every call is served by the
cache and counted as cached). The index is BM25 over the whole shared corpus
(``--index`` to reuse one; otherwise it is built in a temporary folder,
seconds). Nothing is tracked in MLflow. Results are merged into ``--out``
under ``pipeline``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("HCQR_SHARED_DATA", REPO.parent / "shared" / "data"))
METHODS = ("cot", "simple_rag", "hcqr")
FIELDS = ("lm_calls", "cached_lm_calls", "prompt_tokens", "completion_tokens", "seconds")


def per_stage(rows: list[dict]) -> dict:
    stages: dict = {}
    for row in rows:
        for name, s in (row.get("stages") or {}).items():
            acc = stages.setdefault(name, {f: 0.0 for f in FIELDS})
            for f in FIELDS:
                acc[f] += s.get(f, 0) or 0
    return {name: {f: round(v / len(rows), 3) for f, v in acc.items()} for name, acc in stages.items()}


def summary(result) -> dict:
    rows = result.rows
    n = len(rows)
    return {
        "n": n,
        "accuracy": round(result.metrics["accuracy"], 4),
        "invalid": result.metrics["invalid"],
        **{f"{f}_per_question": round(sum(r.get(f, 0) or 0 for r in rows) / n, 3) for f in FIELDS},
        "stages": per_stage(rows),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm", default="local:qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument(
        "--index", default=None, help="BM25 (or any) index folder; default: BM25 over the shared corpus, built here"
    )
    ap.add_argument("--dataset", default=str(SHARED_DATA / "benchmark" / "medqa.json"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    if not Path(args.dataset).is_file():
        print(f"bench: {args.dataset} is absent: set HCQR_SHARED_DATA to the shared data folder", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    from report import checked_out, shown_path, write_results

    out = checked_out(ap, args.out)  # an unreadable --out would lose the measurements at the end: refuse it now
    import dspy

    from hcqr_dspy.lm import build_lm
    from hcqr_dspy.retrieval import build_retriever, load_corpus
    from hcqr_dspy.retrieval.retriever_base import library_versions
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    with tempfile.TemporaryDirectory() as tmp:
        dspy.configure_cache(disk_cache_dir=str(Path(tmp) / "dspy-cache"))  # cold: nothing answered from earlier runs
        index = args.index
        if index is None:
            corpus = load_corpus(SHARED_DATA / "corpus", duplicate_ids="rename")
            index = str(build_retriever(corpus, "bm25", show_progress=False).save(Path(tmp) / "bm25"))
        lm = build_lm(args.lm)
        section: dict = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "lm": args.lm,
            "questions": args.n,
            "dataset": shown_path(args.dataset),
            "seed": 0,
            "threads": os.environ.get("HCQR_N_THREADS") or os.cpu_count(),
            "versions": library_versions("hcqr-dspy", "dspy", "llama-cpp-python"),
            "cold": {},
            "warm": {},
        }
        for phase in ("cold", "warm"):
            for method in METHODS:
                spec = EvalSpec(
                    method=method,
                    dataset=args.dataset,
                    index=index,
                    lm=args.lm,
                    limit=args.n,
                    seed=0,
                    run_dir=str(Path(tmp) / phase / method),
                )
                print(f"bench: pipeline {phase} {method} ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                result, _, _ = run_evaluation(spec, track=False, progress=False, lm=lm)
                section[phase][method] = {**summary(result), "wall_seconds": round(time.perf_counter() - t0, 1)}
                print(json.dumps({phase: {method: section[phase][method]}}), file=sys.stderr, flush=True)
    cold = section["cold"]
    section["hcqr_over_simple_rag"] = {
        f: round(cold["hcqr"][f"{f}_per_question"] / cold["simple_rag"][f"{f}_per_question"], 2)
        for f in ("lm_calls", "prompt_tokens", "completion_tokens", "seconds")
        if cold["simple_rag"][f"{f}_per_question"]
    }
    section["warm_lm_calls"] = sum(m["lm_calls_per_question"] for m in section["warm"].values())
    write_results(out, section, key="pipeline")
    print(f"bench: wrote {out} and {out.with_name('RESULTS.md')}", file=sys.stderr)
    if section["warm_lm_calls"]:
        print(f"bench: the warm run made {section['warm_lm_calls']} LM calls per question; expected 0", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
