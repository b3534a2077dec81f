"""Build, save and load retrieval indexes by kind (``dense``, ``bm25``, ``hybrid``).

:func:`load_index` reads the manifest, opens the index's passage store
memory-mapped and asks the registry (:mod:`hcqr_dspy.retrieval.retriever_registry`)
for the class of the manifest's kind; a dense index's vector-index backend
comes from its manifest too. Nothing here names a retriever class but
:func:`build_retriever`, which builds the built-in kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval.bm25 import BM25Retriever
from hcqr_dspy.retrieval.corpus import Corpus, load_corpus
from hcqr_dspy.retrieval.dense import DenseRetriever
from hcqr_dspy.retrieval.hybrid import HybridRetriever
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.query_runtime import check_runtime
from hcqr_dspy.retrieval.retriever_base import Retriever, check_corpus, read_manifest
from hcqr_dspy.retrieval.retriever_registry import get_retriever_class
from hcqr_dspy.retrieval.vector_index import check_search_options

KINDS = ("dense", "bm25", "hybrid")

_DENSE_OPTIONS = ("backend", "backend_options", "batch_size", "chunk_size", "embeddings_dir", "search_options")


def build_retriever(
    corpus: PassageStore,
    kind: str = "dense",
    encoder: Any = None,
    show_progress: bool = True,
    *,
    faiss: str | None = None,
    **options: Any,
) -> Retriever:
    """Build a retriever of ``kind`` over ``corpus``.

    Args:
        corpus: The passages.
        kind: ``"dense"``, ``"bm25"`` or ``"hybrid"`` (dense + BM25 by RRF).
        encoder: Encoder spec for dense parts (see :mod:`hcqr_dspy.retrieval.encoder`).
        show_progress: Progress bars while encoding / indexing.
        faiss: faiss ``index_factory`` string of dense parts (``Flat``
            default, ``HNSW32``, ``IVF1024,PQ32`` ...); shorthand for
            ``backend_options={"factory": ...}``.
        **options: Dense options (``backend``, ``backend_options``,
            ``batch_size``, ``chunk_size``, ``embeddings_dir``,
            ``search_options``; see :class:`DenseRetriever`) and hybrid ones
            (``rrf_k``, ``pool_k``).

    Raises:
        HCQRError: unknown kind, or an option the kind does not take.
    """
    if kind not in KINDS:
        raise HCQRError(f"unknown retriever {kind!r}; choose one of {', '.join(KINDS)}")
    dense_opts = {k: options.pop(k) for k in _DENSE_OPTIONS if k in options}
    if faiss is not None:
        dense_opts["backend_options"] = {**dense_opts.get("backend_options", {}), "factory": faiss}
    hybrid_opts = {k: options.pop(k) for k in ("rrf_k", "pool_k") if k in options}
    if options:
        raise HCQRError(f"unknown option(s) {', '.join(sorted(options))} for a {kind} retriever")
    if kind == "bm25":
        if dense_opts or hybrid_opts or encoder is not None:
            given = sorted(dense_opts) + sorted(hybrid_opts) + (["encoder"] if encoder is not None else [])
            raise HCQRError(f"a bm25 retriever takes no {', '.join(given)} (those are dense options)")
        return BM25Retriever(corpus, show_progress=show_progress)
    if kind == "dense" and hybrid_opts:
        raise HCQRError(f"a dense retriever takes no {', '.join(sorted(hybrid_opts))} (hybrid options)")
    dense = DenseRetriever(corpus, encoder=encoder, show_progress=show_progress, **dense_opts)
    if kind == "dense":
        return dense
    return HybridRetriever([dense, BM25Retriever(corpus, show_progress=show_progress)], **hybrid_opts)


def _check_backend(path: Path, manifest: dict[str, Any], cls: type, encoder_backend: str | None) -> str | None:
    if encoder_backend is None:
        return None
    encoder_backend = check_runtime(encoder_backend)
    if encoder_backend != "torch" and not cls.uses_encoder:
        raise RetrievalIndexError(
            f"index {path} is a {manifest['retriever']} index and embeds no queries: "
            f"--encoder-backend {encoder_backend} does not apply"
        )
    return encoder_backend


def check_index_options(
    path: str | Path, search_options: Mapping[str, int] | None = None, encoder_backend: str | None = None
) -> None:
    """Refuse what :func:`load_index` would refuse for these options, from the manifest alone (nothing loaded).

    For ``hcqr experiment --check``: the manifest is read without hashing
    files; search options of a faiss index are tried on an empty index made
    from its recorded factory string (no vectors read). Options of other
    backends (Milvus) are checked when the index is loaded.

    Raises:
        RetrievalIndexError: not an index, an encoder backend for an index
            that embeds no queries, or search options its type does not take.
        QueryRuntimeError: an unknown encoder backend.
    """
    path = Path(path)
    manifest = read_manifest(path, verify_files=False)
    cls = get_retriever_class(manifest["retriever"])
    _check_backend(path, manifest, cls, encoder_backend)
    options = check_search_options(search_options)
    record = manifest.get("vector_index") or {}
    if options and record.get("backend") == "faiss":
        from hcqr_dspy.retrieval.vector_index import FaissIndex

        factory = record.get("factory", "Flat")
        FaissIndex(FaissIndex.make(factory, manifest["dimension"]), factory).set_search_options(options)
    elif options and not cls.uses_encoder:
        raise RetrievalIndexError(
            f"index {path} is a {manifest['retriever']} index: search options "
            f"({', '.join(options)}) apply to dense indexes"
        )


def load_index(
    path: str | Path,
    corpus: PassageStore | str | Path | None = None,
    encoder: Any = None,
    verify_files: bool | None = None,
    search_options: Mapping[str, int] | None = None,
    encoder_backend: str | None = None,
) -> Retriever:
    """Load a saved index.

    Args:
        path: Index folder written by :meth:`Retriever.save`.
        corpus: A corpus (object or source) the caller expects the index to
            be built on: refused when its fingerprint differs. The passages
            themselves are always read from the index's own store.
        encoder: If given, the encoder spec the caller expects; refused when
            it differs from the one the index was built with (both named);
            the same encoder read from other folders is accepted and used
            (e.g. ``medcpt:/new/query,/new/article``).
        verify_files: ``None`` (default): every file's presence and size,
            and its SHA-256 unless the files total more than
            ``base.FULL_VERIFY_MAX_BYTES`` (1 GiB); ``True``: SHA-256 always;
            ``False``: nothing beyond the manifest (see :func:`read_manifest`).
        search_options: Search-time options of dense indexes: ``nprobe``
            (IVF lists visited), ``efSearch`` (HNSW candidates) and
            ``k_factor`` (refine indexes' candidates re-scored exactly per
            hit), positive integers.
        encoder_backend: What embeds the queries of an index with an
            encoder: ``torch`` (default), ``onnx``, ``onnx-int8``,
            ``openvino`` or ``openvino-bf16`` (exported locally from the index's query encoder;
            see :mod:`hcqr_dspy.retrieval.query_runtime`). Not a property of
            the index: one built with PyTorch is searched with any of them.

    Safe with untrusted folders: nothing is unpickled. The manifest is JSON;
    the passages an Arrow IPC file (memory-mapped) with numpy id arrays; a
    dense index is faiss's own binary format (``faiss.read_index``); a BM25
    index is numpy arrays read with ``allow_pickle=False`` (memory-mapped)
    plus JSON. The dense encoder is loaded by sentence-transformers from the
    names or folders the manifest records (or ``encoder``).

    Raises:
        RetrievalIndexError: not an index, an index of format 1 (rebuild
            it), corrupted, built for another corpus or encoder (the message
            names both), search options the index does not take, or an
            encoder backend for an index that uses no encoder.
        QueryRuntimeError: an unknown encoder backend, its library missing,
            or its export failed.
        CorpusError: the given corpus cannot be loaded.
    """
    path = Path(path)
    manifest = read_manifest(path, verify_files=verify_files)
    cls = get_retriever_class(manifest["retriever"])
    search_options = check_search_options(search_options)
    if encoder is not None and not cls.uses_encoder:
        raise RetrievalIndexError(
            f"index {path} is a {manifest['retriever']} index and uses no encoder (asked for {encoder!r})"
        )
    encoder_backend = _check_backend(path, manifest, cls, encoder_backend)
    store = Corpus.open(path)
    if store.fingerprint != manifest["corpus"]["fingerprint"] or len(store) != manifest["corpus"]["count"]:
        raise RetrievalIndexError(
            f"index {path} is inconsistent: its passage store is not the corpus its manifest records; rebuild it"
        )
    if corpus is not None:
        if not isinstance(corpus, PassageStore):
            corpus = load_corpus(corpus, duplicate_ids=manifest["corpus"].get("duplicate_ids", "error"))
        check_corpus(manifest, corpus, path)
    options = {"encoder_backend": encoder_backend} if encoder_backend is not None else {}
    return cls._read(path, manifest, store, encoder=encoder, search_options=search_options, **options)
