"""DSPy's response cache keyed by endpoint too, and by the model card the endpoint lists, so two servers of one
model name, or one server redeployed with another checkpoint, never share replies."""

from __future__ import annotations

import json

# The request fields DSPy leaves out of its response-cache key (``dspy.clients.execution.IGNORED_CACHE_KEYS``:
# api_key, api_base, base_url) that say where a request is sent: without them, two servers serving one model
# name (two vLLM deployments of different checkpoints) would share cached replies.
ENDPOINT_KEYS = ("api_base", "base_url")
_endpoint_cache_classes: dict[type, type] = {}
# api_base (no trailing slash) -> the model card it listed (:func:`hcqr_dspy.lm.endpoint_card.endpoint_card`), as
# canonical JSON without its address: put into the key of every request sent there.
_endpoint_cards: dict[str, str] = {}


def key_cache_by_card(api_base: str, card: dict) -> None:
    """Key DSPy's cached replies from ``api_base`` by the model card it lists too (a vLLM server's ``root``: the
    checkpoint it loaded), so a server redeployed there with another checkpoint under the same model name is never
    served the old one's replies. Replies cached there under a key without a card are not served again."""
    key_cache_by_endpoint()
    identity = {k: v for k, v in card.items() if k != "url"}
    _endpoint_cards[api_base.rstrip("/")] = json.dumps(identity, sort_keys=True)


def key_cache_by_endpoint() -> None:
    """Make DSPy's response cache (``dspy.cache``) key each reply by its endpoint too.

    DSPy hashes a request without ``api_key``, ``api_base`` and ``base_url``; this keeps the API key out
    but puts the endpoint in, by overriding ``Cache.cache_key`` as DSPy's cache guide does for custom keys
    ("Use and Customize DSPy Cache"). The cache object is kept (its memory and disk stores, whatever
    ``dspy.configure_cache`` set): its class becomes a subclass of its own class. Requests without an
    endpoint (in-process llama.cpp, a provider's default endpoint) keep DSPy's own keys; a reply cached
    under DSPy's own key for a request with an endpoint is never served for it.
    """
    import dspy

    cache = dspy.cache
    base = type(cache)
    if getattr(base, "keys_endpoint", False):
        return
    if base not in _endpoint_cache_classes:

        def cache_key(self, request, ignored_args_for_cache_key=None):
            ignored = [a for a in (ignored_args_for_cache_key or []) if a not in ENDPOINT_KEYS]
            where = str(request.get("api_base") or request.get("base_url") or "").rstrip("/")
            if where in _endpoint_cards:
                request = {**request, "hcqr_endpoint_card": _endpoint_cards[where]}
            return base.cache_key(self, request, ignored)

        _endpoint_cache_classes[base] = type(
            f"EndpointKeyed{base.__name__}",
            (base,),
            {"keys_endpoint": True, "cache_key": cache_key, "__doc__": key_cache_by_endpoint.__doc__},
        )
    cache.__class__ = _endpoint_cache_classes[base]
