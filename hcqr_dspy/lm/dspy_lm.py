"""LM specs -> ``dspy.LM``: build one, prove a remote one answers, and count tokens for it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.lm.cache import key_cache_by_card, key_cache_by_endpoint
from hcqr_dspy.lm.endpoint_card import endpoint_card
from hcqr_dspy.lm.llama_cpp import DEFAULT_N_CTX, LlamaCppEngine, engine_for
from hcqr_dspy.lm.model_file import gguf_sha256, require_gguf_file
from hcqr_dspy.lm.packaged import packaged_model_path
from hcqr_dspy.lm.reply_setup import record_reply_setups, register_lm
from hcqr_dspy.lm.spec import LMConfig, check_route, parse_lm_spec
from hcqr_dspy.redaction import redact, redact_logging, register_secret


def build_lm(
    spec: str | LMConfig,
    temperature: float = 0.0,
    max_tokens: int = 1024,
    n_ctx: int = DEFAULT_N_CTX,
    api_base: str | None = None,
    api_key_env: str | None = None,
    cache: bool = True,
    num_retries: int = 3,
):
    """Build the ``dspy.LM`` for a spec.

    Args:
        spec: ``--lm`` string or a parsed :class:`LMConfig`.
        temperature: Sampling temperature (0 as in the HCQR reference setup).
        max_tokens: Output tokens per call.
        n_ctx: Context window of local models.
        api_base: API base for LiteLLM models.
        api_key_env: Environment variable holding the API key of a LiteLLM
            model; it must be set. Keys are never accepted as values.
        cache: Use DSPy's response cache (each reply cached with the LM's setup,
            :mod:`hcqr_dspy.lm.reply_setup`).
        num_retries: LiteLLM retries with exponential backoff.

    Raises:
        LMSpecError: see :func:`parse_lm_spec`, :func:`packaged_model_path`,
            or an unset key variable.

    A remote LM's key is registered with :mod:`hcqr_dspy.redaction` and its errors are masked before DSPy's
    other callbacks (MLflow's tracing) see them (:mod:`hcqr_dspy.lm.redacted_errors`).
    """
    import dspy

    cfg = spec if isinstance(spec, LMConfig) else parse_lm_spec(spec, api_base=api_base, api_key_env=api_key_env)
    if cfg.kind in ("packaged", "gguf"):
        path = packaged_model_path(cfg.model.split("/", 1)[1]) if cfg.kind == "packaged" else Path(cfg.path)
        engine = engine_for(path, n_ctx)
        lm = dspy.LM(
            engine_model_name(cfg, engine), engine=engine, temperature=temperature, max_tokens=max_tokens, cache=cache
        )
    else:
        check_route(cfg.model)
        kwargs: dict[str, Any] = {}
        if cfg.api_base:
            kwargs["api_base"] = cfg.api_base
        if cfg.api_key_env:
            kwargs["api_key"] = key = api_key(cfg)
            register_secret(key)  # masked wherever it would be printed or recorded
        from hcqr_dspy.lm import redacted_errors

        redacted_errors.install()
        if cache:
            key_cache_by_endpoint()
        lm = dspy.LM(
            cfg.model, temperature=temperature, max_tokens=max_tokens, cache=cache, num_retries=num_retries, **kwargs
        )
        card = endpoint_card(cfg, kwargs.get("api_key"))
        if cache and card and "unavailable" not in card:
            key_cache_by_card(cfg.api_base, card)
        lm.hcqr_endpoint_card = card
        redact_logging()  # DSPy's and LiteLLM's log handlers exist once they are imported
    lm.hcqr_config = cfg
    register_lm(lm)  # its replies are cached with its setup (hcqr_dspy.lm.reply_setup)
    if cache:
        record_reply_setups()
    return lm


def api_key(cfg: LMConfig) -> str:
    """The API key of a remote LM, from its ``api_key_env`` variable.

    Raises:
        LMSpecError: the variable is not set (or empty).
    """
    key = os.environ.get(cfg.api_key_env or "")
    if not key:
        raise LMSpecError(f"environment variable {cfg.api_key_env} (the API key for {cfg.model}) is not set")
    return key


def check_lm_spec(spec: str, api_base: str | None = None, api_key_env: str | None = None) -> None:
    """What :func:`build_lm` checks of a spec before it loads a model or asks a server anything: the spec, a
    packaged model's file, and a remote LM's route and key variable.

    Raises:
        LMSpecError: as :func:`build_lm` would.
    """
    cfg = parse_lm_spec(spec, api_base=api_base, api_key_env=api_key_env)
    if cfg.kind == "packaged":
        packaged_model_path(cfg.model.split("/", 1)[1])
    elif cfg.kind == "gguf":
        require_gguf_file(cfg.path)
    elif cfg.kind == "litellm":
        check_route(cfg.model)
        if cfg.api_key_env:
            api_key(cfg)


def check_lm(lm, timeout: float = 60.0) -> None:
    """Ask a remote LM one tiny question (not cached) to prove it can be used before a run writes anything.

    Local llama.cpp models are proven by loading them (:func:`build_lm`) and are
    not asked. A remote LM that refuses the key, does not know the model, or
    cannot be reached after LiteLLM's retries stops here with one line.

    Raises:
        LMSpecError: the LM cannot be used (the error type and first line of its message).
    """
    if isinstance(getattr(lm, "engine", None), LlamaCppEngine) or getattr(lm, "hcqr_config", None) is None:
        return
    import logging

    quiet = logging.getLogger("dspy.clients.lm")  # a 5-token probe may be cut: not the run's business
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        lm("Reply with the word OK.", max_tokens=5, cache=False, timeout=timeout)
    except Exception as exc:  # any failure of a one-word request means the LM cannot be used
        first = (redact(str(exc)).splitlines() or [""])[0][:300]
        raise LMSpecError(f"the LM {lm.hcqr_config.spec!r} cannot be used: {type(exc).__name__}: {first}") from None
    finally:
        quiet.setLevel(level)


def engine_model_name(cfg: LMConfig, engine: LlamaCppEngine) -> str:
    """The model name a local model is given in DSPy, which keys DSPy's response cache.

    DSPy caches a reply under the request (model name, messages, temperature,
    max_tokens ...); the engine's own settings are not in the request, so they
    go into the name: the context window (a smaller window must not be served
    a reply cached under a larger one, whose prompt it would have refused), the
    repetition penalty and the seed. A ``gguf:`` file adds the start of its SHA-256
    (:func:`~hcqr_dspy.lm.model_file.gguf_sha256`), so files that share a stem, or a file replaced by another
    at the same path, are told apart. The llama.cpp build's CPU kernels
    (:func:`~hcqr_dspy.lm.engine_settings.build_features`) and the engine settings that change the
    prompt's floating-point order (:meth:`~hcqr_dspy.lm.engine_settings.EngineSettings.reply_key`) come
    last: another build or batch size need not give the same reply at temperature 0.

    Example:
        ``llama_cpp/qwen2.5-coder-1.5b@n_ctx=8192,repeat_penalty=1.1,seed=0,build=avx512,ubatch=512,fa=1,threads=2,bufts=0``
    """
    name = cfg.model
    if cfg.kind == "gguf":
        name = f"{cfg.model}-{gguf_sha256(cfg.path)[:12]}"
    return (
        f"{name}@n_ctx={engine.n_ctx},repeat_penalty={engine.repeat_penalty},seed={engine.seed},"
        f"build={engine.build},{engine.settings.reply_key()}"
    )


def count_tokens(lm, text: str) -> int:
    """Tokens of ``text`` for ``lm``: exact for llama.cpp engines, else ~4 characters a token."""
    engine = getattr(lm, "engine", None)
    if isinstance(engine, LlamaCppEngine):
        return engine.count_tokens(text)
    return max(1, len(text) // 4)
