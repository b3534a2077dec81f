"""The in-process llama.cpp engine for DSPy, and one shared engine per GGUF file and context window.

Local models run through llama-cpp-python as a DSPy 3.4 custom engine (``dspy.LM(..., engine=...)``) that
declares response-schema support, so DSPy's ``JSONAdapter`` schema becomes llama.cpp grammar-constrained
decoding.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.lm import grammar_sampling
from hcqr_dspy.lm.engine_settings import EngineSettings, build_features, default_extra_bufts
from hcqr_dspy.lm.model_file import require_gguf_file, trained_context

DEFAULT_N_CTX = 8192
# llama.cpp's repetition penalty; 1.1 stops most temperature-0 loops in free-text
# reasoning fields (measured in this project's probe).
DEFAULT_REPEAT_PENALTY = 1.1


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
        n_ctx: Context window in tokens (8192 holds 15 passages of 1,000 chars); one above the window the model
            was trained with (:func:`~hcqr_dspy.lm.model_file.trained_context`) raises ``LMSpecError``.
        n_threads: CPU threads (default: ``$HCQR_N_THREADS`` or all cores; llama.cpp
            slows down sharply when another process competes for its cores, so
            lower it when sharing the machine).
        settings: Batch sizes, flash attention and weight repacking
            (:class:`~hcqr_dspy.lm.engine_settings.EngineSettings`; default: from the
            environment, ``n_threads`` overriding its threads).
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
        settings: EngineSettings | None = None,
    ):
        if importlib.util.find_spec("llama_cpp") is None:  # fail early, with the setup hint
            raise LMSpecError(
                "local GGUF models need llama-cpp-python; run `make setup-llm` (it builds and caches the wheel)"
            )
        self.model_path = require_gguf_file(model_path)
        trained = trained_context(self.model_path)
        if trained is not None and n_ctx > trained:
            raise LMSpecError(
                f"--n-ctx {n_ctx} is above the {trained} tokens {self.model_path.name} was trained with; "
                f"give at most {trained}"
            )
        self.n_ctx = n_ctx
        self.settings = settings or EngineSettings.from_env(n_threads)
        if self.settings.use_extra_bufts is None:
            self.settings = replace(self.settings, use_extra_bufts=default_extra_bufts(self.build))
        self.n_threads = self.settings.n_threads
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        self.llm = self._load(logits_all=False)
        if self.settings.prompt_cache_mb:
            from llama_cpp import LlamaRAMCache

            self.llm.set_cache(LlamaRAMCache(capacity_bytes=self.settings.prompt_cache_mb << 20))
            self.llm.save_state = lambda: save_state_without_scores(self.llm)
        self._llm_logprobs = None
        self._lock = threading.Lock()

    def _load(self, logits_all: bool):
        from llama_cpp import Llama

        cfg = self.settings
        with _load_lock, extra_bufts(cfg.use_extra_bufts):
            try:
                llm = Llama(
                    model_path=str(self.model_path),
                    n_ctx=self.n_ctx,
                    n_threads=cfg.n_threads,
                    n_threads_batch=cfg.n_threads,
                    n_batch=cfg.n_batch,
                    n_ubatch=cfg.n_ubatch,
                    flash_attn=cfg.flash_attn,
                    seed=self.seed,
                    logits_all=logits_all,
                    verbose=False,
                )
            except Exception as exc:
                raise LMSpecError(f"llama.cpp cannot load {self.model_path}: {exc}") from None
        grammar_sampling.install(llm)  # greedy JSON replies: the grammar checked on the greedy token first
        return llm

    @property
    def system_info(self) -> str:
        """llama.cpp's ``llama_print_system_info``: the CPU features this build uses (``AVX2 = 1 | ...``)."""
        import llama_cpp

        info = llama_cpp.llama_print_system_info()
        return (info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)).strip(" |")

    @property
    def build(self) -> str:
        """The widest CPU kernels of this llama.cpp build (:func:`~hcqr_dspy.lm.engine_settings.build_features`)."""
        return build_features(self.system_info)

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

    def next_token_logprobs(
        self, messages: list[dict[str, str]], assistant_prefix: str, usage: dict[str, int] | None = None
    ):
        """Teacher-forced: the natural-log probabilities of every vocabulary token as the next token, after the
        chat prompt of ``messages`` and an assistant turn that already holds ``assistant_prefix``.

        One prefill and nothing generated: the prompt is rendered by the GGUF's own chat template (as
        :meth:`complete` renders it through llama-cpp-python), the prefix is appended as tokens, and the
        tokens llama.cpp already holds in its KV cache from the previous call (the same prompt just answered)
        are not evaluated again. The distribution is the model's raw one (no repetition penalty, no grammar).

        Args:
            messages: The chat messages of the call being scored.
            assistant_prefix: The reply's text up to the token to score.
            usage: If given, set to ``{"prompt_tokens": <tokens evaluated>}`` (those not already in the KV cache).

        Returns:
            A float64 array of shape ``(n_vocab,)`` (log-softmax of the last position's logits).

        Raises:
            dspy.lm15.ContextLengthError: the prompt and prefix do not fit ``n_ctx``.
        """
        import numpy as np
        from dspy.lm15 import ContextLengthError
        from scipy.special import log_softmax

        formatted = self._chat_formatter()(messages=messages)
        tokens = self.llm.tokenize(formatted.prompt.encode("utf-8"), add_bos=not formatted.added_special, special=True)
        tokens += self.llm.tokenize(assistant_prefix.encode("utf-8"), add_bos=False, special=False)
        if len(tokens) >= self.n_ctx:
            raise ContextLengthError(f"prompt and prefix of {len(tokens)} tokens exceed n_ctx={self.n_ctx}")
        with self._lock:
            llm = self.llm
            held = llm.input_ids[: llm.n_tokens].tolist()
            same = 0
            while same < min(len(held), len(tokens) - 1) and held[same] == tokens[same]:
                same += 1
            llm.n_tokens = same  # eval() drops the KV cache past this point
            llm.eval(tokens[same:])
            if usage is not None:
                usage["prompt_tokens"] = len(tokens) - same
            # llama-cpp-python keeps no scores without logits_all; the context holds the last position's logits
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)
        return log_softmax(logits)

    def letter_tokens(self) -> dict[str, list[int]]:
        """``{letter: token ids}``: every vocabulary token that reads as one capital letter once spaces and
        quotes are stripped (``C``, `` C``, ``"C``), for summing a letter's probability over its spellings."""
        if getattr(self, "_letter_tokens", None) is None:
            out: dict[str, list[int]] = {}
            for token_id in range(self.llm.n_vocab()):
                text = self.llm.detokenize([token_id], special=False).decode("utf-8", errors="ignore")
                letter = text.strip().strip("\"'").strip()
                if len(letter) == 1 and "A" <= letter <= "Z":
                    out.setdefault(letter, []).append(token_id)
            self._letter_tokens = out
        return self._letter_tokens

    def _chat_formatter(self):
        """The GGUF's chat template as llama-cpp-python renders it for :meth:`complete` (``chat_template.default``),
        compiled once per engine.

        Raises:
            LMSpecError: llama-cpp-python uses another chat format for this model (teacher forcing would render a
                prompt the generation did not see).
        """
        if getattr(self, "_formatter", None) is None:
            self._formatter = self._new_chat_formatter()
        return self._formatter

    def _new_chat_formatter(self):
        from llama_cpp import llama_chat_format

        llm = self.llm
        template = llm.metadata.get("tokenizer.chat_template")
        if llm.chat_format == "chat_template.default" and template:
            eos, bos = llm.token_eos(), llm.token_bos()
            return llama_chat_format.Jinja2ChatFormatter(
                template=template,
                eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
            )
        raise LMSpecError(
            f"{self.model_path.name}: teacher-forced scoring needs the GGUF's own chat template "
            f"(llama-cpp-python uses chat format {llm.chat_format!r})"
        )

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def save_state_without_scores(llm):
    """``Llama.save_state`` for a model without ``logits_all``, whose ``scores`` array it never writes.

    llama-cpp-python 0.3.36's ``save_state`` copies that array (``n_batch x vocabulary`` float32: 297 MB for
    Qwen2.5) into every state the prompt cache keeps, which cost about as much time as the cache saved; this keeps one
    row of it (``load_state`` broadcasts it back) and the context's own state (KV cache and last logits,
    ``llama_state_get_data``) copied once.

    Raises:
        RuntimeError: llama.cpp wrote more state than it said it would.
    """
    import ctypes

    import llama_cpp.llama_cpp as llama_cpp_c
    from llama_cpp.llama import LlamaState

    size = llama_cpp_c.llama_state_get_size(llm._ctx.ctx)
    buffer = (ctypes.c_uint8 * int(size))()
    written = int(llama_cpp_c.llama_state_get_data(llm._ctx.ctx, buffer, size))
    if written > int(size):
        raise RuntimeError("llama.cpp wrote more state than llama_state_get_size said")
    return LlamaState(
        scores=llm.scores[:1, :].copy(),
        input_ids=llm.input_ids.copy(),
        n_tokens=llm.n_tokens,
        llama_state=ctypes.string_at(buffer, written),
        llama_state_size=written,
        seed=llm._seed,
    )


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


_load_lock = threading.Lock()  # the model-parameter hook in LlamaCppEngine._load is process-wide
_engines: dict[tuple, LlamaCppEngine] = {}
_engines_lock = threading.Lock()


def engine_for(path: Path, n_ctx: int) -> LlamaCppEngine:
    """The one :class:`LlamaCppEngine` of a GGUF file and context window, loaded on first use and shared after."""
    key = (str(path.resolve()), n_ctx)
    with _engines_lock:
        if key not in _engines:
            _engines[key] = LlamaCppEngine(path, n_ctx=n_ctx)
        return _engines[key]


@contextmanager
def extra_bufts(value: bool | None) -> Iterator[None]:
    """Within the block, every model llama.cpp loads gets ``use_extra_bufts = value`` (weight repacking;
    llama-cpp-python's ``Llama()`` has no argument for it and builds its parameters from
    ``llama_model_default_params``)."""
    import llama_cpp.llama_cpp as llama_cpp_c

    defaults = llama_cpp_c.llama_model_default_params

    def model_params():
        params = defaults()
        params.use_extra_bufts = value
        return params

    llama_cpp_c.llama_model_default_params = model_params
    try:
        yield
    finally:
        llama_cpp_c.llama_model_default_params = defaults
