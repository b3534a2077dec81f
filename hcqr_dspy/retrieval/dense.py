"""Dense retrieval: a sentence-transformers encoder and an exact faiss index.

Passages (``title + "\\n" + content``) and queries are embedded with the same
encoder, L2-normalized, and searched by inner product in
``faiss.IndexFlatIP``, i.e. exact cosine similarity (faiss, Johnson et al.
2019). The HCQR reference setup also searched by exact inner product.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval.base import Hit, Retriever
from hcqr_dspy.retrieval.corpus import Corpus
from hcqr_dspy.retrieval.encoder import canonical_encoder_name, load_encoder

FAISS_FILE = "faiss.index"


class DenseRetriever(Retriever):
    """Exact inner-product search over normalized sentence embeddings.

    Args:
        corpus: The passages.
        encoder: sentence-transformers model name or path (default: the
            packaged all-MiniLM-L6-v2).
        index: A prebuilt ``faiss.Index`` with one row per passage, in corpus
            order; built by encoding the corpus when omitted.
        batch_size: Passages per encoder batch when building.
        show_progress: Show a progress bar while encoding the corpus.

    Example:
        >>> r = DenseRetriever(load_corpus("corpus.jsonl"))
        >>> r.search(["digoxin toxicity ECG"], k=5)[0][0].passage_id
    """

    kind = "dense"

    def __init__(
        self,
        corpus: Corpus,
        encoder: str | None = None,
        index: Any = None,
        batch_size: int = 64,
        show_progress: bool = True,
    ):
        super().__init__(corpus)
        import faiss

        self.encoder_name = canonical_encoder_name(encoder)
        self.encoder = load_encoder(self.encoder_name)
        if index is None:
            emb = self.encode([p.text for p in corpus], batch_size=batch_size, show_progress=show_progress)
            index = faiss.IndexFlatIP(emb.shape[1])
            index.add(emb)
        if index.ntotal != len(corpus):
            raise RetrievalIndexError(f"faiss index holds {index.ntotal} vectors but the corpus has {len(corpus)} passages")
        self.index = index
        self.dimension = int(index.d)

    def encode(self, texts: list[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        """Embed texts: float32 array of shape ``(len(texts), dimension)``, rows of unit L2 norm."""
        emb = self.encoder.encode(
            texts,
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        scores, rows = self.index.search(self.encode(queries, batch_size=len(queries)), k)
        ids = self.corpus.passages
        return [
            [Hit(ids[r].id, float(s)) for s, r in zip(srow, rrow) if r >= 0]
            for srow, rrow in zip(scores, rows)
        ]

    def describe(self) -> dict[str, Any]:
        return {"encoder": self.encoder_name, "dimension": self.dimension, "faiss_index": type(self.index).__name__}

    def _write(self, folder: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(folder / FAISS_FILE))

    @classmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: Corpus, encoder: str | None = None, **_: Any):
        import faiss

        built_with = manifest["encoder"]
        if encoder is not None and canonical_encoder_name(encoder) != built_with:
            raise RetrievalIndexError(
                f"index {folder} was built with encoder {built_with!r}, not {canonical_encoder_name(encoder)!r}; "
                "query and passage embeddings must come from the same encoder"
            )
        # faiss.read_index parses faiss's own binary format; it does not unpickle.
        index = faiss.read_index(str(folder / FAISS_FILE))
        if index.d != manifest["dimension"]:
            raise RetrievalIndexError(f"{folder / FAISS_FILE} has dimension {index.d}, manifest says {manifest['dimension']}")
        return cls(corpus, encoder=built_with, index=index)
