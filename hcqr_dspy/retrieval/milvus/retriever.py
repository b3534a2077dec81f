"""BM25 and hybrid retrieval inside Milvus: :class:`MilvusRetriever`, retriever kind ``milvus``.

``bm25``
    Milvus's full-text search: the BM25 function turns ``text`` into sparse
    term weights at insert time and each query at search time (analyzer:
    Milvus's ``standard`` tokenizer, lower-casing and bm25s' English
    stopword list; no stemming, which Milvus Lite's analyzer lacks).
``hybrid``
    both in one collection, fused inside Milvus by reciprocal rank
    (``hybrid_search`` with ``RRFRanker(60)``; Cormack et al. 2009), each
    side drawing ``pool_k`` candidates, as :mod:`hcqr_dspy.retrieval.hybrid`
    does across two systems.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval.embeddings import DEFAULT_CHUNK_SIZE, EmbeddingStore
from hcqr_dspy.retrieval.encoder import Encoder, load_encoder
from hcqr_dspy.retrieval.encoder_spec import encoder_of_index, parse_encoder
from hcqr_dspy.retrieval.milvus.collection import MilvusCollection
from hcqr_dspy.retrieval.milvus.identity import collection_identity
from hcqr_dspy.retrieval.milvus.settings import MilvusSettings
from hcqr_dspy.retrieval.retriever_base import Hit, Retriever, library_versions
from hcqr_dspy.retrieval.retriever_registry import register
from hcqr_dspy.retrieval.vector_index import check_search_options


@register("milvus")
class MilvusRetriever(Retriever):
    """Full-text BM25, or dense + BM25 fused by RRF, inside one Milvus collection.

    (Dense retrieval alone is :class:`~hcqr_dspy.retrieval.dense.DenseRetriever`
    with the ``milvus`` vector-index backend.)

    Args:
        corpus: The passage store (the text of hits is read from here).
        settings: Where and how; ``settings.retrieval`` is ``bm25`` or ``hybrid``.
        encoder: Encoder spec for hybrid (see :mod:`hcqr_dspy.retrieval.encoder`).
        batch_size / chunk_size / embeddings_dir: As for a dense build: the
            passage vectors of a hybrid collection come from the resumable
            :class:`~hcqr_dspy.retrieval.embeddings.EmbeddingStore`.
        show_progress: Progress bars.
        open_existing: Open the finished collection (what :func:`load_index` does).

    Raises:
        HCQRError: bad settings. MilvusUnavailableError: the URI cannot be
        reached (one line naming it). RetrievalIndexError: the collection
        belongs to another corpus or encoder (naming both), or the build
        failed. MilvusCapabilityError: the engine lacks BM25.
    """

    required_fields = ("milvus.uri", "milvus.collection", "milvus.retrieval")
    uses_encoder = True  # hybrid does; a bm25 index refuses an encoder in _read

    def __init__(
        self,
        corpus: Any,
        settings: MilvusSettings,
        encoder: Any = None,
        *,
        batch_size: int = 64,
        chunk_size: int | None = None,
        embeddings_dir: str | Path | None = None,
        show_progress: bool = True,
        open_existing: bool = False,
    ):
        super().__init__(corpus)
        if settings.retrieval not in ("bm25", "hybrid"):
            raise HCQRError(
                "MilvusRetriever is for bm25 and hybrid; dense Milvus indexes are DenseRetriever(backend='milvus')"
            )
        self.settings = settings
        self.encoder = None
        if settings.dense:
            self.encoder = encoder if isinstance(encoder, Encoder) else load_encoder(parse_encoder(encoder))
        elif encoder is not None:
            raise HCQRError("a bm25 Milvus index uses no encoder")
        self.collection = MilvusCollection.connect(settings, create=not open_existing)
        self.build_stats: dict[str, Any] = {}
        if open_existing:
            self.collection.open(self.identity())
            return
        self.collection.check_capabilities()  # before minutes of encoding
        embeddings = None
        if self.encoder is not None:
            embeddings = EmbeddingStore.open(corpus, self.encoder, embeddings_dir, chunk_size or DEFAULT_CHUNK_SIZE)
            self.build_stats = {
                "embeddings": str(embeddings.folder),
                "chunk_size": embeddings.chunk_size,
                **embeddings.fill(corpus, self.encoder, batch_size=batch_size, show_progress=show_progress),
            }
        self.build_stats.update(self.collection.fill(self.identity(), corpus, embeddings, show_progress=show_progress))

    @property
    def encoder_name(self) -> str | None:
        return self.encoder.spec.name if self.encoder is not None else None

    @property
    def dimension(self) -> int | None:
        return self.encoder.dimension if self.encoder is not None else None

    def identity(self) -> dict[str, str]:
        """What the collection's properties record and what opening it compares."""
        passage = self.encoder.spec.passage_description() if self.encoder is not None else None
        return collection_identity(self.corpus, self.settings.retrieval, passage, self.dimension)

    def set_search_options(self, options: Any) -> None:
        options = check_search_options(options)
        if options and not self.settings.dense:
            raise RetrievalIndexError(
                "search options (nprobe, efSearch) apply to dense indexes, not a Milvus bm25 index"
            )
        self.collection.set_search_options(options)
        self.search_options.update(options)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if self.settings.retrieval == "bm25":
            found = self.collection.search_bm25(queries, k)
        else:
            pool = min(max(k, self.settings.pool_k), len(self.corpus))
            vectors = self.encoder.encode_queries(queries, batch_size=len(queries))
            found = self.collection.search_hybrid(vectors, queries, k, pool)
        out = []
        for hits in found:
            ids = self.corpus.ids([row for row, _ in hits])
            out.append([Hit(pid, score) for pid, (_, score) in zip(ids, hits)])
        return out

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "milvus": {
                **self.settings.describe(),
                "engine": self.collection.engine,
                "client": library_versions("pymilvus", "milvus-lite"),
            }
        }
        if self.encoder is not None:
            out.update(
                encoder=self.encoder_name,
                encoders=self.encoder.spec.describe(),
                encoder_paths=self.encoder.spec.paths(),
                dimension=self.dimension,
            )
        return out

    def _write(self, folder: Path) -> None:
        """Nothing to write: the collection lives in Milvus, and the manifest records where."""

    @classmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: Any, **options: Any) -> MilvusRetriever:
        encoder, search_options = options.get("encoder"), options.get("search_options")
        encoder_backend = options.get("encoder_backend")
        settings = MilvusSettings.from_manifest(manifest["milvus"])
        built = None
        if settings.dense:
            built = encoder_of_index(folder, manifest, encoder, encoder_backend)
        elif encoder is not None:
            raise RetrievalIndexError(
                f"index {folder} is a Milvus bm25 index and uses no encoder (asked for {encoder!r})"
            )
        elif encoder_backend not in (None, "torch"):
            raise RetrievalIndexError(
                f"index {folder} is a Milvus bm25 index and embeds no queries: "
                f"--encoder-backend {encoder_backend} does not apply"
            )
        retriever = cls(corpus, settings, encoder=built, open_existing=True)
        if search_options:
            retriever.set_search_options(search_options)
        return retriever
