"""One MLflow span per LM call in a ``full`` question trace: the messages sent and the reply, below the stage that
made the call (``hypothesis``, ``rewrite``, ``answer`` ...).

:class:`LMCallSpans` is a DSPy callback: DSPy calls its ``on_lm_start`` and ``on_lm_end`` around every
``LM.__call__``. It records nothing of DSPy's modules and adapters (``Predict.forward``, the adapter's ``format``
and ``parse``): what they did is in the LM call's messages and reply, and in the stage span's inputs and outputs.
A call made while no trace is active (:func:`hcqr_dspy.tracking.stage_spans.active` false) is not recorded.

The span (:data:`SPAN_NAME`, then the model, e.g. ``LM openai/gpt-4o-mini``) is of type ``CHAT_MODEL`` (``LLM`` for
a text-completion LM) and holds:

* inputs: ``messages`` (the chat messages, as DSPy's adapter made them), or ``prompt`` for a prompt call;
* outputs: the reply texts, one per choice (a choice with more than text, such as tool calls, as a dict without its
  ``logprobs``);
* attributes: the model (``mlflow.llm.model``), its provider, DSPy's message format (``dspy``, which MLflow's UI
  renders as a chat), :data:`LM_SETTINGS` found in the LM's settings (never a key or an endpoint), and the token
  usage the endpoint reported (``mlflow.chat.tokenUsage``: ``input_tokens``, ``output_tokens``, ``total_tokens``,
  which MLflow sums into the trace's token usage), read from DSPy's usage tracker; a reply served by DSPy's cache
  reports none;
* status ``ERROR`` with the exception as an event when the call failed (its text masked by
  :mod:`hcqr_dspy.lm.redacted_errors`, which DSPy calls first).

:func:`recording` installs the callback for a block (:func:`hcqr_dspy.tracking.mlflow_runs.dspy_tracing`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from hcqr_dspy.tracking import stage_spans

SPAN_NAME = "LM"
LM_SETTINGS = ("temperature", "max_tokens", "top_p", "top_logprobs", "seed", "n")
"""The LM settings an LM call's span carries as attributes, where the LM has them."""


def _usage_entries(model: str) -> tuple[Any, int]:
    """DSPy's usage tracker active now and how many entries it holds for ``model`` (``(None, 0)`` without one)."""
    tracker = dspy.settings.get("usage_tracker", None)
    if tracker is None:
        return None, 0
    return tracker, len(tracker.usage_data.get(model, []))


def _reply(output: Any) -> Any:
    """One choice of a reply as the span keeps it: the text, or the choice's dict without its log-probabilities."""
    if isinstance(output, dict):
        rest = {k: v for k, v in output.items() if k != "logprobs"}
        return rest["text"] if set(rest) == {"text"} else rest
    return output


class LMCallSpans(BaseCallback):
    """Records each LM call made under an active trace as one span (see the module's text); thread-safe."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, str, Any, int]] = {}  # call id: (span, model, usage tracker, entries)
        self._lock = threading.Lock()

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if not stage_spans.active():
            return
        import mlflow
        from mlflow.entities import SpanType
        from mlflow.tracing.constant import SpanAttributeKey

        model = str(getattr(instance, "model", "") or "")
        chat = getattr(instance, "model_type", "chat") == "chat"
        settings = getattr(instance, "kwargs", None) or {}
        attributes = {
            SpanAttributeKey.MODEL: model,
            SpanAttributeKey.MESSAGE_FORMAT: "dspy",
            **{k: settings[k] for k in LM_SETTINGS if settings.get(k) is not None},
        }
        if "/" in model:
            attributes[SpanAttributeKey.MODEL_PROVIDER] = model.split("/", 1)[0]
        messages = inputs.get("messages")
        sent = {"messages": messages} if messages is not None else {"prompt": inputs.get("prompt")}
        span = mlflow.start_span_no_context(
            name=f"{SPAN_NAME} {model}".strip(),
            span_type=SpanType.CHAT_MODEL if chat else SpanType.LLM,
            parent_span=mlflow.get_current_active_span(),
            inputs=sent,
            attributes=attributes,
        )
        tracker, entries = _usage_entries(model)
        with self._lock:
            self._open[call_id] = (span, model, tracker, entries)

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        with self._lock:
            opened = self._open.pop(call_id, None)
        if opened is None:
            return
        from mlflow.entities import SpanEvent, SpanStatusCode
        from mlflow.tracing.constant import SpanAttributeKey, TokenUsageKey

        span, model, tracker, before = opened
        if tracker is not None:
            new = tracker.usage_data.get(model, [])[before:]
            if new:
                prompt = sum(int(u.get("prompt_tokens") or 0) for u in new)
                completion = sum(int(u.get("completion_tokens") or 0) for u in new)
                span.set_attribute(
                    SpanAttributeKey.CHAT_USAGE,
                    {
                        TokenUsageKey.INPUT_TOKENS: prompt,
                        TokenUsageKey.OUTPUT_TOKENS: completion,
                        TokenUsageKey.TOTAL_TOKENS: prompt + completion,
                    },
                )
        if exception is not None:
            span.add_event(SpanEvent.from_exception(exception))
            span.end(status=SpanStatusCode.ERROR)
            return
        replies = [_reply(o) for o in outputs] if isinstance(outputs, list) else outputs
        span.end(outputs=replies)


@contextmanager
def recording() -> Iterator[LMCallSpans]:
    """Add an :class:`LMCallSpans` to DSPy's callbacks (after those there, so that the error masking stays first)
    and turn on DSPy's usage tracking (``track_usage``: every top-level module call gets a usage tracker, so that
    calls outside a stage report their tokens too) for the block; both are restored at its end. Enter it in the
    thread that configured DSPy, before the ``dspy.context`` of the calls: a context keeps the callbacks it was
    entered with."""
    callback = LMCallSpans()
    callbacks = list(dspy.settings.get("callbacks", None) or [])
    usage = dspy.settings.get("track_usage", False)
    dspy.settings.configure(callbacks=[*callbacks, callback], track_usage=True)
    try:
        yield callback
    finally:
        rest = [c for c in (dspy.settings.get("callbacks", None) or []) if c is not callback]
        dspy.settings.configure(callbacks=rest, track_usage=usage)
