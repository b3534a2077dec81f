"""``hcqr index`` (build a retrieval index over a corpus) and ``hcqr search`` (query one).

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from hcqr_dspy.cli.common import RETRIEVER_KINDS, add_search_option_args, parsed_search_options, positive_int
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.folders import out_folder_fault
from hcqr_dspy.evaluation.progress import ProgressReport
from hcqr_dspy.retrieval import build_retriever, load_corpus, load_encoder, load_index
from hcqr_dspy.retrieval.milvus import MilvusRetriever, MilvusSettings, parse_params
from hcqr_dspy.retrieval.retriever_base import check_index_target
from hcqr_dspy.retrieval.vector_index import FaissIndex

log = logging.getLogger(__name__)


def _given(args: argparse.Namespace, *flags: str, given=lambda value: value is not None) -> list[str]:
    """The ``flags`` given on the command line: those whose value passes ``given`` (default: not ``None``)."""
    return [flag for flag in flags if given(getattr(args, flag[2:].replace("-", "_")))]


def _milvus_settings(args: argparse.Namespace):
    """The Milvus settings of `hcqr index` (checked, nothing contacted), or None for faiss/bm25s files.

    Raises:
        HCQRError: Milvus flags without --backend milvus, faiss flags with it, or bad Milvus settings.
    """
    given = _given(
        args,
        "--milvus-uri",
        "--collection",
        "--milvus-index",
        "--milvus-index-param",
        "--milvus-search-param",
        "--milvus-token-env",
        "--milvus-index-timeout",
        given=bool,
    )
    if args.backend != "milvus":
        if given:
            raise HCQRError(f"{', '.join(given)} only apply with --backend milvus")
        return None
    faiss_flags = _given(args, "--faiss", "--train-size")
    if faiss_flags:
        raise HCQRError(
            f"{', '.join(faiss_flags)} apply to the faiss backend, not --backend milvus (see --milvus-index)"
        )
    if not args.milvus_uri or not args.collection:
        raise HCQRError(
            "--backend milvus needs --milvus-uri (a Milvus Lite .db path or http://host:port) and --collection"
        )
    return MilvusSettings(
        uri=args.milvus_uri,
        collection=args.collection,
        retrieval=args.retriever,
        index_type=args.milvus_index or "FLAT",
        index_params=parse_params(args.milvus_index_param, "--milvus-index-param"),
        search_params=parse_params(args.milvus_search_param, "--milvus-search-param"),
        token_env=args.milvus_token_env,
        index_timeout=args.milvus_index_timeout or 3600.0,
    )


def cmd_index(args: argparse.Namespace) -> int:
    milvus = _milvus_settings(args)  # bad Milvus flags fail here, before anything is read or contacted
    fault = out_folder_fault(Path(args.out), "index")  # a run's (or another tool's) records are never replaced
    if fault:
        raise HCQRError(fault)
    out = check_index_target(args.out)  # fail before minutes of encoding, not after
    dense = args.retriever != "bm25"
    if not dense:
        given = _given(args, "--encoder", "--faiss", "--train-size", "--embeddings")
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise HCQRError(f"{', '.join(given)} {verb} to dense and hybrid indexes, not --retriever bm25")
    encoder = None
    options: dict = {}
    if dense:
        encoder = load_encoder(args.encoder)  # a missing model fails here, before the corpus is read
        options = {"batch_size": args.batch_size, "chunk_size": args.chunk_size, "embeddings_dir": args.embeddings}
        if milvus is None:
            backend_options = {
                "factory": "Flat" if args.faiss is None else args.faiss,
                **({"train_size": args.train_size} if args.train_size else {}),
            }
            FaissIndex.check_settings(encoder.dimension, **backend_options)
            options["backend_options"] = backend_options
        elif args.retriever == "dense":
            options.update(backend="milvus", backend_options=milvus.options())
    staging = out.parent / f".{out.name}.corpus"  # the passage store, hard-linked into the index when it is saved
    try:
        t0 = time.perf_counter()
        corpus = load_corpus(args.corpus, duplicate_ids=args.duplicate_ids, store=staging)
        t_load = time.perf_counter() - t0
        renamed = f" ({corpus.renamed} repeated ids renamed <id>#N)" if corpus.renamed else ""
        log.info(f"loaded {len(corpus)} passages from {corpus.source} in {t_load:.1f}s{renamed}")
        t0 = time.perf_counter()
        if milvus is not None and args.retriever != "dense":
            retriever = MilvusRetriever(corpus, milvus, encoder=encoder, show_progress=ProgressReport.shown, **options)
        else:
            retriever = build_retriever(
                corpus, args.retriever, encoder=encoder, show_progress=ProgressReport.shown, **options
            )  # -q: no bars
        t_build = time.perf_counter() - t0
        out = retriever.save(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    summary = {
        "index": str(out),
        "retriever": args.retriever,
        "passages": len(corpus),
        "build_seconds": round(t_build, 2),
        "passages_per_second": round(len(corpus) / t_build, 1),
        "size_bytes": size,
    }
    dense_part = next((r for r in [retriever, *getattr(retriever, "retrievers", [])] if r.kind == "dense"), None)
    if dense_part is not None or retriever.kind == "milvus":  # a vector store holds it (BM25 has none)
        summary["backend"] = args.backend
    if dense_part is not None:
        summary.update(encoder=dense_part.encoder_name, **dense_part.build_stats)
        if milvus is None:
            summary["faiss"] = dense_part.index.describe().get("factory")
    if retriever.kind == "milvus":
        summary.update(encoder=retriever.encoder_name, **retriever.build_stats)
    print(json.dumps(summary))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    retriever = load_index(
        args.index,
        corpus=args.corpus,
        encoder=args.encoder,
        search_options=parsed_search_options(args),
        encoder_backend=args.encoder_backend,
    )
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


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``index`` and ``search`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command(
        "index",
        help="build a retrieval index over a corpus",
        description="Build a retrieval index over a corpus. The passages are stored in the index (an Arrow file,\n"
        "memory-mapped when searched). Dense builds encode in chunks written to disk as they finish:\n"
        "the same command resumes a killed build, and another index type over the same corpus and\n"
        "passage encoder reuses the embeddings (see --embeddings).",
        epilog="encoder specs (--encoder):\n"
        "  (none) or default          all-MiniLM-L6-v2, packaged; one model for queries and passages, cosine\n"
        "  NAME_OR_PATH               any sentence-transformers model, used the same way\n"
        "  QUERY_MODEL,PASSAGE_MODEL  a pair: queries through the first, passages through the second (cosine)\n"
        "  medcpt                     the HCQR reference retriever: ncbi/MedCPT-Query-Encoder (queries, <= 64\n"
        "                             tokens) + ncbi/MedCPT-Article-Encoder ([title, content], <= 512 tokens),\n"
        "                             CLS pooling, raw inner product; weights from the Hugging Face hub cache\n"
        "  medcpt:QUERY_DIR,ARTICLE_DIR  the same, weights from two local folders\n"
        "faiss index types (--faiss, any faiss index_factory string, inner product):\n"
        "  Flat (exact, default), HNSW32 (graph; search with --ef-search), IVF1024,PQ32 or IVF4096,SQ8\n"
        "  (compressed inverted lists, trained on a seeded sample; search with --nprobe);\n"
        "  IVF1024,PQ96,RFlat (PQ codes in RAM, full vectors memory-mapped from disk and re-scored exactly;\n"
        "  search with --nprobe and --k-factor): a corpus whose vectors do not fit in RAM",
    )
    p.add_argument("--corpus", required=True, help=".jsonl file, folder of .jsonl files, or hub dataset name")
    p.add_argument("--retriever", choices=RETRIEVER_KINDS, default="dense", help="retriever kind")
    p.add_argument("--encoder", default=None, help="encoder spec (see below; default: all-MiniLM-L6-v2)")
    p.add_argument(
        "--faiss",
        default=None,
        metavar="FACTORY",
        help="faiss index_factory string of the dense index: Flat (default), HNSW32, IVF1024,PQ32 ...",
    )
    p.add_argument(
        "--train-size",
        type=positive_int,
        default=None,
        help="vectors sampled (seed 0) to train faiss types that need it (default: 64 per IVF list, 16,384 to 500,000)",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="passages per encoder batch")
    p.add_argument(
        "--chunk-size",
        type=positive_int,
        default=4096,
        help="passages per embedding chunk written to disk (what a killed build resumes from)",
    )
    p.add_argument(
        "--embeddings",
        default=None,
        metavar="DIR",
        help="root folder of saved passage embeddings (default: $HCQR_EMBEDDINGS, else "
        "$HCQR_CACHE/embeddings, else ~/.cache/hcqr-dspy/embeddings)",
    )
    p.add_argument(
        "--duplicate-ids",
        choices=["error", "rename"],
        default="error",
        help="a repeated passage id: refuse (default) or keep the row as <id>#2, #3 ...",
    )
    p.add_argument("--out", required=True, help="index folder to write")
    p.add_argument(
        "--backend",
        choices=["faiss", "milvus"],
        default="faiss",
        help="where vectors and BM25 live: faiss/bm25s files in the index folder (default) or a Milvus collection",
    )
    p.add_argument(
        "--milvus-uri",
        default=None,
        help="Milvus Lite database (a path ending in .db, embedded) or a server, http://host:port",
    )
    p.add_argument("--collection", default=None, help="Milvus collection name (letters, digits, _)")
    p.add_argument(
        "--milvus-index",
        default=None,
        type=str.upper,
        choices=["FLAT", "IVF_FLAT", "HNSW", "DISKANN"],
        help="Milvus vector index type (default FLAT, exact)",
    )
    p.add_argument(
        "--milvus-index-param",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="index build parameter, e.g. M=32, efConstruction=80, nlist=128 (repeatable)",
    )
    p.add_argument(
        "--milvus-search-param",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="search parameter, e.g. ef=64, nprobe=16, search_list=64 (repeatable)",
    )
    p.add_argument(
        "--milvus-token-env",
        default=None,
        metavar="VAR",
        help="name of the environment variable holding the server token (never the token itself)",
    )
    p.add_argument(
        "--milvus-index-timeout",
        type=float,
        default=None,
        help="seconds to wait for a server to build the index (default 3600)",
    )
    p.set_defaults(func=cmd_index)

    p = command("search", help="search an index with one or more queries")
    p.add_argument("--index", required=True, help="index folder")
    p.add_argument("--k", type=positive_int, default=5, help="passages per query")
    p.add_argument("--corpus", default=None, help="corpus to search (default: the one the index was built on)")
    p.add_argument(
        "--encoder",
        default=None,
        help="expected encoder spec; refused if the index used another (medcpt:QUERY_DIR,ARTICLE_DIR "
        "reads the same MedCPT pair from other folders; default: the index's)",
    )
    add_search_option_args(p)
    p.add_argument("--width", type=positive_int, default=160, help="characters of each passage to print")
    p.add_argument("queries", nargs="+", help="query strings")
    p.set_defaults(func=cmd_search)
