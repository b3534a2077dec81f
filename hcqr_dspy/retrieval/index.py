"""Build, save and load retrieval indexes by kind (``dense``, ``bm25``, ``hybrid``, ``milvus``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcqr_dspy.errors import CorpusError, HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval.base import Retriever, check_corpus, read_manifest
from hcqr_dspy.retrieval.bm25 import BM25Retriever
from hcqr_dspy.retrieval.corpus import Corpus, load_corpus
from hcqr_dspy.retrieval.dense import DenseRetriever
from hcqr_dspy.retrieval.hybrid import HybridRetriever
from hcqr_dspy.retrieval.milvus import MilvusRetriever

RETRIEVERS: dict[str, type[Retriever]] = {
    "dense": DenseRetriever,
    "bm25": BM25Retriever,
    "hybrid": HybridRetriever,
    "milvus": MilvusRetriever,
}


def build_retriever(
    corpus: Corpus, kind: str = "dense", encoder: str | None = None, show_progress: bool = True, **options: Any
) -> Retriever:
    """Build a retriever of ``kind`` over ``corpus``.

    Args:
        corpus: The passages.
        kind: ``"dense"``, ``"bm25"`` or ``"hybrid"`` (dense + BM25 by RRF).
        encoder: sentence-transformers name or path for dense parts.
        show_progress: Progress bars while encoding / indexing.
        **options: Passed to the retriever (``batch_size``, ``rrf_k``, ``pool_k``).

    Raises:
        HCQRError: unknown kind.
    """
    if kind == "dense":
        return DenseRetriever(corpus, encoder=encoder, show_progress=show_progress, **options)
    if kind == "bm25":
        return BM25Retriever(corpus, show_progress=show_progress)
    if kind == "hybrid":
        batch = {k: options.pop(k) for k in ("batch_size",) if k in options}
        return HybridRetriever(
            [
                DenseRetriever(corpus, encoder=encoder, show_progress=show_progress, **batch),
                BM25Retriever(corpus, show_progress=show_progress),
            ],
            **options,
        )
    raise HCQRError(f"unknown retriever {kind!r}; choose one of {', '.join(RETRIEVERS)}")


def load_index(
    path: str | Path,
    corpus: Corpus | str | Path | None = None,
    encoder: str | None = None,
    verify_files: bool = True,
    **backend_options: Any,
) -> Retriever:
    """Load a saved index.

    Args:
        path: Index folder written by :meth:`Retriever.save`.
        corpus: The corpus (object or source) to search; by default the one
            recorded in the manifest is reloaded.
        encoder: If given, the encoder the caller expects; refused when it
            differs from the one the index was built with.
        verify_files: Check each file against its manifest checksum.
        **backend_options: Passed to the backend: ``milvus_uri`` (the same
            collection reached through another URI) and ``milvus_token_env``
            for a Milvus index.

    Safe with untrusted folders: nothing is unpickled. The manifest is JSON;
    a dense index is faiss's own binary format (``faiss.read_index``); a BM25
    index is numpy arrays read with ``allow_pickle=False`` plus JSON
    (``bm25s.BM25.load(..., allow_pickle=False)``); the corpus is JSON lines.
    The dense encoder is loaded by sentence-transformers from the name or path
    the manifest records (safetensors weights for the packaged encoder).

    Raises:
        RetrievalIndexError: not an index, corrupted, or built for another
            corpus or encoder (the message names both).
        CorpusError: the corpus cannot be loaded.
    """
    path = Path(path)
    manifest = read_manifest(path, verify_files=verify_files)
    policy = manifest["corpus"].get("duplicate_ids", "error")
    if corpus is None:
        try:
            corpus = load_corpus(manifest["corpus"]["source"], duplicate_ids=policy)
        except CorpusError as exc:
            raise CorpusError(f"{exc} (the corpus index {path} was built on; pass --corpus with its new place)") from None
    elif not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus, duplicate_ids=policy)
    check_corpus(manifest, corpus, path)
    kind = manifest.get("retriever")
    if kind not in RETRIEVERS:
        raise RetrievalIndexError(f"{path}: unknown retriever kind {kind!r} in manifest")
    if encoder is not None and "encoder" not in manifest and kind != "hybrid":
        raise RetrievalIndexError(f"index {path} is a {kind} index and uses no encoder (asked for {encoder!r})")
    return RETRIEVERS[kind]._read(path, manifest, corpus, encoder=encoder, **backend_options)
