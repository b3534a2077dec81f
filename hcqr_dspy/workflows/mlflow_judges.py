"""``hcqr judge RUN --mlflow-scorers``: MLflow's built-in retrieval judges on a tracked run's question traces.

:func:`judge_with_mlflow_scorers` checks the run before any call (tracked, its MLflow run and question traces in
the store), turns the judge LM (``--judge-lm``, else the run's own LM at the run's own endpoint) into MLflow's model
URI (:func:`hcqr_dspy.tracking.judge_server.served_endpoint`: a remote LM at its endpoint, a local one served by
llama-cpp-python's server on 127.0.0.1 for the judging only), asks it one probe question through MLflow, then,
under the folder's writer lock, runs ``RetrievalRelevance`` and/or ``RetrievalGroundedness`` on each question's
trace (:func:`~hcqr_dspy.tracking.retrieval_judges.judge_trace`: their feedback logged on the trace, beside DUR's;
a trace judged already by the same judge LM is skipped), and records the per-question values read back from the
traces in the run folder's ``mlflow_judges.json`` (:mod:`hcqr_dspy.judge.mlflow_record`) and their means in its
MLflow run (metrics ``retrieval_relevance/mean``, ``retrieval_groundedness/mean``; tags ``mlflow_judges.judge_lm``,
``mlflow_judges.model`` and, for a local judge LM, ``mlflow_judges.model_file`` and ``mlflow_judges.model_sha256``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.mlflow_record import MLFLOW_JUDGES_FILE, SCORERS, means
from hcqr_dspy.judge.run_judging import judgeable, judged_sample
from hcqr_dspy.lm import parse_lm_spec
from hcqr_dspy.lm.llama_cpp import DEFAULT_N_CTX
from hcqr_dspy.tracking import retrieval_judges as rj
from hcqr_dspy.tracking.judge_server import served_endpoint
from hcqr_dspy.tracking.store import existing_store, open_store
from hcqr_dspy.tracking.trace_repair import rebuilt_traces

log = logging.getLogger(__name__)


def _tracked_traces(folder: RunFolder, mlflow_dir: str | Path | None, qids: Sequence[str] | None) -> dict[str, str]:
    """``{qid: trace id}`` of the run's questions (``qids``, else all) whose trace is in the store.

    Raises:
        RunError: the run was not tracked, its MLflow run is not in the store, or none of its traces is.
        HCQRError: no store at ``mlflow_dir`` (nothing is created), or one that cannot be used.
    """
    import mlflow

    run_id = folder.mlflow_run_id
    if not run_id:
        raise RunError(
            f"{folder.path}: the run was not tracked in MLflow (hcqr eval --no-mlflow): MLflow's judges read its "
            "question traces; evaluate it with tracking on"
        )
    where = existing_store(mlflow_dir, "track the run with `hcqr eval`")
    open_store(mlflow_dir)
    try:
        experiment_id = mlflow.get_run(run_id).info.experiment_id
    except Exception:  # MlflowException: no such run in this store
        raise RunError(
            f"{folder.path}: its MLflow run {run_id} is not in the store {where}; give --mlflow-dir the store it "
            "was tracked in"
        ) from None
    found = mlflow.search_traces(locations=[experiment_id], run_id=run_id, include_spans=False, return_type="list")
    stored = {t.info.trace_id for t in found}
    rebuilt = rebuilt_traces(run_id)
    wanted = set(qids) if qids is not None else None
    ids = {
        r["qid"]: tid
        for r in folder.rows()
        if (wanted is None or r["qid"] in wanted) and (tid := rebuilt.get(r["qid"]) or r.get("trace_id")) in stored
    }
    if not ids:
        raise RunError(
            f"{folder.path}: none of its question traces is in the store {where} (the run was evaluated with "
            "--traces off, or its traces were deleted): MLflow's judges have nothing to read"
        )
    return ids


def judge_with_mlflow_scorers(
    run: str | Path | RunFolder,
    scorers: Sequence[str] = tuple(SCORERS.values()),
    judge_lm: str | None = None,
    api_base: str | None = None,
    api_key_env: str | None = None,
    mlflow_dir: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
    ids: Sequence[str] | None = None,
    n_ctx: int = DEFAULT_N_CTX,
) -> dict[str, Any]:
    """Judge a tracked run's question traces with MLflow's retrieval judges and record the result.

    Args:
        run: The run folder (tracked in MLflow, its traces with passage text: ``--traces full``).
        scorers: MLflow scorer names (:data:`hcqr_dspy.judge.mlflow_record.SCORERS` values).
        judge_lm, api_base, api_key_env: The judge LM; default the run's own LM at its own endpoint and key variable.
        mlflow_dir: The MLflow store the run was tracked in.
        limit, seed, ids: Judge only these questions (:func:`~hcqr_dspy.judge.run_judging.judged_sample`); default all.
        n_ctx: The context window of a local judge LM's server.

    Returns:
        ``{"mlflow_judges": {scorer: {"mean", "se", "n"}}, "judge_lm", "model", "judge_model", "counts"}``
        (``judge_model``: a local judge LM's file, SHA-256 and engine settings, else ``None``): ``counts`` of this
        judging, per outcome of :func:`~hcqr_dspy.tracking.retrieval_judges.judge_trace` (``judged``, ``already``,
        ``no_passages``, ``failed``) summed over traces and scorers, with ``first_failure`` when any failed.

    Raises:
        RunError: no retrieved context, not tracked, its run or traces not in the store. LMSpecError: a judge LM
            MLflow cannot call (a key variable unset, a local model whose server does not start, the probe failed:
            nothing written).
        LMUnavailableError: the judge LM stopped answering mid-run (what was judged is on the traces; the same
            command resumes).
    """
    import mlflow

    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    if not judgeable(folder):
        raise RunError(f"{folder.path}: no question has a retrieved context (method {folder.method}): nothing to judge")
    sample = judged_sample(folder, limit, seed, ids)
    traces = _tracked_traces(folder, mlflow_dir, sample["ids"] if sample else None)
    spec, recorded = judge_lm or folder.lm_spec, folder.config.get("lm") or {}
    if not spec:
        raise RunError(f"{folder.path}: the run records no LM; give --judge-lm")
    if judge_lm is None:  # the run's own LM, at the run's own endpoint with its key variable
        api_base, api_key_env = api_base or recorded.get("api_base"), api_key_env or recorded.get("api_key_env")
    cfg = parse_lm_spec(spec, api_base=api_base, api_key_env=api_key_env, option="--judge-lm")
    counts = {"judged": 0, "already": 0, "no_passages": 0, "failed": 0}
    first_failure = None
    with served_endpoint(cfg, n_ctx) as endpoint, rj.endpoint_env(endpoint):
        rj.probe(endpoint)  # an endpoint that cannot be used stops here: nothing is written
        log.info(
            f"hcqr judge: {folder.path}: MLflow's {', '.join(scorers)} with judge LM {spec} ({endpoint.model_uri}) "
            f"at {endpoint.where()}, {len(traces)} question traces"
        )
        with WriterLock(folder.path, "judge"):
            for qid, trace_id in traces.items():
                outcome = rj.judge_trace(mlflow.get_trace(trace_id), scorers, endpoint)
                for result in outcome.values():
                    counts[result.partition(":")[0]] += 1
                    if result.startswith("failed") and first_failure is None:
                        first_failure = f"{qid}: {result.partition(': ')[2]}"
            summary = _record(folder, traces, endpoint)
    if first_failure:
        counts["first_failure"] = first_failure
        log.warning(
            f"hcqr judge: {folder.path}: {counts['failed']} MLflow judge call(s) failed (first: {first_failure}); "
            "their traces hold an error assessment and the same command judges them again"
        )
    if counts["no_passages"]:
        log.warning(
            f"hcqr judge: note: {counts['no_passages']} trace(s) hold no RETRIEVER span with passage text (rebuilt "
            "from the run folder, or recorded with --traces light): not judged"
        )
    return {**summary, "counts": counts}


def _record(folder: RunFolder, traces: dict[str, str], endpoint: rj.JudgeEndpoint) -> dict[str, Any]:
    """Read the values back from the traces, write ``mlflow_judges.json`` and log the means on the MLflow run."""
    import mlflow

    questions: dict[str, dict[str, Any]] = dict((folder.read_json(MLFLOW_JUDGES_FILE) or {}).get("questions") or {})
    for qid, trace_id in traces.items():
        values = rj.question_values(mlflow.get_trace(trace_id))
        if values:
            questions[qid] = values
        else:  # its assessments failed or were removed: no value
            questions.pop(qid, None)
    judges: dict[str, set[str]] = {}
    for values in questions.values():
        for name, spec in (values.get("judge_lm") or {}).items():
            judges.setdefault(name, set()).add(spec)
    record = {
        "questions": questions,
        "judges": {k: sorted(v) for k, v in judges.items()},
        "model": endpoint.model_uri,
        "api_base": endpoint.api_base,
        "judge_model": endpoint.model,
    }
    folder.write_json(MLFLOW_JUDGES_FILE, record)
    summary = means(record)
    with mlflow.start_run(run_id=folder.mlflow_run_id, nested=mlflow.active_run() is not None):
        mlflow.log_metrics({f"{k}/mean": v["mean"] for k, v in summary.items()})
        tags = {"mlflow_judges.judge_lm": endpoint.spec, "mlflow_judges.model": endpoint.model_uri}
        if endpoint.model is not None:
            tags["mlflow_judges.model_file"] = endpoint.model["model_file"]
            tags["mlflow_judges.model_sha256"] = endpoint.model["model_sha256"]
        mlflow.set_tags(tags)
    return {
        "mlflow_judges": summary,
        "judge_lm": endpoint.spec,
        "model": endpoint.model_uri,
        "judge_model": endpoint.model,
    }
