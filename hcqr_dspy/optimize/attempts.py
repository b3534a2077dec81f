"""Every bootstrapping attempt of a compile, seen as it happens: the training question the teacher program ran,
the round, what the metric said, and whether its trace was kept.

DSPy's ``BootstrapFewShot`` (also run inside ``BootstrapFewShotWithRandomSearch`` and MIPROv2, which build one per
candidate demo set) bootstraps in ``_bootstrap``: for each training question, in order, up to ``max_rounds`` times,
``_bootstrap_one_example(example, round_idx)`` runs the teacher on it under ``dspy.context(trace=[])``, calls the
metric ``metric(example, prediction, trace)`` and returns whether it passed (the metric's value, or the value
against ``metric_threshold``); a passing attempt's trace becomes a demo of each predictor it went through, and the
first ``max_bootstrapped_demos`` are kept. An exception (the program's or the metric's) is counted in
``error_count`` and the attempt fails (source: ``dspy/teleprompt/bootstrap.py``, DSPy 3.4).

:func:`watch_bootstrapping` wraps that method for the time of a block and hands each attempt to a caller's context
manager, open while the attempt runs (so that what the program records, spans included, falls inside it). Nothing
here imports MLflow: the caller decides what an attempt becomes (:mod:`hcqr_dspy.tracking.compile_run` makes it a
trace).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from dspy.teleprompt import BootstrapFewShot

HOOKED = "_bootstrap_one_example"  # BootstrapFewShot's method that runs one attempt (DSPy 3.4)
_ACTIVE = threading.Lock()  # one watched compile at a time per process (the method is patched on the class)


@dataclass
class Attempt:
    """One bootstrapping attempt.

    Attributes:
        index: Its place among the compile's attempts, from 0, in the order they ran.
        run: Which bootstrapping pass of the compile it belongs to, from 0 (``BootstrapFewShot``: one pass;
            MIPROv2 and random search: one per candidate demo set).
        round: DSPy's ``round_idx``, from 0 (rounds after the first resample at temperature 1.0).
        example: The training question (``dspy.Example`` with ``qid``, ``question``, ``options``, ``answer``).
        prediction: The teacher's prediction (``None`` when the program raised).
        score: The metric's value (``None`` when it was not called: the program raised).
        passed: Whether the attempt passed the metric (its trace then became demos).
        error: Whether the program or the metric raised (DSPy counts it in ``error_count``; the attempt failed).
    """

    index: int
    run: int
    round: int
    example: Any
    prediction: Any = None
    score: Any = None
    passed: bool = False
    error: bool = False

    @property
    def qid(self) -> str:
        """The training question's id (``""`` when it has none)."""
        return str(self.example.get("qid", "")) if hasattr(self.example, "get") else ""


Watch = Callable[[Attempt], AbstractContextManager[None]]


@contextmanager
def watch_bootstrapping(watch: Watch) -> Iterator[list[Attempt]]:
    """Inside the block, every ``BootstrapFewShot`` attempt runs inside ``watch(attempt)``; the attempt's
    ``prediction``, ``score``, ``passed`` and ``error`` are filled in before that context exits.

    The method is wrapped on the class and restored when the block ends; one block at a time per process.

    Yields:
        The attempts so far (a list that grows as they run).

    Raises:
        RuntimeError: another block is open in this process, or DSPy's ``BootstrapFewShot`` has no
            ``_bootstrap_one_example`` (a DSPy whose bootstrapping this does not know).
    """
    original = getattr(BootstrapFewShot, HOOKED, None)
    if original is None:
        raise RuntimeError(f"dspy's BootstrapFewShot has no {HOOKED}: its bootstrapping attempts cannot be watched")
    if not _ACTIVE.acquire(blocking=False):
        raise RuntimeError("bootstrapping attempts are already watched in this process")
    attempts: list[Attempt] = []
    runs: list[Any] = []  # the optimizers seen, in order (kept referenced, so that no id is reused)

    def attempt_once(self, example, round_idx=0):
        if not any(r is self for r in runs):
            runs.append(self)
        attempt = Attempt(
            index=len(attempts), run=next(i for i, r in enumerate(runs) if r is self), round=round_idx, example=example
        )
        attempts.append(attempt)
        metric, errors = self.metric, self.error_count

        def observed(example, prediction, trace=None):
            attempt.prediction = prediction
            attempt.score = metric(example, prediction, trace)
            return attempt.score

        with watch(attempt):
            if metric is not None:
                self.metric = observed
            try:
                attempt.passed = bool(original(self, example, round_idx))
            finally:
                self.metric = metric
                attempt.error = self.error_count > errors
        return attempt.passed

    setattr(BootstrapFewShot, HOOKED, attempt_once)
    try:
        yield attempts
    finally:
        setattr(BootstrapFewShot, HOOKED, original)
        with contextlib.suppress(RuntimeError):
            _ACTIVE.release()
