"""MLflow scorers of a question's trace, and scoring an evaluation's traces with them.

A tracked evaluation records one trace per question (:mod:`hcqr_dspy.tracking.question_traces`);
when every question of the run folder is answered, :func:`score_rows` scores those
traces inside the evaluation's MLflow run, a bounded batch at a time, as ``mlflow.genai.evaluate`` scores and
logs them. Each scorer's value is feedback on the
question's trace, the scorers' means are MLflow run metrics (``correct/mean`` ...), and that
MLflow run is an evaluation run (it is listed under *Evaluation runs*, and its per-question results appear
in MLflow's evaluation view) with the run folder's questions (the MLflow
evaluation dataset made by :func:`hcqr_dspy.tracking.datasets.questions_dataset`) as
its input.

Scorers (``mlflow.genai.scorers.scorer``, source ``CODE``), read from the
trace's root span outputs (:func:`hcqr_dspy.tracking.question_traces.root_outputs`) and its
``answer`` expectation (the gold letter):

* ``correct`` — the valid answer equals the gold letter (an invalid answer is
  wrong: :func:`hcqr_dspy.evaluation.metrics.is_correct`);
* ``valid`` — the reply was one of the option letters (the rationale keeps the
  error of an invalid one);
* ``hypothesis`` — for HCQR runs, how the answer relates to the working
  hypothesis: ``kept_right``, ``kept_wrong``, ``fixed``, ``broke``,
  ``changed_wrong_to_wrong`` or ``invalid_answer``
  (:func:`hcqr_dspy.evaluation.metrics.hypothesis_outcome`);
* ``gold_prob`` — the answer step's probability of the gold letter, its letter distribution as rationale
  (only for an LM with log-probabilities: :mod:`hcqr_dspy.programs.answer_slot_probs`).

The DUR judge is a scorer too (:func:`dur_scorer`): it labels the context the
trace's ``answer`` span received. ``hcqr judge`` labels run folders through
:func:`hcqr_dspy.workflows.judge.judge_and_track` (with its negative controls, which need
the other questions of the run folder) and logs each label on the question's trace.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import dspy
import mlflow
from mlflow.entities import AssessmentSource, Feedback
from mlflow.genai.scorers import Scorer, scorer
from mlflow.tracking import MlflowClient

from hcqr_dspy.evaluation.metrics import hypothesis_outcome, is_correct
from hcqr_dspy.judge.dur_judge import DURJudge
from hcqr_dspy.lm.adapter import HCQRAdapter

log = logging.getLogger(__name__)

CODE = AssessmentSource(source_type="CODE", source_id="hcqr-dspy")
SCORE_BATCH = 1000
"""Traces read and scored at once (:func:`score_rows`): the traces and rows it holds in memory."""
LINK_BATCH = 100
"""Traces linked to the run per request (MLflow refuses more)."""


def _gold(expectations: dict[str, Any] | None) -> str | None:
    return (expectations or {}).get("answer")


@scorer(name="correct", description="The valid answer letter equals the gold letter (invalid = wrong).")
def correct(outputs: dict[str, Any], expectations: dict[str, Any]) -> Feedback | None:
    gold = _gold(expectations)
    if gold is None:
        return None  # an unlabelled question: nothing to score
    answer = outputs.get("answer")
    value = is_correct(answer, bool(outputs.get("valid")), gold)
    return Feedback(
        name="correct", value=value, source=CODE, rationale=f"answered {answer or 'nothing valid'}, gold {gold}"
    )


@scorer(name="valid", description="The reply was one of the question's option letters.")
def valid(outputs: dict[str, Any]) -> Feedback:
    ok = bool(outputs.get("valid"))
    return Feedback(name="valid", value=ok, source=CODE, rationale=None if ok else outputs.get("error"))


@scorer(
    name="hypothesis",
    description="HCQR: how the final answer relates to the working hypothesis (kept_right, "
    "kept_wrong, fixed, broke, changed_wrong_to_wrong, invalid_answer).",
)
def hypothesis(outputs: dict[str, Any], expectations: dict[str, Any]) -> Feedback | None:
    h = (outputs.get("hypothesis") or {}).get("working_hypothesis")
    outcome = hypothesis_outcome(h, outputs.get("answer"), bool(outputs.get("valid")), _gold(expectations))
    if outcome is None:
        return None
    return Feedback(
        name="hypothesis",
        value=outcome,
        source=CODE,
        rationale=f"hypothesis {h}, answer {outputs.get('answer') or 'invalid'}, gold {_gold(expectations)}",
    )


@scorer(
    name="gold_prob",
    description="The answer step's probability of the gold option letter (its letter distribution in the "
    "rationale); only where the LM gave log-probabilities.",
)
def gold_prob(outputs: dict[str, Any], expectations: dict[str, Any]) -> Feedback | None:
    probs, gold = outputs.get("option_probs"), _gold(expectations)
    if not probs or gold is None:
        return None  # no letter distribution (an LM without log-probabilities) or no gold answer
    shown = ", ".join(f"p({letter})={p:.3f}" for letter, p in sorted(probs.items()))
    return Feedback(name="gold_prob", value=float(probs.get(gold, 0.0)), source=CODE, rationale=f"gold {gold}; {shown}")


def evaluation_scorers(labelled: bool = True) -> list[Scorer]:
    """The scorers of a run: ``correct``, ``valid``, ``hypothesis`` and ``gold_prob``; ``valid`` alone without gold
    answers."""
    return [correct, valid, hypothesis, gold_prob] if labelled else [valid]


def answer_context(trace: Any) -> str | None:
    """The context the trace's answer step received (its ``answer`` span's ``context`` input), or ``None``."""
    spans = trace.search_spans(name="answer") if trace is not None else []
    for span in spans:
        context = (span.inputs or {}).get("context") if isinstance(span.inputs, dict) else None
        if context:
            return context
    return None


def dur_scorer(lm: Any, judge_lm: str | None = None, reasoning: bool = True) -> Scorer:
    """The DUR judge as an MLflow scorer (``dur``).

    It labels the context of a question's trace (:func:`answer_context`) against the gold answer
    (the trace's ``answer`` expectation) with :class:`hcqr_dspy.judge.dur_judge.DURJudge` in context mode, and
    also its positive control. The negative control needs another question's context, so it is only
    in ``hcqr judge`` (:func:`hcqr_dspy.judge.run_judging.judge_run`).

    Args:
        lm: The judge's ``dspy.LM``.
        judge_lm: The judge's name in the feedback's source (default: the LM's model name).
        reasoning: The judge reasons before it labels (``dspy.ChainOfThought``).

    Returns:
        A scorer giving the feedback ``dur`` (``ENTAILED``, ``USEFUL`` or ``NOT_USEFUL``, the judge's
        reasoning as rationale; an error feedback for an invalid judge reply) and
        ``dur_positive_control``; nothing for a question without gold answer or context.

    Example:
        >>> traces = mlflow.search_traces(run_id=run_id, return_type="list")
        >>> mlflow.genai.evaluate(data=traces, scorers=[dur_scorer(build_lm("local"))])
    """
    judge = DURJudge("context", reasoning)
    source = AssessmentSource(source_type="LLM_JUDGE", source_id=judge_lm or getattr(lm, "model", str(lm)))

    @scorer(
        name="dur",
        description="Decision-Useful Rate judge: ENTAILED / USEFUL / NOT_USEFUL for the context "
        "the answer step saw, given the gold answer (HCQR paper).",
    )
    def dur(inputs: dict[str, Any], expectations: dict[str, Any], trace: Any) -> list[Feedback] | None:
        gold = _gold(expectations)
        context = answer_context(trace)
        if gold is None or not context:
            return None
        with dspy.context(lm=lm, adapter=HCQRAdapter()):
            pred = judge(question=inputs["question"], options=inputs["options"], answer=gold, documents=[context])
        if pred.label is None:
            from mlflow.entities.assessment_error import AssessmentError

            label = Feedback(
                name="dur",
                source=source,
                error=AssessmentError(error_code="INVALID_JUDGMENT", error_message=str(pred.error)),
            )
        else:
            label = Feedback(name="dur", value=pred.label, rationale=pred.rationale, source=source)
        return [label, Feedback(name="dur_positive_control", value=pred.positive_label, source=source)]

    return dur


def score_rows(
    rows: Iterable[dict[str, Any]],
    dataset: Any = None,
    labelled: bool = True,
    scorers: Sequence[Scorer] | None = None,
    digest: str | None = None,
) -> dict[str, float]:
    """Score the traces of a run's rows inside the active MLflow run, holding :data:`SCORE_BATCH` traces and rows at
    once, in time linear in their number.

    ``rows`` are read once, and their traces are read and scored :data:`SCORE_BATCH` at a time by :func:`_log_scores`
    (what ``mlflow.genai.evaluate`` does per trace: the same scorers, feedback names, values, sources, root span and
    ``mlflow.assessment.sourceRunId``); each batch's traces are linked to the run. Before the first batch the run is
    made an evaluation run as ``mlflow.genai.evaluate`` makes it (:func:`_mark_evaluation_run`: the tag
    ``mlflow.runType``, ``dataset`` as its input, the scorers' lineage tags). ``mlflow.genai.evaluate`` itself is
    not called: after scoring it lists every trace of the run (``mlflow.search_traces`` over the run), a few KB
    each, which a long run cannot hold. The scorers' means over every scored trace (each name's mean over the
    traces that have a numeric, boolean or yes/no value for it) are logged last as ``<name>/mean``, with the
    evaluation's dataset.

    Args:
        rows: The run's rows (any iterable, read once: a generator over ``predictions.jsonl``); those with a
            ``trace_id`` whose trace is in the store are scored.
        dataset: The run's MLflow evaluation dataset (:func:`hcqr_dspy.tracking.datasets.questions_dataset`):
            recorded as the evaluation's dataset instead of an anonymous table of the first batch's traces.
        labelled: The questions have gold answers (else only ``valid`` is scored).
        digest: The digest the run logged its dataset under (:func:`hcqr_dspy.tracking.datasets.log_question_set`),
            so that the evaluation records the same input.
        scorers: Scorers to use instead of :func:`evaluation_scorers`.

    Returns:
        The scorers' means (``correct/mean`` ...) over every scored trace; ``{}`` when no trace was found.
    """
    mlflow.flush_trace_async_logging()  # traces are written in the background: every one must be in the store now
    ids = (r["trace_id"] for r in rows if r.get("trace_id"))
    chosen = list(scorers or evaluation_scorers(labelled))
    run_id = mlflow.active_run().info.run_id
    sums: dict[str, list[float]] = {}  # name -> [sum of values, count]
    scored = listed = 0
    evaluated = None  # the evaluation's dataset, once the run is marked
    while batch_ids := list(itertools.islice(ids, SCORE_BATCH)):
        listed += len(batch_ids)
        found = [t for t in (mlflow.get_trace(i, silent=True) for i in batch_ids) if t]
        if not found:
            continue
        if not scored:
            evaluated = _mark_evaluation_run(found, chosen, run_id, dataset, digest)
        for name, vs in _log_scores(found, chosen, run_id).items():
            total = sums.setdefault(name, [0, 0])
            for v in vs:
                total[0] += v
            total[1] += len(vs)
        for start in range(0, len(found), LINK_BATCH):  # as mlflow.genai.evaluate links them
            MlflowClient().link_traces_to_run([t.info.trace_id for t in found[start : start + LINK_BATCH]], run_id)
        scored += len(found)
        del found
    if scored < listed:
        log.warning(
            f"hcqr: note: {listed - scored} of {listed} question traces are not in this MLflow store; "
            "they are not scored"
        )
    if not scored:
        return {}
    metrics = {f"{name}/mean": total / count for name, (total, count) in sums.items() if count}
    mlflow.log_metrics(metrics, dataset=evaluated)
    log.info(f"scored {scored} question traces: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(metrics.items())))
    return metrics


def _mark_evaluation_run(traces: Sequence[Any], scorers: Sequence[Scorer], run_id: str, dataset: Any, digest: Any):
    """Make ``run_id`` an evaluation run of ``scorers`` as ``mlflow.genai.evaluate`` does before it scores: its
    dataset as the run's input (``dataset``'s own identity, its records not loaded, ``digest`` as its digest;
    without one, an anonymous table of ``traces``), the tag ``mlflow.runType`` (listed under *Evaluation runs*) and
    the scorers' lineage tags.

    Returns:
        The dataset entity the evaluation's metrics are logged with (``None`` for an anonymous table, as MLflow).
    """
    import pandas as pd
    from mlflow.entities import Dataset as DatasetEntity
    from mlflow.genai.evaluation.base import _log_dataset_input
    from mlflow.genai.evaluation.lineage import log_lineage_tags
    from mlflow.genai.evaluation.utils import _convert_to_eval_set
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_TYPE, MLFLOW_RUN_TYPE_GENAI_EVALUATE

    if dataset is not None:
        # the dataset's identity as EvaluationDataset.to_df() attaches it, read without loading its records (a
        # run's whole question set) or hashing a table of the traces
        entity = dataset._to_mlflow_entity()
        if digest:
            entity = DatasetEntity(
                name=entity.name,
                digest=digest,
                source_type=entity.source_type,
                source=entity.source,
                schema=entity.schema,
                profile=entity.profile,
            )
        _log_dataset_input(entity, run_id)
    else:
        entity = None  # an anonymous table of the traces, as mlflow.genai.evaluate logs one
        data = pd.DataFrame({"trace": list(traces)})
        _log_dataset_input(mlflow.data.from_pandas(df=_convert_to_eval_set(data), name="dataset"), run_id)
    if mlflow.get_run(run_id).data.tags.get(MLFLOW_RUN_TYPE) is None:
        MlflowClient().set_tag(run_id, MLFLOW_RUN_TYPE, MLFLOW_RUN_TYPE_GENAI_EVALUATE)
    log_lineage_tags(run_id, list(scorers), None)
    return entity


def _as_number(value: Any) -> float | None:
    """A feedback value as MLflow aggregates it: a number or boolean as a float, ``yes``/``no`` as 1.0/0.0, else
    ``None`` (not aggregated)."""
    if isinstance(value, (bool, int, float)):
        return None if value != value else float(value)  # NaN: a missing value in a table
    if isinstance(value, str) and value.lower() in ("yes", "no"):
        return float(value.lower() == "yes")
    return None


def _log_scores(traces: Sequence[Any], scorers: Sequence[Scorer], run_id: str) -> dict[str, list[float]]:
    """Run ``scorers`` on each trace as ``mlflow.genai.evaluate`` does and log their feedback on it.

    A scorer gets the root span's inputs and outputs, the trace's expectations (name -> value) and the trace; its
    feedback gets the root span, the scorer's metadata and ``run_id`` as its source run. A scorer that raises gives
    an error feedback (``SCORER_ERROR``) and one warning per scorer.

    Returns:
        Each feedback name's aggregable values (:func:`_as_number`) over ``traces``.
    """
    from mlflow.entities.assessment_error import AssessmentError
    from mlflow.genai.evaluation.utils import add_scorer_metadata, standardize_scorer_value
    from mlflow.tracing.constant import AssessmentMetadataKey

    values: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for trace in traces:
        root = next((s for s in trace.data.spans if s.parent_id is None), None)
        expectations = {a.name: a.expectation.value for a in trace.info.assessments or [] if a.expectation}
        for sc in scorers:
            try:
                out = sc.run(
                    inputs=root.inputs if root else None,
                    outputs=root.outputs if root else None,
                    expectations=expectations,
                    trace=trace,
                )
                feedbacks = standardize_scorer_value(sc.name, out)
            except Exception as e:
                failed[sc.name] = failed.get(sc.name, 0) + 1
                source = AssessmentSource(source_type="CODE", source_id=sc.name)
                error = AssessmentError(error_code="SCORER_ERROR", error_message=str(e))
                feedbacks = [Feedback(name=sc.name, source=source, error=error)]
            add_scorer_metadata(sc, feedbacks)
            for fb in feedbacks:
                fb.trace_id = trace.info.trace_id
                fb.metadata = {**(fb.metadata or {}), AssessmentMetadataKey.SOURCE_RUN_ID: run_id}
                if root is not None:
                    fb.span_id = root.span_id
                mlflow.log_assessment(trace_id=fb.trace_id, assessment=fb)
                if (v := _as_number(fb.value)) is not None:
                    values.setdefault(fb.name, []).append(v)
    for name, count in failed.items():
        log.warning(f"hcqr: note: scorer {name} failed on {count} of {len(traces)} question traces")
    return values
