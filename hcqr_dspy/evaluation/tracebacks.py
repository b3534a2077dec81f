"""A run folder's ``tracebacks/<qid>.txt``: the traceback of a question whose program raised an error that
is not a bad LM reply (the run stopped there), removed once the question has a row."""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

TRACEBACKS = "tracebacks"


def traceback_file(folder: Path, qid: str) -> Path:
    """``<folder>/tracebacks/<qid>.txt``, the id made a file name (characters other than letters, digits and
    ``-_.`` become ``_``)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(qid)) or "question"
    return folder / TRACEBACKS / f"{safe}.txt"


def save_traceback(folder: Path, qid: str, exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to :func:`traceback_file`; ``None`` if that cannot be written."""
    path = traceback_file(folder, qid)
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        return path
    except OSError:
        return None


def clear_traceback(folder: Path, qid: str) -> None:
    """Remove the question's traceback file (it has a row now), and ``tracebacks/`` once it is empty."""
    path = traceback_file(folder, qid)
    if path.is_file():
        path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only when empty
