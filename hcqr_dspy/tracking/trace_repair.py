"""Every answered question of a tracked evaluation has a whole trace in its MLflow run, so that the scorers' metrics
(``correct/mean`` ...) are those of the run folder.

A question's trace is written in the background after its row (:mod:`~hcqr_dspy.tracking.question_traces`). A process
killed (``kill -9``, SIGTERM) just after a row, a store locked past the wait or a disk that filled under it leaves
that row's trace missing or unfinished (``IN_PROGRESS``: some spans, no root outputs, no gold answer; or ``OK`` with
spans missing). Such a trace is rebuilt from the row: a trace of the root span alone (the question and options as
inputs, :func:`~hcqr_dspy.tracking.question_traces.root_outputs` of the row as outputs, the gold answer as the
expectation ``answer``), tagged ``trace_source=run_folder`` and ``replaces_trace=<the row's trace id>``; what the
store holds of the row's own trace is closed as ``ERROR`` and tagged ``replaced_by``. The LM and retrieval spans of a
rebuilt trace are not recorded (the row has what they returned). Rebuilt traces are found again by their tags on the
next resume; the row keeps its own ``trace_id``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

from hcqr_dspy.tracking.question_traces import question

SOURCE_TAG = "trace_source"  # "run_folder": a trace rebuilt from the run folder's row
REPLACES_TAG = "replaces_trace"  # the row's own trace id, which the rebuilt trace stands for
REPLACED_BY_TAG = "replaced_by"  # on an unfinished trace: the one rebuilt in its place


def whole(info: Any, row: dict[str, Any]) -> bool:
    """Whether the trace ``info`` (an ``mlflow.entities.TraceInfo``) is a finished trace of ``row``'s question:
    state ``OK``, tagged with its ``qid``, with the expectation ``answer`` when the row has a gold answer, and
    every span it counts (:func:`spans_whole`)."""
    if str(getattr(info.state, "value", info.state)) != "OK" or info.tags.get("qid") != str(row["qid"]):
        return False
    if row.get("gold") is not None and not any(a.name == "answer" for a in info.assessments or []):
        return False
    return spans_whole(info.trace_id)


def spans_whole(trace_id: str) -> bool:
    """Whether the store holds every span of trace ``trace_id`` (as many as its ``mlflow.trace.sizeStats`` counts:
    what ``mlflow.get_trace`` checks, without its 3 s of retries for a trace still being written).

    Raises:
        MlflowException: the store failed (:func:`~hcqr_dspy.tracking.store_faults.store_fault`).
    """
    import mlflow
    from mlflow.tracing.client import TracingClient

    from hcqr_dspy.tracking.store_faults import store_fault

    try:
        trace = TracingClient().store.get_trace(trace_id, allow_partial=True)
    except Exception as exc:  # MlflowException: not there; spans kept elsewhere than the store (artifacts)
        if store_fault(exc):
            raise
        return mlflow.get_trace(trace_id, silent=True) is not None
    stats = json.loads(trace.info.trace_metadata.get("mlflow.trace.sizeStats") or "{}")
    return len(trace.data.spans) >= int(stats.get("num_spans", 0))


def question_traces(
    rows: Iterable[dict[str, Any]],
    questions: Sequence[Any],
    run_id: str,
    experiment_id: str,
    method: str,
    tags: dict[str, str],
) -> tuple[dict[str, str], int]:
    """The whole trace of every row in the active MLflow run ``run_id``, rebuilding those that are missing or
    unfinished (the module's docstring). Call it inside that run, after the rows are written.

    Each row's trace is read by its id (:func:`stored_whole`), one at a time, and the run's traces are never listed
    but for those rebuilt before (tagged ``trace_source=run_folder``): memory holds one row and one trace at once,
    and the ``{qid: trace id}`` returned.

    Args:
        rows: The run's rows, read once (a generator over ``predictions.jsonl``: ``qid``, ``trace_id`` when traced,
            and what :func:`~hcqr_dspy.tracking.question_traces.root_outputs` reads).
        questions: The questions of the rows (``dspy.Example`` with ``qid``, ``question``, ``options``).
        run_id: The MLflow run.
        experiment_id: Its experiment.
        method: The root span's name.
        tags: The trace tags of the run's questions (:data:`~hcqr_dspy.tracking.question_traces.QUESTION_TAGS` but
            ``qid``).

    Returns:
        ``{qid: trace id}`` for every row, and how many traces were rebuilt now.

    Raises:
        MlflowException: the store failed (the caller turns it into one line).
    """
    import mlflow

    mlflow.flush_trace_async_logging()  # written in the background: every trace that will arrive is there now
    rebuilt = rebuilt_traces(run_id, experiment_id)
    by_qid = {str(q.qid): q for q in questions}
    ids: dict[str, str] = {}
    broken = 0
    for row in rows:
        found = next(
            (t for t in (row.get("trace_id"), rebuilt.get(str(row["qid"]))) if stored_whole(t, row, run_id)), None
        )
        if found is not None:
            ids[row["qid"]] = found
            continue
        broken += 1
        old = row.get("trace_id")
        q = by_qid[str(row["qid"])]
        question_tags = {**tags, "qid": row["qid"]}
        extra = {SOURCE_TAG: "run_folder", **({REPLACES_TAG: old} if old else {})}
        with question(method, q.question, q.options, {**question_tags, **extra}) as trace:
            trace.finish(dict(row))  # a copy: the row keeps its own trace id
        ids[row["qid"]] = trace.trace_id
        if old:
            close_replaced(old, trace.trace_id, question_tags)
    if broken:
        mlflow.flush_trace_async_logging()
    return ids, broken


def stored_whole(trace_id: str | None, row: dict[str, Any], run_id: str) -> bool:
    """Whether the store holds trace ``trace_id`` whole (:func:`whole`) in MLflow run ``run_id`` (its
    ``mlflow.sourceRun``), read by its id alone (a trace the store lacks costs one query, no wait).

    Raises:
        MlflowException: the store failed (:func:`~hcqr_dspy.tracking.store_faults.store_fault`).
    """
    from mlflow.tracing.client import TracingClient
    from mlflow.tracing.constant import TraceMetadataKey

    from hcqr_dspy.tracking.store_faults import store_fault

    if not trace_id:
        return False
    try:
        info = TracingClient().get_trace_info(trace_id)
    except Exception as exc:  # MlflowException: never written
        if store_fault(exc):
            raise
        return False
    return info.trace_metadata.get(TraceMetadataKey.SOURCE_RUN) == run_id and whole(info, row)


def rebuilt_traces(run_id: str | None, experiment_id: str | None = None) -> dict[str, str]:
    """``{qid: trace id}`` of the traces rebuilt from rows in MLflow run ``run_id`` (the latest per question), for
    whoever labels a row's trace (``hcqr judge``); ``{}`` for a run not in the active store. Only those traces are
    listed (by their tag), without spans."""
    import mlflow

    if not run_id:
        return {}
    if experiment_id is None:
        try:
            experiment_id = mlflow.get_run(run_id).info.experiment_id
        except Exception as exc:  # MlflowException: not in this store
            from hcqr_dspy.tracking.store_faults import store_fault

            if store_fault(exc):
                raise
            return {}
    found = mlflow.search_traces(
        locations=[experiment_id],
        run_id=run_id,
        filter_string=f"tags.{SOURCE_TAG} = 'run_folder'",
        include_spans=False,
        return_type="list",
    )
    return {t.info.tags["qid"]: t.info.trace_id for t in sorted(found, key=lambda t: t.info.request_time)}


def close_replaced(trace_id: str, replaced_by: str, tags: dict[str, str]) -> bool:
    """Close the trace ``trace_id``, which ``replaced_by`` was rebuilt for, as ``ERROR`` tagged ``replaced_by`` and
    ``tags`` (its question's, which an unfinished trace lacks), if the store holds any of it (``IN_PROGRESS``: its
    process died before its root span was written; ``OK`` with spans missing: the store failed under some of them).

    Returns:
        Whether it was closed (``False``: not in the store).
    """
    from mlflow.entities import TraceState
    from mlflow.exceptions import MlflowException
    from mlflow.tracing.client import TracingClient

    from hcqr_dspy.tracking.store_faults import store_fault

    client = TracingClient()
    try:
        info = client.get_trace_info(trace_id)
    except MlflowException as exc:
        if store_fault(exc):
            raise
        return False  # never written
    client.start_trace(
        dataclasses.replace(
            info,
            state=TraceState.ERROR,
            tags={**info.tags, **{k: str(v) for k, v in tags.items()}, REPLACED_BY_TAG: replaced_by},
        )
    )
    return True
