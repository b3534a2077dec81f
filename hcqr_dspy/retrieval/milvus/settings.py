"""Where and how an index lives in Milvus: the URI and token variable (:class:`MilvusTarget`), the retrieval mode,
index type and parameters (:class:`MilvusSettings`, all recorded in the manifest; the token never is), and the
BM25 analyzer.

Index types (``index_type``, Milvus names): ``FLAT`` (exact), ``IVF_FLAT``
(``nlist``; searched with ``nprobe``), ``HNSW`` (``M``, ``efConstruction``;
searched with ``ef``, raised to at least ``k``) and ``DISKANN``
(``search_list``) where the engine builds it. Defaults follow
bench/retrieval.py's faiss HNSW (M=32, efConstruction=80, ef=64) and Milvus's
documentation for IVF (nlist=128, nprobe=16).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hcqr_dspy.errors import HCQRError

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
    def parse(cls, uri: str, token_env: str | None = None) -> MilvusTarget:
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
            out.update(
                index_type=self.index_type,
                index_params=self.index_params,
                search_params=self.search_params,
                metric=METRIC,
            )
        if self.bm25:
            out["analyzer"] = bm25_analyzer()
        if self.retrieval == "hybrid":
            out.update(rrf_k=self.rrf_k, pool_k=self.pool_k)
        return out

    def options(self) -> dict[str, Any]:
        """The dense backend's build options (``DenseRetriever(backend="milvus", backend_options=...)``)."""
        return {
            "uri": self.uri,
            "collection": self.collection,
            "index_type": self.index_type,
            "index_params": dict(self.index_params),
            "search_params": dict(self.search_params),
            "token_env": self.token_env,
            "index_timeout": self.index_timeout,
        }

    @classmethod
    def from_manifest(cls, record: dict[str, Any], **overrides: Any) -> MilvusSettings:
        keys = (
            "uri",
            "collection",
            "retrieval",
            "index_type",
            "index_params",
            "search_params",
            "token_env",
            "rrf_k",
            "pool_k",
        )
        values = {k: record[k] for k in keys if k in record}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def bm25_analyzer() -> dict[str, Any]:
    """Milvus analyzer params for the BM25 field: standard tokenizer, lower-casing, bm25s' English stopwords."""
    from bm25s.stopwords import STOPWORDS_EN

    return {"tokenizer": "standard", "filter": ["lowercase", {"type": "stop", "stop_words": sorted(STOPWORDS_EN)}]}
