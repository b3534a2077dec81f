"""The connection to a Milvus engine and what the engine can do.

:func:`connect` opens pymilvus's ``MilvusClient`` (pymilvus 3.x) on a
:class:`~hcqr_dspy.retrieval.milvus.settings.MilvusTarget` and asks the engine
its version; the version decides which index types it builds
(:func:`offered_index_types`) and whether it has the full-text BM25 function
(:func:`has_bm25_function`).

Which engines have the BM25 function: Milvus Lite 3.2.2 (``milvus-lite`` from
PyPI) has it; Milvus 2.3.5 (PyPI's ``milvus`` server package) has not: it
accepts a schema with the function, then refuses every insert (BM25 functions
and sparse vectors arrived in Milvus 2.5 and 2.4, per the Milvus release
notes), so BM25 is refused below 2.5 before anything is created. Milvus Lite
3.2.2 does not build DISKANN (it accepts the index, then cannot load it), so
DISKANN is refused there.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import MilvusUnavailableError
from hcqr_dspy.retrieval.milvus.retries import one_line
from hcqr_dspy.retrieval.milvus.settings import INDEX_TYPES, MilvusTarget

# pymilvus logs every failed RPC with a full traceback at ERROR and a failed reconnect with its traceback at WARNING,
# and Milvus Lite a database it cannot open; each such failure is raised here as one line instead. pymilvus's import
# configures its loggers (pymilvus/settings.py, logging.config.dictConfig), which resets the level of any
# "pymilvus.*" logger made before it: :func:`_quiet_pymilvus` sets theirs after the import.
PYMILVUS_NOISY_LOGGERS = ("pymilvus.decorators", "pymilvus.client.connection_manager")
logging.getLogger("milvus_lite.server_manager").setLevel(logging.CRITICAL)

BM25_MIN_SERVER_VERSION = (2, 5)  # Milvus release notes: full-text search (BM25 function) since 2.5.0


def _quiet_pymilvus() -> None:
    import pymilvus  # noqa: F401 - its import configures the loggers set below

    for name in PYMILVUS_NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


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
        hint = (
            ""
            if target.is_lite or target.token_env
            else " (if it requires a token, name its variable with --milvus-token-env)"
        )
        raise MilvusUnavailableError(f"cannot reach Milvus at {target.uri}: {one_line(exc)}{hint}") from None
    return client, str(version)


def _lite_locked(db: Path) -> bool:
    """Whether another process holds Milvus Lite's advisory lock (``flock`` on ``<db>/LOCK``, as milvus_lite.db
    does)."""
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
    """Index types (of :data:`~hcqr_dspy.retrieval.milvus.settings.INDEX_TYPES`) the engine builds.

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
