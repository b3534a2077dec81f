"""The in-process llama.cpp engine's settings: threads, batch sizes, flash attention and weight repacking.

Every setting has a default measured on this project's machines (``bench/lm.py``, ``bench/RESULTS.md``) and can be
changed by an environment variable, so a study can be run the same way from any command:

=========================  ======================  =========================================================
variable                   default                 llama.cpp setting
=========================  ======================  =========================================================
``HCQR_N_THREADS``         every core              ``n_threads`` (and ``n_threads_batch``)
``HCQR_N_BATCH``           512                     ``n_batch``: prompt tokens submitted per ``llama_decode``
``HCQR_N_UBATCH``          512                     ``n_ubatch``: tokens computed per graph (physical batch)
``HCQR_FLASH_ATTN``        1                       ``flash_attn``
``HCQR_EXTRA_BUFTS``       per build (see below)   ``llama_model_params.use_extra_bufts`` (weight repacking)
``HCQR_PROMPT_CACHE_MB``   2048                    ``Llama.set_cache(LlamaRAMCache(capacity_bytes))``; 0: off
=========================  ======================  =========================================================

``use_extra_bufts`` (llama.cpp ``llama_model_params``, "use extra buffer types (used for weight repacking)")
repacks quantised weights at load time into the CPU backend's extra buffer types (the ``CPU_REPACK`` and, where
built, AMX buffers). On this project's machines the AVX-512 build prefilled faster without it (it generates
faster with it, but a question's time is mostly prefill), the portable AVX2 build faster with it, and a native
build's AMX repack path crashed in ``llama_decode``; so it is off for AVX-512 and AMX builds and on for the
others unless asked for (:func:`default_extra_bufts`). llama-cpp-python 0.3.36's ``Llama()`` has no argument for it;
:meth:`LlamaCppEngine._load <hcqr_dspy.lm.llama_cpp.LlamaCppEngine>` sets the field while the model loads.

Flash attention (llama.cpp's fused attention kernel, which llama.cpp itself turns on where the backend supports
it) prefilled 1,000- and 3,000-token prompts faster on the CPU, so it is on.

The prompt cache is llama-cpp-python's ``LlamaRAMCache``: after each completion the context's state (KV cache and
the last batch's logits) is kept under its tokens, and a later prompt starts from the kept state that shares its
longest token prefix (least recently used states are dropped beyond the capacity). llama-cpp-python by itself
reuses only the prefix shared with the previous call; HCQR alternates three stages whose prompts start with
different system messages, so each stage's long fixed prefix (the signature's instructions and field
descriptions, rendered by DSPy's adapter) would otherwise be computed again for every question. A state of a
3,000-token prompt holds about 0.4 GB for the 1.5B model (the ``n_batch x vocabulary`` float32 logits and the KV
cache), so the default capacity keeps a few of them. A prompt resumed from a kept state computes its remaining
tokens in other batches than a prompt computed whole, which can turn a near-tie at temperature 0; llama-cpp-python
already resumes every prompt from the previous call's tokens, so a local reply has always depended on the calls
before it at that level, and DSPy's response cache (which answers a repeated request with the first reply) is
what makes a rerun exact.

The settings that can change a reply at temperature 0 (they change the floating-point order of the prompt's
computation: the build's CPU kernels, repacking, the physical batch and flash attention) are part of the engine's
model name, which keys DSPy's response cache (:func:`hcqr_dspy.lm.dspy_lm.engine_model_name`); so are the threads
when flash attention is on: its sums are split across threads (with it, the in-process engine at 2 threads and
llama-cpp-python's server at 1 replied differently to the same prompt, and alike at equal threads); without it
ggml splits rows, not sums, across threads. All are recorded in each session's record
(:func:`hcqr_dspy.evaluation.provenance.engine_record`).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

from hcqr_dspy.errors import LMSpecError

DEFAULT_N_BATCH = 512  # llama-cpp-python's default
DEFAULT_N_UBATCH = 512  # llama-cpp-python's default
DEFAULT_PROMPT_CACHE_MB = 2048  # LlamaRAMCache's own default capacity (2 GiB)


def _env_int(name: str, default: int | None, minimum: int = 1) -> int | None:
    """``$name`` as an integer of at least ``minimum`` (``default`` when unset).

    Raises:
        LMSpecError: the variable is not such an integer.
    """
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise LMSpecError(f"{name} must be {kind}, got {raw!r}")
    return int(raw)


def _flag(name: str, default: bool | None) -> bool | None:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw not in ("0", "1"):
        raise LMSpecError(f"{name} must be 0 or 1, got {raw!r}")
    return raw == "1"


def default_threads() -> int:
    """llama.cpp threads: ``$HCQR_N_THREADS`` if set (a positive integer), else every core.

    Raises:
        LMSpecError: ``HCQR_N_THREADS`` is not a positive integer.
    """
    return _env_int("HCQR_N_THREADS", None) or os.cpu_count() or 1


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs llama.cpp (see the module's table for each field's variable and source).

    Attributes:
        n_threads: CPU threads for prompt and generation.
        n_batch: Logical batch (prompt tokens per ``llama_decode`` call).
        n_ubatch: Physical batch (at most ``n_batch``).
        flash_attn: llama.cpp's flash attention.
        use_extra_bufts: Repack weights into the CPU backend's extra buffer types (``None``: the build's default,
            :func:`default_extra_bufts`, which the engine fills in when it loads).
        prompt_cache_mb: Capacity of the prompt cache in MiB (0: no cache).
    """

    n_threads: int
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_UBATCH
    flash_attn: bool = True
    use_extra_bufts: bool | None = None
    prompt_cache_mb: int = DEFAULT_PROMPT_CACHE_MB

    def __post_init__(self):
        if min(self.n_threads, self.n_batch, self.n_ubatch) < 1 or self.prompt_cache_mb < 0:
            raise LMSpecError(f"engine settings must be positive: {self}")
        if self.n_ubatch > self.n_batch:
            raise LMSpecError(f"n_ubatch ({self.n_ubatch}) cannot exceed n_batch ({self.n_batch})")

    @classmethod
    def from_env(cls, n_threads: int | None = None) -> EngineSettings:
        """The settings from the environment (module table), ``n_threads`` overriding ``HCQR_N_THREADS``.

        Raises:
            LMSpecError: a variable that is not a positive integer (or 0/1 for a switch), or
                ``n_ubatch > n_batch``.
        """
        n_batch = _env_int("HCQR_N_BATCH", DEFAULT_N_BATCH)
        return cls(
            n_threads=n_threads or default_threads(),
            n_batch=n_batch,
            n_ubatch=_env_int("HCQR_N_UBATCH", min(DEFAULT_N_UBATCH, n_batch)),
            flash_attn=_flag("HCQR_FLASH_ATTN", True),
            use_extra_bufts=_flag("HCQR_EXTRA_BUFTS", None),
            prompt_cache_mb=_env_int("HCQR_PROMPT_CACHE_MB", DEFAULT_PROMPT_CACHE_MB, minimum=0),
        )

    def record(self) -> dict:
        """The settings as a JSON object (for session records)."""
        return asdict(self)

    def reply_key(self) -> str:
        """The settings that can change a reply, for the engine's model name: ``ubatch=512,fa=1,threads=2,bufts=0``
        (threads only with flash attention, whose sums depend on them)."""
        bufts = "build" if self.use_extra_bufts is None else int(self.use_extra_bufts)
        threads = f"threads={self.n_threads}," if self.flash_attn else ""
        return f"ubatch={self.n_ubatch},fa={int(self.flash_attn)},{threads}bufts={bufts}"


def default_extra_bufts(build: str) -> bool:
    """Weight repacking's measured default for a build's kernels (:func:`build_features`): off for ``avx512``
    (faster prompts without it) and ``amx`` (its repack path crashed), on otherwise (``bench/RESULTS.md``, LM
    path: the portable build prefilled and generated faster with it)."""
    return build not in ("avx512", "amx")


def build_features(system_info: str) -> str:
    """The CPU kernels a llama.cpp build uses, from ``llama_print_system_info``: ``amx``, ``avx512``, ``avx2``
    or ``generic`` (the widest one it reports as on)."""
    on = set(re.findall(r"(\w+) = 1\b", system_info))
    if "AMX_INT8" in on:
        return "amx"
    if "AVX512" in on:
        return "avx512"
    if "AVX2" in on:
        return "avx2"
    return "generic"
