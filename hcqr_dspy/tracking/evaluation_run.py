"""The MLflow run of one evaluation or prediction (``hcqr eval``, ``hcqr predict``, ``hcqr demo``, experiments):
opened or resumed around the answering of its questions, recorded once they are answered.

:func:`evaluation_run` opens the MLflow run (or resumes the one whose id the run folder keeps), named
``method · dataset · LM`` after the program (:func:`mlflow_run_name`) and tagged likewise, with the run id written
to the run folder, the questions logged as its input (an MLflow evaluation dataset), the evaluated model linked and
made MLflow's active model, and the trace level tagged (:data:`TRACES_TAG`). Its :class:`EvaluationRun` gives the
evaluation loop the observer that makes each question a trace (:attr:`EvaluationRun.observer`); once every
question is answered, :meth:`EvaluationRun.finish` logs the run folder's records, rebuilds the traces a stopped
process or a failed store left out, logs the metrics (the headline ones on the model too) and scores the traces
(:func:`hcqr_dspy.tracking.scorers.score_rows`; once per MLflow run, :data:`SCORED_TAG`: a rerun that answers nothing
new does not score again). A failure of the MLflow store is one line (:func:`~hcqr_dspy.tracking.store.store_outages`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hcqr_dspy.evaluation.answering import EvalResult
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.observers import NO_OBSERVER, Observer
from hcqr_dspy.tracking.datasets import log_question_set, question_set_entity, questions_dataset
from hcqr_dspy.tracking.mlflow_runs import describe_mlflow_run, log_metrics, log_run_folder, mlflow_run
from hcqr_dspy.tracking.model_links import evaluated_model, link_run_to_model, log_model_metrics
from hcqr_dspy.tracking.prompt_links import link_traces, model_prompts
from hcqr_dspy.tracking.question_traces import QuestionTraces
from hcqr_dspy.tracking.store import existing_mlflow_run_id, store_outages
from hcqr_dspy.tracking.store_faults import WATCH
from hcqr_dspy.tracking.trace_repair import question_traces

log = logging.getLogger(__name__)

SCORED_TAG = "hcqr.scored"
"""The MLflow run's tag ``true`` once its traces are scored."""
TRACES_TAG = "hcqr.traces"
"""The MLflow run's tag naming the trace level of its last session (:data:`hcqr_dspy.trace_levels.TRACE_LEVELS`)."""


class EvaluationRun:
    """An evaluation's open MLflow run (made by :func:`evaluation_run`).

    Attributes:
        run_id: The MLflow run's id.
        observer: What the evaluation loop tells of each question
            (:func:`hcqr_dspy.evaluation.answering.evaluate`'s ``observer``): an MLflow trace per question
            (:class:`~hcqr_dspy.tracking.question_traces.QuestionTraces`), nothing at level ``off``.
        folder_logged: Whether the run folder's records are logged as artifacts (by :meth:`finish`).
    """

    def __init__(
        self, run: Any, folder: RunFolder, questions: Sequence[Any], method: str, level: str, saved: Callable[[], str]
    ):
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id
        self.folder, self.questions, self.method, self.level, self.saved = folder, questions, method, level, saved
        self.observer: Observer = NO_OBSERVER
        self.folder_logged = False
        self.model: dict[str, Any] = {"model_id": None}
        self.prompts: dict[str, Any] = {}
        self.trace_tags: dict[str, str] = {}
        self.dataset: Any = None
        self.digest = ""
        self.labelled = all(q.answer is not None for q in questions)

    def finish(self, result: EvalResult) -> None:
        """Record the answered evaluation: the run folder's records as artifacts, the traces a stopped process or a
        failed store left out rebuilt from the rows (said on stderr), the traces linked to their prompt versions,
        the metrics (``correct`` as ``n_correct``; the headline ones on the model, with the question set), and the
        traces scored when this session answered or rebuilt any, or the run was never scored.

        Raises:
            OutageError: the store failed under the traces written in the background (it names what is saved).
        """
        import mlflow

        log_run_folder(self.folder)
        self.folder_logged = True
        WATCH.stop_if_failed(self.saved())  # the store failed under the last traces
        # the traces a killed process, a locked store or a full disk left out are rebuilt from the rows
        trace_ids, rebuilt = {}, 0
        if self.level != "off":
            trace_ids, rebuilt = question_traces(
                result.iter_rows(), self.questions, self.run_id, self.experiment_id, self.method, self.trace_tags
            )
            note_rebuilt_traces(rebuilt, result.saved)
            link_traces(trace_ids.values(), self.prompts)
        model_id = self.model["model_id"]
        if model_id:
            # the active model would take every run metric (MLflow links metrics to it); it takes the headline ones,
            # with the question set, below
            mlflow.clear_active_model()
        # the count of right answers as `n_correct`: the scorers log `correct/mean`, and a `correct` beside it reads
        # as the same figure
        log_metrics({("n_correct" if k == "correct" else k): v for k, v in result.metrics.items()})
        if model_id:
            log_model_metrics(model_id, result.metrics, question_set_entity(self.dataset, self.digest))
        if self.level != "off" and (result.ran or rebuilt or not self.scored()):
            from hcqr_dspy.tracking.scorers import score_rows  # imports mlflow: only once scoring

            traced = ({**r, "trace_id": trace_ids[r["qid"]]} for r in result.iter_rows())  # read as scored
            score_rows(traced, self.dataset, labelled=self.labelled, digest=self.digest)
            WATCH.stop_if_failed(self.saved())
            mlflow.set_tag(SCORED_TAG, "true")

    def scored(self) -> bool:
        """Whether the MLflow run's traces were scored (:data:`SCORED_TAG`)."""
        import mlflow

        return mlflow.get_run(self.run_id).data.tags.get(SCORED_TAG) == "true"


@contextmanager
def evaluation_run(
    folder: RunFolder,
    questions: Sequence[Any],
    config: dict[str, Any],
    method: str,
    dataset: str,
    lm: str,
    saved: Callable[[], str],
    store: str | Path | None = None,
    level: str = "full",
) -> Iterator[EvaluationRun]:
    """Open (or resume) the MLflow run of an evaluation for the block; call :meth:`EvaluationRun.finish` with the
    result before the block ends.

    Open it before ``dspy.context`` is entered for the answering: the MLflow run sets up the recording of LM calls
    (at level ``full``: :func:`~hcqr_dspy.tracking.mlflow_runs.dspy_tracing`), and a ``dspy.context`` entered
    earlier keeps the callbacks it started with.

    Args:
        folder: The claimed, started run folder; a new MLflow run's id is written to it.
        questions: The evaluation's questions (``dspy.Example`` with ``qid``, ``question``, ``options``, ``answer``;
            all with an answer: an ``evaluation``, else a ``prediction``).
        config: The run folder's config (its ``questions.content_sha256``, ``saved_program``, ``answer_step``); the
            MLflow run's params.
        method, dataset, lm: The method, the dataset's name and the ``--lm`` spec (run name, tags).
        saved: Says what is saved (``"3/6 questions are saved in ..."``), for a one-line stop.
        store: The MLflow store folder (:func:`hcqr_dspy.tracking.store.store_dir`).
        level: ``full``, ``light`` or ``off`` (:data:`hcqr_dspy.trace_levels.TRACE_LEVELS`); ``off`` records no
            traces and scores none.

    Yields:
        The :class:`EvaluationRun`. A failure inside the block logs the records saved so far before it passes on
        (best effort: the failure's own message is kept).

    Raises:
        HCQRError: a failure of the store, in one line (:func:`~hcqr_dspy.tracking.store.store_outages`).
    """
    with store_outages(store, saved=saved):
        old_id = existing_mlflow_run_id(folder.mlflow_run_id, store)
        kind = "evaluation" if all(q.answer is not None for q in questions) else "prediction"
        program = program_label(config)
        tags = {"method": method, "dataset": dataset, "lm": lm, "program": program, "kind": kind}
        seed = (config.get("saved_program") or {}).get("seed")
        if seed is not None:  # replicate compiles of one recipe: the runs are told apart (and grouped) by it
            tags["compile_seed"] = str(seed)
        name = mlflow_run_name(method, dataset, lm, config, kind)
        with mlflow_run(name, config, tags=tags, run_id=old_id, store=store, traces=level == "full") as run:
            import mlflow  # heavy: imported once an MLflow run is opened

            tracked = EvaluationRun(run, folder, questions, method, level, saved)
            mlflow.set_tag(TRACES_TAG, level)
            folder.set_mlflow_run_id(tracked.run_id)
            if old_id is None:
                describe_mlflow_run(tracked.run_id, config, kind)
            suffix = f"-{config['questions']['content_sha256'][:12]}"
            # an hcqr dataset read back (--dataset mlflow:medqa-1a2b3c4d5e6f) is logged under its own name again
            tracked.dataset = questions_dataset(
                questions, dataset if dataset.endswith(suffix) else dataset + suffix, tracked.experiment_id
            )
            tracked.digest = config["questions"]["content_sha256"][:8]
            if old_id is None:
                log_question_set(tracked.dataset, tracked.digest, kind)
            tracked.model = evaluated_model(config, tracked.experiment_id)
            if tracked.model["model_id"]:
                link_run_to_model(tracked.run_id, tracked.model)
                mlflow.set_active_model(model_id=tracked.model["model_id"])  # the traces of this evaluation name it
            tracked.prompts = model_prompts(tracked.model["model_id"])  # {stage: PromptVersion}: linked to each trace
            tracked.trace_tags = {
                "method": method,
                "dataset": dataset,
                "run_folder": str(folder.path.resolve()),
                "lm": lm,
                "program": program,
                "mlflow_run_id": tracked.run_id,
            }
            if level != "off":
                tracked.observer = QuestionTraces(tracked.trace_tags, level, tracked.prompts)
            try:
                yield tracked
            except BaseException:
                # the records so far, best effort: the stop's own message (an outage, a full disk) must not be
                # replaced by this logging's failure; the next run logs them again
                if not tracked.folder_logged:
                    with contextlib.suppress(Exception):
                        log_run_folder(folder)
                raise


def note_rebuilt_traces(rebuilt: int, total: int) -> None:
    """Say on stderr how many question traces were rebuilt from the rows
    (:func:`hcqr_dspy.tracking.trace_repair.question_traces`)."""
    if rebuilt:
        log.warning(
            f"hcqr: note: {rebuilt} of {total} question traces were missing or unfinished in the MLflow store (a "
            "process stopped, or the store failed, before they were written); rebuilt from the run folder's rows, "
            "without their LM and retrieval spans"
        )


def program_label(config: dict[str, Any]) -> str:
    """``zero-shot``, or ``compiled:<recipe>`` for a saved program (``saved`` for one no optimizer made);
    ``answer-step:<recipe>`` for a fresh method answering with a saved program's answer step."""
    saved = config.get("saved_program")
    answer = config.get("answer_step")
    if not saved and answer:
        return f"answer-step:{answer.get('recipe') or 'saved'}"
    if not saved:
        return "zero-shot"
    return f"compiled:{saved['recipe']}" if saved.get("recipe") else "saved"


def mlflow_run_name(method: str, dataset: str, lm: str, config: dict[str, Any], kind: str = "evaluation") -> str:
    """An evaluation's MLflow run name, what tells runs apart first (the UI cuts long names): the program, then the
    dataset and the LM. The program is the method (``hcqr · medqa · local``) for a zero-shot program,
    ``<method>+<recipe>`` for a compiled one (``+saved`` without a recipe; `` seed N`` after it for a compile
    that recorded its seed, so replicate compiles are told apart), ``<name> v<version>`` for a registered version,
    ``<method>+answer:<recipe>`` for a fresh method with a saved answer step; ``predict `` goes before it for
    predictions."""
    saved = config.get("saved_program") or {}
    model = saved.get("model") or {}
    if model.get("version"):
        program = f"{model['name']} v{model['version']}"
    elif saved:
        program = f"{method}+{saved.get('recipe') or 'saved'}"
        if saved.get("seed") is not None:
            program += f" seed {saved['seed']}"
    elif config.get("answer_step"):
        program = f"{method}+answer:{config['answer_step'].get('recipe') or 'saved'}"
    else:
        program = method
    return " · ".join([f"predict {program}" if kind == "prediction" else program, dataset, lm])
