"""DSPy's ``JSONAdapter`` as hcqr uses it: the output schema sent to remote LMs too, and a cut reply refused.

**The schema for remote LMs.** DSPy 3.4's ``JSONAdapter`` sends the signature's JSON schema only to an LM that
DSPy's model catalogue (``dspy/clients/model_metadata``) lists as schema-capable
(``JSONAdapter._prepare_response_format``, ``dspy.clients.capabilities``). The model behind an OpenAI-compatible
server (``hosted_vllm/<model>``, ``openai/<model>`` with ``--api-base``) is not listed, so DSPy sent no
``response_format`` at all: the model wrote free text where the in-process engine, which declares schema support,
decodes under the schema's grammar, and the two disagreed (SmolLM2-135M asked "What is 2+2?" through
``hosted_vllm/`` answered prose around a fenced JSON object of other fields). :class:`HCQRAdapter` sends every
LiteLLM-named LM the schema, in the dialect ``HCQR_RESPONSE_FORMAT`` names (:data:`RESPONSE_FORMATS`):

* ``json_schema`` (the default): OpenAI's ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``,
  which OpenAI, vLLM, SGLang, LM Studio, Ollama and llama.cpp's ``llama-server`` take;
* ``json_object``: ``{"type": "json_object", "schema": {...}}``, which llama-cpp-python's server takes (its request
  model allows only ``text`` and ``json_object``: ``llama_cpp.llama_types.ChatCompletionRequestResponseFormat``;
  ``json_schema`` is answered with HTTP 500 "Input should be 'text' or 'json_object'"), and ``llama-server`` too;
* ``off``: DSPy's own choice (for an unlisted model: no ``response_format``).

The schema is the one the in-process engine turns into its grammar (DSPy's strict form of the signature's output
model, ``dspy.clients.legacy_requests._strict_json_schema``), so a llama.cpp server decodes under the same grammar.
In-process models are untouched: their engine declares the support itself.

**A reply cut at ``max_tokens``.** DSPy only logs a warning for a reply whose finish reason is ``length``
(``dspy.clients.execution._result``), and its JSON parser repairs a cut object (``json_repair``): a reply cut
after ``"answer": "B`` was read as a whole answer. :class:`HCQRAdapter` raises
:class:`~hcqr_dspy.errors.TruncatedReplyError` for it instead, which programs count as a bad reply of cause
``truncated`` (:mod:`hcqr_dspy.programs.invalid_replies`). The finish reason is read from the LM's history entry of the
call (DSPy's history is on by default; with ``dspy.settings.disable_history`` no reason can be read and none is
assumed).
"""

from __future__ import annotations

import os
from typing import Any

import dspy

from hcqr_dspy.errors import LMCapabilityError, LMSpecError, TruncatedReplyError

RESPONSE_FORMAT_VARIABLE = "HCQR_RESPONSE_FORMAT"
RESPONSE_FORMATS = ("json_schema", "json_object", "off")
DEFAULT_RESPONSE_FORMAT = "json_schema"


def response_format_dialect() -> str:
    """The structured-output dialect for remote LMs: ``$HCQR_RESPONSE_FORMAT`` or ``json_schema``.

    Raises:
        LMSpecError: the variable names no dialect of :data:`RESPONSE_FORMATS`.
    """
    value = os.environ.get(RESPONSE_FORMAT_VARIABLE, DEFAULT_RESPONSE_FORMAT).strip() or DEFAULT_RESPONSE_FORMAT
    if value not in RESPONSE_FORMATS:
        raise LMSpecError(f"{RESPONSE_FORMAT_VARIABLE}={value!r}: choose one of {', '.join(RESPONSE_FORMATS)}")
    return value


def remote(lm: Any) -> bool:
    """Whether ``lm`` was built from a LiteLLM model name (an endpoint), not an in-process model."""
    cfg = getattr(lm, "hcqr_config", None)
    return cfg is not None and cfg.kind == "litellm"


def schema_response_format(signature: type[dspy.Signature], dialect: str, native_tools: bool = True) -> Any:
    """The ``response_format`` of ``dialect`` for ``signature``'s outputs (``None`` where no schema can be built:
    an open-ended mapping field)."""
    from dspy.adapters.json_adapter import _get_structured_outputs_response_format
    from dspy.clients.legacy_requests import _strict_json_schema

    try:
        model = _get_structured_outputs_response_format(signature, native_tools)
    except ValueError:
        return None
    if dialect == "json_object":
        return {"type": "json_object", "schema": _strict_json_schema(model.model_json_schema())}
    return model  # DSPy sends a generated model as OpenAI's strict json_schema on either engine


class HCQRAdapter(dspy.JSONAdapter):
    """``dspy.JSONAdapter`` that sends remote LMs the output schema and refuses a reply cut at ``max_tokens``
    (see the module's notes and sources).

    Args:
        response_format: The dialect for remote LMs (default: :func:`response_format_dialect`, which checks it).

    Raises:
        LMSpecError: an unknown dialect.

    Example:
        >>> lm = build_lm("hosted_vllm/Qwen/Qwen2.5-7B-Instruct", api_base="http://127.0.0.1:8000/v1")
        >>> with dspy.context(lm=lm, adapter=HCQRAdapter()):
        ...     program(question=..., options=...)
    """

    def __init__(self, response_format: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.response_format = response_format or response_format_dialect()
        if self.response_format not in RESPONSE_FORMATS:
            raise LMSpecError(f"response format {self.response_format!r}: choose one of {', '.join(RESPONSE_FORMATS)}")

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        from dspy.utils.exceptions import LMError

        try:
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)
        except LMError as exc:
            refusal = format_refusal(lm, exc, self.response_format)
            if refusal is None:
                raise
            raise LMCapabilityError(refusal) from exc

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        super()._prepare_response_format(lm, lm_kwargs, signature)
        if not remote(lm) or self.response_format == "off" or "response_format" in lm_kwargs:
            return  # in-process engines (and catalogued schema-capable models) already get the schema
        format_ = schema_response_format(signature, self.response_format, self.use_native_function_calling)
        if format_ is not None:
            lm_kwargs["response_format"] = format_

    def _call_postprocess(self, processed_signature, original_signature, outputs, lm, lm_kwargs):
        if "length" in finish_reasons(lm, outputs):
            limit = lm_kwargs.get("max_tokens") or getattr(lm, "kwargs", {}).get("max_tokens")
            text = outputs[0].get("text") if outputs and isinstance(outputs[0], dict) else (outputs or [""])[0]
            raise TruncatedReplyError(
                f"the LM's reply was cut at max_tokens={limit} (finish reason 'length'): ...{str(text or '')[-80:]!r}"
            )
        return super()._call_postprocess(processed_signature, original_signature, outputs, lm, lm_kwargs)


def format_refusal(lm: Any, exc: BaseException, dialect: str) -> str | None:
    """One line saying that a remote endpoint refused the ``response_format`` it was sent, and what to set
    instead; ``None`` for any other failure. (llama-cpp-python's server answers OpenAI's ``json_schema`` with HTTP
    500 "Input should be 'text' or 'json_object'" for ``('body', 'response_format', 'type')``; DSPy has retried it
    by then, as any server error.)"""
    text = " ".join(str(exc).split())
    if not remote(lm) or "response_format" not in text:
        return None
    other = "json_object (llama-cpp-python's server)" if dialect != "json_object" else "json_schema (OpenAI's)"
    return (
        f"the endpoint of {lm.hcqr_config.spec} refused the output schema sent as {RESPONSE_FORMAT_VARIABLE}="
        f"{dialect}: set {RESPONSE_FORMAT_VARIABLE}={other}, or off to send none ({type(exc).__name__}: {text[:220]})"
    )


def finish_reasons(lm: Any, outputs: Any) -> list[str]:
    """The finish reasons of the call of ``lm`` that returned ``outputs``, from its history entry (found by
    identity: DSPy stores the very list it returns, ``dspy.clients.execution.finalize``); ``[]`` if none is found."""
    from dspy.clients.base_lm import GLOBAL_HISTORY

    for history in (getattr(lm, "history", None) or [], GLOBAL_HISTORY):
        for entry in reversed(history):
            if entry.get("outputs") is outputs:
                return _reasons(entry.get("response"))
    return []


def _reasons(response: Any) -> list[str]:
    """Finish reasons of an lm15 ``Response`` (native engines, custom engines, their cached replies), a tuple of
    them, or an OpenAI-shaped reply (LiteLLM's ``ModelResponse`` or its cached dict)."""
    if response is None:
        return []
    if isinstance(response, (tuple, list)):
        return [r for item in response for r in _reasons(item)]
    reason = getattr(response, "finish_reason", None)
    if isinstance(reason, str):
        return [reason]
    choices = response.get("choices") if isinstance(response, dict) else getattr(response, "choices", None)
    out = []
    for choice in choices or []:
        value = choice.get("finish_reason") if isinstance(choice, dict) else getattr(choice, "finish_reason", None)
        if isinstance(value, str):
            out.append(value)
    return out
