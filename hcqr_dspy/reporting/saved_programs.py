"""The saved programs of the compared runs, each read once per comparison.

A run of a saved (compiled) program records the program's folder (``config.json``'s ``saved_program.folder``).
The report asks that folder for its compile cost and recipe seed (``meta.json``), its instructions and demos
(``program.json``) and the demos its prompts show. :class:`ProgramFolder` answers all of these from one
:class:`~hcqr_dspy.optimize.saved.SavedProgram` (``meta.json`` validated, ``program.json``'s bytes checked against
its recorded SHA-256, each file opened once); :class:`ProgramFolders` hands out one per distinct folder, so runs
of one program share it. A folder that is not a readable saved program (a ``program.json`` edited since it was
saved, a ``meta.json`` of another shape) is read as plain JSON instead, each file at most once, and what it lacks
is said in the report, not invented.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.optimize.demo_counts import stage_demos
from hcqr_dspy.optimize.saved import META_FILE, STATE_FILE, NoRetriever, SavedProgram, read_saved_program


class ProgramFolder:
    """One saved-program folder as the report reads it; nothing is read until asked, then each file once.

    Attributes:
        folder: The folder as the run records it (relative paths against the working directory).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @cached_property
    def saved(self) -> SavedProgram | None:
        """The saved program (:func:`~hcqr_dspy.optimize.saved.read_saved_program`), ``None`` where the folder is
        not a readable one (missing, another format, ``program.json`` changed since it was saved)."""
        try:
            return read_saved_program(self.folder)
        except HCQRError:
            return None

    @cached_property
    def meta(self) -> tuple[Any, str | None]:
        """``meta.json`` (the saved program's validated record, else the file as plain JSON, any value) and
        ``None``; or ``(None, why not)``: ``"<path> missing"``, ``"<path> unreadable"`` (not UTF-8 JSON)."""
        if self.saved is not None:
            return self.saved.meta, None
        path = self.folder / META_FILE
        try:
            return json.loads(path.read_text(encoding="utf-8")), None
        except OSError:
            return None, f"{path} missing"
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            return None, f"{path} unreadable"

    @cached_property
    def state(self) -> Any:
        """``program.json`` parsed: the DSPy state, one entry per predictor (the saved program's, else the file as
        plain JSON, any value); ``None`` where it is missing or not UTF-8 JSON."""
        if self.saved is not None:
            try:
                return self.saved.state
            except HCQRError:
                return None
        try:
            return json.loads((self.folder / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    @cached_property
    def demo_counts(self) -> dict[str, dict[str, int]] | None:
        """Each stage's demos as its prompt shows them (:func:`~hcqr_dspy.optimize.demo_counts.stage_demos` of the
        program built over no retriever: ``{stage: {"bootstrapped", "labelled", "rendered", "saved"}}``); ``None``
        where the folder is not a saved program that builds."""
        if self.saved is None:
            return None
        try:
            return stage_demos(self.saved.build(NoRetriever()))
        except HCQRError:
            return None


class ProgramFolders:
    """One :class:`ProgramFolder` per distinct folder (by resolved path), for one comparison's runs."""

    def __init__(self) -> None:
        self._folders: dict[Path, ProgramFolder] = {}

    def get(self, folder: str | Path) -> ProgramFolder:
        """The :class:`ProgramFolder` of ``folder``, made on first ask."""
        key = Path(folder).resolve()
        if key not in self._folders:
            self._folders[key] = ProgramFolder(folder)
        return self._folders[key]
