"""Saved programs: a folder of two JSON files, loadable against any index.

A saved (usually compiled) program is a folder::

    programs/NAME/
        program.json   DSPy's state of the program: each predictor's signature
                       instructions and field descriptions, and its demos
                       (``dspy.Module.save(path)`` with a ``.json`` path)
        meta.json      what it is: the method and its options, the recipe, LM, index and training
                       questions of its compile, program.json's SHA-256 as saved (a hand edit
                       is refused when read): :mod:`hcqr_dspy.optimize.program_meta`

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

import copy
import hashlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import dspy

from hcqr_dspy import __version__
from hcqr_dspy.config import read_text, validate
from hcqr_dspy.errors import HCQRError, ProgramFormatError
from hcqr_dspy.evaluation.places import portable_meta, resolved_meta
from hcqr_dspy.files import file_sha256
from hcqr_dspy.optimize.program_meta import FORMAT, FORMAT_VERSION, META_FILE, STATE_FILE, ProgramMeta
from hcqr_dspy.programs.method_registry import PROGRAMS, make_program
from hcqr_dspy.programs.program_base import MCQProgram, accepted_options


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


def read_meta(folder: str | Path, check_state: bool = True) -> dict[str, Any]:
    """``meta.json`` of a saved program, validated by :class:`ProgramMeta` (``check_state`` false: the record alone,
    ``program.json`` not checked against its hash).

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
    if check_state and meta["program_sha256"] is not None:
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


@dataclass(frozen=True, eq=False)
class SavedProgram:
    """One saved program, read once for a command: its folder, ``meta.json`` and ``program.json``'s bytes.

    Made by :func:`read_saved_program` (a local folder) or
    :func:`hcqr_dspy.workflows.programs.resolve_saved_program` (a folder or an MLflow URI); what a command asks
    about the program (its method, training set, recipe and seed, the LM it was compiled with, the program
    itself) is asked of this object, not of the files.

    Attributes:
        source: The program as named (a folder, ``runs:/<run_id>[/program]``, ``models:/...``).
        folder: The local folder read (an MLflow URI's download).
        meta: ``meta.json`` validated by :class:`~hcqr_dspy.optimize.program_meta.ProgramMeta` (its ``model_dump()``,
            ``None`` where unset; places resolved against ``folder``).
        state_bytes: ``program.json``'s bytes as read: the bytes checked against ``meta.json``'s
            ``program_sha256`` (where it records one), hashed in :attr:`state_sha256` and parsed in :attr:`state`.
    """

    source: str
    folder: Path
    meta: dict[str, Any]
    state_bytes: bytes = field(repr=False)

    @property
    def method(self) -> str:
        """The registered method (``meta.json``'s ``method``)."""
        return self.meta["method"]

    @property
    def train(self) -> dict[str, Any] | None:
        """The training set (:class:`~hcqr_dspy.optimize.program_meta.TrainingSet` as a dict: ``dataset``, ``ids``,
        ``text_sha256`` ...), ``None`` for a program no optimizer trained."""
        return self.meta["train"]

    @property
    def recipe(self) -> dict[str, Any] | None:
        """The recipe that compiled it (:meth:`~hcqr_dspy.optimize.recipes.Recipe.record`), ``None`` for none."""
        return self.meta["recipe"]

    @property
    def seed(self) -> int | None:
        """The compile seed (``recipe.seed``), ``None`` without a recipe."""
        return (self.recipe or {}).get("seed")

    @property
    def lm(self) -> dict[str, str] | None:
        """The LM it was compiled with (``meta.json``'s ``lm``: ``spec`` ...), or ``None``."""
        return self.meta["lm"]

    @cached_property
    def state_sha256(self) -> str:
        """SHA-256 (hex) of :attr:`state_bytes`."""
        return hashlib.sha256(self.state_bytes).hexdigest()

    @cached_property
    def state(self) -> dict[str, Any]:
        """``program.json`` parsed (once per object): the DSPy state, one entry per predictor (and ``metadata``).

        Raises:
            ProgramFormatError: not UTF-8 JSON, or not a JSON object.
        """
        try:
            state = json.loads(self.state_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramFormatError(f"{self.folder / STATE_FILE} is unreadable: {exc}") from None
        if not isinstance(state, dict):
            raise ProgramFormatError(f"{self.folder / STATE_FILE} is not a DSPy program state (a JSON object)")
        return state

    def described(self) -> dict[str, Any]:
        """``meta`` plus ``"path"``: :attr:`source`."""
        return {**self.meta, "path": self.source}

    def build(self, retriever: Any = None, method: str | None = None) -> MCQProgram:
        """The program with its instructions and demos, over ``retriever`` (any index; ``None`` for a method without
        retrieval; :class:`NoRetriever` for its prompts only). Each call builds a new program from :attr:`state`.

        Args:
            retriever: The index to retrieve from.
            method: If given, the method the caller expects; another one is refused.

        Raises:
            ProgramFormatError: ``method`` differs; the options do not fit the method; see :attr:`state`; the state
                does not fit the method (a predictor missing or extra) or does not load into it.
        """
        folder, meta = self.folder, self.meta
        if method is not None and method != meta["method"]:
            raise ProgramFormatError(f"{folder} is a saved {meta['method']!r} program, not {method!r}")
        options = meta["options"]
        try:
            program = make_program(meta["method"], retriever, **options)
        except (TypeError, ValueError) as exc:
            raise ProgramFormatError(
                f"{folder / META_FILE}: options {options} do not fit method {meta['method']!r}: {exc}"
            ) from None
        state = self.state
        expected = {name for name, _ in program.named_predictors()}
        found = {k for k in state if k != "metadata"}
        if found != expected:
            raise ProgramFormatError(
                f"{folder / STATE_FILE} holds predictors {sorted(found)}, but method {meta['method']!r} "
                f"with these options has {sorted(expected)}"
            )
        try:
            program.load_state(copy.deepcopy(state))  # a program's demos are its own, not this object's
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProgramFormatError(
                f"{folder / STATE_FILE} does not load into a {meta['method']!r} program: {exc!r}"
            ) from None
        if meta["demo_context_tokens"] is not None:
            program.demo_context_tokens = meta["demo_context_tokens"]
        return program


def read_saved_program(folder: str | Path, source: str | None = None) -> SavedProgram:
    """Read the saved program in the local ``folder`` once: ``meta.json`` validated, ``program.json``'s bytes
    checked against its recorded SHA-256.

    Args:
        folder: A saved-program folder (for MLflow URIs see
            :func:`hcqr_dspy.workflows.programs.resolve_saved_program`).
        source: How the program was named (default: ``folder``).

    Raises:
        ProgramFormatError: no such folder; see :func:`read_meta`; ``program.json`` unreadable.
    """
    path = program_folder(folder)
    meta = _read_record(path)
    data = _state_bytes(path)
    _check_state(path, data, meta["program_sha256"])  # the bytes kept are the bytes checked
    return SavedProgram(str(folder if source is None else source), path, meta, data)


def load_program(source: str | Path, retriever=None, method: str | None = None) -> tuple[MCQProgram, dict[str, Any]]:
    """Rebuild a saved program against ``retriever``: :func:`read_saved_program`, then :meth:`SavedProgram.build`
    (``method``: the one the caller expects, another refused; a folder, an MLflow URI resolved to one first by
    :func:`hcqr_dspy.workflows.programs.resolve_program_path`).

    Returns:
        The program with its instructions and demos, and its ``meta.json`` (plus ``"path"``: where it was read).

    Raises:
        ProgramFormatError: see :func:`read_saved_program` and :meth:`SavedProgram.build`.
    """
    saved = read_saved_program(source)
    return saved.build(retriever, method), saved.described()
