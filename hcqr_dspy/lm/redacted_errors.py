"""LM errors cleaned of secrets before anything records them: a DSPy callback, first among DSPy's callbacks.

A gateway may echo the key it refused ("Incorrect API key provided: Bearer sk-..."). DSPy hands an LM call's
exception to each callback's ``on_lm_end`` in the order of ``dspy.settings.callbacks`` (DSPy's
``with_callbacks``), and MLflow's DSPy autologging records it there on the LM span. This callback, kept first,
masks the exception in place (:func:`hcqr_dspy.redaction.redact_exception`), so the span, the module spans
above it, tracebacks and the one-line error all carry the masked text.
"""

from __future__ import annotations

from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from hcqr_dspy.redaction import redact_exception


class RedactLMErrors(BaseCallback):
    """Masks secrets in the exception of every LM call (``on_lm_end``)."""

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        if exception is not None:
            redact_exception(exception)


def install() -> None:
    """Put :class:`RedactLMErrors` first among ``dspy.settings.callbacks`` (once; callbacks added later, such as
    MLflow's autologging, come after it)."""
    callbacks = list(dspy.settings.get("callbacks", None) or [])
    if callbacks and isinstance(callbacks[0], RedactLMErrors):
        return
    rest = [c for c in callbacks if not isinstance(c, RedactLMErrors)]
    dspy.settings.configure(callbacks=[RedactLMErrors(), *rest])
