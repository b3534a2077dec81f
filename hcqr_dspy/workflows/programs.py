"""Where a saved program comes from: a folder, an MLflow run (``runs:/``) or a logged model (``models:/``), and
the program a finished run folder ran.

The saved-program format itself (two JSON files, read without unpickling anything) is
:mod:`hcqr_dspy.optimize.saved`; this module only fetches the folder from the MLflow store first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError, ProgramFormatError, RunError
from hcqr_dspy.evaluation.fingerprints import prompt_fingerprint
from hcqr_dspy.files import file_sha256
from hcqr_dspy.optimize import saved
from hcqr_dspy.optimize.answer_step import adopt_answer_step
from hcqr_dspy.programs import PROGRAMS, make_program
from hcqr_dspy.programs.program_base import MCQProgram, accepted_options
from hcqr_dspy.tracking.serving import program_folder_of_model
from hcqr_dspy.tracking.store import configure, tracking_uri


def resolve_program_path(source: str | Path, mlflow_dir: str | Path | None = None) -> Path:
    """A local saved-program folder for a path or an MLflow URI.

    ``runs:/<run_id>`` (or ``runs:/<run_id>/program``) downloads that MLflow run's
    ``program`` artifacts from the tracking store (:mod:`hcqr_dspy.tracking.store`);
    ``models:/NAME/VERSION``, ``models:/NAME@ALIAS`` (the Model Registry) and
    ``models:/<model id>`` download the pyfunc model that ``hcqr compile`` logged
    (:mod:`hcqr_dspy.tracking.serving`) and use the program folder it carries. Either way
    only the two JSON files are read.

    Raises:
        ProgramFormatError: no such folder, run, model, version or alias, or a
            run or model without program artifacts.
    """
    text = str(source)
    if not text.startswith(("runs:/", "models:/")):
        return saved.program_folder(text)
    import mlflow

    configure(mlflow_dir)
    uri = text.rstrip("/")
    ref = uri[len("models:/") :] if uri.startswith("models:/") else None
    if ref is not None and "/" not in ref and "@" not in ref and not ref.startswith("m-"):
        raise ProgramFormatError(
            f"{text}: give a version or an alias (models:/{ref}/VERSION, models:/{ref}/latest, models:/{ref}@ALIAS) "
            "or a logged model id (models:/m-...)"
        )
    if uri.startswith("runs:/") and uri.count("/") == 1:  # runs:/<id>
        uri += "/program"
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    except Exception as exc:  # MlflowException, OSError: both mean "not there"
        first = (str(exc).splitlines() or [""])[0][:300]
        raise ProgramFormatError(
            f"cannot fetch saved program {text} from {tracking_uri(mlflow_dir)}: {first}"
        ) from None
    if uri.startswith("models:/"):
        try:
            return program_folder_of_model(local)
        except HCQRError as exc:
            raise ProgramFormatError(f"{text}: {exc}") from None
    return local


def resolve_saved_program(source: str | Path, mlflow_dir: str | Path | None = None) -> saved.SavedProgram:
    """The saved program a path or an MLflow URI names, read once (:func:`resolve_program_path`, then
    :func:`hcqr_dspy.optimize.saved.read_saved_program`): what a command asks about it is asked of this object.

    Raises:
        ProgramFormatError: see :func:`resolve_program_path` and :func:`hcqr_dspy.optimize.saved.read_saved_program`.
    """
    return saved.read_saved_program(resolve_program_path(source, mlflow_dir), str(source))


def load_program(
    source: str | Path, retriever=None, method: str | None = None, mlflow_dir: str | Path | None = None
) -> tuple[MCQProgram, dict[str, Any]]:
    """Rebuild a saved program from a folder or an MLflow URI against ``retriever``.

    Args:
        source: A saved-program folder, ``runs:/<run_id>[/program]`` or ``models:/...``
            (:func:`resolve_program_path`).
        retriever: The index to retrieve from (any index; not saved with the program).
        method: If given, the method the caller expects; another one is refused.
        mlflow_dir: MLflow store for ``runs:/`` and ``models:/`` URIs.

    Returns:
        The program and its ``meta.json`` (plus ``"path"``: ``source``), as
        :func:`hcqr_dspy.optimize.saved.load_program`.

    Raises:
        ProgramFormatError: see :func:`resolve_saved_program` and :meth:`hcqr_dspy.optimize.saved.SavedProgram.build`.
    """
    program = resolve_saved_program(source, mlflow_dir)
    return program.build(retriever, method), program.described()


def run_program(folder: Any, retriever=None, budget: int | None = None) -> MCQProgram:
    """The program a run folder ran, over ``retriever``: its saved program (a compiled one, say), or its method
    with the options ``config.json`` records (budget, passages per query, fusion, roles ...) and the saved answer
    step it answered with, if any (``answer_step``: :func:`hcqr_dspy.optimize.answer_step.adopt_answer_step`).

    Args:
        folder: The :class:`~hcqr_dspy.evaluation.run_folder.RunFolder`.
        retriever: The index to retrieve from (``None`` for a method without retrieval).
        budget: Replaces the run's context budget (the recorded options are used, not a saved program's);
            passages per query then take the method's default for it (HCQR: ``ceil(budget / roles)``).

    Raises:
        RunError: a method this hcqr-dspy does not know, recorded options that do not build it, a saved
            program whose ``program.json`` changed since the run, or a program whose prompts are not the run's
            (``prompts_sha256``: a signature reworded since).
        ProgramFormatError: the saved program cannot be read.
    """
    method = folder.method
    if method not in PROGRAMS:
        raise RunError(f"{folder.path}: method {method!r} is not one this hcqr-dspy knows")
    saved_program = folder.saved_program
    if saved_program and budget is None:
        _check_unchanged(folder, saved_program)
        program, _ = load_program(saved_program.get("folder") or saved_program["source"], retriever, method)
        return _same_prompts(folder, program)
    recorded = folder.config.get("program") or {}
    options = {k: v for k, v in recorded.items() if k in accepted_options(PROGRAMS[method])}
    if budget is not None:
        options["budget"] = budget
        options.pop("k_per_query", None)
    try:
        program = make_program(method, retriever, **options)
    except (TypeError, ValueError) as exc:
        raise RunError(f"{folder.path}: its recorded program options do not build {method}: {exc}") from None
    answer_step = folder.config.get("answer_step")
    if answer_step:  # a fresh method that answered with a saved program's answer step
        _check_unchanged(folder, answer_step)
        adopt_answer_step(program, answer_step.get("folder") or answer_step["source"])
    return _same_prompts(folder, program)


def _check_unchanged(folder: Any, record: dict[str, Any]) -> None:
    """A saved program's ``program.json`` is still the one the run recorded (its SHA-256), where the run recorded
    one and the file is at the recorded folder (a ``models:/`` program downloaded again is read as it comes).

    Raises:
        RunError: it changed (instructions or demos edited since the run).
    """
    path = Path(record.get("folder") or record.get("source") or "") / saved.STATE_FILE
    if "program_sha256" in record and path.is_file() and file_sha256(path) != record["program_sha256"]:
        raise RunError(
            f"{folder.path}: {path} changed since the run (its SHA-256 is not the recorded one): the rows were made "
            "by another program; restore it or evaluate the new one in a new run folder"
        )


def _same_prompts(folder: Any, program: MCQProgram) -> MCQProgram:
    """``program``, once its prompts are found to be the run's (``prompts_sha256``, where the run recorded it).

    Raises:
        RunError: they differ (a signature reworded, instructions or demos changed since the run).
    """
    if "prompts_sha256" in folder.config and prompt_fingerprint(program) != folder.config["prompts_sha256"]:
        raise RunError(
            f"{folder.path}: the program rebuilt for it sends other prompts than the run did (its signatures, "
            "instructions or demos changed since: prompts_sha256 differs); its rows cannot be scored or replayed "
            "with it"
        )
    return program
