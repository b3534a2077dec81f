"""Building a Milvus collection of passages: create it (or resume an unfinished one), insert, index, load.

A collection holds one row per passage: ``row`` (INT64 primary key, the
passage's row in the index folder's passage store), ``vector``
(FLOAT_VECTOR, inner-product metric, the passage vectors of the embedding
store) and, for BM25, ``text`` (``title + "\\n" + content``, analyzed) with
``sparse``, the output of Milvus's full-text ``BM25`` function. Passage text
for answers comes from the index folder's Arrow passage store, not from
Milvus.

PyPI's Milvus 2.3.5 server accepts DISKANN but its index node fails to build
it and retries forever, so a build waits for the index at most
``index_timeout`` seconds and then stops with a line saying how many rows
were indexed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hcqr_dspy.errors import HCQRError, MilvusCapabilityError, RetrievalIndexError
from hcqr_dspy.retrieval.milvus.client import has_bm25_function, offered_index_types
from hcqr_dspy.retrieval.milvus.identity import PROPERTY_PREFIX
from hcqr_dspy.retrieval.milvus.retries import one_line
from hcqr_dspy.retrieval.milvus.settings import METRIC, SEARCH_CONSISTENCY, bm25_analyzer

MAX_TEXT_BYTES = 65_535  # Milvus VARCHAR max_length limit
INSERT_BATCH_BYTES = 16 << 20  # rows per insert call sized to ~16 MB of payload (gRPC's default limit is 64 MB)


class CollectionBuild:
    """The building half of :class:`~hcqr_dspy.retrieval.milvus.collection.MilvusCollection`, which it is mixed
    into: it uses the collection's ``settings``, ``client``, ``version``, ``name``, ``engine``, ``rows``,
    :meth:`count` and :meth:`check_identity`.

    Build with :meth:`fill` (create or resume, insert, index, load).
    """

    def check_capabilities(self) -> None:
        """Refuse an index type or BM25 the engine lacks, before anything is created.

        Raises:
            MilvusCapabilityError: naming the engine, its version and the URI.
        """
        s = self.settings
        if s.dense and s.index_type not in offered_index_types(self.version):
            raise MilvusCapabilityError(
                f"{self.engine} at {s.uri} does not build {s.index_type} indexes; "
                f"choose one of {', '.join(offered_index_types(self.version))}"
            )
        if s.bm25 and has_bm25_function(self.version) is False:
            raise MilvusCapabilityError(
                f"{self.engine} at {s.uri} has no full-text BM25 function (Milvus >= 2.5 and Milvus Lite 3.x "
                "have it); use --retriever dense with this engine"
            )

    def create_or_resume(self, identity: dict[str, str], dimension: int | None) -> int:
        """Create the collection, or check and resume an unfinished one.

        Returns:
            Rows already present (0 for a new collection; the whole count
            for a finished one).

        Raises:
            RetrievalIndexError: the collection belongs to another corpus or
                encoder, or holds rows that are not a prefix of the corpus.
            MilvusCapabilityError: the engine lacks the index type or BM25.
        """
        s = self.settings
        self.check_capabilities()
        if self.client.has_collection(self.name):
            have = self.check_identity(identity)
            if have.get("complete") == "true":
                return int(have["corpus_count"])
            present = self.count()
            if present and self._query_rows(f"row >= {present}"):
                raise RetrievalIndexError(
                    f"Milvus collection {self.name!r} at {s.uri} holds {present} rows of an unfinished build that "
                    "are not the corpus's first rows; drop the collection and build again"
                )
            return present
        from pymilvus import DataType, Function, FunctionType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("row", DataType.INT64, is_primary=True)
        if s.dense:
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=int(dimension))
        if s.bm25:
            schema.add_field(
                "text",
                DataType.VARCHAR,
                max_length=MAX_TEXT_BYTES,
                enable_analyzer=True,
                analyzer_params=bm25_analyzer(),
            )
            schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
            schema.add_function(
                Function(
                    name="bm25",
                    function_type=FunctionType.BM25,
                    input_field_names=["text"],
                    output_field_names=["sparse"],
                )
            )
        props = {PROPERTY_PREFIX + k: v for k, v in {**identity, "complete": "false"}.items()}
        try:
            self.client.create_collection(
                self.name, schema=schema, consistency_level=SEARCH_CONSISTENCY, properties=props
            )
        except Exception as exc:
            raise RetrievalIndexError(
                f"{self.engine} at {s.uri} refused to create collection {self.name!r}: {one_line(exc)}"
            ) from None
        return 0

    def fill(
        self, identity: dict[str, str], corpus: Any, embeddings: Any = None, show_progress: bool = True
    ) -> dict[str, Any]:
        """Create (or resume) the collection and insert every passage not yet in it; then :meth:`finish`.

        Args:
            identity: :func:`~hcqr_dspy.retrieval.milvus.identity.collection_identity`.
            corpus: The passage store (text for BM25, the row count).
            embeddings: The complete :class:`~hcqr_dspy.retrieval.embeddings.EmbeddingStore`
                for dense and hybrid.
            show_progress: A progress bar while inserting.

        Returns:
            Build figures: engine, first row inserted (a resumed build starts
            past 0), rows inserted, insert and index seconds.
        """
        from tqdm.auto import tqdm

        s = self.settings
        n = len(corpus)
        dimension = embeddings.dimension if embeddings is not None else None
        t0 = time.perf_counter()
        start = self.create_or_resume(identity, dimension)
        row_bytes = (dimension or 0) * 4 + (1200 if s.bm25 else 64)
        batch = max(1, min(50_000, INSERT_BATCH_BYTES // row_bytes))
        inserted = 0
        with tqdm(
            total=n,
            initial=start,
            unit="passage",
            desc=f"inserting into Milvus {self.name}",
            disable=not show_progress or start >= n,
            dynamic_ncols=True,
        ) as bar:
            for lo in range(start, n, batch):
                hi = min(n, lo + batch)
                columns: dict[str, list] = {"row": list(range(lo, hi))}
                if s.dense:
                    columns["vector"] = embeddings.rows(np.arange(lo, hi)).tolist()
                if s.bm25:
                    columns["text"] = [
                        _passage_text(t, c)
                        for _, _, titles, contents in corpus.iter_batches(hi - lo, lo, hi)
                        for t, c in zip(titles, contents)
                    ]
                    _check_text_sizes(columns["text"], lo, corpus)
                self.insert([{k: v[i] for k, v in columns.items()} for i in range(hi - lo)])
                inserted += hi - lo
                bar.update(hi - lo)
        t_insert = time.perf_counter() - t0
        self.finish(n)
        return {
            "engine": self.engine,
            "resumed_from_row": start,
            "inserted": inserted,
            "insert_seconds": round(t_insert, 3),
            "milvus_build_seconds": round(time.perf_counter() - t0, 3),
        }

    def insert(self, rows: list[dict[str, Any]]) -> None:
        try:
            self.client.insert(self.name, rows)
        except Exception as exc:
            raise RetrievalIndexError(
                f"inserting rows {rows[0]['row']}..{rows[-1]['row']} into Milvus collection {self.name!r} at "
                f"{self.settings.uri} failed: {one_line(exc)}"
            ) from None

    def finish(self, expected_count: int) -> None:
        """Flush, build the index(es), wait for them, load, check the count, mark the collection complete.

        Raises:
            RetrievalIndexError: the index did not build within
                ``index_timeout`` or the count is not ``expected_count``.
        """
        s = self.settings
        self.client.flush(self.name)
        wanted = self.client.prepare_index_params()
        if s.dense:
            wanted.add_index(
                field_name="vector",
                index_name="vector",
                index_type=s.index_type,
                metric_type=METRIC,
                params=s.index_params,
            )
            # pymilvus 3 sends build parameters as flat key/value pairs (M=32, ...), which Milvus servers read;
            # Milvus Lite 3.2.2 reads only a JSON "params" pair (the older wire form, which servers accept too)
            # and silently builds with its defaults otherwise (measured: nlist=128 for nlist=16). Send both.
            wanted[-1].get_index_configs()["params"] = dict(s.index_params)
        if s.bm25:
            wanted.add_index(
                field_name="sparse", index_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25"
            )
        present = set(self.client.list_indexes(self.name))
        if present:
            self.client.release_collection(self.name)
            for name in present:
                self.client.drop_index(self.name, name)
        try:
            # sync=False: pymilvus's own wait asks for a timestamp Milvus Lite does not serve, and trusts an index
            # state that PyPI's 2.3.5 server reports "Finished" for a DISKANN index it never built; the rows
            # indexed, read below, are what counts.
            self.client.create_index(self.name, wanted, sync=False)
        except Exception as exc:
            raise RetrievalIndexError(
                f"{self.engine} at {s.uri} refused the {s.index_type} index {s.index_params}: {one_line(exc)}"
            ) from None
        if s.dense:
            self._wait_indexed("vector", expected_count)
        self.client.load_collection(self.name)
        have = self.count()
        if have != expected_count:
            raise RetrievalIndexError(
                f"Milvus collection {self.name!r} at {s.uri} holds {have} rows after the build, "
                f"expected {expected_count}"
            )
        self.client.alter_collection_properties(self.name, properties={PROPERTY_PREFIX + "complete": "true"})
        self.rows = have

    def _wait_indexed(self, field_name: str, expected: int) -> None:
        s = self.settings
        t0 = time.monotonic()
        info: dict[str, Any] = {}
        while time.monotonic() - t0 < s.index_timeout:
            info = self.client.describe_index(self.name, field_name)
            if int(info.get("indexed_rows", 0)) >= expected and int(info.get("pending_index_rows", 0)) == 0:
                return
            time.sleep(min(2.0, 0.1 + (time.monotonic() - t0) / 10))
        raise RetrievalIndexError(
            f"{self.engine} at {s.uri} did not build the {s.index_type} index of collection {self.name!r} within "
            f"{s.index_timeout:.0f} s ({info.get('indexed_rows', 0)} of {expected} rows indexed); the server's log "
            "says why (PyPI's Milvus 2.3.5 cannot build DISKANN)"
        )


def _passage_text(title: str, content: str) -> str:
    return f"{title}\n{content}" if title else content  # Passage.text: what BM25 indexes everywhere


def _check_text_sizes(texts: list[str], first_row: int, corpus: Any) -> None:
    for i, text in enumerate(texts):
        size = len(text.encode("utf-8"))
        if size > MAX_TEXT_BYTES:
            pid = corpus.ids([first_row + i])[0]
            raise HCQRError(
                f"passage {pid!r} has {size} bytes of text; Milvus keeps at most {MAX_TEXT_BYTES} per row for BM25 "
                "(split the passage)"
            )
