"""LM replies that are not the API's format: recognised, retried with back-off, then a stop as an LM outage.

A gateway or proxy in front of an LM server (nginx, a cloud load balancer, a captive portal) answers with
its own HTML page, sometimes behind HTTP 200, while the server behind it restarts or is overloaded, and a
connection cut mid-reply leaves a JSON body short. Neither is a bad answer of the model, nor a bug here:
it is the endpoint failing for a while, as a refused connection is.

DSPy retries a refused connection (``LMTransportError``), a timeout and an HTTP 5xx itself, ``num_retries``
times with doubling waits (``dspy.utils.exceptions.is_retryable_lm_error``, ``dspy.clients.execution``).
It does not retry a body that cannot be decoded: its native lm15 engine raises ``ProviderError`` ("the reply
(HTTP 200, text/html, ...) is not JSON", ``dspy._vendor.lm15.providers.base.HttpResponse.json``) and
LiteLLM's ``hosted_vllm`` route an ``APIError`` ("Unable to get json response"); DSPy turns both into
``LMProviderError``, whose chain holds the ``json.JSONDecodeError``. :func:`call_retrying_bad_replies` retries
such a call with the same count and waits as DSPy does, then raises
:class:`~hcqr_dspy.errors.LMReplyFormatError`, which
:data:`hcqr_dspy.evaluation.answering.LM_UNAVAILABLE` turns into :class:`~hcqr_dspy.errors.LMUnavailableError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

from hcqr_dspy.errors import LMReplyFormatError

T = TypeVar("T")

FIRST_DELAY = 1.0
"""Seconds before the first retry of a call whose reply was not the API's format. Each later wait doubles, as
DSPy's own back-off for refused connections does (``dspy.clients.execution._delay``: ``2 ** attempt``)."""

MAX_DELAY = 60.0
"""The longest wait between two tries, in seconds (DSPy's own cap for its back-off)."""

DEFAULT_RETRIES = 3
"""Retries when the LM in use records none (DSPy's default ``num_retries``)."""


def bad_reply(exc: BaseException) -> BaseException | None:
    """The decoding error behind ``exc`` when ``exc`` is an LM reply that is not the API's format, else ``None``.

    That is a DSPy LM error (``dspy.utils.exceptions.LMError``, so it came from the LM call, not from a program)
    that DSPy does not retry itself, whose chain (``__cause__`` / ``__context__``) holds a
    ``json.JSONDecodeError`` or ``UnicodeDecodeError``: the body could not be decoded. A reply that decodes but
    does not answer (an empty message) is a bad answer, not this; an HTTP 5xx page is DSPy's ``LMServerError``,
    already retried.
    """
    from dspy.utils.exceptions import LMError, is_retryable_lm_error

    if not isinstance(exc, LMError) or is_retryable_lm_error(exc):
        return None
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, (json.JSONDecodeError, UnicodeDecodeError)):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def lm_retries() -> int:
    """``num_retries`` of the LM DSPy is configured with (``dspy.settings.lm``), or :data:`DEFAULT_RETRIES`."""
    import dspy

    retries = getattr(dspy.settings.lm, "num_retries", None)
    return retries if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0 else DEFAULT_RETRIES


def call_retrying_bad_replies(call: Callable[[], T], retries: int | None = None) -> T:
    """``call()``, tried again while it fails on an LM reply that is not the API's format (:func:`bad_reply`).

    Args:
        call: The work to do (a program answering one question: every LM call in it is made again, DSPy's
            response cache serving those that succeeded before).
        retries: Tries after the first; default :func:`lm_retries`, the count DSPy uses for refused connections.
            The waits are :data:`FIRST_DELAY`, doubling, at most :data:`MAX_DELAY` seconds.

    Returns:
        What ``call`` returns.

    Raises:
        LMReplyFormatError: every try failed so; one line naming the tries, the seconds they took and the
            first line of the last failure (its status, content type and the start of the body). Any other
            exception of ``call`` propagates unchanged, at once.
    """
    retries = lm_retries() if retries is None else retries
    start, attempt = time.monotonic(), 0
    while True:
        try:
            return call()
        except Exception as exc:
            if bad_reply(exc) is None:
                raise
            if attempt >= retries:
                first = " ".join((str(exc).splitlines() or [""])[0].split())
                raise LMReplyFormatError(
                    f"{attempt + 1} tries over {time.monotonic() - start:.0f} s got a reply that is not the API's "
                    f"format: {first}"
                ) from exc
            time.sleep(min(FIRST_DELAY * 2**attempt, MAX_DELAY))
            attempt += 1
