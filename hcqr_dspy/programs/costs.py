"""LM cost accounting of one program stage: wall time, LM calls and tokens.

A program's prediction records ``stages`` as ``{stage: {seconds, lm_calls, cached_lm_calls, prompt_tokens,
completion_tokens}}``; :func:`lm_costs` measures one such record around a block, and
:func:`hcqr_dspy.programs.base.stage` files it under the stage's name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.usage_tracker import track_usage


class _LMCallCounter(BaseCallback):
    """Counts LM requests (served by the model or by DSPy's cache) within one stage."""

    def __init__(self) -> None:
        self.requests = 0

    def on_lm_start(self, call_id, instance, inputs):
        self.requests += 1


@contextmanager
def lm_costs(record: dict[str, Any], start: float) -> Iterator[None]:
    """Fill ``record`` with the cost of the block when it ends (also when it raises).

    ``lm_calls`` and the token counts come from DSPy's usage tracker, which
    sees only requests the model actually served; ``cached_lm_calls`` counts
    the requests DSPy's response cache answered (no cost, no tokens), so cost
    summaries of a partly cached run are not mistaken for cheap methods.

    Args:
        record: Filled with ``seconds`` (wall time since ``start``, rounded to 0.1 ms), ``lm_calls``,
            ``cached_lm_calls``, ``prompt_tokens`` and ``completion_tokens``.
        start: ``time.perf_counter()`` when the stage started.
    """
    counter = _LMCallCounter()
    with dspy.context(callbacks=[*(dspy.settings.get("callbacks") or []), counter]), track_usage() as tracker:
        try:
            yield
        finally:
            entries = [u for lm_entries in tracker.usage_data.values() for u in lm_entries]
            record.update(
                {
                    "seconds": round(time.perf_counter() - start, 4),
                    "lm_calls": len(entries),
                    "cached_lm_calls": max(0, counter.requests - len(entries)),
                    "prompt_tokens": sum(int(u.get("prompt_tokens") or 0) for u in entries),
                    "completion_tokens": sum(int(u.get("completion_tokens") or 0) for u in entries),
                }
            )
