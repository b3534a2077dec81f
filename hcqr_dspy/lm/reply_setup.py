"""Under which setup an LM reply was made: each reply of an LM built by :func:`hcqr_dspy.lm.build_lm` goes into
DSPy's response cache with a record of its setup, and a reply the cache serves says whose it was.

At temperature 0 a reply still depends on what made it: the llama.cpp build, its CPU features and engine
settings, the model file, the server behind an endpoint, and the versions of the libraries that send the request.
DSPy keys a cached reply by its request (model name, messages, temperature, max_tokens ...; the engine's model name
holds the settings :meth:`~hcqr_dspy.lm.engine_settings.EngineSettings.reply_key` names, and
:mod:`hcqr_dspy.lm.cache` adds the endpoint and its model card), not by all of that: a cache folder kept across an
upgrade of llama-cpp-python, dspy or litellm, or shared by engines of another logical batch, answers a request with
a reply made under another setup.

* :func:`reply_setup` describes an LM's setup and :func:`setup_fingerprint` names it by a short hash;
  :func:`lm_setup` gives both for an LM (computed once for an LM :func:`register_lm` registered).
* :func:`record_reply_setups` makes ``dspy.cache`` keep, beside each reply of a registered LM, that LM's setup: an
  entry of its own, keyed by the reply's cache key (DSPy's entry for the reply is left as DSPy wrote it). Which LM
  a cached request is for is known from a callback of that LM's (:func:`register_lm`).
* :func:`cached_reply_setups` collects, for the block it wraps, the setup of every LM reply the cache served: the
  fingerprint of the LM asking when the reply was made under that LM's setup, another fingerprint with its record
  when made under another setup, or :data:`UNRECORDED` for a reply cached without a record (by a version before
  this one, by an LM not built by ``build_lm``, or whose record the cache has dropped).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import metadata
from typing import Any

from hcqr_dspy.lm.llama_cpp import LlamaCppEngine
from hcqr_dspy.lm.model_file import gguf_sha256

# The distributions whose versions decide a reply (names as pip knows them): the one that sends a request and the
# ones that make or carry the reply (llama-cpp-python in-process, litellm to an endpoint).
REPLY_PACKAGES = ("dspy", "litellm", "llama_cpp_python")
# The setup of a cached reply stored without a record.
UNRECORDED = "unrecorded"
# The one field of the cache request under which a reply's setup record is kept (its value: the reply's cache key).
SIDE_FIELD = "hcqr_reply_setup_of"
# DSPy's LM requests name their function so (``dspy.clients.execution.PreparedCall.key``); other cached functions
# (embeddings ...) are left alone.
LM_FUNCTIONS = "dspy.clients.lm"

# The setup of the LM whose call is under way (set by the callback :func:`register_lm` gives it; None outside).
_asking: ContextVar[Callable[[], dict[str, Any]] | None] = ContextVar("hcqr_asking_lm", default=None)
_recording_classes: dict[type, type] = {}
# The cached replies of the block :func:`cached_reply_setups` wraps (None outside one); also the DSPy setting
# SERVED_SETTING there, which DSPy passes on to its worker threads.
SERVED_SETTING = "hcqr_cached_replies"
_served: ContextVar[list[tuple[str, dict[str, Any] | None]] | None] = ContextVar("hcqr_cached_replies", default=None)


def reply_setup(lm: Any) -> dict[str, Any]:
    """What makes ``lm``'s replies: ``model`` (its name in DSPy), ``engine`` (the in-process llama.cpp engine's
    settings, context window, build, CPU features, model file and its SHA-256; ``None`` for an LM served elsewhere),
    ``endpoint`` (an endpoint's API base and the model card it listed, :mod:`hcqr_dspy.lm.endpoint_card`; ``None``
    in-process or for a provider's own endpoint) and ``packages`` (the versions of :data:`REPLY_PACKAGES`)."""
    engine = getattr(lm, "engine", None)
    cfg = getattr(lm, "hcqr_config", None)
    described = None
    if isinstance(engine, LlamaCppEngine):
        described = {
            **engine.settings.record(),
            "n_ctx": engine.n_ctx,
            "build": engine.build,
            "system_info": engine.system_info,
            "model_file": engine.model_path.name,
            "model_sha256": gguf_sha256(engine.model_path),
        }
    endpoint = None
    if described is None and cfg is not None and cfg.api_base:
        card = getattr(lm, "hcqr_endpoint_card", None) or {}
        endpoint = {"api_base": cfg.api_base.rstrip("/"), **{k: v for k, v in card.items() if k != "url"}}
    return {
        "model": getattr(lm, "model", None),
        "engine": described,
        "endpoint": endpoint,
        "packages": package_versions(REPLY_PACKAGES),
    }


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed version of each distribution (:func:`importlib.metadata.version`); ``None`` if not installed."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def setup_fingerprint(setup: dict[str, Any]) -> str:
    """A setup record's name: the first 16 hex digits of the SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:16]


def register_lm(lm: Any) -> None:
    """Have the replies of ``lm`` (a ``dspy.LM`` built by :func:`hcqr_dspy.lm.build_lm`) cached with its setup: its
    setup is computed on first use and kept (``lm.hcqr_reply_setup``), and a callback of its own marks its calls, so
    that the cache knows whose request it stores or serves (two LMs may share a model name: engines that differ only
    in what the name leaves out)."""
    from dspy.utils.callback import BaseCallback

    kept: dict[str, Any] = {}

    def setup() -> dict[str, Any]:
        if not kept:
            record = reply_setup(lm)
            kept.update(fingerprint=setup_fingerprint(record), setup=record)
        return kept

    class AskingLM(BaseCallback):
        """Marks the calls of an LM (DSPy calls ``on_lm_start``/``on_lm_end`` around each, cache hits included)."""

        def __init__(self) -> None:
            self.tokens: dict[str, Any] = {}

        def on_lm_start(self, call_id, instance, inputs):
            self.tokens[call_id] = _asking.set(getattr(instance, "hcqr_reply_setup", None))

        def on_lm_end(self, call_id, outputs, exception=None):
            token = self.tokens.pop(call_id, None)
            if token is not None:
                try:
                    _asking.reset(token)
                except ValueError:  # ended in another context than it started: nothing of this one to undo
                    pass

    lm.hcqr_reply_setup = setup
    lm.callbacks = [*(getattr(lm, "callbacks", None) or []), AskingLM()]


def lm_setup(lm: Any) -> dict[str, Any]:
    """``{"fingerprint", "setup"}`` of ``lm`` (:func:`reply_setup`): the registered one, else computed now."""
    known = getattr(lm, "hcqr_reply_setup", None)
    if callable(known):
        return known()
    record = reply_setup(lm)
    return {"fingerprint": setup_fingerprint(record), "setup": record}


def _asked_by(request: dict[str, Any]) -> dict[str, Any] | None:
    """The setup record of the registered LM whose call is under way, for a cache request of DSPy's LM calls;
    ``None`` for another request or an LM not registered."""
    setup = _asking.get() if _is_lm_request(request) else None
    return setup() if setup is not None else None


def _is_lm_request(request: dict[str, Any]) -> bool:
    return str(request.get("_fn_identifier", "")).startswith(LM_FUNCTIONS)


def record_reply_setups() -> None:
    """Make DSPy's response cache (``dspy.cache``) keep each registered LM's setup beside its replies and report
    the setups of the replies it serves to :func:`cached_reply_setups`.

    As :func:`hcqr_dspy.lm.cache.key_cache_by_endpoint` does, the cache object is kept (its memory and disk stores)
    and its class becomes a subclass of its own class, overriding ``put`` and ``get`` (DSPy's cache guide, "Use and
    Customize DSPy Cache"): a reply is stored as DSPy stores it, and its setup record under the request
    ``{SIDE_FIELD: <the reply's cache key>}``; a reply served is looked up there.
    """
    import dspy

    cache = dspy.cache
    base = type(cache)
    if getattr(base, "records_reply_setups", False):
        return
    if base not in _recording_classes:

        def side(self, request, ignored) -> dict[str, str]:
            return {SIDE_FIELD: self.cache_key(request, ignored)}

        def put(self, request, value, ignored_args_for_cache_key=None, enable_memory_cache=True):
            base.put(self, request, value, ignored_args_for_cache_key, enable_memory_cache)
            setup = _asked_by(request)
            if setup is not None:
                try:
                    record = side(self, request, ignored_args_for_cache_key)
                except Exception:  # DSPy's own put gave up on this request's key too
                    return
                base.put(self, record, dict(setup), None, enable_memory_cache)

        def get(self, request, ignored_args_for_cache_key=None):
            value = base.get(self, request, ignored_args_for_cache_key)
            served = _served.get()
            if served is None:  # a worker thread of DSPy's ParallelExecutor inside the block: it passes settings on
                served = dspy.settings.get(SERVED_SETTING)
            if value is None or served is None or not _is_lm_request(request):
                return value
            try:
                record = base.get(self, side(self, request, ignored_args_for_cache_key), None)
            except Exception:  # no key for this request: its record cannot be found
                record = None
            own = _asked_by(request)
            if not (isinstance(record, dict) and isinstance(record.get("fingerprint"), str)):
                served.append((UNRECORDED, None))
            elif own is not None and record["fingerprint"] == own["fingerprint"]:
                served.append((record["fingerprint"], None))
            else:
                served.append((record["fingerprint"], record.get("setup")))
            return value

        _recording_classes[base] = type(
            f"SetupRecording{base.__name__}",
            (base,),
            {"records_reply_setups": True, "put": put, "get": get, "__doc__": record_reply_setups.__doc__},
        )
    cache.__class__ = _recording_classes[base]


class CachedReplies:
    """The LM replies DSPy's cache served within a :func:`cached_reply_setups` block."""

    def __init__(self) -> None:
        self.served: list[tuple[str, dict[str, Any] | None]] = []

    def summary(self) -> list[dict[str, Any]]:
        """One entry per setup the served replies were made under, in the order first served:
        ``{"setup": <fingerprint or "unrecorded">, "calls": <replies>}``, with ``"record"`` (its
        :func:`reply_setup` record) for a setup other than that of the LM that asked; ``[]`` when none was served."""
        calls = Counter(fingerprint for fingerprint, _ in self.served)
        records = {fingerprint: record for fingerprint, record in self.served if record is not None}
        return [
            {"setup": fingerprint, "calls": n, **({"record": records[fingerprint]} if fingerprint in records else {})}
            for fingerprint, n in calls.items()
        ]


@contextmanager
def cached_reply_setups() -> Iterator[CachedReplies]:
    """Collect the setups of the LM replies DSPy's cache serves in the block (in this thread or task, and in the
    worker threads DSPy's ``ParallelExecutor`` starts there, which inherit DSPy's settings), after making sure the
    cache records them (:func:`record_reply_setups`)."""
    import dspy

    record_reply_setups()
    replies = CachedReplies()
    token = _served.set(replies.served)
    try:
        with dspy.context(**{SERVED_SETTING: replies.served}):  # passed on to the threads DSPy's optimizers start
            yield replies
    finally:
        _served.reset(token)


def lm_settings(lm: Any) -> dict[str, Any]:
    """What ``lm`` asks every request with: ``model`` (its name in DSPy), ``temperature``, ``max_tokens`` and
    ``cache`` (whether DSPy's response cache serves it)."""
    kwargs = getattr(lm, "kwargs", None) or {}
    return {
        "model": getattr(lm, "model", None),
        "temperature": kwargs.get("temperature"),
        "max_tokens": kwargs.get("max_tokens") or kwargs.get("max_completion_tokens"),
        "cache": bool(getattr(lm, "cache", False)),
    }


def response_cache(lm: Any) -> dict[str, Any] | None:
    """The response cache ``lm``'s replies are kept in and served from (``dspy.cache``): ``folder`` (its disk
    store; ``None`` without one), ``disk`` and ``memory`` (which stores are on); ``None`` for an LM that does not
    cache."""
    if not getattr(lm, "cache", False):
        return None
    import dspy

    cache = dspy.cache
    disk = bool(getattr(cache, "enable_disk_cache", False))
    return {
        "folder": getattr(cache, "disk_cache_dir", None) if disk else None,
        "disk": disk,
        "memory": bool(getattr(cache, "enable_memory_cache", False)),
    }
