"""Dense retrieval in Milvus: :class:`MilvusIndex`, the ``milvus`` vector-index backend.

:class:`~hcqr_dspy.retrieval.dense.DenseRetriever` (which owns the encoder or
encoder pair) searches it: nearest neighbours by inner product, exact or
approximate; all queries of a batch go to Milvus in one ``search`` call. The
vectors come from the resumable embedding store, so a Milvus and a faiss index
over one corpus and encoder hold the same vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hcqr_dspy.errors import HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval.milvus.collection import MilvusCollection
from hcqr_dspy.retrieval.milvus.identity import collection_identity
from hcqr_dspy.retrieval.milvus.settings import MilvusSettings
from hcqr_dspy.retrieval.retriever_base import library_versions
from hcqr_dspy.retrieval.retriever_registry import register_backend
from hcqr_dspy.retrieval.vector_index import VectorIndex, check_search_options

SETTING_NAMES = ("uri", "collection", "index_type", "index_params", "search_params", "token_env", "index_timeout")


def _settings(retrieval: str, options: dict[str, Any]) -> MilvusSettings:
    unknown = sorted(set(options) - set(SETTING_NAMES))
    if unknown:
        raise RetrievalIndexError(
            f"unknown Milvus build option(s) {', '.join(unknown)}; known: {', '.join(SETTING_NAMES)}"
        )
    if not options.get("uri") or not options.get("collection"):
        raise HCQRError(
            "--backend milvus needs --milvus-uri (a Milvus Lite .db path or http://host:port) and --collection"
        )
    return MilvusSettings(retrieval=retrieval, **{k: v for k, v in options.items() if v is not None})


@register_backend("milvus")
class MilvusIndex(VectorIndex):
    """Dense vectors in a Milvus collection (inner product; Milvus Lite or a server).

    Built from an :class:`~hcqr_dspy.retrieval.embeddings.EmbeddingStore`
    (so the vectors are the ones a faiss index over the same corpus and
    encoder gets); rows are passage positions in the index's passage store.
    Build options (``backend_options``): ``uri``, ``collection``,
    ``index_type``, ``index_params``, ``search_params``, ``token_env``,
    ``index_timeout`` (see :class:`~hcqr_dspy.retrieval.milvus.settings.MilvusSettings`).
    """

    def __init__(
        self,
        collection: MilvusCollection,
        dimension: int,
        identity: dict[str, str],
        build_stats: dict[str, Any] | None = None,
    ):
        self.collection = collection
        self._dimension = int(dimension)
        self.identity = identity
        self.build_stats = build_stats or {}
        self.search_options: dict[str, int] = {}

    @classmethod
    def check_settings(cls, dimension: int, **settings: Any) -> None:
        """Check the settings and reach the engine before any encoding: an unreachable URI, an index type the
        engine does not build, fail here (one line), not after minutes of encoding."""
        s = _settings("dense", dict(settings))
        MilvusCollection.connect(s, create=True).check_capabilities()

    @classmethod
    def build(cls, embeddings: Any, show_progress: bool = True, corpus: Any = None, **settings: Any) -> MilvusIndex:
        s = _settings("dense", dict(settings))
        if corpus is None:
            raise RetrievalIndexError("a Milvus index is built with its corpus (the passage store)")
        identity = collection_identity(corpus, "dense", embeddings.record["passage_encoder"], embeddings.dimension)
        collection = MilvusCollection.connect(s, create=True)
        stats = collection.fill(identity, corpus, embeddings, show_progress=show_progress)
        return cls(collection, embeddings.dimension, identity, stats)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        found = self.collection.search_dense(vectors, k)
        scores = np.full((len(found), k), -np.inf, dtype=np.float32)
        rows = np.full((len(found), k), -1, dtype=np.int64)
        for i, hits in enumerate(found):
            for j, (row, score) in enumerate(hits[:k]):
                rows[i, j], scores[i, j] = row, score
        return scores, rows

    def set_search_options(self, options: Any) -> None:
        options = check_search_options(options)
        self.collection.set_search_options(options)
        self.search_options.update(options)

    @property
    def ntotal(self) -> int:
        return self.collection.rows

    @property
    def dimension(self) -> int:
        return self._dimension

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "milvus",
            **self.collection.settings.describe(),
            "engine": self.collection.engine,
            "client": library_versions("pymilvus", "milvus-lite"),
            "ntotal": self.ntotal,
            "dimension": self._dimension,
            "identity": self.identity,
        }

    def write(self, folder: Path) -> None:
        """Nothing to write: the vectors live in Milvus, and the manifest records where."""

    @classmethod
    def read(cls, folder: Path, record: dict[str, Any]) -> MilvusIndex:
        settings = MilvusSettings.from_manifest(record, retrieval="dense")
        collection = MilvusCollection.connect(settings)
        collection.open(record["identity"])
        return cls(collection, record["dimension"], record["identity"])
