"""``hcqr judge``: judge one run's contexts (with controls) and record the result in its MLflow run.

The one judging path of ``hcqr judge`` and of experiments (:func:`judge_and_track`): the judge LM (the run's own
at the run's own endpoint unless given), the run's index checked against its corpus, the folder's writer lock,
the judging itself (:func:`hcqr_dspy.judge.run_judging.judge_run`), with a labelled set the same judge's agreement
with hand labels (:func:`hcqr_dspy.judge.agreement.measure_agreement`, written to ``judge_agreement.json``),
then, for a tracked run, the DUR metrics and the judge's settings on its MLflow run, one ``dur judge`` trace per
question, and each label logged on the question's trace (:func:`log_dur_feedback`). :func:`judge_labelled`
measures a judge on a labelled set alone, without a run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.agreement import AGREEMENT_FILE, agreement_summary, measure_agreement
from hcqr_dspy.judge.control_upgrade import read_added
from hcqr_dspy.judge.dur_metrics import CONTROLS
from hcqr_dspy.judge.run_judging import check_judge_index, judge_run, judgeable
from hcqr_dspy.lm import DEFAULT_N_CTX, build_lm, check_lm, describe_endpoint
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.retrieval.retriever_base import Retriever
from hcqr_dspy.tracking.mlflow_runs import dspy_tracing, flatten, log_metrics, log_run_folder
from hcqr_dspy.tracking.model_links import judged_dataset, log_model_metrics
from hcqr_dspy.tracking.question_traces import QuestionTraces
from hcqr_dspy.tracking.store import existing_mlflow_run_id
from hcqr_dspy.tracking.trace_repair import rebuilt_traces

log = logging.getLogger(__name__)

JUDGE_MAX_TOKENS = 512


def judge_and_track(
    run: str | Path | RunFolder,
    judge_lm: str | None = None,
    lm: Any = None,
    mode: Literal["context", "passage"] = "context",
    reasoning: bool = True,
    index: str | Path | None = None,
    retriever: Retriever | None = None,
    mlflow_dir: str | Path | None = None,
    track: bool = True,
    num_threads: int = 1,
    progress: bool = True,
    max_tokens: int = JUDGE_MAX_TOKENS,
    n_ctx: int | None = None,
    api_base: str | None = None,
    api_key_env: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    ids: Sequence[str] | None = None,
    labelled_set: str | Path | None = None,
) -> dict[str, Any] | None:
    """Judge one run and record the result in its MLflow run: the one judging path of
    ``hcqr judge`` and of experiments.

    Args:
        run: The run folder.
        judge_lm: The judge's LM spec; default the run's own LM.
        lm: A ready judge ``dspy.LM`` (tests, notebooks, experiments sharing one); ``judge_lm``
            is still what is recorded.
        mode, reasoning: See :class:`~hcqr_dspy.judge.dur_judge.DURJudge`.
        index: The index to resolve passages; default the run's own.
        retriever: A loaded retriever instead of ``index``.
        mlflow_dir: MLflow store; the run's MLflow run (if any) gets the DUR metrics, the
            judge's settings as tags (``dur.judge_lm`` ...) and the updated record files; the judge's calls are traced
            (one ``dur judge`` trace per question, tagged ``kind=dur_judge``, ``qid`` and the judged run),
            and each label is logged on the question's trace (:func:`log_dur_feedback`).
        track: Log to MLflow.
        num_threads, progress: See :func:`~hcqr_dspy.judge.run_judging.judge_run`.
        max_tokens, n_ctx, api_base, api_key_env: Settings of the judge LM when it is built here.
        limit, seed, ids: Judge only these questions (:func:`~hcqr_dspy.judge.run_judging.judged_sample`); default all.
        labelled_set: Also judge this labelled set (:mod:`hcqr_dspy.judge.agreement`) with the same judge and
            write its agreement to the run folder's ``judge_agreement.json`` (replacing an earlier one), where
            ``hcqr compare`` reads it; ``None``: not measured.

    Returns:
        The DUR metrics (with ``judge_agreement``: :func:`~hcqr_dspy.judge.agreement.agreement_summary`, when
        a labelled set was judged), or ``None`` for a run without retrieval (nothing to judge; said on stderr).

    Raises:
        HCQRError: not a run folder, an unusable judge LM or index, or any error of
            :func:`~hcqr_dspy.judge.run_judging.judge_run`.
    """
    folder = run if isinstance(run, RunFolder) else RunFolder.open(run)
    if not judgeable(folder):
        log.warning(f"{folder.path}: no question has a retrieved context (method {folder.method}): nothing to judge")
        return None
    with WriterLock(folder.path, "judge"):  # one writer: a second judge (or an eval) of the folder is refused
        folder.judgments(), read_added(folder)  # malformed records are refused before the LM is built
        if retriever is None:
            retriever = load_index(check_judge_index(folder, index))
        lm, spec = _judge_lm(folder, judge_lm, lm, max_tokens, n_ctx, api_base, api_key_env)
        return _judge_and_track(
            folder,
            retriever,
            lm,
            spec,
            mode,
            reasoning,
            mlflow_dir,
            track,
            num_threads,
            progress,
            limit,
            seed,
            ids,
            labelled_set,
        )


def _judge_lm(
    folder: RunFolder,
    judge_lm: str | None,
    lm: Any,
    max_tokens: int,
    n_ctx: int | None,
    api_base: str | None,
    api_key_env: str | None,
) -> tuple[Any, str | None]:
    """The judge's ``dspy.LM`` and spec: ``judge_lm``, or the run's own LM at the run's own endpoint (its
    ``api_base`` and key variable, unless given), never a provider's default endpoint in its place. The endpoint
    is said on stderr before the LM is asked anything.

    Raises:
        RunError: no judge LM given and the run records none. LMSpecError: see :func:`hcqr_dspy.lm.build_lm`,
            :func:`hcqr_dspy.lm.check_lm`.
    """
    spec = judge_lm or folder.lm_spec
    if judge_lm is None:  # the run's own LM, at the run's own endpoint with its key variable
        recorded = folder.config.get("lm") or {}
        api_base = api_base or recorded.get("api_base")
        api_key_env = api_key_env or recorded.get("api_key_env")
    if lm is None:
        if not spec:
            raise RunError(f"{folder.path}: the run records no LM; give --judge-lm")
        lm = build_lm(
            spec, max_tokens=max_tokens, n_ctx=n_ctx or DEFAULT_N_CTX, api_base=api_base, api_key_env=api_key_env
        )
        log.info(f"hcqr judge: {folder.path}: judge LM {spec} at {describe_endpoint(lm.hcqr_config)}")
        check_lm(lm)
    return lm, spec


def _judge_and_track(
    folder: RunFolder,
    retriever: Retriever,
    lm: Any,
    spec: str | None,
    mode: str,
    reasoning: bool,
    mlflow_dir: str | Path | None,
    track: bool,
    num_threads: int,
    progress: bool,
    limit: int | None,
    seed: int,
    ids: Sequence[str] | None,
    labelled_set: str | Path | None = None,
) -> dict[str, Any]:
    """The part of :func:`judge_and_track` that writes, under the folder's writer lock."""
    run_id = folder.mlflow_run_id
    tracked = bool(track and run_id and existing_mlflow_run_id(run_id, mlflow_dir))

    def judge(traces: QuestionTraces | None = None) -> dict[str, Any]:
        return judge_run(
            folder,
            retriever,
            lm,
            mode=mode,
            reasoning=reasoning,
            judge_lm=spec,
            num_threads=num_threads,
            progress=progress,
            traces=traces,
            limit=limit,
            seed=seed,
            ids=ids,
        )

    def agreement(metrics: dict[str, Any]) -> dict[str, Any]:
        """The same judge on the labelled set, untraced (its calls belong to no question of the run)."""
        if labelled_set is not None:
            record = measure_agreement(lm, metrics["judge"]["judge_lm"], mode, reasoning, labelled_set, progress)
            folder.write_json(AGREEMENT_FILE, record)
            metrics["judge_agreement"] = agreement_summary(record)
        return metrics

    if not tracked:
        return agreement(judge())
    import mlflow

    trace_tags = {
        "kind": "dur_judge",
        "judged_run_id": run_id,
        "method": folder.method,
        "dataset": folder.dataset_name,
        "run_folder": str(folder.path.resolve()),
        "judge_lm": spec,
    }
    with dspy_tracing():
        metrics = judge(QuestionTraces(trace_tags))
    metrics = agreement(metrics)
    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        log_metrics(metrics)
        if agreed := metrics.get("judge_agreement"):
            log_metrics({f"dur_judge_agreement_{k}": agreed[k] for k in ("accuracy", "kappa") if agreed[k] is not None})
        # tags, not params: MLflow params never change, and a run may be judged again with other settings
        mlflow.set_tags(flatten({"dur": metrics["judge"]}))
        if metrics.get("sample"):  # a metric, not a param: a later judging may widen the sample
            mlflow.log_metric("dur_sample_n", metrics["sample"]["n"])
        if model_id := mlflow.get_run(run_id).data.tags.get("model_id"):  # the evaluated model's page shows DUR
            log_model_metrics(model_id, {k: metrics.get(k) for k in ("dur", "dur_n")}, judged_dataset(run_id))
        log_run_folder(folder)
        log_dur_feedback(folder)
    return metrics


# Assessment metadata that marks a DUR label logged by `hcqr judge` (a rerun does not log it twice).
JUDGE_FEEDBACK_SOURCE = "hcqr judge"


def log_dur_feedback(folder: RunFolder) -> int:
    """Log each DUR judgment of a run on its question's MLflow trace, once; labels an earlier judging
    with other settings left there are replaced.

    Feedback ``dur`` (the label, the judge's reasoning as rationale; an error for an invalid judgment),
    ``dur_positive_control``, ``dur_negative_control`` and ``dur_on_topic_control``, source ``LLM_JUDGE``
    (the judge LM), with metadata naming the judge's settings and its own trace (``judge_trace_id``). Questions
    without a trace in the current store, and traces that already hold a label from ``hcqr judge``, are skipped.

    Returns:
        How many questions got their labels now.
    """
    import mlflow
    from mlflow.entities import AssessmentError, AssessmentSource

    mlflow.flush_trace_async_logging()
    rebuilt = rebuilt_traces(folder.mlflow_run_id)  # a row whose own trace was lost: the one rebuilt for it
    trace_ids = {r["qid"]: rebuilt.get(r["qid"]) or r.get("trace_id") for r in folder.rows()}
    logged = 0
    for j in folder.judgments():
        trace_id = trace_ids.get(j["qid"])
        trace = mlflow.get_trace(trace_id, silent=True) if trace_id else None
        if trace is None:
            continue
        source = AssessmentSource(source_type="LLM_JUDGE", source_id=str(j.get("judge_lm")))
        meta = {
            "source": JUDGE_FEEDBACK_SOURCE,
            "mode": str(j.get("mode")),
            "reasoning": str(j.get("reasoning")),
            **({"judge_trace_id": j["judge_trace_id"]} if j.get("judge_trace_id") else {}),
        }
        ours = [
            a
            for a in trace.info.assessments
            if a.name in ("dur", *(f"dur_{side}_control" for side in CONTROLS))
            and (a.metadata or {}).get("source") == JUDGE_FEEDBACK_SOURCE
        ]
        if any(a.name == "dur" and a.metadata == meta and a.source.source_id == source.source_id for a in ours):
            continue  # this judgment is already on the trace
        for old in ours:  # labels of an earlier judging (other settings, or judged again): replaced
            mlflow.delete_assessment(trace_id=trace_id, assessment_id=old.assessment_id)
        if j["valid"]:
            mlflow.log_feedback(
                trace_id=trace_id,
                name="dur",
                value=j["label"],
                rationale=j.get("rationale"),
                source=source,
                metadata=meta,
            )
        else:
            mlflow.log_feedback(
                trace_id=trace_id,
                name="dur",
                source=source,
                metadata=meta,
                error=AssessmentError(error_code="INVALID_JUDGMENT", error_message=str(j.get("error"))),
            )
        for side in CONTROLS:
            if j.get(f"{side}_label"):
                mlflow.log_feedback(
                    trace_id=trace_id,
                    name=f"dur_{side}_control",
                    value=j[f"{side}_label"],
                    source=source,
                    metadata=meta,
                )
        logged += 1
    return logged


def judge_labelled(
    judge_lm: str,
    labelled_set: str | Path | None = None,
    lm: Any = None,
    mode: Literal["context", "passage"] = "context",
    reasoning: bool = True,
    progress: bool = True,
    max_tokens: int = JUDGE_MAX_TOKENS,
    n_ctx: int | None = None,
    api_base: str | None = None,
    api_key_env: str | None = None,
) -> dict[str, Any]:
    """Measure a judge on a labelled set alone (``hcqr judge --labelled-set --judge-lm SPEC`` without runs).

    Args:
        judge_lm: The judge's LM spec (recorded; built here unless ``lm`` is given).
        labelled_set: The set; default the shipped one (:func:`~hcqr_dspy.judge.agreement.default_labelled_set`).
        lm: A ready judge ``dspy.LM``.
        mode, reasoning: See :class:`~hcqr_dspy.judge.dur_judge.DURJudge`.
        progress: Progress bar.
        max_tokens, n_ctx, api_base, api_key_env: Settings of the judge LM when it is built here.

    Returns:
        :func:`~hcqr_dspy.judge.agreement.agreement_record` (written nowhere; the caller decides).

    Raises:
        DataError: an unreadable labelled set. LMSpecError, LMUnavailableError: an unusable judge LM.
    """
    if lm is None:
        lm = build_lm(
            judge_lm, max_tokens=max_tokens, n_ctx=n_ctx or DEFAULT_N_CTX, api_base=api_base, api_key_env=api_key_env
        )
        log.info(f"hcqr judge: judge LM {judge_lm} at {describe_endpoint(lm.hcqr_config)}")
        check_lm(lm)
    return measure_agreement(lm, judge_lm, mode, reasoning, labelled_set, progress)
