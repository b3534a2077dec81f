"""``--lm`` specs: one string names the language model everywhere (CLI flag ``--lm``).

* ``local`` — the embedded default, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF);
* ``local:<name>`` — another packaged model (see :data:`hcqr_dspy.lm.packaged.PACKAGED_MODELS`);
* ``gguf:<path>`` — any GGUF file, run in-process by llama.cpp;
* anything else — a LiteLLM model name (``openai/gpt-4o-mini``,
  ``ollama_chat/llama3.1``, ``hosted_vllm/Qwen/Qwen3-4B-Instruct-2507``),
  with an optional API base; its key is read from an environment variable,
  never from a flag.

Parsing loads nothing heavy; LiteLLM is imported only to name or check a provider route.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.lm.packaged import DEFAULT_LOCAL, PACKAGED_MODELS
from hcqr_dspy.redaction import check_endpoint_url


@dataclass(frozen=True)
class LMConfig:
    """A resolved LM spec: what was asked for, and what is safe to log.

    Attributes:
        spec: The ``--lm`` string as given.
        kind: ``"packaged"``, ``"gguf"`` or ``"litellm"``.
        model: Model name given to ``dspy.LM``.
        path: GGUF path for local models.
        api_base: API base for LiteLLM models.
        api_key_env: Name (not value) of the environment variable holding the key.
    """

    spec: str
    kind: str
    model: str
    path: str | None = None
    api_base: str | None = None
    api_key_env: str | None = None

    def params(self) -> dict[str, str]:
        """Loggable description (never contains a key)."""
        return {k: str(v) for k, v in self.__dict__.items() if v is not None}


def parse_lm_spec(
    spec: str, api_base: str | None = None, api_key_env: str | None = None, option: str = "--lm"
) -> LMConfig:
    """Resolve an ``--lm`` spec without loading anything heavy.

    ``option`` is the flag the spec came from (``--judge-lm``, ``--reflection-lm`` ...), named in errors.

    Raises:
        LMSpecError: empty spec, unknown ``local:`` name, ``gguf:`` without a
            path, a LiteLLM name without a provider prefix, or an API base carrying credentials
            (:func:`~hcqr_dspy.redaction.check_endpoint_url`).
    """
    spec = (spec or "").strip()
    if not spec:
        raise LMSpecError(f"empty {option} spec")
    if spec == "local" or spec.startswith("local:"):
        name = DEFAULT_LOCAL if spec == "local" else spec.partition(":")[2].strip()
        if not name:
            raise LMSpecError(
                f"{option} {spec!r} names no model: use local (the default, {DEFAULT_LOCAL}) or "
                f"local:<name> ({', '.join(PACKAGED_MODELS)})"
            )
        if name not in PACKAGED_MODELS:
            raise LMSpecError(
                f"unknown packaged model {name!r} in {option} {spec!r}; choose one of {', '.join(PACKAGED_MODELS)}"
            )
        return LMConfig(spec, "packaged", f"llama_cpp/{name}")
    if spec.startswith("gguf:"):
        path = spec[len("gguf:") :]
        if not path:
            raise LMSpecError(f"{option} gguf: needs a path, e.g. gguf:/models/model.gguf")
        return LMConfig(spec, "gguf", f"llama_cpp/{Path(path).stem}", path=path)
    if "/" not in spec:
        raise LMSpecError(
            f"unknown {option} spec {spec!r}: use local, local:<name> ({', '.join(PACKAGED_MODELS)}), gguf:<path>, "
            "or a LiteLLM model name with its provider prefix (openai/..., ollama_chat/..., hosted_vllm/...)"
        )
    provider, _, model = spec.partition("/")
    if not provider.strip() or not model.strip() or any(c.isspace() for c in spec):
        raise LMSpecError(
            f"{option} {spec!r} is not <provider>/<model>: name both, without spaces, "
            "e.g. openai/gpt-4o-mini, ollama_chat/llama3.1, hosted_vllm/Qwen/Qwen3-4B-Instruct-2507"
        )
    flags = "--reflection-" if option == "--reflection-lm" else "--"  # the endpoint flags beside the spec's
    check_endpoint_url(api_base, option=f"{flags}api-base", key_option=f"{flags}api-key-env")
    return LMConfig(spec, "litellm", spec, api_base=api_base, api_key_env=api_key_env)


def describe_endpoint(cfg: LMConfig) -> str:
    """Where calls of an LM go, for messages: ``in-process llama.cpp (<file>)``, the API base with the key's
    variable, or the provider's default endpoint (LiteLLM's ``get_llm_provider``) when none was named."""
    if cfg.kind != "litellm":
        return f"in-process llama.cpp ({cfg.path or cfg.model.split('/', 1)[1]})"
    key = f" (key from ${cfg.api_key_env})" if cfg.api_key_env else " (no key variable)"
    if cfg.api_base:
        return cfg.api_base + key
    import litellm

    try:
        _, provider, _, base = litellm.get_llm_provider(cfg.model)
    except Exception:  # an unroutable name is refused by check_route before any call
        provider, base = cfg.model.split("/", 1)[0], None
    return f"{provider}'s default endpoint{f' {base}' if base else ''}{key}"


def check_route(model: str) -> None:
    """Refuse a LiteLLM model name LiteLLM cannot route to a provider (e.g. a typo of the prefix).

    Asks ``litellm.get_llm_provider`` (no network), with LiteLLM's own "Provider List" banner
    (printed to stdout on failure) silenced: the one line raised here is what the user sees.

    Raises:
        LMSpecError: naming the model and how a name looks.
    """
    import litellm

    quiet = litellm.suppress_debug_info
    litellm.suppress_debug_info = True
    try:
        litellm.get_llm_provider(model)
    except Exception:  # litellm raises its BadRequestError (or ValueError) for names it cannot route
        raise LMSpecError(
            f"--lm {model!r}: LiteLLM cannot route this model name to a provider; use <provider>/<model>, "
            "e.g. openai/gpt-4o-mini, ollama_chat/llama3.1, hosted_vllm/<model> (with --api-base)"
        ) from None
    finally:
        litellm.suppress_debug_info = quiet
