"""Refusing, before a question is answered, to add rows on another setup to runs meant to share one.

``hcqr compare --strict-setup`` refuses runs whose recorded setups differ (:mod:`hcqr_dspy.reporting.setups`), but
only once every run is done: a study resumed on a machine with another llama.cpp build (or another dspy, model file,
batch size ...) would answer for hours and then be refused, or leave a run *mixed*. With a strict setup (``hcqr eval
--strict-setup``, an experiment file's ``comparison: {strict_setup: true}``), this session's setup is checked first
against every ``hcqr eval`` session the given run folders recorded, with the fields ``hcqr compare`` compares for a
session (:func:`hcqr_dspy.reporting.setup_fields.lm_fields`: model file, build and CPU features, batches, flash
attention, repacking, threads with flash attention on, an endpoint's model card, the versions of dspy and
llama-cpp-python or litellm, the questions in flight), and the first field that differs is named.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import SetupMismatchError
from hcqr_dspy.evaluation.folders import SESSIONS
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm.reply_setup import UNRECORDED
from hcqr_dspy.optimize.saved import read_meta
from hcqr_dspy.reporting.setup_fields import field_rank, lm_fields, shown_value


def session_fields(session: dict[str, Any]) -> dict[str, Any]:
    """The setup fields of a session record (``sessions.jsonl``), as ``hcqr compare`` compares them."""
    return lm_fields(
        session.get("engine"), session.get("endpoint"), session.get("packages"), session.get("questions_in_flight")
    )


def recorded_setups(folders: Iterable[str | Path]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, fields)`` of every ``hcqr eval`` session the run folders recorded (a folder without
    ``sessions.jsonl`` recorded none); ``where``: ``FOLDER (session N)``.

    Raises:
        SetupMismatchError: a folder holds rows that no recorded session wrote (written before sessions were
            recorded, or ``sessions.jsonl`` lost): they cannot be checked.
        RunError: a malformed ``sessions.jsonl`` (:meth:`~hcqr_dspy.evaluation.run_folder.RunFolder.sessions`).
    """
    for path in dict.fromkeys(Path(f) for f in folders):
        folder = RunFolder(path)
        evals = [s for s in folder.sessions() if s.get("command") == "eval"] if (path / SESSIONS).is_file() else []
        first = evals[0]["predictions_before"] if evals else None
        rows = sum(1 for _ in folder.predictions.iter()) if first != 0 else 0
        if rows and first != 0:  # rows that no recorded session wrote: their setup is unknown
            raise SetupMismatchError(
                f"strict setup: {min(rows, first or rows)} row(s) of {path} were written before any recorded "
                f"{SESSIONS} session (an earlier version, or the file was lost), so whether they share this setup "
                "cannot be checked; drop the strict setup to resume it as a run of unverified setup; nothing was "
                "written"
            )
        for session in evals:
            yield f"{path} (session {session['session']})", session_fields(session)


def check_same_setup(session: dict[str, Any], folders: Iterable[str | Path]) -> None:
    """Refuse ``session`` (:func:`~hcqr_dspy.evaluation.provenance.session_record` of the LM about to answer) when a
    field it shares with a session recorded in ``folders`` has another value there.

    Raises:
        SetupMismatchError: naming the field, both values and the folder and session that recorded the other.
        RunError: a malformed ``sessions.jsonl``.
    """
    _refuse_other(session_fields(session), recorded_setups(folders), "answer", "record a mixed run")


def check_same_compile_setup(session: dict[str, Any], programs: Iterable[str | Path]) -> None:
    """Refuse ``session`` (the compile's :func:`~hcqr_dspy.evaluation.provenance.session_record`) when a field it
    shares with the compile session that a saved program in ``programs`` recorded (``meta.json``'s
    ``compile_setup``), or with the setup of a cached reply that compile was served (its ``cached_setups``), has
    another value there; or when a saved program records no setup, or was served cached replies of an unrecorded
    setup (it cannot be checked).

    Raises:
        SetupMismatchError: naming the field and both values, or the program that cannot be checked.
    """
    recorded = []
    for folder in programs:
        setup = read_meta(folder).get("compile_setup")
        record = setup.get("session") if isinstance(setup, dict) else None
        cached = setup.get("cached_setups") if isinstance(setup, dict) else None
        if not isinstance(record, dict) or not isinstance(cached, list):
            raise SetupMismatchError(
                f"strict setup: the saved program {folder} records no compile setup (saved before programs "
                "recorded one, or edited), so whether it was compiled on this setup cannot be checked; nothing was "
                "written"
            )
        recorded.append((str(folder), session_fields(record)))
        for entry in cached:
            other = entry.get("record") if isinstance(entry, dict) else None
            if isinstance(other, dict):  # a reply made under another setup, served from the cache
                recorded.append((f"{folder} (a cached reply it was served)", session_fields(other)))
            elif not isinstance(entry, dict) or entry.get("setup") == UNRECORDED or not entry.get("setup"):
                raise SetupMismatchError(
                    f"strict setup: the saved program {folder} was served cached replies of an unrecorded setup "
                    f"({str(entry)[:80]}), so whether it was compiled on this setup cannot be checked; nothing was "
                    "written"
                )
    _refuse_other(session_fields(session), recorded, "compile", "save seeds compiled on different setups")


def _refuse_other(now: dict[str, Any], recorded: Iterable[tuple[str, dict[str, Any]]], verb: str, else_: str) -> None:
    """Raise on the first field (in the report's order) of ``now`` that a ``(where, fields)`` of ``recorded``
    holds with another value."""
    for where, fields in recorded:
        for name in sorted(now.keys() & fields.keys(), key=field_rank):
            if now[name] != fields[name]:
                raise SetupMismatchError(
                    f"strict setup: this session's {name} is {shown_value(now[name])}, but {where} recorded "
                    f"{shown_value(fields[name])}; {verb} on that setup (the same machine kind, build, settings and "
                    f"library versions), or drop the strict setup to {else_}; nothing was written"
                )
