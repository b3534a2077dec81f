"""Milvus backend: passage vectors (and BM25 where the engine has it) in a Milvus collection.

One code path serves a laptop and a cluster, through pymilvus's
``MilvusClient`` (pymilvus 3.x):

* a URI that is a file path ending in ``.db`` is **Milvus Lite**, embedded
  in this process (the ``milvus-lite`` package; the ``.db`` path is a
  folder of Milvus Lite's own files);
* ``http://host:port`` / ``https://host:port`` is a **Milvus server**
  (standalone or distributed; Zilliz Cloud too), with an optional token
  read from the environment variable named by ``token_env`` (never from a
  flag, never written anywhere).

Retrieval modes (``retrieval``): ``dense`` is :class:`MilvusIndex`, the
``milvus`` vector-index backend of
:class:`~hcqr_dspy.retrieval.dense.DenseRetriever`; ``bm25`` and ``hybrid``
are :class:`MilvusRetriever`, retriever kind ``milvus``. Importing this
package registers both.

Modules, one job each:

* :mod:`~hcqr_dspy.retrieval.milvus.settings`: URIs and tokens, retrieval
  mode, index types and parameters (what the manifest records);
* :mod:`~hcqr_dspy.retrieval.milvus.client`: the connection, the engine's
  version and what it can build;
* :mod:`~hcqr_dspy.retrieval.milvus.retries`: failed calls in one line,
  transient or not, searches tried again with back-off;
* :mod:`~hcqr_dspy.retrieval.milvus.identity`: what a collection was built
  from (corpus, passage encoder), and the refusal of another's;
* :mod:`~hcqr_dspy.retrieval.milvus.collection_build`: create or resume, insert,
  index, load;
* :mod:`~hcqr_dspy.retrieval.milvus.collection`: one collection: open,
  count, search;
* :mod:`~hcqr_dspy.retrieval.milvus.milvus_index`: :class:`MilvusIndex`;
* :mod:`~hcqr_dspy.retrieval.milvus.retriever`: :class:`MilvusRetriever`.

Errors (:mod:`hcqr_dspy.errors`, re-exported here):
:class:`MilvusUnavailableError` (cannot reach or open),
:class:`MilvusCapabilityError` (the engine lacks an index type or BM25),
:class:`MilvusOutageError` (a search failed mid-run after retries).
"""

from hcqr_dspy.errors import MilvusCapabilityError, MilvusOutageError, MilvusUnavailableError
from hcqr_dspy.retrieval.milvus.client import (
    BM25_MIN_SERVER_VERSION,
    PYMILVUS_NOISY_LOGGERS,
    connect,
    engine_label,
    has_bm25_function,
    offered_index_types,
)
from hcqr_dspy.retrieval.milvus.collection import MilvusCollection
from hcqr_dspy.retrieval.milvus.collection_build import INSERT_BATCH_BYTES, MAX_TEXT_BYTES
from hcqr_dspy.retrieval.milvus.identity import COLLECTION_FORMAT, PROPERTY_PREFIX, collection_identity
from hcqr_dspy.retrieval.milvus.milvus_index import SETTING_NAMES, MilvusIndex
from hcqr_dspy.retrieval.milvus.retries import (
    RETRY_FIRST_DELAY,
    RETRY_MAX_DELAY,
    RETRY_SECONDS,
    RETRY_SECONDS_ENV,
    SEARCH_TIMEOUT,
    SEARCH_TIMEOUT_ENV,
    TRANSIENT_GRPC_CODES,
    TRANSIENT_MILVUS_CODES,
    retry_settings,
    transient,
)
from hcqr_dspy.retrieval.milvus.retriever import MilvusRetriever
from hcqr_dspy.retrieval.milvus.settings import (
    DEFAULT_INDEX_PARAMS,
    DEFAULT_SEARCH_PARAMS,
    INDEX_TYPES,
    METRIC,
    RETRIEVAL_MODES,
    SEARCH_CONSISTENCY,
    MilvusSettings,
    MilvusTarget,
    bm25_analyzer,
    parse_params,
)

__all__ = [
    "BM25_MIN_SERVER_VERSION",
    "COLLECTION_FORMAT",
    "DEFAULT_INDEX_PARAMS",
    "DEFAULT_SEARCH_PARAMS",
    "INDEX_TYPES",
    "INSERT_BATCH_BYTES",
    "MAX_TEXT_BYTES",
    "METRIC",
    "MilvusCapabilityError",
    "MilvusCollection",
    "MilvusIndex",
    "MilvusOutageError",
    "MilvusRetriever",
    "MilvusSettings",
    "MilvusTarget",
    "MilvusUnavailableError",
    "PROPERTY_PREFIX",
    "PYMILVUS_NOISY_LOGGERS",
    "RETRIEVAL_MODES",
    "RETRY_FIRST_DELAY",
    "RETRY_MAX_DELAY",
    "RETRY_SECONDS",
    "RETRY_SECONDS_ENV",
    "SEARCH_CONSISTENCY",
    "SEARCH_TIMEOUT",
    "SEARCH_TIMEOUT_ENV",
    "SETTING_NAMES",
    "TRANSIENT_GRPC_CODES",
    "TRANSIENT_MILVUS_CODES",
    "bm25_analyzer",
    "collection_identity",
    "connect",
    "engine_label",
    "has_bm25_function",
    "offered_index_types",
    "parse_params",
    "retry_settings",
    "transient",
]
