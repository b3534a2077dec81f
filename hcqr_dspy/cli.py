"""The ``hcqr`` command line.

Every subcommand prints a one-line ``hcqr: error: ...`` message and exits with
code 2 on bad input (:class:`hcqr_dspy.errors.HCQRError`), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from hcqr_dspy.errors import HCQRError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

Command = Callable[[argparse.Namespace], int]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# -- index / search ----------------------------------------------------------
def cmd_index(args: argparse.Namespace) -> int:
    from hcqr_dspy.retrieval import build_retriever, load_corpus

    t0 = time.perf_counter()
    corpus = load_corpus(args.corpus)
    t_load = time.perf_counter() - t0
    print(f"loaded {len(corpus)} passages from {corpus.source} in {t_load:.1f}s", file=sys.stderr)
    t0 = time.perf_counter()
    options = {"batch_size": args.batch_size} if args.retriever != "bm25" else {}
    retriever = build_retriever(corpus, args.retriever, encoder=args.encoder, **options)
    t_build = time.perf_counter() - t0
    out = retriever.save(args.out)
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    print(
        json.dumps(
            {
                "index": str(out),
                "retriever": args.retriever,
                "passages": len(corpus),
                "build_seconds": round(t_build, 2),
                "passages_per_second": round(len(corpus) / t_build, 1),
                "size_bytes": size,
            }
        )
    )
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from hcqr_dspy.retrieval import load_index

    retriever = load_index(args.index, corpus=args.corpus, encoder=args.encoder)
    results = retriever.search(args.queries, args.k)
    for query, hits in zip(args.queries, results):
        print(f"## {query}")
        if not hits:
            print("   (no passage matched)")
        for rank, hit in enumerate(hits, start=1):
            p = retriever.get(hit.passage_id)
            snippet = " ".join(p.content.split())[: args.width]
            print(f"{rank:>3}  {hit.score:8.4f}  [{p.id}] {p.title}\n       {snippet}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcqr", description="Hypothesis-Conditioned Query Rewriting (HCQR) for retrieval-augmented MCQA."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("index", help="build a retrieval index over a corpus")
    p.add_argument("--corpus", required=True, help=".jsonl file, folder of .jsonl files, or hub dataset name")
    p.add_argument("--retriever", choices=["dense", "bm25", "hybrid"], default="dense")
    p.add_argument("--encoder", default=None, help="sentence-transformers model name or path (default: all-MiniLM-L6-v2)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="passages per encoder batch")
    p.add_argument("--out", required=True, help="index folder to write")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="search an index with one or more queries")
    p.add_argument("--index", required=True, help="index folder")
    p.add_argument("--k", type=_positive_int, default=5, help="passages per query")
    p.add_argument("--corpus", default=None, help="corpus to search (default: the one the index was built on)")
    p.add_argument("--encoder", default=None, help="expected encoder; refused if the index used another")
    p.add_argument("--width", type=_positive_int, default=160, help="characters of each passage to print")
    p.add_argument("queries", nargs="+", help="query strings")
    p.set_defaults(func=cmd_search)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HCQRError as exc:
        print(f"hcqr: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hcqr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
