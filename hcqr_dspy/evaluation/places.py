"""Where a record's inputs lie, written so that another clone of the project finds them: :func:`portable` turns a
path into the form a record keeps, :func:`resolve` turns that form back into a path on this machine.

Roots (:func:`roots`, found from the record's own folder): the *project root* is the nearest folder at or above it
that holds ``pyproject.toml`` (the clone; for reading a relative form in a record that lies in no project, such as a
program MLflow downloaded to a temporary folder, the working directory's); the *data root* is the folder
``$HCQR_DATA`` names, else ``<project root>/../shared/data`` where that is a folder.

Recorded forms::

    $HCQR_DATA/<relative>   a path under the data root (POSIX separators)
    <relative>              a path under the project root
    /absolute               a path under neither, or a record's folder outside any project

:func:`resolve` reads a relative form against this clone's roots. An absolute path that does not exist here (a
record written on another machine) is looked for at the same place relative to a root: each tail of the path,
longest first, under the data root then the project root; the first that exists and that ``matches`` accepts (its
fingerprint is the recorded one) is the input. Found nowhere, the recorded form is returned unchanged, and the
reader names it as missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DATA_ENV = "HCQR_DATA"
DATA_PREFIX = "$HCQR_DATA/"
PROJECT_MARKER = "pyproject.toml"


@dataclass(frozen=True)
class Roots:
    """The project root and the data root of a record's folder (``None``: none found)."""

    project: Path | None
    data: Path | None


def roots(near: str | Path, reading: bool = False) -> Roots:
    """The :class:`Roots` of a record in folder ``near`` (which need not exist yet); ``reading``: a record outside
    any project takes the working directory's."""
    project = _project(Path(near).resolve())
    if project is None and reading:
        project = _project(Path.cwd().resolve())
    if os.environ.get(DATA_ENV):
        data: Path | None = Path(os.environ[DATA_ENV]).expanduser().resolve()
    elif project is not None and (project.parent / "shared" / "data").is_dir():
        data = (project.parent / "shared" / "data").resolve()
    else:
        data = None
    return Roots(project, data)


def portable(path: str, near: str | Path) -> str:
    """The form a record in folder ``near`` keeps for ``path``, an existing file or folder: ``$HCQR_DATA/<relative>``
    under the data root, relative under the project root, else ``path`` unchanged (an absolute path outside both, or
    a value that names no existing path by its absolute path: a hub dataset's name, a ``runs:/`` URI, a saved
    dataset's ``FOLDER:SPLIT``)."""
    if not isinstance(path, str) or not Path(path).is_absolute() or not Path(path).exists():
        return path
    where = roots(near)
    for prefix, root in ((DATA_PREFIX, where.data), ("", where.project)):
        if root is not None and Path(path).is_relative_to(root) and Path(path) != root:
            return prefix + Path(path).relative_to(root).as_posix()
    return path


def resolve(recorded: str, near: str | Path, matches: Callable[[Path], bool] | None = None, names: bool = False) -> str:
    """The path on this machine of what a record in folder ``near`` keeps as ``recorded`` (module docstring).

    Args:
        recorded: The recorded form (:func:`portable`).
        near: The record's folder, whose :func:`roots` relative forms are read against.
        matches: Whether a candidate found for an absolute path missing here is the recorded input (its
            fingerprint); ``None`` accepts any that exists.
        names: ``recorded`` may be a name rather than a path (a hub dataset): a relative form that is nothing under
            the project root is returned unchanged.

    Returns:
        An absolute path, or ``recorded`` unchanged where nothing here answers to it.
    """
    if not isinstance(recorded, str) or not recorded:
        return recorded
    where = roots(near, reading=True)
    if recorded.startswith(DATA_PREFIX):
        return str(where.data / recorded[len(DATA_PREFIX) :]) if where.data is not None else recorded
    path = Path(recorded)
    if not path.is_absolute():
        if where.project is None or (names and not (where.project / path).exists()):
            return recorded
        return str(where.project / path)
    if path.exists():
        return recorded
    where = roots(near)
    parts = PurePosixPath(path.as_posix()).parts[1:]
    for start in range(len(parts)):
        for root in (where.data, where.project):
            candidate = root / Path(*parts[start:]) if root is not None else None
            if candidate is not None and candidate.exists() and (matches is None or matches(candidate)):
                return str(candidate)
    return recorded


def _project(folder: Path) -> Path | None:
    return next((p for p in (folder, *folder.parents) if (p / PROJECT_MARKER).is_file()), None)


def index_matches(fingerprint: str | None) -> Callable[[Path], bool]:
    """Whether a folder is an index of the corpus with ``fingerprint`` (its ``manifest.json``'s
    ``corpus.fingerprint``); any index folder when ``fingerprint`` is ``None``."""

    def check(folder: Path) -> bool:
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
            return fingerprint is None or manifest["corpus"]["fingerprint"] == fingerprint
        except (OSError, ValueError, KeyError, TypeError):
            return False

    return check


def portable_meta(meta: dict, folder: str | Path) -> dict:
    """A saved program's ``meta.json`` fields with the places it records (``index.path``, ``index.corpus_source``,
    ``train.file``) in the form :func:`portable` gives for a record in ``folder`` (copies)."""
    return _map_meta(meta, lambda value, _: portable(value, folder))


def resolved_meta(meta: dict, folder: str | Path) -> dict:
    """:func:`portable_meta` read back on this machine (:func:`resolve`; the index matched by its corpus
    fingerprint)."""
    fingerprint = (meta.get("index") or {}).get("corpus_fingerprint")
    checks = {"path": index_matches(fingerprint if isinstance(fingerprint, str) else None)}
    return _map_meta(meta, lambda value, field: resolve(value, folder, checks.get(field), names=field == "file"))


def _map_meta(meta: dict, place: Callable[[str, str], str]) -> dict:
    out = dict(meta)
    for key, fields in (("index", ("path", "corpus_source")), ("train", ("file",))):
        if isinstance(out.get(key), dict):
            out[key] = {k: place(v, k) if k in fields and isinstance(v, str) else v for k, v in out[key].items()}
    return out
