"""Failed Milvus calls: one line saying why, whether trying again may help, and the retry loop of searches.

A server that stops answering mid-run (stopped, restarting, hung, reloading
its collections) is searched again with back-off for :data:`RETRY_SECONDS`
(``$HCQR_MILVUS_RETRY_SECONDS``), each try bounded by :data:`SEARCH_TIMEOUT`
(``$HCQR_MILVUS_SEARCH_TIMEOUT``); then the search fails with
:class:`~hcqr_dspy.errors.MilvusOutageError`, an outage that stops a run in
one line, resumable.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

from hcqr_dspy.errors import HCQRError, MilvusOutageError

RETRY_SECONDS = 300.0
"""Seconds a search keeps retrying a Milvus server that stopped answering before it fails (a run then stops as an
outage): long enough for a standalone server to restart on its data. Milvus 2.3.5, stopped with SIGTERM, answers
"empty grpc client" (:data:`RESTARTING_SERVER_MESSAGE`) while it stops, nothing while it is down, and once started
again serves only when its coordinators' previous etcd sessions have expired (``common.session.ttl``, 30 s by
default: about 55 s from the restart here), then says "collection not loaded" while it reloads the collection. A
search fails at most this plus :data:`SEARCH_TIMEOUT` seconds after it began."""

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

UNEXPECTED_MILVUS_CODE = 65535
"""Milvus's code for an error it has no code for (``errUnexpected``, ``(1<<16)-1``, pkg/util/merr/errors.go): what
``merr.Code`` gives any error that is not one of its own, so the code alone says nothing; the message decides."""

RESTARTING_SERVER_MESSAGE = re.compile(
    r"empty grpc client: (failed to connect \S+, reason: .*connect: connection refused"
    r"|find no available [a-z]+, check [a-z]+ state)"
)
"""What a Milvus 2.3 proxy answers, under :data:`UNEXPECTED_MILVUS_CODE`, while the coordinators behind it are
stopped or not yet registered: a standalone server stopping (SIGTERM stops its coordinators first, the proxy last) or
a cluster's coordinator restarting. The proxy's client of a coordinator (``ClientBase.call``,
internal/util/grpcclient/client.go) wraps why it has no connection as "empty grpc client: ...": the coordinator's
address refusing connections (``wrapErrConnect``, "failed to connect ADDR, reason: connection error: desc =
"transport: error while dialing: dial tcp ADDR: connect: connection refused"") or its session gone from etcd
(``getAddr`` of internal/distributed/rootcoord/client/client.go and the other coordinators' clients: "find no
available rootcoord, check rootcoord state"). Seen from pymilvus 3.0 as ``MilvusException(code=65535,
compatible_code=1, retriable=False)`` with exactly these messages, searching a Milvus 2.3.5 standalone server in the
seconds after its SIGTERM. Other "empty grpc client" causes (an etcd error reading the session) stay failures."""


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
    :data:`TRANSIENT_MILVUS_CODES`, that the server marked retriable, or whose code is the generic
    :data:`UNEXPECTED_MILVUS_CODE` and whose message is a restarting server's (:data:`RESTARTING_SERVER_MESSAGE`)."""
    import grpc
    from pymilvus.exceptions import MilvusException, ParamError

    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return getattr(exc.code(), "name", None) in TRANSIENT_GRPC_CODES
    if isinstance(exc, MilvusException) and not isinstance(exc, ParamError):
        if isinstance(exc.code, grpc.StatusCode):  # pymilvus's own retries ran out ("Retry timeout: ...")
            return exc.code.name in TRANSIENT_GRPC_CODES
        if getattr(exc, "retriable", False) or exc.code in TRANSIENT_MILVUS_CODES:
            return True
        return exc.code == UNEXPECTED_MILVUS_CODE and bool(RESTARTING_SERVER_MESSAGE.search(str(exc.message or "")))
    return False


def one_line(exc: BaseException) -> str:
    """An exception's message on one line, at most 400 characters (pymilvus's ``message`` where it has one)."""
    msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(msg).split())[:400]


def call_failure(exc: BaseException) -> str:
    """One line for a failed Milvus call: a gRPC error's status and details, else :func:`one_line`."""
    if callable(getattr(exc, "details", None)) and callable(getattr(exc, "code", None)):
        code = getattr(exc.code(), "name", exc.code())
        return " ".join(f"gRPC {code}: {exc.details() or ''}".split())[:400]
    return one_line(exc)


def call_with_retries(
    what: str, fn: Callable[..., Any], *args: Any, retry_seconds: float, timeout: float, **kwargs: Any
) -> Any:
    """``fn(*args, timeout=timeout, **kwargs)``, tried again while Milvus is not answering.

    A failure that may pass (:func:`transient`: the server down, hung, restarting, reloading or shedding load)
    is tried again after :data:`RETRY_FIRST_DELAY` seconds, the wait doubling up to :data:`RETRY_MAX_DELAY`,
    while the next try starts within ``retry_seconds`` of the first. pymilvus retries a dropped connection
    itself (``retry_on_rpc_failure``, within the ``timeout``), but not a server it cannot reconnect to: its
    connection manager then raises "Fail connecting to server" at once.

    Args:
        what: The call and where, for the message (``"Milvus search in collection 'c' at URI"``).
        fn: The pymilvus client method.
        retry_seconds: The retry window, in seconds (see :func:`retry_settings`).
        timeout: Seconds one try may take.

    Raises:
        MilvusOutageError: Milvus still failed when the window closed, or refused the request (one line:
            what, tries and the last failure). Anything else (pymilvus's ``ParamError`` for our own
            arguments, an error of this code) propagates unchanged: a bug.
    """
    import grpc
    from pymilvus.exceptions import MilvusException, ParamError

    start, delay, tries = time.monotonic(), RETRY_FIRST_DELAY, 0
    while True:
        tries += 1
        try:
            return fn(*args, timeout=timeout, **kwargs)
        except ParamError:
            raise
        except (MilvusException, grpc.RpcError) as exc:
            elapsed = time.monotonic() - start
            if not transient(exc) or elapsed + delay > retry_seconds:
                again = f" ({tries} tries over {elapsed:.0f} s)" if tries > 1 else ""
                raise MilvusOutageError(f"{what} failed{again}: {call_failure(exc)}") from None
        time.sleep(delay)
        delay = min(2 * delay, RETRY_MAX_DELAY)
