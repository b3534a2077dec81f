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

A collection holds one row per passage: ``row`` (INT64 primary key, the
passage's row in the index folder's passage store), ``vector``
(FLOAT_VECTOR, inner-product metric, the passage vectors of the embedding
store) and, for BM25, ``text`` (``title + "\\n" + content``, analyzed) with
``sparse``, the output of Milvus's full-text ``BM25`` function. Passage text
for answers comes from the index folder's Arrow passage store, not from
Milvus. The collection's properties record the corpus fingerprint, passage
count and passage encoder; a collection built from another corpus or encoder
is refused, naming both.

Retrieval modes (``retrieval``):

``dense``
    :class:`MilvusIndex`, the ``milvus`` vector-index backend of
    :class:`~hcqr_dspy.retrieval.dense.DenseRetriever` (which owns the
    encoder or encoder pair): nearest neighbours by inner product, exact or
    approximate; all queries of a batch go to Milvus in one ``search`` call.
    The vectors come from the resumable embedding store, so a Milvus and a
    faiss index over one corpus and encoder hold the same vectors.
``bm25`` (:class:`MilvusRetriever`, kind ``milvus``)
    Milvus's full-text search: the BM25 function turns ``text`` into sparse
    term weights at insert time and each query at search time (analyzer:
    Milvus's ``standard`` tokenizer, lower-casing and bm25s' English
    stopword list; no stemming, which Milvus Lite's analyzer lacks).
``hybrid`` (:class:`MilvusRetriever`, kind ``milvus``)
    both in one collection, fused inside Milvus by reciprocal rank
    (``hybrid_search`` with ``RRFRanker(60)``; Cormack et al. 2009), each
    side drawing ``pool_k`` candidates, as :mod:`hcqr_dspy.retrieval.hybrid`
    does across two systems.

Which engines have the BM25 function (measured here, 2026-12): Milvus Lite
3.2.2 (``milvus-lite`` from PyPI) has it; Milvus 2.3.5 (PyPI's ``milvus``
server package) has not: it accepts a schema with the function, then refuses
every insert (BM25 functions and sparse vectors arrived in Milvus 2.5 and
2.4, per the Milvus release notes). This module asks the engine its version
and refuses BM25 below 2.5 before creating anything.

A server that stops answering mid-run (stopped, restarting, hung, reloading
its collections) is searched again with back-off for :data:`RETRY_SECONDS`
(``$HCQR_MILVUS_RETRY_SECONDS``), each try bounded by :data:`SEARCH_TIMEOUT`
(``$HCQR_MILVUS_SEARCH_TIMEOUT``); then the search fails with
:class:`MilvusOutageError`, an outage that stops a run in one line, resumable.

Index types (``index_type``, Milvus names): ``FLAT`` (exact), ``IVF_FLAT``
(``nlist``; searched with ``nprobe``), ``HNSW`` (``M``, ``efConstruction``;
searched with ``ef``, raised to at least ``k``) and ``DISKANN``
(``search_list``) where the engine builds it. Milvus Lite 3.2.2 does not
build DISKANN (it accepts the index, then cannot load it), so DISKANN is
refused there; PyPI's Milvus 2.3.5 server accepts DISKANN but its index
node fails to build it and retries forever, so a build waits for the index
at most ``index_timeout`` seconds and then stops with a line saying how many
rows were indexed. Defaults follow bench/retrieval.py's faiss HNSW (M=32,
efConstruction=80, ef=64) and Milvus's documentation for IVF (nlist=128,
nprobe=16).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

import numpy as np

from hcqr_dspy.errors import BackendUnavailableError, HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval.base import Hit, Retriever, library_versions
from hcqr_dspy.retrieval.registry import register, register_backend
from hcqr_dspy.retrieval.vector_index import VectorIndex, check_search_options

# pymilvus logs every failed RPC with a full traceback at ERROR and a failed reconnect with its traceback at WARNING,
# and Milvus Lite a database it cannot open; each such failure is raised here as one line instead. pymilvus's import
# configures its loggers (pymilvus/settings.py, logging.config.dictConfig), which resets the level of any
# "pymilvus.*" logger made before it: :func:`_quiet_pymilvus` sets theirs after the import.
PYMILVUS_NOISY_LOGGERS = ("pymilvus.decorators", "pymilvus.client.connection_manager")
logging.getLogger("milvus_lite.server_manager").setLevel(logging.CRITICAL)


def _quiet_pymilvus() -> None:
    import pymilvus  # noqa: F401 - its import configures the loggers set below

    for name in PYMILVUS_NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


RETRIEVAL_MODES = ("dense", "bm25", "hybrid")
INDEX_TYPES = ("FLAT", "IVF_FLAT", "HNSW", "DISKANN")
DEFAULT_INDEX_PARAMS: dict[str, dict[str, Any]] = {
    "FLAT": {},
    "IVF_FLAT": {"nlist": 128},
    "HNSW": {"M": 32, "efConstruction": 80},
    "DISKANN": {},
}
DEFAULT_SEARCH_PARAMS: dict[str, dict[str, Any]] = {
    "FLAT": {},
    "IVF_FLAT": {"nprobe": 16},
    "HNSW": {"ef": 64},
    "DISKANN": {"search_list": 64},
}
METRIC = "IP"
# Session consistency: a search sees every row this client wrote and, in a later process, every row flushed
# before the collection was loaded; Strong would wait for the server's time tick (~200 ms) on every search.
SEARCH_CONSISTENCY = "Session"
BM25_MIN_SERVER_VERSION = (2, 5)  # Milvus release notes: full-text search (BM25 function) since 2.5.0
MAX_TEXT_BYTES = 65_535  # Milvus VARCHAR max_length limit
PROPERTY_PREFIX = "hcqr."
COLLECTION_FORMAT = "hcqr-milvus/1"
INSERT_BATCH_BYTES = 16 << 20  # rows per insert call sized to ~16 MB of payload (gRPC's default limit is 64 MB)


class MilvusUnavailableError(RetrievalIndexError):
    """A Milvus server or Milvus Lite database cannot be reached or opened."""


class MilvusOutageError(MilvusUnavailableError, BackendUnavailableError):
    """A search failed on Milvus's side mid-run: the server stayed unreachable, hung or not ready through
    :func:`retry_settings`' window of retries, or refused the request. An outage: a run stops with one line and
    the same command resumes."""


# -- a server that stops answering mid-run -------------------------------------------------------------------
RETRY_SECONDS = 300.0
"""Seconds a search keeps retrying a Milvus server that stopped answering before it fails (a run then stops as an
outage): long enough for a standalone server to restart on its data (Milvus 2.3.5 answers again only once its previous
etcd session has expired, then says "collection not loaded" while it reloads the collection). A search fails at most
this plus :data:`SEARCH_TIMEOUT` seconds after it began."""

SEARCH_TIMEOUT = 60.0
"""Seconds one search try may take (pymilvus's per-call ``timeout``, which also bounds pymilvus's own retries of a
dropped connection) before it is abandoned and tried again: a hung server (a stopped process, a route that drops
packets) answers nothing, ever. A search of a loaded collection takes milliseconds to seconds."""

RETRY_FIRST_DELAY = 0.5
"""Seconds before the second try; each later wait doubles, up to :data:`RETRY_MAX_DELAY`, so a short hiccup costs
little and a long outage is asked about every few seconds, not hammered."""

RETRY_MAX_DELAY = 10.0
"""The longest wait between two tries, in seconds: a server back after a restart is used within this much."""

RETRY_SECONDS_ENV = "HCQR_MILVUS_RETRY_SECONDS"
SEARCH_TIMEOUT_ENV = "HCQR_MILVUS_SEARCH_TIMEOUT"

# gRPC status codes of a server that is not answering now (pymilvus raises them as grpc.RpcError): down or
# restarting (UNAVAILABLE), hung (DEADLINE_EXCEEDED: the try's timeout passed), shedding load.
TRANSIENT_GRPC_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
# Codes of a MilvusException that say "not now" (Milvus's pkg/util/merr/errors.go): 1 service not ready,
# 2 service unavailable (also pymilvus's own "Fail connecting to server", pymilvus.client.types.Status.CONNECT_FAILED,
# raised when its reconnect finds the server down), 4 too many requests, 8 rate limit, 101 collection not loaded (what
# a restarted server says while it reloads), 103 collection not fully loaded, 106 collection on
# recovering, 401 replica not available, 503 channel not available, 601 segment not loaded, 905 node not available.
TRANSIENT_MILVUS_CODES = frozenset({1, 2, 4, 8, 101, 103, 106, 401, 503, 601, 905})


def retry_settings() -> tuple[float, float]:
    """``(retry window, search timeout)`` in seconds: :data:`RETRY_SECONDS` and :data:`SEARCH_TIMEOUT`, or the
    values of ``$HCQR_MILVUS_RETRY_SECONDS`` (0: no retry) and ``$HCQR_MILVUS_SEARCH_TIMEOUT``.

    Raises:
        HCQRError: a value that is not a finite number, a negative window or a timeout that is not positive.
    """
    return _env_seconds(RETRY_SECONDS_ENV, RETRY_SECONDS, zero=True), _env_seconds(SEARCH_TIMEOUT_ENV, SEARCH_TIMEOUT)


def _env_seconds(name: str, default: float, zero: bool = False) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise HCQRError(f"${name} must be a number of seconds, {'0 or more' if zero else 'more than 0'}; got {raw!r}")
    return value


def transient(exc: BaseException) -> bool:
    """Whether a failed Milvus call may succeed if tried again: a gRPC status in :data:`TRANSIENT_GRPC_CODES`, or a
    ``MilvusException`` (not pymilvus's check of our own arguments, ``ParamError``) whose code is in
    :data:`TRANSIENT_MILVUS_CODES` or that the server marked retriable."""
    import grpc
    from pymilvus.exceptions import MilvusException, ParamError

    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return getattr(exc.code(), "name", None) in TRANSIENT_GRPC_CODES
    if isinstance(exc, MilvusException) and not isinstance(exc, ParamError):
        if isinstance(exc.code, grpc.StatusCode):  # pymilvus's own retries ran out ("Retry timeout: ...")
            return exc.code.name in TRANSIENT_GRPC_CODES
        return bool(getattr(exc, "retriable", False)) or exc.code in TRANSIENT_MILVUS_CODES
    return False


def _failure(exc: BaseException) -> str:
    """One line for a failed Milvus call: a gRPC error's status and details, else :func:`_one_line`."""
    if callable(getattr(exc, "details", None)) and callable(getattr(exc, "code", None)):
        code = getattr(exc.code(), "name", exc.code())
        return " ".join(f"gRPC {code}: {exc.details() or ''}".split())[:400]
    return _one_line(exc)


class MilvusCapabilityError(RetrievalIndexError):
    """The Milvus engine lacks what was asked (an index type, the BM25 function)."""


# -- where: URIs and tokens ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MilvusTarget:
    """A Milvus URI, checked, and the *name* of the variable holding its token.

    Attributes:
        uri: ``http(s)://host:port`` (a server) or the absolute path of a
            Milvus Lite ``.db`` folder.
        token_env: Name of the environment variable holding the server
            token (``user:password`` or an API key), or ``None``.
    """

    uri: str
    token_env: str | None = None

    @classmethod
    def parse(cls, uri: str, token_env: str | None = None) -> "MilvusTarget":
        """Check a URI.

        Raises:
            HCQRError: an empty URI, a URI with credentials in it (use
                ``token_env``), a scheme other than http/https, a Lite path
                not ending in ``.db``, or a token with Milvus Lite.
        """
        if not isinstance(uri, str) or not uri.strip():
            raise HCQRError("--milvus-uri is empty: give a Milvus Lite file (path ending in .db) or http://host:port")
        uri = uri.strip()
        if token_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env):
            raise HCQRError(f"--milvus-token-env takes the name of an environment variable, got {token_env!r}")
        if "://" in uri:
            parsed = urlparse(uri)
            if parsed.scheme not in ("http", "https"):
                raise HCQRError(f"Milvus URI {uri!r}: use http://host:port or https://host:port (or a Lite .db path)")
            if parsed.username or parsed.password:
                raise HCQRError(
                    "a Milvus URI must not carry credentials (they would be recorded with the index); "
                    "put the token in an environment variable and name it with --milvus-token-env"
                )
            if not parsed.hostname:
                raise HCQRError(f"Milvus URI {uri!r} names no host")
            return cls(uri.rstrip("/"), token_env)
        path = Path(uri).expanduser()
        if path.suffix != ".db":
            raise HCQRError(
                f"Milvus URI {uri!r}: a Milvus Lite database is a path ending in .db (or give http://host:port)"
            )
        if token_env is not None:
            raise HCQRError("Milvus Lite (a .db path) takes no token; --milvus-token-env is for a server URI")
        return cls(str(path.resolve()), None)

    @property
    def is_lite(self) -> bool:
        return "://" not in self.uri

    def token(self) -> str:
        """The token from ``token_env`` ("" without one).

        Raises:
            HCQRError: the named variable is unset or empty.
        """
        if self.token_env is None:
            return ""
        value = os.environ.get(self.token_env, "")
        if not value:
            raise HCQRError(f"environment variable {self.token_env} (named by --milvus-token-env) is not set")
        return value


def _one_line(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(msg).split())[:400]


def connect(target: MilvusTarget, timeout: float = 20.0, create: bool = False) -> tuple[Any, str]:
    """Open a client and ask the engine its version.

    Args:
        target: Where.
        timeout: Seconds to wait for a server.
        create: For Milvus Lite, create the ``.db`` folder's parent; else
            a missing database is an error.

    Returns:
        ``(client, version)``; the version string is the engine's own
        (``"v2.3.5-lite"`` from PyPI's server, ``"milvus_lite-3.2.2"``).

    Raises:
        MilvusUnavailableError: one line naming the URI and why.
    """
    token = target.token()
    if target.is_lite:
        db = Path(target.uri)
        if create:
            db.parent.mkdir(parents=True, exist_ok=True)
        elif not db.exists():
            raise MilvusUnavailableError(f"Milvus Lite database {db} does not exist")
    from pymilvus import MilvusClient

    _quiet_pymilvus()
    try:
        client = MilvusClient(uri=target.uri, token=token, timeout=timeout)
        version = client.get_server_version()
    except Exception as exc:  # pymilvus raises MilvusException and others (grpc errors) for the same cause
        if target.is_lite and _lite_locked(Path(target.uri)):
            raise MilvusUnavailableError(
                f"Milvus Lite database {target.uri} is open in another process (Milvus Lite serves one process at a "
                "time; share an index between processes through a Milvus server)"
            ) from None
        hint = "" if target.is_lite or target.token_env else " (if it requires a token, name its variable with --milvus-token-env)"
        raise MilvusUnavailableError(f"cannot reach Milvus at {target.uri}: {_one_line(exc)}{hint}") from None
    return client, str(version)


def _lite_locked(db: Path) -> bool:
    """Whether another process holds Milvus Lite's advisory lock (``flock`` on ``<db>/LOCK``, as milvus_lite.db does)."""
    import fcntl

    lock = db / "LOCK"
    if not lock.is_file():
        return False
    with lock.open("a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


def engine_label(version: str) -> str:
    """A readable engine name: ``milvus-lite 3.2.2`` or ``milvus v2.3.5-lite``."""
    if version.startswith("milvus_lite-"):
        return "milvus-lite " + version.split("-", 1)[1]
    return f"milvus {version}"


def _server_version(version: str) -> tuple[int, int] | None:
    m = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m and not version.startswith("milvus_lite-") else None


def offered_index_types(version: str) -> tuple[str, ...]:
    """Index types (of :data:`INDEX_TYPES`) the engine builds.

    Milvus Lite: those its index factory knows
    (``milvus_lite.index.factory.KNOWN_VECTOR_INDEX_TYPES``); a server: all
    of them (whether it really builds one shows while waiting for the index).
    """
    if version.startswith("milvus_lite-"):
        from milvus_lite.index.factory import KNOWN_VECTOR_INDEX_TYPES

        return tuple(t for t in INDEX_TYPES if t in KNOWN_VECTOR_INDEX_TYPES)
    return INDEX_TYPES


def has_bm25_function(version: str) -> bool | None:
    """Whether the engine has the full-text BM25 function: True / False, or None when the version is unreadable."""
    if version.startswith("milvus_lite-"):
        return _lite_has_bm25()
    parsed = _server_version(version)
    return None if parsed is None else parsed >= BM25_MIN_SERVER_VERSION


def _lite_has_bm25() -> bool:
    try:
        from milvus_lite import FunctionType
    except ImportError:
        return False
    return hasattr(FunctionType, "BM25")


# -- settings recorded in the manifest ---------------------------------------------------------------------
def _param_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_params(items: Sequence[str] | None, flag: str) -> dict[str, Any]:
    """``["M=32", "efConstruction=80"]`` -> ``{"M": 32, "efConstruction": 80}`` (ints and floats converted).

    Raises:
        HCQRError: an item without ``=`` or with an empty name.
    """
    out: dict[str, Any] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise HCQRError(f"{flag} takes NAME=VALUE, got {item!r}")
        out[name.strip()] = _param_value(value.strip())
    return out


@dataclass
class MilvusSettings:
    """Where and how an index lives in Milvus (all of it goes into the manifest; the token never does).

    Attributes:
        uri: See :class:`MilvusTarget`.
        collection: Collection name (letters, digits and ``_``, starting
            with a letter or ``_``, as Milvus requires).
        retrieval: ``dense``, ``bm25`` or ``hybrid``.
        index_type: One of :data:`INDEX_TYPES`.
        index_params: Build parameters (defaults per type).
        search_params: Search parameters (defaults per type).
        token_env: Name of the token's environment variable.
        rrf_k / pool_k: Hybrid fusion constant and candidates per side.
        index_timeout: Seconds to wait for the server to build the index.
    """

    uri: str
    collection: str
    retrieval: str = "dense"
    index_type: str = "FLAT"
    index_params: dict[str, Any] = field(default_factory=dict)
    search_params: dict[str, Any] = field(default_factory=dict)
    token_env: str | None = None
    rrf_k: int = 60
    pool_k: int = 50
    index_timeout: float = 3600.0

    def __post_init__(self) -> None:
        self.target = MilvusTarget.parse(self.uri, self.token_env)
        self.uri = self.target.uri
        if not isinstance(self.collection, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,254}", self.collection):
            raise HCQRError(
                f"Milvus collection name {self.collection!r}: use letters, digits and _, starting with a letter or _"
            )
        if self.retrieval not in RETRIEVAL_MODES:
            raise HCQRError(f"unknown Milvus retrieval {self.retrieval!r}; choose one of {', '.join(RETRIEVAL_MODES)}")
        self.index_type = str(self.index_type).upper()
        if self.index_type not in INDEX_TYPES:
            raise HCQRError(f"unknown Milvus index type {self.index_type!r}; choose one of {', '.join(INDEX_TYPES)}")
        self.index_params = {**DEFAULT_INDEX_PARAMS[self.index_type], **(self.index_params or {})}
        self.search_params = {**DEFAULT_SEARCH_PARAMS[self.index_type], **(self.search_params or {})}

    @property
    def dense(self) -> bool:
        return self.retrieval in ("dense", "hybrid")

    @property
    def bm25(self) -> bool:
        return self.retrieval in ("bm25", "hybrid")

    def describe(self) -> dict[str, Any]:
        out = {
            "uri": self.uri,
            "collection": self.collection,
            "retrieval": self.retrieval,
            "token_env": self.token_env,
        }
        if self.dense:
            out.update(index_type=self.index_type, index_params=self.index_params,
                       search_params=self.search_params, metric=METRIC)
        if self.bm25:
            out["analyzer"] = bm25_analyzer()
        if self.retrieval == "hybrid":
            out.update(rrf_k=self.rrf_k, pool_k=self.pool_k)
        return out

    def options(self) -> dict[str, Any]:
        """The dense backend's build options (``DenseRetriever(backend="milvus", backend_options=...)``)."""
        return {"uri": self.uri, "collection": self.collection, "index_type": self.index_type,
                "index_params": dict(self.index_params), "search_params": dict(self.search_params),
                "token_env": self.token_env, "index_timeout": self.index_timeout}

    @classmethod
    def from_manifest(cls, record: dict[str, Any], **overrides: Any) -> "MilvusSettings":
        keys = ("uri", "collection", "retrieval", "index_type", "index_params", "search_params", "token_env",
                "rrf_k", "pool_k")
        values = {k: record[k] for k in keys if k in record}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def bm25_analyzer() -> dict[str, Any]:
    """Milvus analyzer params for the BM25 field: standard tokenizer, lower-casing, bm25s' English stopwords."""
    from bm25s.stopwords import STOPWORDS_EN

    return {"tokenizer": "standard", "filter": ["lowercase", {"type": "stop", "stop_words": sorted(STOPWORDS_EN)}]}


# -- identity: what a collection was built from ------------------------------------------------------------
def collection_identity(corpus: Any, retrieval: str, passage_encoder: dict[str, Any] | None,
                        dimension: int | None) -> dict[str, str]:
    """The collection properties that name what it was built from (all strings, as Milvus properties are).

    Args:
        corpus: The :class:`~hcqr_dspy.retrieval.store.PassageStore` (fingerprint, count, source).
        retrieval: ``dense``, ``bm25`` or ``hybrid``.
        passage_encoder: :meth:`EncoderSpec.passage_description` of the
            encoder whose passage side made the vectors (``None`` for bm25).
        dimension: Vector size (``None`` for bm25).
    """
    return {
        "format": COLLECTION_FORMAT,
        "corpus_fingerprint": corpus.fingerprint,
        "corpus_source": str(corpus.source),
        "corpus_count": str(len(corpus)),
        "passage_encoder": json.dumps(passage_encoder, sort_keys=True) if passage_encoder else "none",
        "dimension": str(dimension or 0),
        "retrieval": retrieval,
    }


def _encoder_label(value: str | None) -> str:
    if not value or value == "none":
        return "no encoder"
    try:
        return repr(json.loads(value)["passage_encoder"]["model"])
    except (ValueError, KeyError, TypeError):
        return repr(value)


# -- the collection ----------------------------------------------------------------------------------------
class MilvusCollection:
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
    def connect(cls, settings: MilvusSettings, create: bool = False) -> "MilvusCollection":
        """Connect to ``settings.uri`` (see :func:`connect`)."""
        client, version = connect(settings.target, create=create)
        return cls(settings, client, version)

    @property
    def engine(self) -> str:
        return engine_label(self.version)

    # identity ------------------------------------------------------------------------------------------
    def properties(self) -> dict[str, str]:
        desc = self.client.describe_collection(self.name)
        props = desc.get("properties") or {}
        return {k[len(PROPERTY_PREFIX):]: v for k, v in props.items() if k.startswith(PROPERTY_PREFIX)}

    def check_identity(self, expected: dict[str, str]) -> dict[str, str]:
        """Refuse a collection built from another corpus, passage encoder or for another retrieval mode.

        Raises:
            RetrievalIndexError: naming the collection's and the expected corpus / encoder.
        """
        have = self.properties()
        where = f"Milvus collection {self.name!r} at {self.settings.uri}"
        if have.get("format") != COLLECTION_FORMAT:
            raise RetrievalIndexError(f"{where} was not built by hcqr-dspy (no {PROPERTY_PREFIX}format property)")
        if have.get("corpus_fingerprint") != expected["corpus_fingerprint"]:
            raise RetrievalIndexError(
                f"{where} was built for corpus {have.get('corpus_source')!r} ({have.get('corpus_count')} passages, "
                f"fingerprint {str(have.get('corpus_fingerprint'))[:12]}) but was given corpus "
                f"{expected['corpus_source']!r} ({expected['corpus_count']} passages, fingerprint "
                f"{expected['corpus_fingerprint'][:12]}); use another --collection or the corpus it was built for"
            )
        if have.get("passage_encoder") != expected["passage_encoder"]:
            raise RetrievalIndexError(
                f"{where} holds vectors of passage encoder {_encoder_label(have.get('passage_encoder'))}, not "
                f"{_encoder_label(expected['passage_encoder'])}; use another --collection"
            )
        for key, what in (("dimension", "dimension"), ("retrieval", "retrieval mode")):
            if have.get(key) != expected[key]:
                raise RetrievalIndexError(
                    f"{where} was built with {what} {have.get(key)!r}, not {expected[key]!r}; use another --collection"
                )
        return have

    # building ------------------------------------------------------------------------------------------
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
            schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES, enable_analyzer=True,
                             analyzer_params=bm25_analyzer())
            schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
            schema.add_function(Function(name="bm25", function_type=FunctionType.BM25,
                                         input_field_names=["text"], output_field_names=["sparse"]))
        props = {PROPERTY_PREFIX + k: v for k, v in {**identity, "complete": "false"}.items()}
        try:
            self.client.create_collection(self.name, schema=schema, consistency_level=SEARCH_CONSISTENCY,
                                          properties=props)
        except Exception as exc:
            raise RetrievalIndexError(
                f"{self.engine} at {s.uri} refused to create collection {self.name!r}: {_one_line(exc)}"
            ) from None
        return 0

    def fill(self, identity: dict[str, str], corpus: Any, embeddings: Any = None, show_progress: bool = True
             ) -> dict[str, Any]:
        """Create (or resume) the collection and insert every passage not yet in it; then :meth:`finish`.

        Args:
            identity: :func:`collection_identity`.
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
        with tqdm(total=n, initial=start, unit="passage", desc=f"inserting into Milvus {self.name}",
                  disable=not show_progress or start >= n, dynamic_ncols=True) as bar:
            for lo in range(start, n, batch):
                hi = min(n, lo + batch)
                columns: dict[str, list] = {"row": list(range(lo, hi))}
                if s.dense:
                    columns["vector"] = embeddings.rows(np.arange(lo, hi)).tolist()
                if s.bm25:
                    columns["text"] = [_passage_text(t, c) for _, _, titles, contents in
                                       corpus.iter_batches(hi - lo, lo, hi) for t, c in zip(titles, contents)]
                    _check_text_sizes(columns["text"], lo, corpus)
                self.insert([{k: v[i] for k, v in columns.items()} for i in range(hi - lo)])
                inserted += hi - lo
                bar.update(hi - lo)
        t_insert = time.perf_counter() - t0
        self.finish(n)
        return {"engine": self.engine, "resumed_from_row": start, "inserted": inserted,
                "insert_seconds": round(t_insert, 3), "milvus_build_seconds": round(time.perf_counter() - t0, 3)}

    def insert(self, rows: list[dict[str, Any]]) -> None:
        try:
            self.client.insert(self.name, rows)
        except Exception as exc:
            raise RetrievalIndexError(
                f"inserting rows {rows[0]['row']}..{rows[-1]['row']} into Milvus collection {self.name!r} at "
                f"{self.settings.uri} failed: {_one_line(exc)}"
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
            wanted.add_index(field_name="vector", index_name="vector", index_type=s.index_type, metric_type=METRIC,
                             params=s.index_params)
            # pymilvus 3 sends build parameters as flat key/value pairs (M=32, ...), which Milvus servers read;
            # Milvus Lite 3.2.2 reads only a JSON "params" pair (the older wire form, which servers accept too)
            # and silently builds with its defaults otherwise (measured: nlist=128 for nlist=16). Send both.
            wanted[-1].get_index_configs()["params"] = dict(s.index_params)
        if s.bm25:
            wanted.add_index(field_name="sparse", index_name="sparse", index_type="SPARSE_INVERTED_INDEX",
                             metric_type="BM25")
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
                f"{self.engine} at {s.uri} refused the {s.index_type} index {s.index_params}: {_one_line(exc)}"
            ) from None
        if s.dense:
            self._wait_indexed("vector", expected_count)
        self.client.load_collection(self.name)
        have = self.count()
        if have != expected_count:
            raise RetrievalIndexError(
                f"Milvus collection {self.name!r} at {s.uri} holds {have} rows after the build, expected {expected_count}"
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

    # opening and searching -----------------------------------------------------------------------------
    def open(self, identity: dict[str, str]) -> None:
        """Check an existing, finished collection and load it.

        Finished means marked ``complete`` by :meth:`finish`, or, where the
        mark was lost (Milvus 2.3.5 forgets a collection's last property change
        across a restart, milvus-io/milvus#30144), every index built over
        every row and the row count equal to the corpus's.

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
                f"{self.engine} at {s.uri} cannot load collection {self.name!r}: {_one_line(exc)}"
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
        """``fn(*args, **kwargs)`` with ``timeout=search_timeout``, tried again while Milvus is not answering.

        A failure that may pass (:func:`transient`: the server down, hung, restarting, reloading or shedding load)
        is tried again after :data:`RETRY_FIRST_DELAY` seconds, the wait doubling up to :data:`RETRY_MAX_DELAY`,
        while the next try starts within ``retry_seconds`` of the first. pymilvus retries a dropped connection
        itself (``retry_on_rpc_failure``, within the ``timeout``), but not a server it cannot reconnect to: its
        connection manager then raises "Fail connecting to server" at once.

        Raises:
            MilvusOutageError: Milvus still failed when the window closed, or refused the request (one line:
                what, collection, URI, tries and the last failure). Anything else (pymilvus's ``ParamError`` for
                our own arguments, an error of this code) propagates unchanged: a bug.
        """
        import grpc
        from pymilvus.exceptions import MilvusException, ParamError

        start, delay, tries = time.monotonic(), RETRY_FIRST_DELAY, 0
        while True:
            tries += 1
            try:
                return fn(*args, timeout=self.search_timeout, **kwargs)
            except ParamError:
                raise
            except (MilvusException, grpc.RpcError) as exc:
                elapsed = time.monotonic() - start
                if not transient(exc) or elapsed + delay > self.retry_seconds:
                    again = f" ({tries} tries over {elapsed:.0f} s)" if tries > 1 else ""
                    raise MilvusOutageError(
                        f"Milvus {what} in collection {self.name!r} at {self.settings.uri} failed{again}: "
                        f"{_failure(exc)}"
                    ) from None
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_DELAY)

    def search_dense(self, vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """One ``search`` call for all query vectors: ``(row, inner product)`` lists, best first."""
        res = self._call("search", self.client.search, self.name, data=np.asarray(vectors, dtype=np.float32).tolist(),
                         anns_field="vector", limit=k, search_params=self._dense_params(k), output_fields=[],
                         consistency_level=SEARCH_CONSISTENCY)
        return [[(int(h.id), float(h.distance)) for h in hits] for hits in res]

    def search_bm25(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """One full-text ``search`` call for all queries: ``(row, BM25 score)`` lists, best first."""
        res = self._call("BM25 search", self.client.search, self.name, data=queries, anns_field="sparse", limit=k,
                         search_params={"metric_type": "BM25"}, output_fields=[], consistency_level=SEARCH_CONSISTENCY)
        # Milvus servers return BM25 scores (>= 0, larger is better); Milvus Lite 3.2.2 returns them negated
        # (its internal smaller-is-better distance), in the same best-first order. The score is its magnitude.
        return [[(int(h.id), abs(float(h.distance))) for h in hits] for hits in res]

    def search_hybrid(self, vectors: np.ndarray, queries: list[str], k: int, pool: int) -> list[list[tuple[int, float]]]:
        """One ``hybrid_search`` call: dense and BM25 candidates (``pool`` each) fused by RRF inside Milvus."""
        from pymilvus import AnnSearchRequest, RRFRanker

        requests = [
            AnnSearchRequest(data=np.asarray(vectors, dtype=np.float32).tolist(), anns_field="vector",
                             param=self._dense_params(pool), limit=pool),
            AnnSearchRequest(data=queries, anns_field="sparse", param={"metric_type": "BM25"}, limit=pool),
        ]
        res = self._call("hybrid search", self.client.hybrid_search, self.name, requests,
                         ranker=RRFRanker(self.settings.rrf_k), limit=k, output_fields=[],
                         consistency_level=SEARCH_CONSISTENCY)
        return [[(int(h.id), float(h.distance)) for h in hits] for hits in res]

    def close(self) -> None:
        self.client.close()


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


# -- dense retrieval: Milvus as a vector-index backend -----------------------------------------------------
SETTING_NAMES = ("uri", "collection", "index_type", "index_params", "search_params", "token_env", "index_timeout")


def _settings(retrieval: str, options: dict[str, Any]) -> MilvusSettings:
    unknown = sorted(set(options) - set(SETTING_NAMES))
    if unknown:
        raise RetrievalIndexError(f"unknown Milvus build option(s) {', '.join(unknown)}; known: {', '.join(SETTING_NAMES)}")
    if not options.get("uri") or not options.get("collection"):
        raise HCQRError("--backend milvus needs --milvus-uri (a Milvus Lite .db path or http://host:port) and --collection")
    return MilvusSettings(retrieval=retrieval, **{k: v for k, v in options.items() if v is not None})


@register_backend("milvus")
class MilvusIndex(VectorIndex):
    """Dense vectors in a Milvus collection (inner product; Milvus Lite or a server).

    Built from an :class:`~hcqr_dspy.retrieval.embeddings.EmbeddingStore`
    (so the vectors are the ones a faiss index over the same corpus and
    encoder gets); rows are passage positions in the index's passage store.
    Build options (``backend_options``): ``uri``, ``collection``,
    ``index_type``, ``index_params``, ``search_params``, ``token_env``,
    ``index_timeout`` (see :class:`MilvusSettings`).
    """

    def __init__(self, collection: MilvusCollection, dimension: int, identity: dict[str, str],
                 build_stats: dict[str, Any] | None = None):
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
    def build(cls, embeddings: Any, show_progress: bool = True, corpus: Any = None, **settings: Any) -> "MilvusIndex":
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
        return {"backend": "milvus", **self.collection.settings.describe(), "engine": self.collection.engine,
                "client": library_versions("pymilvus", "milvus-lite"), "ntotal": self.ntotal,
                "dimension": self._dimension, "identity": self.identity}

    def write(self, folder: Path) -> None:
        """Nothing to write: the vectors live in Milvus, and the manifest records where."""

    @classmethod
    def read(cls, folder: Path, record: dict[str, Any]) -> "MilvusIndex":
        settings = MilvusSettings.from_manifest(record, retrieval="dense")
        collection = MilvusCollection.connect(settings)
        collection.open(record["identity"])
        return cls(collection, record["dimension"], record["identity"])


# -- BM25 and hybrid inside Milvus -------------------------------------------------------------------------
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

    def __init__(self, corpus: Any, settings: MilvusSettings, encoder: Any = None, *, batch_size: int = 64,
                 chunk_size: int | None = None, embeddings_dir: str | Path | None = None,
                 show_progress: bool = True, open_existing: bool = False):
        super().__init__(corpus)
        if settings.retrieval not in ("bm25", "hybrid"):
            raise HCQRError("MilvusRetriever is for bm25 and hybrid; dense Milvus indexes are DenseRetriever(backend='milvus')")
        self.settings = settings
        self.encoder = None
        if settings.dense:
            from hcqr_dspy.retrieval.encoder import Encoder, load_encoder, parse_encoder

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
            from hcqr_dspy.retrieval.embeddings import DEFAULT_CHUNK_SIZE, EmbeddingStore

            embeddings = EmbeddingStore.open(corpus, self.encoder, embeddings_dir, chunk_size or DEFAULT_CHUNK_SIZE)
            self.build_stats = {"embeddings": str(embeddings.folder), "chunk_size": embeddings.chunk_size,
                                **embeddings.fill(corpus, self.encoder, batch_size=batch_size, show_progress=show_progress)}
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
            raise RetrievalIndexError("search options (nprobe, efSearch) apply to dense indexes, not a Milvus bm25 index")
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
        out: dict[str, Any] = {"milvus": {**self.settings.describe(), "engine": self.collection.engine,
                                          "client": library_versions("pymilvus", "milvus-lite")}}
        if self.encoder is not None:
            out.update(encoder=self.encoder_name, encoders=self.encoder.spec.describe(),
                       encoder_paths=self.encoder.spec.paths(), dimension=self.dimension)
        return out

    def _write(self, folder: Path) -> None:
        """Nothing to write: the collection lives in Milvus, and the manifest records where."""

    @classmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: Any, encoder: Any = None,
              search_options: Any = None, encoder_backend: str | None = None, **_: Any) -> "MilvusRetriever":
        from hcqr_dspy.retrieval.encoder import parse_encoder

        settings = MilvusSettings.from_manifest(manifest["milvus"])
        built = None
        if settings.dense:
            built = parse_encoder(manifest["encoder"]).with_paths(manifest.get("encoder_paths"))
            if built.describe() != manifest["encoders"]:
                raise RetrievalIndexError(
                    f"index {folder} records encoder {manifest['encoder']!r} with settings this hcqr-dspy does not "
                    "reproduce; rebuild the index with `hcqr index`"
                )
            if encoder is not None:
                wanted = parse_encoder(encoder)
                if wanted.describe() != built.describe():
                    raise RetrievalIndexError(
                        f"index {folder} was built with encoder {built.label()}, not {wanted.label()}; "
                        "queries must be embedded by the query side of the encoder the passages were embedded with"
                    )
                built = wanted
            built = built.with_runtime(encoder_backend)
        elif encoder is not None:
            raise RetrievalIndexError(f"index {folder} is a Milvus bm25 index and uses no encoder (asked for {encoder!r})")
        elif encoder_backend not in (None, "torch"):
            raise RetrievalIndexError(f"index {folder} is a Milvus bm25 index and embeds no queries: "
                                      f"--encoder-backend {encoder_backend} does not apply")
        retriever = cls(corpus, settings, encoder=built, open_existing=True)
        if search_options:
            retriever.set_search_options(search_options)
        return retriever
