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
                       question text, for the overlap check)

Why it is safe to load: both files are read with ``json``; the program is
rebuilt from the method registry and only receives the JSON state
(``dspy.Module.load`` with a ``.json`` path never unpickles). No code and no
pickle travels with a saved program. MLflow model URIs are read the same way:
:func:`compile_program <hcqr_dspy.optimize.compile_program>` logs this folder
as the run's ``program`` artifacts next to the MLflow model, and
:func:`load_program` downloads that folder (``runs:/<run_id>`` or
``runs:/<run_id>/program``), never ``mlflow.dspy.load_model``, which
unpickles (cloudpickle) the logged object.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any, Iterable

import dspy

from hcqr_dspy import __version__
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs import PROGRAMS, accepted_options, make_program
from hcqr_dspy.programs.base import MCQProgram

FORMAT = "hcqr-dspy-program"
FORMAT_VERSION = 1
STATE_FILE, META_FILE = "program.json", "meta.json"


class ProgramFormatError(HCQRError):
    """A saved program that cannot be used: missing files, another format, a newer version, an unknown method."""


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
            f"{len(both)} question(s) ({shown}; {len(found['by_id'])} match by id, {len(found['by_text'])} by question text); "
            "evaluate on questions the program was not compiled on"
        )


class _NoRetriever:
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
    program = make_program(method, _NoRetriever(), **{k: v for k, v in options.items() if k in accepted})
    return program.dump_state()


def save_program(program: MCQProgram, folder: str | Path, **meta: Any) -> Path:
    """Write ``program.json`` (DSPy state) and ``meta.json`` into ``folder``.

    Args:
        program: A registered program (compiled or not).
        folder: Created if missing; existing files of a saved program are replaced.
        **meta: Recorded as is in ``meta.json`` (``optimizer``, ``recipe``,
            ``lm``, ``index``, ``train`` ...); must be JSON-serializable and
            must not hold secrets (API keys are never passed here).

    Returns:
        The folder.

    Raises:
        ProgramFormatError: ``folder`` exists and is not a saved program folder
            (it is never overwritten then).
    """
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / META_FILE).is_file())):
        raise ProgramFormatError(f"{folder} exists and is not a saved program folder; choose another --out")
    folder.mkdir(parents=True, exist_ok=True)
    program.save(str(folder / STATE_FILE))
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "method": program.method,
        "options": program.options(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hcqr_dspy_version": __version__,
        "dspy_version": dspy.__version__,
        **meta,
    }
    tmp = folder / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(folder / META_FILE)
    return folder


def resolve_program_path(source: str | Path, mlflow_dir: str | Path | None = None) -> Path:
    """A local saved-program folder for a path or an MLflow URI.

    ``runs:/<run_id>`` (or ``runs:/<run_id>/program``) downloads the run's
    ``program`` artifacts from the tracking store (:mod:`hcqr_dspy.tracking`).

    Raises:
        ProgramFormatError: no such folder, or the run has no program artifacts.
    """
    text = str(source)
    if text.startswith("runs:/"):
        import mlflow

        from hcqr_dspy import tracking

        tracking.configure(mlflow_dir)
        uri = text.rstrip("/")
        if uri.count("/") == 1:  # runs:/<id>
            uri += "/program"
        try:
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
        except Exception as exc:  # MlflowException, OSError: both mean "not there"
            raise ProgramFormatError(f"cannot fetch saved program {text} from {tracking.tracking_uri(mlflow_dir)}: {exc}") from None
    path = Path(text)
    if not path.is_dir():
        raise ProgramFormatError(f"saved program {path} not found (a folder with {STATE_FILE} and {META_FILE})")
    return path


def read_meta(folder: str | Path) -> dict[str, Any]:
    """``meta.json`` of a saved program, checked.

    Raises:
        ProgramFormatError: a missing or unreadable file, another format, a
            format version newer than this package reads, an unknown method.
    """
    folder = Path(folder)
    for name in (META_FILE, STATE_FILE):
        if not (folder / name).is_file():
            raise ProgramFormatError(f"{folder} is not a saved program: {name} is missing")
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramFormatError(f"{folder / META_FILE} is unreadable: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ProgramFormatError(f"{folder / META_FILE} is not an {FORMAT} file")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ProgramFormatError(
            f"{folder} was saved in program format version {version!r}, newer than this hcqr-dspy reads "
            f"({FORMAT_VERSION}); upgrade hcqr-dspy"
        )
    if meta.get("method") not in PROGRAMS:
        raise ProgramFormatError(f"{folder} holds method {meta.get('method')!r}, not one of {', '.join(PROGRAMS)}")
    return meta


def load_program(
    source: str | Path, retriever=None, method: str | None = None, mlflow_dir: str | Path | None = None
) -> tuple[MCQProgram, dict[str, Any]]:
    """Rebuild a saved program against ``retriever``.

    Args:
        source: A saved-program folder or ``runs:/<run_id>[/program]``.
        retriever: The index to retrieve from (any index; not saved with the program).
        method: If given, the method the caller expects; another one is refused.
        mlflow_dir: MLflow store for ``runs:/`` URIs.

    Returns:
        The program with its instructions and demos, and its ``meta.json``
        (plus ``"path"``: where it was read).

    Raises:
        ProgramFormatError: see :func:`read_meta`; the state does not fit the
            method (a predictor missing or extra), or ``method`` differs.
    """
    folder = resolve_program_path(source, mlflow_dir)
    meta = read_meta(folder)
    if method is not None and method != meta["method"]:
        raise ProgramFormatError(f"{source} is a saved {meta['method']!r} program, not {method!r}")
    options = meta.get("options") or {}
    if not isinstance(options, dict):
        raise ProgramFormatError(f"{folder / META_FILE}: 'options' must be a mapping, got {options!r}")
    try:
        program = make_program(meta["method"], retriever, **options)
    except (TypeError, ValueError) as exc:
        raise ProgramFormatError(f"{folder / META_FILE}: options {options} do not fit method {meta['method']!r}: {exc}") from None
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
        raise ProgramFormatError(f"{folder / STATE_FILE} does not load into a {meta['method']!r} program: {exc!r}") from None
    if isinstance(meta.get("demo_context_tokens"), int):
        program.demo_context_tokens = meta["demo_context_tokens"]
    return program, {**meta, "path": str(source)}
