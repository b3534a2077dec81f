"""Folders a command is given: the same run folder named twice, an output folder that holds another tool's
records (a run, an index, a saved program, a comparison, a replay), whose files the command would mix with, delete
or overwrite, and a run folder whose records lost their ``config.json``.

Each tool's folder is known by the files it writes at its top (:data:`RECORDS`); a command writing a folder of one
kind refuses a folder that holds any other kind's files, or lies inside an index or saved program folder
(whose files are kept as one) (:func:`out_folder_fault`): ``hcqr eval --run-dir``, ``hcqr index --out``, ``hcqr
compile --out``, ``hcqr compare --out``, ``hcqr replay --out`` and ``hcqr split --out``. A run folder is checked
and claimed for its one writer by :func:`claim_run_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path

from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.records import remove_empty_folders, write_probe

# a run folder's configuration and records (hcqr_dspy.evaluation.run_folder names its summaries)
CONFIG = "config.json"
PREDICTIONS = "predictions.jsonl"
SESSIONS = "sessions.jsonl"
JUDGMENTS = "judgments.jsonl"
OPTION_PROBS = "option_probs.jsonl"
ROW_FILES = (PREDICTIONS, SESSIONS, JUDGMENTS, OPTION_PROBS)  # records its configuration decides

# kind -> (what the folder is called in a message, the command that writes it, the files (globs) that mark it).
# The saved program's, comparison's and replay's names are those of hcqr_dspy.optimize.saved (STATE_FILE,
# META_FILE), hcqr_dspy.reporting.report and hcqr_dspy.workflows.replay (REPORT, SUMMARY), modules above this layer.
RECORDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "run": ("a run folder", "hcqr eval", (CONFIG, PREDICTIONS, SESSIONS)),
    "index": ("an index folder", "hcqr index", ("manifest.json",)),
    "program": ("a saved program folder", "hcqr compile", ("meta.json", "program.json", "seed-*/meta.json")),
    "comparison": ("a comparison folder", "hcqr compare", ("comparison.md", "comparison.json")),
    "replay": ("a replay folder", "hcqr replay", ("replay.md", "replay.json")),
}


def repeated_folder(path: str | Path, seen: dict[Path, str]) -> str | None:
    """``"run folder <path> is given twice (also as <earlier>)"`` when ``path`` resolves to a folder already in
    ``seen`` (resolved folder -> as given); else records it there and returns ``None``."""
    real = Path(path).resolve()
    if real in seen:
        return f"run folder {path} is given twice (also as {seen[real]})"
    seen[real] = str(path)
    return None


def records_held(folder: Path, kinds: tuple[str, ...] = tuple(RECORDS)) -> dict[str, list[str]]:
    """The kinds of :data:`RECORDS` (those of ``kinds``) whose files ``folder`` holds: ``{kind: [file, ...]}`` (paths
    relative to it, in :data:`RECORDS`' order); empty for a missing folder, a file, or a folder of none of them."""
    if not folder.is_dir():
        return {}
    held = {}
    for kind, (_, _, patterns) in RECORDS.items():
        if kind not in kinds:
            continue
        found = [str(p.relative_to(folder)) for pattern in patterns for p in sorted(folder.glob(pattern))]
        if found:
            held[kind] = found
    return held


def enclosing_records(out: Path, what: str) -> tuple[Path, str, list[str]] | None:
    """The nearest folder above ``out`` (resolved) that is an index folder, or a saved program folder when ``what``
    is not ``program`` (a replicate compile writes ``<out>/seed-<N>/``): ``(folder, kind, files)`` as
    :func:`records_held` names them; ``None`` when there is none. ``hcqr index`` replaces its whole folder when it
    rebuilds it, and a saved program's folder is read, registered and copied as one, so records written inside
    either would be lost or mixed in."""
    kinds = ("index",) if what == "program" else ("index", "program")
    for folder in out.resolve().parents:
        held = records_held(folder, kinds)
        if held.get("program") == ["meta.json"]:
            del held["program"]  # a lone meta.json (another tool's) is not a saved program
        if "index" in held and not _is_index(folder):
            del held["index"]  # another tool's manifest.json
        for kind, files in held.items():
            return folder, kind, files
    return None


def _is_index(folder: Path) -> bool:
    """Whether ``folder/manifest.json`` is an hcqr index's (its ``format`` is ``hcqr-index``,
    hcqr_dspy.retrieval.retriever_base's ``INDEX_FORMAT``)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == "hcqr-index"


def link_fault(path: Path) -> str | None:
    """Why ``path`` cannot be written through: it, or a folder on its way, is a symbolic link to nothing (a loop,
    or a target gone: a folder made there would lie elsewhere, or fail with "File exists"); ``None`` otherwise."""
    for place in (path, *path.parents):
        if place.is_symlink() and not place.exists():
            return f"{place} is a symbolic link to nothing (a loop, or its target is gone); remove it"
    return None


def out_folder_fault(out: Path, what: str, option: str = "--out") -> str | None:
    """Why output folder ``out`` cannot hold ``what``, as one line naming the folder, the files that say what it
    is, and what to do; ``None`` when it can.

    Args:
        out: The folder given (missing is fine).
        what: The :data:`RECORDS` kind the command writes (``comparison``, ``replay``, ``run``, ``index``,
            ``program``): its own earlier records are the command's to resume or replace, never refused here.
        option: The command's flag naming ``out``.

    Faults: ``out`` is a file; it is inside an index or saved program folder (:func:`enclosing_records`); it
    holds the records of another kind (:func:`records_held`).
    """
    if fault := link_fault(out):
        return f"{option} {out}: {fault}"
    if out.exists() and not out.is_dir():
        return f"{option} {out} exists and is not a folder; choose another {option}"
    if enclosing := enclosing_records(out, what):
        folder, kind, files = enclosing
        name, command = RECORDS[kind][:2]
        return (
            f"{option} {out} is inside {folder}, {name} (it holds {', '.join(files[:3])}, written by `{command}`); "
            f"write the {what} to a folder of its own, outside it"
        )
    for kind, files in records_held(out).items():
        if kind != what:
            name, command = RECORDS[kind][:2]
            return (
                f"{option} {out} is {name} (it holds {', '.join(files[:3])}, written by `{command}`); "
                f"write the {what} to a folder of its own"
            )
    return None


def run_without_config(folder: Path) -> str | None:
    """Why run folder ``folder`` cannot be started or resumed: it holds a run's records (a non-empty file of
    :data:`ROW_FILES`) but no ``config.json``, so what decided them is unknown and new rows would mix with them;
    ``None`` when it has its ``config.json`` or holds no records."""
    if not folder.is_dir() or (folder / CONFIG).exists():
        return None
    held = []
    for name in ROW_FILES:
        try:
            data = (folder / name).read_bytes()
        except OSError:
            continue
        if data.strip():
            rows = sum(1 for line in data.splitlines() if line.strip())
            held.append(f"{name}: {rows} row{'' if rows == 1 else 's'}" if name == PREDICTIONS else name)
    if not held:
        return None
    return (
        f"run folder {folder} holds the records of a run ({', '.join(held)}) but no {CONFIG}, so the settings they "
        f"were made with are unknown and they cannot be resumed; put its {CONFIG} back, or give --run-dir another "
        "folder"
    )


def run_dir_fault(folder: Path) -> str | None:
    """Why ``hcqr eval --run-dir`` ``folder`` cannot hold a run: it is a file, it holds another tool's records
    (:func:`out_folder_fault`), or a run's records without their ``config.json`` (:func:`run_without_config`);
    ``None`` when it can (missing, empty, or a run folder). A symbolic link to nothing (a loop, a target gone) is
    refused too: a folder made through it would lie elsewhere."""
    if fault := link_fault(folder):
        return f"run folder {folder}: {fault}"
    if folder.exists() and not folder.is_dir():
        return f"run folder {folder} is a file; give --run-dir a folder"
    return out_folder_fault(folder, "run", option="--run-dir") or run_without_config(folder)


def claim_run_dir(folder: Path, command: str) -> tuple[WriterLock, list[Path]]:
    """Check run folder ``folder`` (:func:`run_dir_fault`), create it if needed, check that a file can be written
    in it (:func:`~hcqr_dspy.evaluation.records.write_probe`) and take its
    :class:`~hcqr_dspy.evaluation.lock.WriterLock` for ``command``, before anything is written or any LM is asked.

    Returns:
        The lock taken, and the folders this call created (deepest first; removed again when it fails).

    Raises:
        RunError: :func:`run_dir_fault`'s faults; the folder cannot be created or written (a full or read-only
            disk); another live process writes it (its pid, host and command named).
    """
    if fault := run_dir_fault(folder):
        raise RunError(fault)
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        write_probe(folder)
        return WriterLock(folder, command).acquire(), made
    except OSError as exc:
        remove_empty_folders(made)
        raise RunError(f"run folder {folder} is not writable: {exc.strerror or exc}") from None
    except RunError:
        remove_empty_folders(made)
        raise
