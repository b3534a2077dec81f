"""One evaluation end to end: resolve LM, index, questions and program (:mod:`hcqr_dspy.workflows.specs`);
answer every question into a run folder, resuming it, inside its MLflow run
(:func:`hcqr_dspy.tracking.evaluation_run.evaluation_run`). Shared by ``hcqr eval``, ``hcqr predict``,
``hcqr demo`` and experiments."""

from __future__ import annotations

import functools
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
from hcqr_dspy.evaluation.answering import EvalResult, evaluate
from hcqr_dspy.evaluation.provenance import machine_key, session_record
from hcqr_dspy.evaluation.records import write_probe
from hcqr_dspy.evaluation.rows import answer_record
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm import build_lm, check_lm
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.programs import refuse_bound
from hcqr_dspy.reporting.runs import checked_questions
from hcqr_dspy.trace_levels import trace_level
from hcqr_dspy.tracking.evaluation_run import evaluation_run
from hcqr_dspy.tracking.store import open_store
from hcqr_dspy.workflows.setup_guard import check_same_setup
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
    strict_setup: bool = False,
    same_setup_as: Sequence[str | Path] = (),
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
        on_row: Called with each new row as it is written (see :func:`hcqr_dspy.evaluation.answering.evaluate`).
        traces: What a tracked question's trace keeps (:func:`hcqr_dspy.trace_levels.trace_level`: ``full``, ``light``,
            ``off``; ``None``: ``$HCQR_TRACES``, else ``full``); ``off`` records no traces and scores none. The
            run's tag ``hcqr.traces`` names the last session's level.
        strict_setup: Before a question is answered (when any is left), refuse to answer on another setup than
            the ``hcqr eval`` sessions recorded in the run folder and in ``same_setup_as`` (other run folders, the
            cells of one study): :func:`hcqr_dspy.workflows.setup_guard.check_same_setup`. Without it a resume on
            another setup is recorded and noted, and ``hcqr compare`` flags the run as mixed.

    Tracked, the MLflow run is named ``method · dataset · LM · zero-shot|compiled:<recipe>``
    (:func:`~hcqr_dspy.tracking.evaluation_run.mlflow_run_name`) and tagged likewise; its description links the MLflow
    run that compiled a saved program; the questions are its input (an MLflow evaluation dataset); each question is a
    trace (:mod:`hcqr_dspy.tracking.question_traces`); and once every question is answered the traces are scored
    (:mod:`hcqr_dspy.tracking.evaluation_run`; once per MLflow run: a rerun that answers nothing new does not
    score again).

    Returns:
        The result, the run folder and the MLflow run id (``None`` untracked).

    Raises:
        HCQRError: bad input or an unusable LM (before anything is written; a resumed row that ``hcqr compare``
            would refuse, :func:`~hcqr_dspy.reporting.runs.check_row`, before the LM is loaded), a
            :class:`~hcqr_dspy.errors.SetupMismatchError` (strict setup; nothing written), an
            unusable run folder, :class:`~hcqr_dspy.errors.LMUnavailableError`
            or :class:`~hcqr_dspy.errors.ProgramError` mid-run.
    """
    level = trace_level(traces)  # a bad level is refused before anything is written
    config, questions, program_module = resolve(spec, mlflow_dir)
    # the folder's one writer before the LM is loaded or asked: a second process on it is refused at once
    folder = RunFolder.claim(Path(spec.run_dir) if spec.run_dir else default_run_dir(spec, config), "eval")
    try:
        # the questions answered already, each row checked: one edited by hand is refused before the LM is loaded
        left = {str(q.qid) for q in questions} - checked_questions(folder)
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
        if strict_setup and left:
            now = session_record("eval", lm, spec.num_threads)
            check_same_setup(now, [folder.path, *same_setup_as])  # before anything is written
        if track:  # a store that cannot be used is refused before the run folder is written
            open_store(mlflow_dir)
        note_moved_inputs(folder, folder.start(config))
        note_first_recorded(folder)
        if left:
            # only a session with questions to answer
            note_other_machine(folder, folder.record_session("eval", lm, spec.num_threads))
        if not track:
            with dspy.context(lm=lm, adapter=HCQRAdapter()):
                result = evaluate(program_module, questions, folder, spec.method, spec.num_threads, progress, on_row)
            return result, folder.path, None
        dataset = dataset_name(spec.dataset)
        saved = functools.partial(saved_questions, folder, questions)
        # the MLflow run before dspy.context, which keeps the LM-call callbacks it started with
        with evaluation_run(folder, questions, config, spec.method, dataset, spec.lm, saved, mlflow_dir, level) as run:
            with dspy.context(lm=lm, adapter=HCQRAdapter()):
                result = evaluate(
                    program_module, questions, folder, spec.method, spec.num_threads, progress, on_row, run.observer
                )
            run.finish(result)
        return result, folder.path, run.run_id
    finally:
        folder.release()


def saved_questions(folder: RunFolder, questions: Sequence[dspy.Example]) -> str:
    """``"N/M questions are saved in <predictions.jsonl>"``: the rows of ``questions`` the run folder holds."""
    wanted = {str(q.qid) for q in questions}
    saved = sum(1 for r in folder.iter_rows() if r["qid"] in wanted)
    return f"{saved}/{len(questions)} questions are saved in {folder.predictions.path}"


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
    (:func:`hcqr_dspy.evaluation.answering.answer_record`: the letter and its text, validity, hypothesis, queries and
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
