"""Hybrid retrieval: reciprocal rank fusion of several retrievers.

For each query, every component retriever returns a candidate pool of
``max(k, pool_k)`` hits; the pools are fused by reciprocal rank
(``sum 1 / (rrf_k + rank)``, ``rrf_k = 60``; Cormack, Clarke & Büttcher
2009) and the top ``k`` kept. RRF needs no score calibration between a
dense cosine and a BM25 score.

Components are written into subfolders (``0-dense``, ``1-bm25``) with their
own manifest record (``component.json``) and read back through the
retriever registry; the passage store is stored once, in the hybrid index's
folder, and shared by every component.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval.fusion import DEFAULT_RRF_K, fuse
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.retriever_base import Hit, Retriever
from hcqr_dspy.retrieval.retriever_registry import get_retriever_class, register

COMPONENTS_FILE = "components.json"


@register("hybrid")
class HybridRetriever(Retriever):
    """Reciprocal-rank fusion of component retrievers over the same corpus.

    Args:
        retrievers: Two or more retrievers built on the same corpus.
        rrf_k: RRF constant (default 60, Cormack et al. 2009).
        pool_k: Candidates drawn from each component per query (at least
            ``k``).

    Raises:
        RetrievalIndexError: fewer than two components, or components built
            on different corpora.
    """

    required_fields = ("rrf_k", "pool_k")
    uses_encoder = True

    def __init__(self, retrievers: Sequence[Retriever], rrf_k: int = DEFAULT_RRF_K, pool_k: int = 50):
        retrievers = list(retrievers)
        if len(retrievers) < 2:
            raise RetrievalIndexError("a hybrid retriever needs at least two component retrievers")
        corpus = retrievers[0].corpus
        for r in retrievers[1:]:
            if r.corpus.fingerprint != corpus.fingerprint:
                raise RetrievalIndexError(
                    f"hybrid components must share one corpus: {corpus.source!r} vs {r.corpus.source!r}"
                )
        super().__init__(corpus)
        self.retrievers = retrievers
        self.rrf_k = rrf_k
        self.pool_k = pool_k
        for r in retrievers:
            self.search_options.update(r.search_options)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        pool = min(max(k, self.pool_k), len(self.corpus))
        per_component = [r.search(queries, pool) for r in self.retrievers]
        out = []
        for qi in range(len(queries)):
            fused = fuse([hits[qi] for hits in per_component], budget=k, strategy="rrf", rrf_k=self.rrf_k)
            out.append([Hit(f.passage_id, f.score) for f in fused])
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "rrf_k": self.rrf_k,
            "pool_k": self.pool_k,
            "components": [{"retriever": r.kind, **r.describe()} for r in self.retrievers],
        }

    def _write(self, folder: Path) -> None:
        names = []
        for i, r in enumerate(self.retrievers):
            name = f"{i}-{r.kind}"
            sub = folder / name
            sub.mkdir()
            r._write(sub)
            (sub / "component.json").write_text(json.dumps({"retriever": r.kind, **r.describe()}), encoding="utf-8")
            names.append(name)
        (folder / COMPONENTS_FILE).write_text(json.dumps(names), encoding="utf-8")

    @classmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: PassageStore, **options: Any):
        encoder, search_options = options.pop("encoder", None), options.pop("search_options", None)
        parts = []
        for name in json.loads((folder / COMPONENTS_FILE).read_text(encoding="utf-8")):
            sub = folder / name
            sub_manifest = {**manifest, **json.loads((sub / "component.json").read_text(encoding="utf-8"))}
            component = get_retriever_class(sub_manifest["retriever"])
            parts.append(
                component._read(
                    sub,
                    sub_manifest,
                    corpus,
                    encoder=encoder if component.uses_encoder else None,
                    search_options=search_options if component.uses_encoder else None,
                    **options,
                )
            )
        if search_options and not any(p.search_options for p in parts):
            raise RetrievalIndexError(f"index {folder} has no dense component: search options apply to dense indexes")
        return cls(parts, rrf_k=manifest["rrf_k"], pool_k=manifest["pool_k"])
