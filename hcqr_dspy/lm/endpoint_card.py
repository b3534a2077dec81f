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
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

CARD_FIELDS = ("id", "owned_by", "root", "parent", "max_model_len")


def endpoint_card(cfg: Any, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
    """The model card the endpoint of ``cfg`` lists under its model name.

    Args:
        cfg: The LM's :class:`~hcqr_dspy.lm.spec.LMConfig`; ``None`` is returned for an in-process model or an
            LM without an ``api_base`` (a provider's own endpoint).
        api_key: Sent as a bearer token, never recorded.
        timeout: Seconds to wait for the listing.

    Returns:
        ``{"url", <CARD_FIELDS present>}``, or ``{"url", "unavailable": <why>}`` when the server does not list its
        models or not this one (recorded so, never guessed).
    """
    if cfg.kind != "litellm" or not cfg.api_base:
        return None
    url = cfg.api_base.rstrip("/") + "/models"
    served = cfg.model.split("/", 1)[1] if "/" in cfg.model else cfg.model
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            listing = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return {"url": url, "unavailable": f"HTTP {exc.code}"}
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        return {"url": url, "unavailable": f"{type(exc).__name__}: {str(exc)[:120]}"}
    data = listing.get("data") if isinstance(listing, dict) else None
    cards = [c for c in data or [] if isinstance(c, dict) and c.get("id") == served]
    if not cards:
        return {"url": url, "unavailable": f"{served!r} is not among the models it lists"}
    return {"url": url, **{k: cards[0][k] for k in CARD_FIELDS if k in cards[0]}}
