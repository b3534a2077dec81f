"""One Milvus collection of passages: connecting, checking what it was built from, opening, searching.

Its building half (create or resume, insert, index, load) is
:class:`~hcqr_dspy.retrieval.milvus.collection_build.CollectionBuild`. A search that
fails because the server is not answering is tried again
(:func:`~hcqr_dspy.retrieval.milvus.retries.call_with_retries`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval.milvus.client import connect, engine_label
from hcqr_dspy.retrieval.milvus.collection_build import CollectionBuild
from hcqr_dspy.retrieval.milvus.identity import PROPERTY_PREFIX, compare_identity
from hcqr_dspy.retrieval.milvus.retries import call_with_retries, one_line, retry_settings
from hcqr_dspy.retrieval.milvus.settings import METRIC, SEARCH_CONSISTENCY, MilvusSettings


class MilvusCollection(CollectionBuild):
    """One Milvus collection of passages, through a connected ``MilvusClient``.

    Build with :meth:`fill` (create or resume, insert, index, load); open a
    finished one with :meth:`open`; search with :meth:`search_dense`,
    :meth:`search_bm25`, :meth:`search_hybrid`.
    """

    def __init__(self, settings: MilvusSettings, client: Any, version: str):
        self.settings = settings
        self.client = client
        self.version = version
        self.name = settings.collection
        self.rows = 0
        self.retry_seconds, self.search_timeout = retry_settings()

    @classmethod
    def connect(cls, settings: MilvusSettings, create: bool = False) -> MilvusCollection:
        """Connect to ``settings.uri`` (see :func:`~hcqr_dspy.retrieval.milvus.client.connect`)."""
        client, version = connect(settings.target, create=create)
        return cls(settings, client, version)

    @property
    def engine(self) -> str:
        return engine_label(self.version)

    # identity ------------------------------------------------------------------------------------------
    def properties(self) -> dict[str, str]:
        desc = self.client.describe_collection(self.name)
        props = desc.get("properties") or {}
        return {k[len(PROPERTY_PREFIX) :]: v for k, v in props.items() if k.startswith(PROPERTY_PREFIX)}

    def check_identity(self, expected: dict[str, str]) -> dict[str, str]:
        """Refuse a collection built from another corpus, passage encoder or for another retrieval mode.

        Returns:
            The collection's properties (unprefixed).

        Raises:
            RetrievalIndexError: naming the collection's and the expected corpus / encoder.
        """
        have = self.properties()
        compare_identity(have, expected, f"Milvus collection {self.name!r} at {self.settings.uri}")
        return have

    # opening -------------------------------------------------------------------------------------------
    def open(self, identity: dict[str, str]) -> None:
        """Check an existing, finished collection and load it.

        Finished means marked ``complete`` by :meth:`finish`, or, where the
        mark was lost (Milvus 2.3.5 forgets a collection's last property change
        across a restart), every index built over every row and the row count
        equal to the corpus's.

        Raises:
            RetrievalIndexError: missing, unfinished, another corpus/encoder, or a wrong row count.
        """
        s = self.settings
        if not self.client.has_collection(self.name):
            raise RetrievalIndexError(f"Milvus at {s.uri} has no collection {self.name!r}; build it with `hcqr index`")
        have = self.check_identity(identity)
        expected = int(have["corpus_count"])
        marked = have.get("complete") == "true"
        if not marked:
            # The mark is the fast path, not the only witness: Milvus 2.3.5 loses a collection's last
            # AlterCollection on restart (milvus-io/milvus#30144, fixed in #30145), so a finished build can read
            # "complete": "false" there. What the engine holds decides: every index built over every row.
            why = self._unbuilt_indexes(expected)
            if why:
                raise RetrievalIndexError(
                    f"Milvus collection {self.name!r} at {s.uri} is an unfinished build ({why}); "
                    "run the same `hcqr index` again"
                )
        try:
            self.client.load_collection(self.name)
        except Exception as exc:
            raise RetrievalIndexError(
                f"{self.engine} at {s.uri} cannot load collection {self.name!r}: {one_line(exc)}"
            ) from None
        if not marked and (have_rows := self.count()) != expected:
            raise RetrievalIndexError(
                f"Milvus collection {self.name!r} at {s.uri} is an unfinished build ({have_rows} of {expected} rows); "
                "run the same `hcqr index` again"
            )
        self.rows = expected

    def _unbuilt_indexes(self, expected: int) -> str | None:
        """Why the collection's indexes are not finished over ``expected`` rows, or ``None`` when they are.

        Reads the engine's own state (``list_indexes``, ``describe_index``'s
        ``indexed_rows`` and ``pending_index_rows``), not the ``complete`` mark.
        """
        wanted = (["vector"] if self.settings.dense else []) + (["sparse"] if self.settings.bm25 else [])
        present = set(self.client.list_indexes(self.name))
        for name in wanted:
            if name not in present:
                return f"no {name} index"
            info = self.client.describe_index(self.name, name)
            indexed, pending = int(info.get("indexed_rows", 0)), int(info.get("pending_index_rows", 0))
            if indexed < expected or pending:
                return f"{indexed} of {expected} rows in the {name} index"
        return None

    def count(self) -> int:
        res = self.client.query(self.name, filter="", output_fields=["count(*)"], consistency_level="Strong")
        return int(res[0]["count(*)"])

    def _query_rows(self, expr: str) -> list:
        return self.client.query(self.name, filter=expr, output_fields=["row"], limit=1, consistency_level="Strong")

    # searching -----------------------------------------------------------------------------------------
    def set_search_options(self, options: dict[str, int]) -> None:
        """Apply the project's search options: ``nprobe`` (IVF_FLAT) and ``efSearch`` (HNSW's ``ef``).

        Raises:
            RetrievalIndexError: an option that does not apply to this index type.
        """
        names = {"IVF_FLAT": {"nprobe": "nprobe"}, "HNSW": {"efSearch": "ef"}}.get(self.settings.index_type, {})
        for name, value in options.items():
            if name not in names:
                raise RetrievalIndexError(
                    f"search option {name} does not apply to Milvus {self.settings.index_type} indexes "
                    "(nprobe applies to IVF_FLAT, efSearch to HNSW)"
                )
            self.settings.search_params[names[name]] = int(value)

    def _dense_params(self, k: int) -> dict[str, Any]:
        params = dict(self.settings.search_params)
        if self.settings.index_type == "HNSW":
            params["ef"] = max(int(params.get("ef", k)), k)  # Milvus requires ef >= limit
        if self.settings.index_type == "DISKANN":
            params["search_list"] = max(int(params.get("search_list", k)), k)
        return {"metric_type": METRIC, "params": params}

    def _call(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` with ``timeout=search_timeout``, tried again within ``retry_seconds`` while
        Milvus is not answering (:func:`~hcqr_dspy.retrieval.milvus.retries.call_with_retries`).

        Raises:
            MilvusOutageError: Milvus still failed when the window closed, or refused the request.
        """
        return call_with_retries(
            f"Milvus {what} in collection {self.name!r} at {self.settings.uri}",
            fn,
            *args,
            retry_seconds=self.retry_seconds,
            timeout=self.search_timeout,
            **kwargs,
        )

    def search_dense(self, vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """One ``search`` call for all query vectors: ``(row, inner product)`` lists, best first."""
        res = self._call(
            "search",
            self.client.search,
            self.name,
            data=np.asarray(vectors, dtype=np.float32).tolist(),
            anns_field="vector",
            limit=k,
            search_params=self._dense_params(k),
            output_fields=[],
            consistency_level=SEARCH_CONSISTENCY,
        )
        return [[(int(h.id), float(h.distance)) for h in hits] for hits in res]

    def search_bm25(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """One full-text ``search`` call for all queries: ``(row, BM25 score)`` lists, best first."""
        res = self._call(
            "BM25 search",
            self.client.search,
            self.name,
            data=queries,
            anns_field="sparse",
            limit=k,
            search_params={"metric_type": "BM25"},
            output_fields=[],
            consistency_level=SEARCH_CONSISTENCY,
        )
        # Milvus servers return BM25 scores (>= 0, larger is better); Milvus Lite 3.2.2 returns them negated
        # (its internal smaller-is-better distance), in the same best-first order. The score is its magnitude.
        return [[(int(h.id), abs(float(h.distance))) for h in hits] for hits in res]

    def search_hybrid(
        self, vectors: np.ndarray, queries: list[str], k: int, pool: int
    ) -> list[list[tuple[int, float]]]:
        """One ``hybrid_search`` call: dense and BM25 candidates (``pool`` each) fused by RRF inside Milvus."""
        from pymilvus import AnnSearchRequest, RRFRanker

        requests = [
            AnnSearchRequest(
                data=np.asarray(vectors, dtype=np.float32).tolist(),
                anns_field="vector",
                param=self._dense_params(pool),
                limit=pool,
            ),
            AnnSearchRequest(data=queries, anns_field="sparse", param={"metric_type": "BM25"}, limit=pool),
        ]
        res = self._call(
            "hybrid search",
            self.client.hybrid_search,
            self.name,
            requests,
            ranker=RRFRanker(self.settings.rrf_k),
            limit=k,
            output_fields=[],
            consistency_level=SEARCH_CONSISTENCY,
        )
        return [[(int(h.id), float(h.distance)) for h in hits] for hits in res]

    def close(self) -> None:
        self.client.close()
