"""What a bad LM reply makes of one question: invalid, with its stage and cause, and the run goes on.

:data:`BAD_REPLY_ERRORS` are the exceptions a reply may raise that invalidate one question without
stopping a run; :func:`bad_reply` gives the prediction fields of such a question.
"""

from __future__ import annotations

from typing import Any

from dspy.utils.exceptions import AdapterParseError, ContextWindowExceededError

from hcqr_dspy.errors import TruncatedReplyError

# Replies that make one question invalid but must not stop a run: unparseable
# output, a letter outside the options, a prompt too long for the model, a reply
# cut at max_tokens (hcqr_dspy.lm.adapter.HCQRAdapter).
BAD_REPLY_ERRORS: tuple[type[BaseException], ...] = (AdapterParseError, ContextWindowExceededError, TruncatedReplyError)


def bad_reply(stage_name: str, exc: BaseException | None = None, message: str | None = None) -> dict[str, Any]:
    """Fields of a prediction made invalid by a bad LM reply at ``stage_name``.

    ``invalid_cause`` is ``"context_window"`` (the prompt did not fit the model's
    window), ``"truncated"`` (the reply was cut at ``max_tokens``), ``"unparseable"``
    (DSPy could not parse the reply) or ``"not_an_option"`` (a parsed letter outside
    the question's options, given as ``message``).
    """
    if exc is not None:
        if isinstance(exc, ContextWindowExceededError):
            cause = "context_window"
        elif isinstance(exc, TruncatedReplyError):
            cause = "truncated"
        else:
            cause = "unparseable"
        message = f"{type(exc).__name__}: {exc}"
    else:
        cause = "not_an_option"
    return {
        "answer": None,
        "valid": False,
        "reasoning": None,
        "error": f"{stage_name}: {message}"[:500],
        "invalid_stage": stage_name,
        "invalid_cause": cause,
    }
