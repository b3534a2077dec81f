"""What a compile's MLflow run records of the compile itself: its training and validation questions as datasets,
one trace per bootstrapping attempt, and the optimizer's score of each candidate or trial as a metric with steps.

Called by :func:`hcqr_dspy.workflows.compile.compile_and_save` inside the compile's run. The attempts come from
:func:`hcqr_dspy.optimize.attempts.watch_bootstrapping`, the scores from
:func:`hcqr_dspy.optimize.trials.trial_scores`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hcqr_dspy.evaluation.fingerprints import question_fingerprint
from hcqr_dspy.optimize.attempts import Attempt, Watch
from hcqr_dspy.tracking.datasets import log_question_set, questions_dataset
from hcqr_dspy.tracking.question_traces import question

ATTEMPT_SPAN = "bootstrap_attempt"
"""The root span's name of an attempt's trace (and its tag ``kind``)."""
QUESTION_CONTEXTS = ("training", "validation")


def log_compile_questions(trainset: Sequence[Any], valset: Sequence[Any], dataset: str, experiment_id: str) -> None:
    """Log the compile's questions as inputs of the active run: the training questions with the input context
    ``training``, the validation questions (when the recipe holds some out) with ``validation``.

    Each is an MLflow evaluation dataset (:func:`~hcqr_dspy.tracking.datasets.questions_dataset`) named
    ``<dataset>-<first 12 hex digits of the set's content SHA-256>``, logged under the first 8 digits
    (:func:`~hcqr_dspy.evaluation.fingerprints.question_fingerprint`): the scheme of an evaluation's question set,
    so the same questions are the same dataset wherever they are used.
    """
    for context, questions in zip(QUESTION_CONTEXTS, (trainset, valset)):
        if not questions:
            continue
        sha = question_fingerprint(questions)["content_sha256"]
        log_question_set(questions_dataset(questions, f"{dataset}-{sha[:12]}", experiment_id), sha[:8], context)


def attempt_traces(tags: dict[str, str]) -> Watch:
    """A watch for :func:`~hcqr_dspy.optimize.attempts.watch_bootstrapping` that makes each attempt one trace in the
    active run's experiment, linked to the run (MLflow's ``mlflow.sourceRun``).

    The root span ``bootstrap_attempt`` has the training question and options as inputs and, as outputs, the
    teacher's ``answer``, the ``gold`` answer, the metric's value (``metric``) and ``passed``; the program's stage
    spans (:mod:`hcqr_dspy.tracking.stage_spans`) fall inside it. Tags: ``tags`` (the compile's ``method``, ``recipe``,
    ``optimizer``, ``mlflow_run_id``), ``kind`` (``bootstrap_attempt``), ``qid``, ``round`` (DSPy's round, from
    0), ``attempt`` (its place among the compile's attempts, from 0), ``bootstrap_run`` (which bootstrapping pass,
    from 0), ``passed`` (``true`` or ``false``) and, when the program or the metric raised, ``error`` (``true``, or
    the exception's class when it stopped the compile).
    """
    import mlflow

    @contextmanager
    def watch(attempt: Attempt) -> Iterator[None]:
        example = attempt.example
        trace_tags = {
            **tags,
            "kind": ATTEMPT_SPAN,
            "qid": attempt.qid,
            "round": str(attempt.round),
            "attempt": str(attempt.index),
            "bootstrap_run": str(attempt.run),
        }
        with question(ATTEMPT_SPAN, example.question, dict(example.options), trace_tags) as trace:
            try:
                yield
            except BaseException as exc:  # the attempt stopped the compile (DSPy's max_errors, an interrupt)
                mlflow.update_current_trace(tags={"passed": "false", "error": type(exc).__name__})
                raise
            trace.root.set_outputs(attempt_outputs(attempt))
            mlflow.update_current_trace(
                tags={"passed": str(attempt.passed).lower(), **({"error": "true"} if attempt.error else {})}
            )

    return watch


def attempt_outputs(attempt: Attempt) -> dict[str, Any]:
    """The root span's outputs of an attempt: ``answer`` (``None`` when the program raised), ``gold``, ``metric``
    (a number, or for a feedback metric its ``score``, with ``feedback``), ``passed``, ``error``."""
    score = attempt.score
    feedback = getattr(score, "feedback", None)
    score = getattr(score, "score", score)
    return {
        "answer": getattr(attempt.prediction, "answer", None),
        "gold": attempt.example.get("answer"),
        "metric": score if isinstance(score, (bool, int, float)) or score is None else str(score),
        **({"feedback": str(feedback)} if feedback is not None else {}),
        "passed": attempt.passed,
        "error": attempt.error,
    }


def log_attempt_counts(attempts: Sequence[Attempt]) -> None:
    """Log ``bootstrap.attempts``, ``bootstrap.passed`` and ``bootstrap.errors`` (counts) to the active run when the
    compile bootstrapped, and wait until the attempts' traces are written (MLflow exports them in the background)."""
    import mlflow

    if not attempts:
        return
    mlflow.flush_trace_async_logging()
    mlflow.log_metrics(
        {
            "bootstrap.attempts": float(len(attempts)),
            "bootstrap.passed": float(sum(a.passed for a in attempts)),
            "bootstrap.errors": float(sum(a.error for a in attempts)),
        }
    )


def log_trial_scores(series: dict[str, list[tuple[int, float]]]) -> None:
    """Log each series of :func:`~hcqr_dspy.optimize.trials.trial_scores` to the active run: one metric per name,
    one value per step (MLflow's metric history; the UI charts it against the step)."""
    import time

    import mlflow
    from mlflow.entities import Metric

    if not series:
        return
    now = int(time.time() * 1000)
    metrics = [Metric(name, value, now, step) for name, points in series.items() for step, value in points]
    run_id = mlflow.active_run().info.run_id
    for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
        mlflow.MlflowClient().log_batch(run_id, metrics=metrics[start : start + 1000])
