"""How much a tracked evaluation records of each question (``hcqr eval --traces``, ``$HCQR_TRACES``).

``full``: the question's trace with every stage, retrieval and LM call span; ``light``: no LM call spans, texts cut
and no passage text (:mod:`hcqr_dspy.tracking.question_traces` says what each keeps); ``off``: no question traces.
MLflow-free, so that the command line names the levels without importing MLflow.
"""

from __future__ import annotations

import os

from hcqr_dspy.errors import HCQRError

TRACE_LEVELS = ("full", "light", "off")
"""What a tracked evaluation records per question, most first."""
TRACES_VARIABLE = "HCQR_TRACES"
"""The environment variable that sets the level when ``--traces`` is not given."""


def trace_level(level: str | None = None) -> str:
    """``level``, else ``$HCQR_TRACES``, else ``full``.

    Raises:
        HCQRError: not one of :data:`TRACE_LEVELS` (one line naming them).
    """
    value = (level or os.environ.get(TRACES_VARIABLE, "") or "full").strip()
    if value not in TRACE_LEVELS:
        where = "--traces" if level else f"${TRACES_VARIABLE}"
        raise HCQRError(f"{where}={value!r}: choose one of {', '.join(TRACE_LEVELS)}")
    return value
