"""A run folder's ``tracebacks/<prefix>-<hash>.txt``: the traceback of a question whose program raised an error
that is not a bad LM reply (the run stopped there), removed once the question has a row.

The file is named by the SHA-256 of the question id, so that any id (thousands of characters, ``/``, characters
a file name cannot hold) gets a file of its own: ``<prefix>`` is up to :data:`PREFIX_CHARS` readable characters
of the id (ASCII letters, digits and ``-_.``; others become ``_``), ``<hash>`` the first :data:`HASH_CHARS` hex
digits of the hash of the whole id (UTF-8). The file's first line names the whole id, as JSON
(``qid: "a/b"``); the traceback follows a blank line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import traceback
from pathlib import Path

TRACEBACKS = "tracebacks"
PREFIX_CHARS = 40
HASH_CHARS = 16


def traceback_file(folder: Path, qid: str) -> Path:
    """``<folder>/tracebacks/<prefix>-<hash>.txt`` (see the module docstring); the name is at most
    ``PREFIX_CHARS + HASH_CHARS + 5`` ASCII characters whatever the id."""
    qid = str(qid)
    readable = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in qid[:PREFIX_CHARS])
    digest = hashlib.sha256(qid.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    prefix = readable.lstrip(".") or "question"  # never a hidden file
    return folder / TRACEBACKS / f"{prefix}-{digest}.txt"


def save_traceback(folder: Path, qid: str, exc: BaseException) -> Path | None:
    """Write the id's line and ``exc``'s traceback to :func:`traceback_file`; ``None`` if that cannot be written."""
    path = traceback_file(folder, qid)
    head = f"qid: {json.dumps(str(qid), ensure_ascii=False)}\n\n"
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(head + "".join(traceback.format_exception(exc)), encoding="utf-8", errors="backslashreplace")
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
