"""How a served program answers a request: its questions in parallel, a deadline, and one trace per question.

* **Threads.** The questions of one request run on up to ``threads`` threads (``HCQR_SERVE_THREADS``, else the
  model config's ``threads``, else :data:`DEFAULT_THREADS`; 1 for an in-process model, whose engine answers one
  call at a time anyway). Answers come back in request order.
* **Deadline.** A request may say how long it may take: ``{"params": {"deadline_s": 120}}`` (the signature's
  params); the default is the model config's ``deadline_s``, else :data:`DEFAULT_DEADLINE_S`, shorter than the
  ``-t`` the serve hint gives (:data:`hcqr_dspy.tracking.serving.SERVE_TIMEOUT_S`) so that the answer is sent
  before MLflow's server gives up. A question not started when the deadline passes is not started: its record
  says so (``valid: false``, ``error: "deadline: ..."``, ``rejected: null``). A question already running
  finishes (an LM call cannot be taken back).
* **Traces.** When the serving process has an MLflow tracking store (``MLFLOW_TRACKING_URI``; ``HCQR_SERVE_TRACES=0``
  turns it off), every answered question is one trace in experiment ``hcqr-dspy``, as an evaluation's are
  (:mod:`~hcqr_dspy.tracking.question_traces`), tagged ``kind=served``, ``qid``, ``method``, ``lm``, ``model_id``
  and, for a registered version, ``model_name`` / ``model_version``; MLflow links it to the served LoggedModel.
  ``hcqr``'s and the UI's trace filters find them: ``tags.kind = 'served'``.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from hcqr_dspy.evaluation.rows import answer_record
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.tracking.question_traces import question

DEFAULT_THREADS = 8
DEFAULT_DEADLINE_S = 1500.0
LOCAL_KINDS = ("packaged", "gguf")


def serve_threads(config: dict[str, Any], lm_kind: str) -> int:
    """Threads for one request's questions (see the module docstring)."""
    if lm_kind in LOCAL_KINDS:
        return 1
    value = os.environ.get("HCQR_SERVE_THREADS") or config.get("threads") or DEFAULT_THREADS
    return max(1, int(value))


def request_deadline(config: dict[str, Any], params: dict[str, Any] | None) -> float:
    """Seconds one request may take: the request's ``deadline_s`` param, the model config's, or the default."""
    given = (params or {}).get("deadline_s")
    return float(given if given is not None else config.get("deadline_s") or DEFAULT_DEADLINE_S)


def tracing_wanted() -> bool:
    """Whether served questions are traced: a tracking store is named and ``HCQR_SERVE_TRACES`` is not ``0``."""
    return bool(os.environ.get("MLFLOW_TRACKING_URI")) and os.environ.get("HCQR_SERVE_TRACES", "1") != "0"


def served_model_tags(model_dir: str | None) -> dict[str, str]:
    """``model_id`` of the served model (its ``MLmodel``) and, when a registered version was logged from it,
    ``model_name`` and ``model_version`` (looked up in the tracking store; absent when it cannot be)."""
    if not model_dir:
        return {}
    import mlflow
    from mlflow.models import Model

    try:
        model_id = Model.load(model_dir).model_id
    except Exception:  # MlflowException, OSError: not a model folder (a test's bare config)
        return {}
    if not model_id:
        return {}
    tags = {"model_id": model_id}
    try:
        # the registry filters versions by run, not by source: the versions of the run that logged the model
        run_id = mlflow.get_logged_model(model_id).source_run_id
        found = mlflow.MlflowClient().search_model_versions(f"run_id = '{run_id}'")
        versions = [v for v in found if v.source == f"models:/{model_id}"]
    except Exception:  # MlflowException: a store without this model or without a registry
        versions = []
    if versions:
        tags.update(model_name=versions[0].name, model_version=str(versions[0].version))
    return tags


def start_tracing() -> None:
    """Record DSPy spans in experiment ``hcqr-dspy`` of the process's tracking store."""
    import mlflow
    import mlflow.dspy

    from hcqr_dspy.tracking.experiment_page import EXPERIMENT

    mlflow.set_experiment(EXPERIMENT)
    mlflow.dspy.autolog(log_traces=True, silent=True)


def answer_all(
    program: Any,
    lm: Any,
    method: str,
    checked: list[tuple[str, Any, tuple[str, str] | None]],
    threads: int,
    deadline_s: float,
    trace_tags: dict[str, str] | None,
) -> list[dict[str, Any]]:
    """Answer the checked records of one request (``(qid, example or None, fault or None)``, from
    :func:`hcqr_dspy.tracking.served_requests.check_record`) in parallel, in request order.

    Returns:
        One record per request record: answered, rejected (``rejected`` says why) or not started before the
        deadline (``error`` says so).
    """
    until = time.monotonic() + deadline_s

    def one(item: tuple[str, Any, tuple[str, str] | None]) -> dict[str, Any]:
        qid, ex, fault = item
        if ex is None:
            return {**answer_record(qid, {}, None, False, None, None, None, None), "rejected": ": ".join(fault)}
        if time.monotonic() > until:
            error = f"deadline: not started within the request's {deadline_s:g} s (deadline_s)"
            return {**answer_record(qid, ex.options, None, False, error, None, None, None), "rejected": None}
        if trace_tags is None:
            return answered(qid, ex)
        with question(method, ex.question, ex.options, {**trace_tags, "qid": qid}) as trace:
            record = answered(qid, ex)
            trace.root.set_outputs({"answer": record["answer"], **record})  # answer first: the Traces tab's response
        return record

    def answered(qid: str, ex: Any) -> dict[str, Any]:
        with dspy.context(lm=lm, adapter=HCQRAdapter()):
            pred = program(question=ex.question, options=ex.options)
        record = answer_record(
            qid,
            ex.options,
            pred.get("answer"),
            bool(pred.get("valid")),
            pred.get("error"),
            pred.get("hypothesis"),
            pred.get("queries"),
            pred.get("passages"),
        )
        return {**record, "rejected": None}

    if threads <= 1 or len(checked) <= 1:
        return [one(item) for item in checked]
    with ThreadPoolExecutor(max_workers=min(threads, len(checked)), thread_name_prefix="hcqr-serve") as pool:
        return list(pool.map(one, checked))
