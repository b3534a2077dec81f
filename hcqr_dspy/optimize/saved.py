"""Saved programs: a folder of two JSON files, loadable against any index.

A saved (usually compiled) program is a folder::

    programs/NAME/
        program.json   DSPy's state of the program: each predictor's signature
                       instructions and field descriptions, and its demos
                       (``dspy.Module.save(path)`` with a ``.json`` path)
        meta.json      what it is: format and version, the method and its
                       constructor options, the optimizer and recipe that made
                       it, the LM, the index it was compiled against, and the
                       training questions (dataset, ids and a SHA-256 of each
                       question text, for the overlap check), and the
                       SHA-256 of program.json as saved (a hand edit after
                       the compile is refused when it is read), each
                       stage's demos as its prompt shows them (bootstrapped,
                       labelled, rendered, saved) and, when the compile kept
                       fewer bootstrapped traces than its recipe asked, how
                       many (``bootstrap_shortfall``); a pydantic
                       model, :class:`ProgramMeta`, checked when written and
                       when read

Why it is safe to load: both files are read with ``json``; the program is
rebuilt from the method registry and only receives the JSON state
(``dspy.Module.load`` with a ``.json`` path never unpickles). No code and no
pickle travels with a saved program. MLflow model URIs are read the same way:
``hcqr compile`` (:func:`hcqr_dspy.workflows.compile.compile_and_save`) logs this folder
as the run's ``program`` artifacts next to the MLflow model, and
:func:`hcqr_dspy.workflows.programs.resolve_program_path` downloads that folder (``runs:/<run_id>`` or
``runs:/<run_id>/program``, or from a registered model ``models:/NAME/VERSION``
or ``models:/NAME@ALIAS``: :mod:`hcqr_dspy.tracking.serving`) before it is read here, never
``mlflow.dspy.load_model``, which unpickles (cloudpickle) the logged object. This module reads and writes
local folders only.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import dspy
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hcqr_dspy import __version__
from hcqr_dspy.config import read_text, validate
from hcqr_dspy.errors import HCQRError, ProgramFormatError
from hcqr_dspy.evaluation.places import portable_meta, resolved_meta
from hcqr_dspy.files import file_sha256
from hcqr_dspy.optimize.recipes import Recipe
from hcqr_dspy.programs.base import MCQProgram, accepted_options
from hcqr_dspy.programs.registry import PROGRAMS, check_options, make_program

FORMAT = "hcqr-dspy-program"
FORMAT_VERSION = 4  # 2: compile_cost; 3: program_sha256; 4: demos, bootstrap_shortfall
STATE_FILE, META_FILE = "program.json", "meta.json"


class TrainingSet(BaseModel):
    """``meta.json``'s ``train``: every question the optimizer saw (training and validation), for the overlap check.

    ``ids`` and ``text_sha256`` (:func:`text_sha256` of each question) are parallel lists, made by
    :func:`question_keys`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    dataset: str
    ids: list[str]
    text_sha256: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]]
    file: str | None = None
    train_count: Annotated[int, Field(ge=0)] | None = None
    val_count: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _parallel(self) -> TrainingSet:
        if len(self.ids) != len(self.text_sha256):
            raise ValueError(f"{len(self.ids)} ids but {len(self.text_sha256)} text hashes")
        if self.train_count is not None and self.train_count + (self.val_count or 0) != len(self.ids):
            raise ValueError(f"train_count {self.train_count} + val_count {self.val_count or 0} != {len(self.ids)} ids")
        return self


class ProgramMeta(BaseModel):
    """``meta.json`` of a saved program.

    The format and its version are checked first (a newer version is refused before its keys are,
    since it may have other ones); then the method (a registered one), its constructor options
    (:func:`hcqr_dspy.programs.check_options`), the recipe that compiled it
    (:class:`hcqr_dspy.optimize.recipes.Recipe`) and its training set (:class:`TrainingSet`). Unknown keys are
    refused. The rest is recorded as :func:`save_program`'s callers give it.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal["hcqr-dspy-program"]
    format_version: Annotated[int, Field(ge=1)]
    method: str
    options: dict[str, Any] = Field(default_factory=dict)
    created: str
    hcqr_dspy_version: str
    dspy_version: str
    optimizer: str | None = None
    recipe: Recipe | None = None
    lm: dict[str, str] | None = None
    reflection_lm: str | None = None
    demo_context_tokens: Annotated[int, Field(ge=0)] | None = None
    index: dict[str, Any] | None = None
    train: TrainingSet | None = None
    mlflow_run_id: str | None = None
    compile_cost: dict[str, float] | None = None
    program_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    demos: dict[str, dict[str, Annotated[int, Field(ge=0)]]] | None = None
    bootstrap_shortfall: dict[str, Annotated[int, Field(ge=0)]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _readable_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("format") == FORMAT:
            version = data.get("format_version")
            if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
                raise ValueError(
                    f"saved in program format version {version}, newer than this hcqr-dspy reads "
                    f"({FORMAT_VERSION}); upgrade hcqr-dspy"
                )
        return data

    @field_validator("method")
    @classmethod
    def _registered(cls, method: str) -> str:
        if method not in PROGRAMS:
            raise ValueError(f"holds method {method!r}, not one of {', '.join(PROGRAMS)}")
        return method

    @model_validator(mode="after")
    def _options_fit(self) -> ProgramMeta:
        try:
            check_options(self.method, self.options)
        except ValueError as exc:
            raise ValueError(f"options: {exc}") from None
        return self


def normalize_text(text: str) -> str:
    """Lower case, whitespace collapsed: how question texts are compared for overlap."""
    return re.sub(r"\s+", " ", str(text)).strip().lower()


def text_sha256(text: str) -> str:
    """SHA-256 of :func:`normalize_text` (hex)."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


def question_keys(examples: Iterable[dspy.Example], dataset: str) -> dict[str, list[str]]:
    """``{"dataset", "ids", "text_sha256"}`` of a question set, as stored in ``meta.json``.

    Args:
        examples: Questions (``qid``, ``question``).
        dataset: The dataset's name (file stem, e.g. ``medmcqa``): MIRAGE ids
            restart at ``0000`` in every file, so an id only means something
            together with its dataset.
    """
    examples = list(examples)
    return {
        "dataset": dataset,
        "ids": [str(e.qid) for e in examples],
        "text_sha256": [text_sha256(e.question) for e in examples],
    }


def overlap(train: dict[str, Any], examples: Iterable[dspy.Example], dataset: str) -> dict[str, list[str]]:
    """Questions of ``examples`` that were in a training set, by id (same dataset) and by text.

    Args:
        train: :func:`question_keys` of the training set (from ``meta.json``).
        examples: The evaluation questions.
        dataset: Their dataset name.

    Returns:
        ``{"by_id": [...], "by_text": [...]}``: evaluation ids found in the
        training set (empty lists when none).
    """
    ids = set(train.get("ids") or []) if train.get("dataset") == dataset else set()
    texts = set(train.get("text_sha256") or [])
    examples = list(examples)
    return {
        "by_id": [e.qid for e in examples if str(e.qid) in ids],
        "by_text": [e.qid for e in examples if text_sha256(e.question) in texts],
    }


def refuse_overlap(train: dict[str, Any], examples: Iterable[dspy.Example], dataset: str, what: str) -> None:
    """Raise when evaluation questions were used for training.

    Raises:
        HCQRError: some of ``examples`` share an id (same dataset) or a
            question text with the training set; the message lists them.
    """
    found = overlap(train, examples, dataset)
    both = list(dict.fromkeys(found["by_id"] + found["by_text"]))  # each question once, in order
    if both:
        shown = ", ".join(both[:5]) + (" ..." if len(both) > 5 else "")
        raise HCQRError(
            f"{what}: the evaluation set {dataset!r} overlaps the training set {train.get('dataset')!r}: "
            f"{len(both)} question(s) ({shown}; {len(found['by_id'])} match by id, {len(found['by_text'])} by "
            "question text); "
            "evaluate on questions the program was not compiled on"
        )


class NoRetriever:
    """Stands in for a retriever where only a program's state is wanted (never searched)."""

    def search(self, *args, **kwargs):
        raise HCQRError("this program was built without a retriever (state only)")

    get = search


def fresh_state(method: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The zero-shot state (instructions, no demos) of ``method`` with recorded options (settings() keys ok).

    Raises:
        HCQRError: unknown method.
    """
    if method not in PROGRAMS:
        raise HCQRError(f"unknown method {method!r}")
    accepted = accepted_options(PROGRAMS[method])
    program = make_program(method, NoRetriever(), **{k: v for k, v in options.items() if k in accepted})
    return program.dump_state()


def save_program(program: MCQProgram, folder: str | Path, **meta: Any) -> Path:
    """Write ``program.json`` (DSPy state) and ``meta.json`` into ``folder``.

    Args:
        program: A registered program (compiled or not).
        folder: Created if missing; existing files of a saved program are replaced.
        **meta: The other :class:`ProgramMeta` fields (``optimizer``, ``recipe``,
            ``lm``, ``index``, ``train`` ...); they must not hold secrets (API
            keys are never passed here).

    Returns:
        The folder.

    Raises:
        ProgramFormatError: ``folder`` exists and is not a saved program folder
            (it is never overwritten then).
        pydantic.ValidationError: ``meta`` does not fit :class:`ProgramMeta` (a bug of the caller;
            nothing is written).
    """
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / META_FILE).is_file())):
        raise ProgramFormatError(f"{folder} exists and is not a saved program folder; choose another --out")
    record = ProgramMeta.model_validate(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "method": program.method,
            "options": program.options(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hcqr_dspy_version": __version__,
            "dspy_version": dspy.__version__,
            **portable_meta(meta, folder),  # places relative to the project or data root (evaluation.places)
        }
    )  # a record that read_meta would refuse is a bug here: pydantic's ValidationError, before anything is written
    folder.mkdir(parents=True, exist_ok=True)
    program.save(str(folder / STATE_FILE))
    record.program_sha256 = file_sha256(folder / STATE_FILE)
    tmp = folder / (META_FILE + ".tmp")
    tmp.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(folder / META_FILE)
    return folder


def program_folder(source: str | Path) -> Path:
    """The local saved-program folder ``source`` names (for MLflow URIs see
    :func:`hcqr_dspy.workflows.programs.resolve_program_path`).

    Raises:
        ProgramFormatError: no such folder.
    """
    path = Path(source)
    if not path.is_dir():
        raise ProgramFormatError(f"saved program {path} not found (a folder with {STATE_FILE} and {META_FILE})")
    return path


def read_meta(folder: str | Path) -> dict[str, Any]:
    """``meta.json`` of a saved program, validated by :class:`ProgramMeta`.

    Returns:
        The validated record as a dict (``ProgramMeta.model_dump()``: every field, ``None`` where unset).

    Raises:
        ProgramFormatError: a missing, unreadable or non-UTF-8 file, not JSON, another format, a format
            version newer than this package reads, an unknown method, options that do not fit it,
            unknown keys or ill-typed values (one line naming the file and the field); a ``program.json``
            changed since it was saved (its SHA-256 against ``meta.json``'s ``program_sha256``; format versions
            1 and 2 have none, nor a file whose hash was deleted by hand, and are not checked here).
    """
    folder = Path(folder)
    meta = _read_record(folder)
    if meta["program_sha256"] is not None:
        _check_state(folder, _state_bytes(folder), meta["program_sha256"])
    return meta


def _read_record(folder: Path) -> dict[str, Any]:
    """:func:`read_meta` without the check of ``program.json`` against its hash (the caller checks the bytes it
    reads)."""
    for name in (META_FILE, STATE_FILE):
        if not (folder / name).is_file():
            raise ProgramFormatError(f"{folder} is not a saved program: {name} is missing")
    path = folder / META_FILE
    try:
        raw = json.loads(read_text(path, ProgramFormatError, "saved-program metadata"))
    except json.JSONDecodeError as exc:
        raise ProgramFormatError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ProgramFormatError(f"{path} is not an {FORMAT} file")
    return resolved_meta(validate(ProgramMeta, raw, path, ProgramFormatError).model_dump(), folder)


def _state_bytes(folder: Path) -> bytes:
    """``program.json``'s bytes. Raises ProgramFormatError: the file cannot be read (one line)."""
    try:
        return (folder / STATE_FILE).read_bytes()
    except OSError as exc:
        raise ProgramFormatError(f"{folder / STATE_FILE} is unreadable: {exc.strerror or exc}") from None


def _check_state(folder: Path, data: bytes, recorded: str | None) -> None:
    """Refuse ``program.json``'s bytes ``data`` when they are not the ones saved (``meta.json``'s SHA-256;
    ``None``: none recorded, not checked)."""
    if recorded is not None and (actual := hashlib.sha256(data).hexdigest()) != recorded:
        raise ProgramFormatError(
            f"{folder / STATE_FILE} was changed after the program was saved (SHA-256 {actual[:12]}..., "
            f"{META_FILE} records {recorded[:12]}...): it is not the program {META_FILE} describes (its recipe "
            f"and compile run); compile again, or, to run the edited file as a program of your own, delete "
            f"program_sha256 from {META_FILE}"
        )


def load_program(source: str | Path, retriever=None, method: str | None = None) -> tuple[MCQProgram, dict[str, Any]]:
    """Rebuild a saved program against ``retriever``.

    Args:
        source: A saved-program folder (an MLflow URI is resolved to one first:
            :func:`hcqr_dspy.workflows.programs.resolve_program_path`).
        retriever: The index to retrieve from (any index; not saved with the program).
        method: If given, the method the caller expects; another one is refused.

    Returns:
        The program with its instructions and demos, and its ``meta.json``
        (plus ``"path"``: where it was read).

    Raises:
        ProgramFormatError: no such folder; see :func:`read_meta`; the state does not fit the
            method (a predictor missing or extra), or ``method`` differs.
    """
    folder = program_folder(source)
    meta = _read_record(folder)  # program.json is checked against its hash below, on the bytes parsed
    if method is not None and method != meta["method"]:
        raise ProgramFormatError(f"{source} is a saved {meta['method']!r} program, not {method!r}")
    options = meta["options"]
    try:
        program = make_program(meta["method"], retriever, **options)
    except (TypeError, ValueError) as exc:
        raise ProgramFormatError(
            f"{folder / META_FILE}: options {options} do not fit method {meta['method']!r}: {exc}"
        ) from None
    data = _state_bytes(folder)
    _check_state(folder, data, meta["program_sha256"])  # the bytes parsed here are the bytes checked, once
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramFormatError(f"{folder / STATE_FILE} is unreadable: {exc}") from None
    if not isinstance(state, dict):
        raise ProgramFormatError(f"{folder / STATE_FILE} is not a DSPy program state (a JSON object)")
    expected = {name for name, _ in program.named_predictors()}
    found = {k for k in state if k != "metadata"}
    if found != expected:
        raise ProgramFormatError(
            f"{folder / STATE_FILE} holds predictors {sorted(found)}, but method {meta['method']!r} "
            f"with these options has {sorted(expected)}"
        )
    try:
        program.load_state(state)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProgramFormatError(
            f"{folder / STATE_FILE} does not load into a {meta['method']!r} program: {exc!r}"
        ) from None
    if meta["demo_context_tokens"] is not None:
        program.demo_context_tokens = meta["demo_context_tokens"]
    return program, {**meta, "path": str(source)}
