"""What an OpenAI-compatible server says it serves under the run's model name (``GET {api_base}/models``),
fetched once when the LM is built (:func:`hcqr_dspy.lm.build_lm`), recorded with each session
(:func:`hcqr_dspy.evaluation.provenance.session_record`) and put into DSPy's response-cache key
(:func:`hcqr_dspy.lm.cache.key_cache_by_card`).

A vLLM server redeployed with another checkpoint under the same served model name (at the same address, say)
answers the same requests differently; the model card tells them apart, so its replies are never served from
the old one's cache, a resumed run whose earlier rows came from another checkpoint is noted, and ``hcqr compare``
counts it as another LM stack. Fields kept (:data:`CARD_FIELDS`) are those of
vLLM's ``ModelCard`` (``vllm/entrypoints/openai/protocol.py``) that describe what is served: ``id``, ``owned_by``,
``root`` (the checkpoint path or hub id vLLM loaded), ``parent`` and ``max_model_len``; its ``created`` and
``permission`` are left out (vLLM fills them anew on every request). llama-cpp-python's server gives ``id`` and
``owned_by`` only, OpenAI's API ``id``, ``owned_by`` (and ``created``, left out).

The server's own version decides replies too (its kernels, its batching), and a model card does not carry it: where
the card's ``owned_by`` names a server whose version route is known (:data:`VERSION_ROUTES`), the card gets
``server_version``, read from that route at the server's root (``api_base`` without its trailing ``/v1``): vLLM's
``GET /version`` (its ``show_version`` route: ``{"version": VLLM_VERSION}``) and llama.cpp's ``llama-server``
``GET /props`` (its ``build_info``: build number and commit).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import unicodedata
import urllib.error
import urllib.request
from typing import Any

CARD_FIELDS = ("id", "owned_by", "root", "parent", "max_model_len")
# A server's ``owned_by`` -> (the route at its root that gives its version, the field of that reply holding it).
VERSION_ROUTES = {"vllm": ("/version", "version"), "llamacpp": ("/props", "build_info")}
MAX_LISTING_BYTES = 1 << 20  # a model listing is a few KB; more is not a listing


def endpoint_card(cfg: Any, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
    """The model card the endpoint of ``cfg`` lists under its model name.

    Args:
        cfg: The LM's :class:`~hcqr_dspy.lm.spec.LMConfig`; ``None`` is returned for an in-process model or an
            LM without an ``api_base`` (a provider's own endpoint).
        api_key: Sent as a bearer token, never recorded.
        timeout: Seconds the whole listing may take (connection and every read).

    Returns:
        ``{"url", <CARD_FIELDS present, as text, whole numbers or null>}``, or ``{"url", "unavailable": <why>}``
        when the server does not list its models, not this one, or answers with anything else (recorded so,
        never guessed; this function does not raise). A card of a server named in :data:`VERSION_ROUTES` also has
        ``server_version`` (:func:`server_version`).
    """
    if cfg.kind != "litellm" or not cfg.api_base:
        return None
    url = cfg.api_base.rstrip("/") + "/models"
    served = cfg.model.split("/", 1)[1] if "/" in cfg.model else cfg.model
    try:
        listing = _read_listing(url, api_key, timeout)
    except urllib.error.HTTPError as exc:
        return {"url": url, "unavailable": f"HTTP {exc.code}"}
    except (OSError, ValueError, http.client.HTTPException, RecursionError) as exc:  # refused, slow, not JSON ...
        return {"url": url, "unavailable": f"{type(exc).__name__}: {str(exc)[:120]}"}
    data = listing.get("data") if isinstance(listing, dict) else None
    cards = [c for c in data if isinstance(c, dict) and c.get("id") == served] if isinstance(data, list) else []
    if not cards:
        return {"url": url, "unavailable": f"{served!r} is not among the models it lists"}
    card = {k: cards[0][k] for k in CARD_FIELDS if k in cards[0]}
    odd = [
        k
        for k, v in card.items()
        if not (v is None or isinstance(v, int) or short_text(v, 1000, blank=True)) or isinstance(v, bool)
    ]
    if odd:
        return {"url": url, "unavailable": f"its card has values that are not short text or whole numbers ({odd})"}
    if card.get("owned_by") in VERSION_ROUTES:
        card["server_version"] = server_version(cfg.api_base, card["owned_by"], api_key, timeout)
    return {"url": url, **card}


def server_version(api_base: str, owned_by: str, api_key: str | None = None, timeout: float = 10.0) -> str:
    """The version the server at ``api_base`` reports on its :data:`VERSION_ROUTES` route for ``owned_by``.

    Returns:
        The version as the server gives it (``"0.11.0"``, ``"b6500-a1b2c3d"``), or ``"unavailable (<why>)"`` when
        the route fails or its reply lacks a short text version (recorded so, never guessed; never raises).
    """
    route, field = VERSION_ROUTES[owned_by]
    root = api_base.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    try:
        reply = _read_listing(root + route, api_key, timeout)
    except urllib.error.HTTPError as exc:
        return f"unavailable (HTTP {exc.code} from {route})"
    except (OSError, ValueError, http.client.HTTPException, RecursionError) as exc:
        return f"unavailable ({type(exc).__name__} from {route}: {str(exc)[:80]})"
    version = reply.get(field) if isinstance(reply, dict) else None
    if not short_text(version, 200):
        return f"unavailable ({route} gives no {field} as short text)"
    return version


def _read_listing(url: str, api_key: str | None, timeout: float) -> Any:
    """``GET url`` parsed as strict JSON (no ``NaN``), read within ``timeout`` seconds in all (headers included: a
    server that drips its reply byte by byte is cut off too) and at most :data:`MAX_LISTING_BYTES`.

    Raises:
        ValueError: a malformed URL, a reply too large or too slow, not JSON. OSError, http.client.HTTPException:
        the connection or the HTTP exchange failed.
    """
    got: dict[str, Any] = {}

    def fetch() -> None:
        try:
            got["body"] = _fetch(url, api_key, timeout)
        except BaseException as exc:  # handed to the caller below
            got["error"] = exc

    # the socket's own timeout bounds each read, not the exchange: the whole of it runs on a thread of its own,
    # left to its socket timeout when it overruns (a daemon: it never holds the process open)
    worker = threading.Thread(target=fetch, name="hcqr-endpoint-card", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise ValueError(f"the listing took more than {timeout:g} s")
    if "error" in got:
        raise got["error"]

    def refuse(name: str) -> float:
        raise ValueError(f"{name} is not JSON")

    return json.loads(got["body"], parse_constant=refuse)


def _fetch(url: str, api_key: str | None, timeout: float) -> bytes:
    """The body of ``GET url``, at most :data:`MAX_LISTING_BYTES`. ValueError: larger, or slower than ``timeout``."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    body = b""
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        while chunk := reply.read1(64 << 10):
            body += chunk
            if len(body) > MAX_LISTING_BYTES:
                raise ValueError(f"the listing is larger than {MAX_LISTING_BYTES} bytes")
            if time.monotonic() > deadline:
                raise ValueError(f"the listing took more than {timeout:g} s")
    return body


def short_text(value: Any, limit: int, blank: bool = False) -> bool:
    """Whether ``value`` is text of at most ``limit`` characters without control, format or line-separator
    characters (Unicode ``Cc``, ``Cf``, ``Zl``, ``Zp``: a newline, an escape sequence or a right-to-left override
    would break the tables and one-line messages it is shown in), and not blank unless ``blank``."""
    return (
        isinstance(value, str)
        and len(value) <= limit
        and (blank or bool(value.strip()))
        and not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value)
    )
