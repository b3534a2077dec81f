"""Record files of a run folder: append-only JSONL tables (:class:`JsonlTable`), JSON objects written atomically
(:func:`atomic_write_text`) and read with one-line errors (:func:`read_json_object`), and the write probe a run makes
before it asks any LM (:func:`write_probe`).

A :class:`JsonlTable` holds records keyed by ``qid`` (``session`` for ``sessions.jsonl``), one per line, each
appended whole and fsynced; a partial last line left by a killed writer is dropped when read and its item redone.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.config import read_json
from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.outages import disk_full, disk_full_error


def write_probe(folder: Path) -> None:
    """Create ``folder`` if needed, then write and delete a probe file in it (``.write-test-<pid>``, deleted
    whether the write succeeds or not: a full disk creates the file but cannot write it).

    Raises:
        OSError: the folder cannot be created or written (read-only or full disk, ``/proc`` ...).
    """
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-test-{os.getpid()}"
    try:
        probe.write_text("ok")
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsynced and renamed over it:
    a reader sees the old file or the new one, never half of one.

    Raises:
        DiskFullError: the disk is full (the temporary file is removed). OSError: another write failure.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if disk_full(exc):
            raise disk_full_error(exc) from None
        raise


def read_json_object(file: Path, what: str = "file") -> dict[str, Any]:
    """A JSON object from ``file``.

    Raises:
        RunError: unreadable, not UTF-8, not JSON or not an object (one line naming the file).
    """
    value = read_json(file, RunError, what, hint="repair it or run the step that writes it again")
    if not isinstance(value, dict):
        raise RunError(f"{file} is not a JSON object; repair it or run the step that writes it again")
    return value


class JsonlTable:
    """An append-only JSONL file of records keyed by ``qid``, written by several threads, resumable
    (:func:`hcqr_dspy.evaluation.loop.run_resumable` fills one).

    Args:
        path: The file (created on the first append).
        what: What a record is, for messages (``"prediction"``, ``"judgment"``).
        key: The field every record must have (``qid``; ``session`` for ``sessions.jsonl``).
    """

    def __init__(self, path: Path, what: str = "record", key: str = "qid"):
        self.path = Path(path)
        self.what = what
        self.key = key
        self._lock = threading.Lock()

    def read(self) -> list[dict[str, Any]]:
        """The records, in file order; a partial last line (killed writer) is left out. A last line without its
        newline that is a whole record (a file edited by hand, its final newline lost) is kept: a killed writer
        cannot leave one, since a record is one JSON object and a cut one does not parse.

        Raises:
            RunError: a line that is not UTF-8, not JSON, or not a record with a ``qid`` (its key) that is text
                or a whole number (file and line named).
        """
        return list(self.iter())

    def iter(self) -> Iterator[dict[str, Any]]:
        """:meth:`read`'s records one at a time, the file read line by line (one record in memory at once).

        Raises:
            RunError: as :meth:`read`, when the bad line is reached; the path is a folder, a symbolic link to
                nothing, not a regular file, or cannot be read (a link loop, no permission).
        """
        try:
            if self.path.exists() and not self.path.is_dir() and not self.path.is_file():
                raise RunError(f"{self.path} is not a regular file (a FIFO or device would block); remove it")
            fh = self.path.open("rb")
        except FileNotFoundError:
            if self.path.is_symlink():  # a link to nothing: records that would be written elsewhere, or lost
                raise RunError(f"{self.path} is a symbolic link to nothing; remove it") from None
            return
        except IsADirectoryError:
            raise RunError(f"{self.path} is a folder, not a file of {self.what} records; move it away") from None
        except OSError as exc:
            raise RunError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        with fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n") and _whole_record(raw, self.key) is None:
                    break  # partial write of a killed process: its item is redone
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise RunError(
                        f"{self.path}:{lineno}: not valid UTF-8 (byte {exc.start}); repair or delete that line"
                    ) from None
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RunError(
                        f"{self.path}:{lineno}: not a valid record ({exc.msg}); repair or delete that line"
                    ) from None
                if not isinstance(row, dict) or self.key not in row:
                    raise RunError(
                        f"{self.path}:{lineno}: not a {self.what} record (no {self.key}); repair or delete that line"
                    )
                if not isinstance(row[self.key], str | int) or isinstance(row[self.key], bool):
                    raise RunError(
                        f"{self.path}:{lineno}: its {self.key} is not text or a whole number "
                        f"({json.dumps(row[self.key])[:40]}); repair or delete that line"
                    )
                yield row

    def drop_partial_tail(self) -> None:
        """Cut a partial last line (a killed writer's) so the next append starts on a fresh line; a last line that
        is a whole record without its newline gets the newline instead (see :meth:`read`)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            tail = data[data.rfind(b"\n") + 1 :]
            if _whole_record(tail, self.key) is not None:
                with self.path.open("ab") as fh:
                    fh.write(b"\n")
            else:
                self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, row: dict[str, Any]) -> None:
        """Append one record as one line, flushed and fsynced (thread-safe). A write that fails part-way
        (disk full) is cut back to the last whole line, so the file stays whole; a file this write created is
        removed again.

        Raises:
            OSError: the write failed (disk full, folder removed ...).
        """
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            new = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError as exc:
                    try:
                        os.ftruncate(fd, start)
                        if new:
                            self.path.unlink()
                    except OSError:
                        pass  # a partial last line is dropped by read() and cut by drop_partial_tail()
                    if exc.filename is None:
                        exc.filename = str(self.path)
                    raise
            finally:
                os.close(fd)


def _whole_record(raw: bytes, key: str) -> dict[str, Any] | None:
    """``raw`` (one line, no newline) as a record holding ``key``, or ``None`` when it is not one."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return row if isinstance(row, dict) and key in row else None


def remove_empty_folders(folders: Sequence[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
