"""One writer per folder, across processes: :class:`WriterLock`, an exclusive ``flock`` on a lock file that names
its holder."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from hcqr_dspy.errors import RunError

# The writer lock of a folder (hidden: never logged as a record file).
WRITER_LOCK = ".writer.lock"


class WriterLock:
    """One writer per folder, across processes: an exclusive ``fcntl.flock`` on ``<folder>/.writer.lock``.

    The lock file names its holder (pid, host, command, start time) so that a refused process can say who
    writes the folder, and is removed when the lock is released. The kernel drops a ``flock`` when its
    process dies, so a lock file left by a killed process is taken over at once (its stale label is
    overwritten). A process that locked a file another one removed meanwhile (released) locks again, so two
    writers never hold two files. Within one process the lock is re-entrant (an experiment evaluates, then
    judges, the same folder): it is released when the last holder releases it. POSIX only (``fcntl``); on a
    network file system ``flock`` is only as good as the server's locking.

    Args:
        folder: The folder written (it must exist).
        command: What writes it (``eval``, ``judge``, ``compile``), for the refusal message.
        lock_file: The lock file (default ``<folder>/.writer.lock``).
    """

    _held: dict[str, list] = {}  # resolved lock file -> [open lock file, holders in this process]
    _guard = threading.Lock()

    def __init__(self, folder: str | Path, command: str, lock_file: str | Path | None = None):
        self.folder = Path(folder)
        self.command = command
        self.file = Path(lock_file) if lock_file else self.folder / WRITER_LOCK
        self.key = str(self.file.resolve())

    def acquire(self) -> WriterLock:
        """Take the lock, or refuse.

        Raises:
            RunError: another live process holds it (its pid, host, command and start named), or the lock file
                cannot be created.
        """
        import fcntl  # POSIX only: imported here so that the module (and a folder opened to read) works elsewhere

        with self._guard:
            if self.key in self._held:
                self._held[self.key][1] += 1
                return self
            while True:
                try:
                    fh = open(self.file, "a+", encoding="utf-8")
                except OSError as exc:
                    raise RunError(f"cannot lock {self.folder}: {exc.strerror or exc}") from None
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    holder = _read_holder(fh)
                    fh.close()
                    raise RunError(
                        f"{self.folder} is being written by another process ({holder}); wait for it to "
                        "finish or stop it, or use another folder"
                    ) from None
                try:
                    if os.stat(self.file).st_ino == os.fstat(fh.fileno()).st_ino:
                        break
                except FileNotFoundError:
                    pass
                fh.close()  # the holder released and removed this file between our open and our lock: again
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": self.command,
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            try:
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(info) + "\n")
                fh.flush()
            except OSError:
                pass  # the lock holds without its label (a full disk); a refused process then says "holder unknown"
            self._held[self.key] = [fh, 1]
        return self

    def release(self) -> None:
        """Give the lock up: the last holder in this process removes the lock file, then closes it (which drops
        the ``flock``)."""
        with self._guard:
            held = self._held.get(self.key)
            if held is None:
                return
            held[1] -= 1
            if held[1] == 0:
                del self._held[self.key]
                with contextlib.suppress(OSError):
                    self.file.unlink()
                with contextlib.suppress(OSError):  # a label a full disk refused is flushed again here: dropped
                    held[0].close()  # the file is closed (and its flock dropped) all the same

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


_UNKNOWN = "holder unknown"


def _read_holder(fh, wait_s: float = 2.0) -> str:
    """The holder named in an open lock file. The holder writes its label right after it takes the ``flock``,
    so a reader that comes in between finds the file empty (or half written): it reads again for up to
    ``wait_s`` seconds before it says ``holder unknown``."""
    deadline = time.monotonic() + wait_s
    while True:
        fh.seek(0)
        holder = _holder(fh.read())
        if holder != _UNKNOWN or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)


def _holder(text: str) -> str:
    """``pid 123 on host h, `hcqr eval` since <UTC start>`` from a lock file's label (``holder unknown`` if
    unreadable)."""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, `hcqr {info['command']}` since {info['started']}"
    except (ValueError, KeyError, TypeError):
        return _UNKNOWN
