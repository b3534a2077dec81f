"""One evaluation end to end: resolve LM, index, questions and program (:mod:`hcqr_dspy.workflows.specs`);
answer every question into a run folder, resuming it; track it as an MLflow run. Shared by ``hcqr eval``,
``hcqr predict``, ``hcqr demo`` and experiments."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy

from hcqr_dspy.data import load_questions, select
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.evaluate import EvalResult, evaluate
from hcqr_dspy.evaluation.provenance import machine_key
from hcqr_dspy.evaluation.records import write_probe
from hcqr_dspy.evaluation.rows import answer_record
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm import build_lm, check_lm
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.programs import refuse_bound
from hcqr_dspy.tracing import trace_level
from hcqr_dspy.tracking.datasets import log_question_set, question_set_entity, questions_dataset
from hcqr_dspy.tracking.mlflow_runs import describe_mlflow_run, log_metrics, log_run_folder, mlflow_run
from hcqr_dspy.tracking.model_links import evaluated_model, link_run_to_model, log_model_metrics
from hcqr_dspy.tracking.prompt_links import link_traces, model_prompts
from hcqr_dspy.tracking.store import existing_mlflow_run_id, open_store, store_outages
from hcqr_dspy.tracking.store_faults import WATCH
from hcqr_dspy.tracking.trace_repair import question_traces
from hcqr_dspy.workflows.specs import EvalSpec, dataset_name, resolve

log = logging.getLogger(__name__)

DEFAULT_RUNS = Path("runs")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60]


def default_run_dir(spec: EvalSpec, config: dict[str, Any]) -> Path:
    """``runs/<dataset>/<method>-<lm>-n<count>-s<seed>-<config hash>`` (``predict-<method>...`` for unlabelled
    questions): the same spec reuses (resumes) its folder."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]
    dataset = _slug(dataset_name(spec.dataset))
    lm = _slug(spec.lm.replace(":", "-").replace("/", "-"))
    kind = "" if spec.labelled else "predict-"
    return DEFAULT_RUNS / dataset / f"{kind}{spec.method}-{lm}-n{config['questions']['count']}-s{spec.seed}-{digest}"


def run_evaluation(
    spec: EvalSpec,
    mlflow_dir: str | Path | None = None,
    progress: bool = True,
    track: bool = True,
    lm: Any = None,
    on_row: Any = None,
    traces: str | None = None,
) -> tuple[EvalResult, Path, str | None]:
    """Resolve, run (resuming the run folder if it has rows) and track one evaluation as an MLflow run.

    Every input is checked before the run folder is written: method and
    options, questions, index, saved program, and the LM (built, and a remote
    one asked one tiny question by :func:`hcqr_dspy.lm.check_lm`), so a failed
    attempt leaves nothing that would refuse the corrected command.

    Args:
        spec: The evaluation.
        mlflow_dir: MLflow store folder (see :func:`hcqr_dspy.tracking.store.store_dir`).
        progress: Show a progress bar.
        track: Track in MLflow.
        lm: A ready ``dspy.LM`` to use instead of building ``spec.lm``
            (tests, notebooks); ``spec.lm`` is still what the config records.
        on_row: Called with each new row as it is written (see :func:`hcqr_dspy.evaluation.evaluate.evaluate`).
        traces: What a tracked question's trace keeps (:func:`hcqr_dspy.tracing.trace_level`: ``full``, ``light``,
            ``off``; ``None``: ``$HCQR_TRACES``, else ``full``); ``off`` records no traces and scores none. The
            run's tag ``hcqr.traces`` names the last session's level.

    Tracked, the MLflow run is named ``method · dataset · LM · zero-shot|compiled:<recipe>``
    (:func:`mlflow_run_name`) and tagged likewise; its description links the MLflow run that compiled a saved program;
    the questions are its input (an MLflow evaluation dataset); each question is a trace
    (:mod:`hcqr_dspy.tracing`); and once every question is answered the traces are scored
    (:func:`hcqr_dspy.tracking.scorers.score_rows`; once per MLflow run: a rerun that answers nothing new does not
    score again).

    Returns:
        The result, the run folder and the MLflow run id (``None`` untracked).

    Raises:
        HCQRError: bad input or an unusable LM (before anything is written), an
            unusable run folder, :class:`~hcqr_dspy.errors.LMUnavailableError`
            or :class:`~hcqr_dspy.errors.ProgramError` mid-run.
    """
    level = trace_level(traces)  # a bad level is refused before anything is written
    config, questions, program_module = resolve(spec, mlflow_dir)
    # the folder's one writer before the LM is loaded or asked: a second process on it is refused at once
    folder = RunFolder.claim(Path(spec.run_dir) if spec.run_dir else default_run_dir(spec, config), "eval")
    try:
        if lm is None:
            lm = build_lm(
                spec.lm,
                temperature=spec.temperature,
                max_tokens=spec.max_tokens,
                n_ctx=spec.n_ctx,
                api_base=spec.api_base,
                api_key_env=spec.api_key_env,
            )
            check_lm(lm)
        if track:  # a store that cannot be used is refused before the run folder is written
            open_store(mlflow_dir)
        note_moved_inputs(folder, folder.start(config))
        note_first_recorded(folder)
        if {str(q.qid) for q in questions} - {r["qid"] for r in folder.iter_rows()}:
            note_other_machine(folder, folder.record_session("eval", lm))  # only a session with questions to answer
        if not track:
            with dspy.context(lm=lm, adapter=HCQRAdapter()):
                result = evaluate(program_module, questions, folder, spec.method, spec.num_threads, progress, on_row)
            return result, folder.path, None
        with store_outages(mlflow_dir, saved=lambda: saved_questions(folder, questions)):
            return _tracked_evaluation(
                spec, config, questions, program_module, lm, folder, mlflow_dir, progress, on_row, level
            )
    finally:
        folder.release()


def _tracked_evaluation(
    spec: EvalSpec,
    config: dict[str, Any],
    questions: list[dspy.Example],
    program_module: Any,
    lm: Any,
    folder: RunFolder,
    mlflow_dir: str | Path | None,
    progress: bool,
    on_row: Any,
    level: str = "full",
) -> tuple[EvalResult, Path, str | None]:
    """The tracked part of :func:`run_evaluation`: the MLflow run, its input, traces (at ``level``) and scores."""
    old_id = existing_mlflow_run_id(folder.mlflow_run_id, mlflow_dir)
    labelled = all(q.answer is not None for q in questions)
    dname = dataset_name(spec.dataset)
    program = program_label(config)
    kind = "evaluation" if labelled else "prediction"
    name = mlflow_run_name(spec.method, dname, spec.lm, config, kind)
    tags = {"method": spec.method, "dataset": dname, "lm": spec.lm, "program": program, "kind": kind}
    seed = (config.get("saved_program") or {}).get("seed")
    if seed is not None:  # replicate compiles of one recipe: the runs are told apart (and grouped) by it
        tags["compile_seed"] = str(seed)
    # The MLflow run (and mlflow.dspy.autolog's trace callback) must be set up before
    # dspy.context: a context entered earlier keeps the callbacks it started with.
    with mlflow_run(name, config, tags=tags, run_id=old_id, store=mlflow_dir, traces=level == "full") as run:
        import mlflow  # heavy: imported once an MLflow run is opened

        run_id = run.info.run_id
        mlflow.set_tag(TRACES_TAG, level)
        folder.set_mlflow_run_id(run_id)
        if old_id is None:
            describe_mlflow_run(run_id, config, kind)
        suffix = f"-{config['questions']['content_sha256'][:12]}"
        # an hcqr dataset read back (--dataset mlflow:medqa-1a2b3c4d5e6f) is logged under its own name again
        questions_ds = questions_dataset(
            questions, dname if dname.endswith(suffix) else dname + suffix, run.info.experiment_id
        )
        digest = config["questions"]["content_sha256"][:8]
        if old_id is None:
            log_question_set(questions_ds, digest, kind)
        model = evaluated_model(config, run.info.experiment_id)
        if model["model_id"]:
            link_run_to_model(run_id, model)
            mlflow.set_active_model(model_id=model["model_id"])  # the traces of this evaluation name the model
        prompts = model_prompts(model["model_id"])  # {stage: PromptVersion}: each trace is linked to them
        trace_tags = {
            "method": spec.method,
            "dataset": dname,
            "run_folder": str(folder.path.resolve()),
            "lm": spec.lm,
            "program": program,
            "mlflow_run_id": run_id,
        }
        with dspy.context(lm=lm, adapter=HCQRAdapter()):
            try:
                result = evaluate(
                    program=program_module,
                    examples=questions,
                    folder=folder,
                    method=spec.method,
                    num_threads=spec.num_threads,
                    progress=progress,
                    on_row=on_row,
                    trace_tags=None if level == "off" else trace_tags,
                    trace_level=level,
                    trace_prompts=prompts,
                )
            except BaseException:
                # the records so far, best effort: the stop's own message (an outage, a full disk) must not be
                # replaced by this logging's failure; the next run logs them again
                with contextlib.suppress(Exception):
                    log_run_folder(folder)
                raise
            log_run_folder(folder)
        WATCH.stop_if_failed(saved_questions(folder, questions))  # the store failed under the last traces
        # the traces a killed process, a locked store or a full disk left out are rebuilt from the rows
        trace_ids, rebuilt = {}, 0
        if level != "off":
            trace_ids, rebuilt = question_traces(
                result.iter_rows(), questions, run_id, run.info.experiment_id, spec.method, trace_tags
            )
            note_rebuilt_traces(rebuilt, result.saved)
            link_traces(trace_ids.values(), prompts)
        if model["model_id"]:
            # the active model would take every run metric (MLflow links metrics to it); it takes the headline ones,
            # with the question set, below
            mlflow.clear_active_model()
        # the count of right answers as `n_correct`: the scorers log `correct/mean`, and a `correct` beside it reads
        # as the same figure
        log_metrics({("n_correct" if k == "correct" else k): v for k, v in result.metrics.items()})
        if model["model_id"]:
            log_model_metrics(model["model_id"], result.metrics, question_set_entity(questions_ds, digest))
        if level != "off" and (result.ran or rebuilt or mlflow.get_run(run_id).data.tags.get(SCORED_TAG) != "true"):
            from hcqr_dspy.tracking.scorers import score_rows  # imports mlflow: only once scoring

            traced = ({**r, "trace_id": trace_ids[r["qid"]]} for r in result.iter_rows())  # read as scored
            score_rows(traced, questions_ds, labelled=labelled, digest=digest)
            WATCH.stop_if_failed(saved_questions(folder, questions))
            mlflow.set_tag(SCORED_TAG, "true")
    return result, folder.path, run_id


SCORED_TAG = "hcqr.scored"
TRACES_TAG = "hcqr.traces"  # the trace level of the run's last session (hcqr_dspy.tracing.TRACE_LEVELS)


def saved_questions(folder: RunFolder, questions: Sequence[dspy.Example]) -> str:
    """``"N/M questions are saved in <predictions.jsonl>"``: the rows of ``questions`` the run folder holds."""
    wanted = {str(q.qid) for q in questions}
    saved = sum(1 for r in folder.iter_rows() if r["qid"] in wanted)
    return f"{saved}/{len(questions)} questions are saved in {folder.predictions.path}"


def note_rebuilt_traces(rebuilt: int, total: int) -> None:
    """Say on stderr how many question traces were rebuilt from the rows
    (:func:`hcqr_dspy.tracking.trace_repair.question_traces`)."""
    if rebuilt:
        log.warning(
            f"hcqr: note: {rebuilt} of {total} question traces were missing or unfinished in the MLflow store (a "
            "process stopped, or the store failed, before they were written); rebuilt from the run folder's rows, "
            "without their LM and retrieval spans"
        )


def note_moved_inputs(folder: RunFolder, moved: list[str]) -> None:
    """Say on stderr when a resumed run folder's inputs were found at other places than it recorded (their
    identities matched: :mod:`hcqr_dspy.evaluation.run_config`)."""
    if moved:
        log.info(
            f"hcqr: note: {folder.path}: resumed with its inputs at other places ({', '.join(moved)}); what they "
            "hold matches the run's record, and config.json now names the new places"
        )


def note_first_recorded(folder: RunFolder) -> None:
    """Say on stderr when a resumed run folder of format 1 now records identities it did not
    (:func:`hcqr_dspy.evaluation.folder_format.first_recorded`): its earlier rows were not checked against them."""
    if folder.first_recorded:
        log.warning(
            f"hcqr: note: {folder.path}: written by an earlier version that did not record "
            f"{', '.join(folder.first_recorded)}; recorded from this session on (the rows before it are not "
            "checked against them)"
        )


def note_other_machine(folder: RunFolder, session: dict[str, Any]) -> None:
    """Say on stderr when a resumed run folder's earlier rows were written on another machine or LM stack
    (:func:`hcqr_dspy.evaluation.provenance.machine_key`): at temperature 0 the LM need not reply as it did there."""
    now = machine_key(session)
    earlier = [machine_key(s) for s in folder.sessions()[:-1] if s.get("command") == "eval"]
    other = [k for k in dict.fromkeys(earlier) if k != now]
    if other:
        log.warning(
            f"hcqr: note: {folder.path}: earlier rows were written on another machine or LM stack ({other[-1]}); "
            f"this session runs on {now}; `hcqr compare` reports it"
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


def answers_target(out: str | Path) -> Path:
    """Check where :func:`write_answers` will write, before any LM call.

    Raises:
        HCQRError: ``out`` is a folder, or its folder cannot be created or written.
    """
    path = Path(out)
    if path.is_dir():
        raise HCQRError(f"--out {path} is a folder; give a file (answers.jsonl or answers.json)")
    try:
        write_probe(path.parent)
    except OSError as exc:
        raise HCQRError(f"--out {path}: its folder cannot be written ({exc.strerror or exc})") from None
    return path


def write_answers(out: str | Path, rows: Sequence[dict[str, Any]], questions: Sequence[dspy.Example]) -> Path:
    """Write an evaluation's answers for people and programs: one record per question, in question order
    (:func:`hcqr_dspy.evaluation.evaluate.answer_record`: the letter and its text, validity, hypothesis, queries and
    passages; ``gold`` and ``correct`` when the question has a gold answer).

    ``out`` ending in ``.json`` gets one object ``{qid: record}``; any other name gets JSON Lines. The
    file is written whole to a temporary name and renamed, so a reader never sees half of it.
    """
    by_qid = {r["qid"]: r for r in rows}
    records = []
    for q in questions:
        r = by_qid.get(q.qid)
        if r is None:
            continue
        record = answer_record(
            q.qid,
            q.options,
            r.get("prediction"),
            r["valid"],
            r.get("error"),
            r.get("hypothesis"),
            r.get("queries"),
            r.get("passages"),
        )
        if q.answer is not None:
            record.update(gold=q.answer, correct=r["correct"])
        records.append(record)
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".json":
        tmp.write_text(
            json.dumps({r["qid"]: r for r in records}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    else:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
    return path


def run_prediction(
    spec: EvalSpec, out: str | Path, mlflow_dir: str | Path | None = None, track: bool = True, traces: str | None = None
) -> tuple[EvalResult, Path, str | None, Path]:
    """Answer a file of questions (``spec.labelled`` false: gold answers optional) and write the answers.

    ``out`` is checked (:func:`answers_target`) before anything else; then :func:`run_evaluation` runs, and
    :func:`write_answers` writes every answer of the run folder for the spec's questions to ``out``.

    Returns:
        The result, the run folder, the MLflow run id (``None`` untracked) and the answers file.

    Raises:
        HCQRError: as :func:`answers_target` and :func:`run_evaluation`.
    """
    path = answers_target(out)
    refuse_bound(spec.method, "hcqr predict")  # a saved program's method is never a bound (compile refuses them)
    result, run_dir, run_id = run_evaluation(spec, mlflow_dir=mlflow_dir, track=track, traces=traces)
    questions = select(load_questions(spec.dataset, labelled=False), limit=spec.limit, seed=spec.seed, ids=spec.ids)
    write_answers(path, result.rows, questions)
    return result, run_dir, run_id, path
