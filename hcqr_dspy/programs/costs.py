"""LM cost accounting of one program stage: wall time, LM calls and tokens.

A program's prediction records ``stages`` as ``{stage: {seconds, lm_calls, cached_lm_calls, prompt_tokens,
completion_tokens}}``; :func:`lm_costs` measures one such record around a block, and
:func:`hcqr_dspy.programs.program_base.stage` files it under the stage's name. Work done inside a stage that is not
an LM call adds its own fields through :func:`add_to_stage`: the answer step's letter-distribution prefill
(:mod:`hcqr_dspy.programs.answer_slot_probs`) adds ``scoring_seconds`` (already inside ``seconds``) and
``scoring_tokens`` (the tokens it evaluated, not in ``prompt_tokens``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.usage_tracker import track_usage

# The record of the stage measured now (set by lm_costs for its block; None outside any stage).
_STAGE_RECORD: ContextVar[dict[str, Any] | None] = ContextVar("hcqr_stage_record", default=None)


def add_to_stage(**amounts: float) -> None:
    """Add ``amounts`` (e.g. ``scoring_seconds=0.8, scoring_tokens=40``) to the record of the stage running
    now, summing with what an earlier call in the same stage added; nothing happens outside a stage."""
    record = _STAGE_RECORD.get()
    if record is not None:
        for key, value in amounts.items():
            record[key] = round(record.get(key, 0) + value, 4)


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
    token = _STAGE_RECORD.set(record)
    with dspy.context(callbacks=[*(dspy.settings.get("callbacks") or []), counter]), track_usage() as tracker:
        try:
            yield
        finally:
            _STAGE_RECORD.reset(token)
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
