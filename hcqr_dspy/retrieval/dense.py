"""Dense retrieval: an encoder (one model or a query/passage pair) and a vector index.

Passages are embedded by the encoder's passage side, queries by its query
side (:mod:`hcqr_dspy.retrieval.encoder`), and searched by inner product in
a vector-index backend (:mod:`hcqr_dspy.retrieval.vector_index`; faiss by
default, exact ``Flat`` unless ``factory`` says otherwise). With the default
encoder the embeddings are L2-normalized, so scores are cosine similarities;
with MedCPT they are raw inner products of ``[CLS]`` vectors, as in the
HCQR reference setup (MedCPT, exact inner product).

A build streams: passage embeddings are encoded chunk by chunk into an
:class:`~hcqr_dspy.retrieval.embeddings.EmbeddingStore` (resumable; reused by
any later build over the same corpus and passage encoder), then added to
the vector index chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval.embeddings import DEFAULT_CHUNK_SIZE, EmbeddingStore
from hcqr_dspy.retrieval.encoder import Encoder, load_encoder
from hcqr_dspy.retrieval.encoder_spec import EncoderSpec, encoder_of_index, parse_encoder
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.retriever_base import Hit, Retriever
from hcqr_dspy.retrieval.retriever_registry import get_backend_class, register
from hcqr_dspy.retrieval.vector_index import VectorIndex, check_search_options

DEFAULT_BACKEND = "faiss"


@register("dense")
class DenseRetriever(Retriever):
    """Inner-product search over passage embeddings.

    Args:
        corpus: The passages.
        encoder: Encoder spec (see :mod:`hcqr_dspy.retrieval.encoder`:
            ``None`` = the packaged all-MiniLM-L6-v2, a model name or path,
            ``QUERY,PASSAGE``, ``medcpt`` or ``medcpt:QUERY_DIR,ARTICLE_DIR``),
            an :class:`EncoderSpec` or a loaded :class:`Encoder`.
        index: A prebuilt :class:`VectorIndex` with one vector per passage,
            in corpus order; built when omitted.
        backend: Vector-index backend for a build (``"faiss"``).
        backend_options: The backend's build options (faiss: ``factory``,
            ``train_size``, ``seed``).
        batch_size: Passages per encoder batch when building.
        chunk_size: Passages per embedding chunk (the unit a killed build
            resumes from) for a new embedding store.
        embeddings_dir: Root folder of embedding stores (see
            :mod:`hcqr_dspy.retrieval.embeddings` for the default).
        show_progress: Progress bars while encoding and adding.
        search_options: Search-time options (``nprobe``, ``efSearch``, ``k_factor``).

    Raises:
        RetrievalIndexError: bad backend options or search options, or an
            index whose size or dimension does not match.
        EncoderError: the encoder cannot be loaded.

    Example:
        >>> r = DenseRetriever(load_corpus("corpus.jsonl"), backend_options={"factory": "HNSW32"})
        >>> r.search(["digoxin toxicity ECG"], k=5)[0][0].passage_id
    """

    required_fields = ("encoder", "encoders", "dimension", "vector_index.backend")
    uses_encoder = True

    def __init__(
        self,
        corpus: PassageStore,
        encoder: str | EncoderSpec | Encoder | None = None,
        index: VectorIndex | None = None,
        *,
        backend: str = DEFAULT_BACKEND,
        backend_options: Mapping[str, Any] | None = None,
        batch_size: int = 64,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        embeddings_dir: str | Path | None = None,
        show_progress: bool = True,
        search_options: Mapping[str, int] | None = None,
    ):
        super().__init__(corpus)
        self.encoder = encoder if isinstance(encoder, Encoder) else load_encoder(parse_encoder(encoder))
        self.build_stats: dict[str, Any] = {}
        if index is None:
            backend_cls = get_backend_class(backend)
            options = dict(backend_options or {})
            backend_cls.check_settings(self.encoder.dimension, **options)  # before any encoding
            store = EmbeddingStore.open(corpus, self.encoder, embeddings_dir, chunk_size)
            self.build_stats = {
                "embeddings": str(store.folder),
                "chunk_size": store.chunk_size,
                **store.fill(corpus, self.encoder, batch_size=batch_size, show_progress=show_progress),
            }
            index = backend_cls.build(store, show_progress=show_progress, corpus=corpus, **options)
            self.build_stats.update(getattr(index, "build_stats", {}))
        if index.ntotal != len(corpus):
            raise RetrievalIndexError(
                f"vector index holds {index.ntotal} vectors but the corpus has {len(corpus)} passages"
            )
        if index.dimension != self.encoder.dimension:
            raise RetrievalIndexError(
                f"vector index has dimension {index.dimension} but encoder {self.encoder.spec.name!r} gives "
                f"{self.encoder.dimension}"
            )
        self.index = index
        self.dimension = index.dimension
        if search_options:
            self.set_search_options(search_options)

    @property
    def encoder_name(self) -> str:
        """The encoder's canonical spec (``"medcpt"``, a model name, ``"QUERY,PASSAGE"``)."""
        return self.encoder.spec.name

    def set_search_options(self, options: Mapping[str, int]) -> None:
        """Apply search-time options (``nprobe``, ``efSearch``, ``k_factor``) to the vector index.

        Raises:
            RetrievalIndexError: an unknown option, a bad value, or one the index type does not take.
        """
        options = check_search_options(options)
        self.index.set_search_options(options)
        self.search_options.update(options)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        scores, rows = self.index.search(self.encoder.encode_queries(queries, batch_size=len(queries)), k)
        out = []
        for srow, rrow in zip(scores, rows):
            keep = rrow >= 0
            ids = self.corpus.ids(rrow[keep])
            out.append([Hit(pid, float(s)) for pid, s in zip(ids, srow[keep])])
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "encoder": self.encoder_name,
            "encoders": self.encoder.spec.describe(),
            "encoder_paths": self.encoder.spec.paths(),
            "dimension": self.dimension,
            "vector_index": self.index.describe(),
        }

    def _write(self, folder: Path) -> None:
        self.index.write(folder)

    @classmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: PassageStore, **options: Any) -> DenseRetriever:
        encoder, search_options = options.get("encoder"), options.get("search_options")
        encoder_backend = options.get("encoder_backend")
        built = encoder_of_index(folder, manifest, encoder, encoder_backend)
        record = manifest["vector_index"]
        index = get_backend_class(record["backend"]).read(folder, record)
        if index.dimension != manifest["dimension"]:
            raise RetrievalIndexError(
                f"{folder}: vector index has dimension {index.dimension}, manifest says {manifest['dimension']}"
            )
        return cls(corpus, encoder=built, index=index, search_options=search_options)
