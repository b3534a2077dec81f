"""Running an experiment grid (:mod:`hcqr_dspy.workflows.experiment_file`): every cell (dataset x method, then
dataset x saved program) is one evaluation, then each dataset's run folders are compared.

``hcqr experiment FILE`` runs the cells in order, each its own run folder under
``runs/experiments/<name>/<dataset>/<method>`` (so an interrupted experiment
resumes cell by cell, question by question) and its own MLflow child run
under one parent MLflow run; DSPy's response cache makes a finished cell free to
re-run. After the cells, each dataset's run folders are compared (table, exact
McNemar tests, plots; with the file's ``comparison:`` margins and setup check)
and the reports logged to the parent MLflow run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hcqr_dspy.data import load_questions, select
from hcqr_dspy.errors import ExperimentError, HCQRError
from hcqr_dspy.evaluation.folders import link_fault, run_dir_fault
from hcqr_dspy.evaluation.option_probs import folder_rows_with_option_probs
from hcqr_dspy.evaluation.provenance import session_record
from hcqr_dspy.evaluation.records import read_json_object
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm import build_lm, check_lm_spec
from hcqr_dspy.optimize.saved import refuse_overlap
from hcqr_dspy.programs.method_registry import PROGRAMS
from hcqr_dspy.reporting import compare
from hcqr_dspy.reporting.runs import checked_questions, load_run
from hcqr_dspy.reporting.saved_programs import ProgramFolders
from hcqr_dspy.reporting.setups import setup_check
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.tracking.comparison import track_comparison
from hcqr_dspy.tracking.mlflow_runs import mlflow_run
from hcqr_dspy.tracking.store import existing_mlflow_run_id
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.experiment_file import Experiment
from hcqr_dspy.workflows.judge import judge_and_track
from hcqr_dspy.workflows.setup_guard import check_same_setup
from hcqr_dspy.workflows.specs import EvalSpec, dataset_name, resolve, resolve_method


def run_experiment(
    exp: Experiment,
    runs_root: str | Path = "runs/experiments",
    mlflow_dir: str | Path | None = None,
    progress: bool = True,
    lm: Any = None,
) -> dict[str, Any]:
    """Run every cell (dataset x method), then compare each dataset's run folders.

    Args:
        exp: The validated experiment.
        runs_root: Root of the run folders.
        mlflow_dir: MLflow store folder.
        progress: Progress bars.
        lm: A ready ``dspy.LM`` for every cell instead of building ``exp.lm`` (tests).

    Returns:
        ``{"parent_run_id", "cells": {dataset: {method: metrics}}, "reports": {dataset: path}}``.

    Raises:
        HCQRError: from any cell (finished cells and questions are kept; re-running resumes); before any MLflow
            run is opened or any cell run: a malformed record in any cell (:func:`preflight_rows`), a cell whose
            inputs do not resolve or whose folder holds another configuration (:func:`preflight_configs`), an LM
            spec that cannot be built (:func:`~hcqr_dspy.lm.check_lm_spec`). With ``comparison: {strict_setup:
            true}``, a :class:`~hcqr_dspy.errors.SetupMismatchError` before a cell answers on another setup than any
            cell recorded (:func:`hcqr_dspy.workflows.setup_guard.check_same_setup`).
    """
    import mlflow  # heavy: imported only to run

    programs = resolve_programs(exp, mlflow_dir)  # before anything is written: a bad program leaves no run behind
    root = Path(runs_root) / exp.name
    cells = [(m, m, None) for m in exp.methods] + [(name, method, exp.programs[name]) for name, method in programs]
    specs = {
        d: [cell_spec(exp, d, root / d / cell, method, program) for cell, method, program in cells]
        for d in exp.datasets
    }
    cell_folders = [Path(spec.run_dir) for d in exp.datasets for spec in specs[d]]
    # before the MLflow runs are opened: a refused experiment leaves them as they were
    answered = preflight_rows(cell_folders)
    preflight_configs([spec for d in exp.datasets for spec in specs[d]], mlflow_dir)
    if lm is None:  # what building the LM checks before it loads a model or asks a server
        check_lm_spec(exp.lm, api_base=exp.api_base, api_key_env=exp.api_key_env)
    strict = bool(exp.comparison.get("strict_setup"))
    if strict:
        preflight_setup(exp, answered, lm)
    root.mkdir(parents=True, exist_ok=True)
    state_path = root / "experiment.json"
    if fault := link_fault(state_path):
        raise HCQRError(fault)
    state = read_json_object(state_path, "experiment state") if state_path.exists() else {}
    params = {k: v for k, v in exp.__dict__.items() if k not in ("description",)}
    out: dict[str, Any] = {"cells": {}, "reports": {}}
    with mlflow_run(
        f"experiment {exp.name}",
        params,
        tags={"kind": "experiment"},
        # a parent run recorded in another MLflow store (a committed study on a new machine): a new one here
        run_id=existing_mlflow_run_id(state.get("parent_run_id"), mlflow_dir),
        store=mlflow_dir,
        traces=False,
    ) as parent:
        state["parent_run_id"] = out["parent_run_id"] = parent.info.run_id
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        for dname in exp.datasets:
            out["cells"][dname] = {}
            run_dirs = []
            for (cell, _, _), spec in zip(cells, specs[dname], strict=True):
                result, run_dir, _ = run_evaluation(
                    spec,
                    mlflow_dir=mlflow_dir,
                    progress=progress,
                    lm=lm,
                    # one setup for every cell: a cell is refused before it answers on another than the others'
                    strict_setup=strict,
                    same_setup_as=cell_folders,
                )
                out["cells"][dname][cell] = result.metrics
                run_dirs.append(run_dir)
            if exp.judge is not None:
                _judge_cells(exp, run_dirs, mlflow_dir, lm)
            if len(run_dirs) > 1:
                reference = str(root / dname / exp.reference) if exp.reference else None  # its folder: unambiguous
                _, files = compare(run_dirs, reference=reference, out_dir=root / dname / "comparison", **exp.comparison)
                out["reports"][dname] = str(files[0])
                for f in files:
                    mlflow.log_artifact(str(f), artifact_path=f"comparison/{dname}")
                track_comparison(root / dname / "comparison", mlflow_dir=mlflow_dir)  # a child run, linking the cells
    return out


def cell_spec(exp: Experiment, dataset: str, run_dir: Path, method: str, program: str | None) -> EvalSpec:
    """The evaluation of one cell: ``method`` (a saved ``program`` of it, or ``None``) on the file's ``dataset``,
    in ``run_dir``, with the experiment's LM, questions, index and settings."""
    return EvalSpec(
        method=method,
        program=program,
        dataset=exp.datasets[dataset],
        index=exp.index,
        lm=exp.lm,
        limit=exp.questions.get("limit"),
        seed=int(exp.questions.get("seed", 0)),
        ids=exp.questions.get("ids"),
        program_options={} if program else {"budget": exp.budget, **exp.method_options.get(method, {})},
        max_tokens=exp.max_tokens,
        n_ctx=exp.n_ctx,
        api_base=exp.api_base,
        api_key_env=exp.api_key_env,
        num_threads=exp.threads,
        run_dir=str(run_dir),
        search_options=exp.search_options if PROGRAMS[method].uses_retrieval else {},
        encoder_backend=exp.encoder_backend if PROGRAMS[method].uses_retrieval else None,
    )


def preflight_configs(specs: list[EvalSpec], mlflow_dir=None) -> None:
    """Refuse the experiment, before any MLflow run is opened or any cell run, when a cell's inputs do not resolve
    (:func:`~hcqr_dspy.workflows.specs.resolve`) or its run folder holds a run of another configuration (the
    file's questions, budget or LM settings changed since: :meth:`RunFolder.refuse_other_config`), as the cell's
    evaluation would once the earlier cells had reopened their MLflow runs.

    Raises:
        HCQRError: naming the run folder and the differing keys, or the input that does not resolve.
    """
    for spec in specs:
        config, _, _ = resolve(dataclasses.replace(spec), mlflow_dir)
        RunFolder(spec.run_dir).refuse_other_config(
            config,
            "the experiment's questions or settings (its file, or an option given) changed since that cell was "
            "answered: undo the change, or rename the experiment",
        )


def preflight_rows(cell_folders: list[Path]) -> dict[Path, set[str]]:
    """Refuse the experiment when a cell's run folder holds a record its resume or the comparison would refuse (a
    question recorded twice, :func:`~hcqr_dspy.reporting.runs.check_row`; a malformed or foreign
    ``option_probs.jsonl``, ``judgments.jsonl`` or ``sessions.jsonl``), or a file lies where a cell's folder goes,
    before any MLflow run is opened or any cell run: a record edited by hand in a later cell does not leave the
    earlier cells' runs reopened and the parent run failed.

    Returns:
        Each cell folder's answered questions (none for a cell not started).

    Raises:
        HCQRError: naming the file (and the question or line).
    """
    answered = {}
    for path in cell_folders:
        if path.exists() and not path.is_dir():
            raise HCQRError(f"{path} is a file, not a run folder, where the experiment keeps its cell {path.name!r}")
        if fault := run_dir_fault(path):  # a link to nothing, another tool's records, rows without config.json
            raise HCQRError(fault)
        folder = RunFolder(path)
        answered[path] = checked_questions(folder)
        if answered[path]:  # its other records, as the comparison reads them
            folder_rows_with_option_probs(folder)
            folder.judgments()
            folder.sessions()
    return answered


def preflight_setup(exp: Experiment, answered: dict[Path, set[str]], lm: Any = None) -> None:
    """Before any MLflow run is opened or any cell run: with cells left to answer (``answered``, each cell folder's
    answered questions, lacks one of the file's question sample of its dataset), refuse the
    experiment's LM when its setup is not the one the cells recorded
    (:func:`~hcqr_dspy.workflows.setup_guard.check_same_setup`; the LM built for the check, ``lm`` a ready one
    instead, is dropped after it); with every cell answered, refuse the cells of a dataset whose setups differ,
    as its report would (:meth:`~hcqr_dspy.reporting.setups.SetupCheck.refuse`).

    Raises:
        SetupMismatchError: naming the field, both values and the cell that recorded the other.
        HCQRError: ``--strict-setup: runs ... differ in ...`` (every cell answered).
    """
    cell_folders = list(answered)
    wanted = {name: {str(q.qid) for q in question_sample(exp, name)} for name in exp.datasets}
    if all(wanted[f.parent.name] <= done for f, done in answered.items()):  # nothing to answer: the report's check
        for dataset in dict.fromkeys(folder.parent for folder in cell_folders):
            cells = [f for f in cell_folders if f.parent == dataset]
            cells.sort(key=lambda f: f.name != exp.reference)  # the reference first, as in its report
            if len(cells) > 1:
                programs = ProgramFolders()
                setup_check([load_run(f, programs=programs) for f in cells]).refuse()
        return
    ready = lm or build_lm(
        exp.lm, max_tokens=exp.max_tokens, n_ctx=exp.n_ctx, api_base=exp.api_base, api_key_env=exp.api_key_env
    )
    check_same_setup(session_record("eval", ready, exp.threads), cell_folders)


def question_sample(exp: Experiment, dataset: str) -> list[Any]:
    """The questions every cell of ``dataset`` answers: the file's ``questions`` sample of it."""
    questions = exp.questions
    return select(
        load_questions(exp.datasets[dataset]),
        limit=questions.get("limit"),
        seed=int(questions.get("seed", 0)),
        ids=questions.get("ids"),
    )


def resolve_programs(exp: Experiment, mlflow_dir=None) -> list[tuple[str, str]]:
    """Each program cell's method, its saved program found (folder, ``runs:/`` or ``models:/``) and its budget
    checked against the experiment's, so that every cell shows the answer step as many passages.

    Returns:
        ``[(cell name, method)]`` in file order.

    Raises:
        ExperimentError: a program that cannot be found or read, or one whose budget is not the file's; its
            message names the first such cell and how many more, its ``problems`` every one.
    """
    cells, problems = [], []
    samples: dict[str, list] = {}  # dataset name -> the questions every cell answers
    for name, ref in exp.programs.items():
        where = f"experiment {exp.name}: program cell {name!r}"
        try:
            method, saved = resolve_method(None, ref, {}, mlflow_dir)
        except HCQRError as exc:
            problems.append(f"{where}: {exc}")
            continue
        budget = (saved.meta.get("options") or {}).get("budget")
        if PROGRAMS[method].uses_retrieval and budget != exp.budget:
            shows = "records no budget" if budget is None else f"shows {budget} passages"
            problems.append(
                f"{where} ({ref}) {shows}, the file's budget is {exp.budget}; compile it with --budget "
                f"{exp.budget} or change the file's budget"
            )
        elif PROGRAMS[method].uses_retrieval and not exp.index:
            problems.append(f"{where} is a {method} program: give 'index'")
        elif overlap := _training_overlap(exp, saved.meta, ref, samples):
            problems.append(f"{where}: {overlap}")
        else:
            cells.append((name, method))
    if problems:
        more = len(problems) - 1
        message = problems[0] + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
        raise ExperimentError(message, problems=problems)
    return cells


def _training_overlap(exp: Experiment, meta: dict[str, Any], ref: str, samples: dict[str, list]) -> str | None:
    """Why a saved program cannot answer the experiment's questions (it was compiled on some of them, as
    :func:`~hcqr_dspy.workflows.specs.resolve` refuses when the cell runs), or ``None``; ``samples`` keeps each
    dataset's question sample, read once."""
    if not meta.get("train"):
        return None
    for dname, file in exp.datasets.items():
        if dname not in samples:
            samples[dname] = question_sample(exp, dname)
        try:
            refuse_overlap(meta["train"], samples[dname], dataset_name(file), f"saved program {ref}")
        except HCQRError as exc:
            return str(exc)
    return None


def _judge_cells(exp: Experiment, run_dirs: list[Path], mlflow_dir, lm: Any = None) -> None:
    """Judge the cells' run folders through the one judging path (:func:`hcqr_dspy.workflows.judge.judge_and_track`)."""
    spec = exp.judge.get("lm") or exp.lm
    if lm is None:
        lm = build_lm(
            spec,
            max_tokens=exp.judge.get("max_tokens", 512),
            n_ctx=exp.n_ctx,
            api_base=exp.api_base,
            api_key_env=exp.api_key_env,
        )
    retriever = (
        load_index(exp.index, search_options=exp.search_options, encoder_backend=exp.encoder_backend)
        if exp.index
        else None
    )
    for run_dir in run_dirs:
        judge_and_track(
            run_dir,
            judge_lm=spec,
            lm=lm,
            mode=exp.judge.get("mode", "context"),
            reasoning=exp.judge.get("reasoning", True),
            retriever=retriever,
            mlflow_dir=mlflow_dir,
            limit=exp.judge.get("limit"),
            seed=exp.judge.get("seed", 0),
        )
