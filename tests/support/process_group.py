"""What the test servers (``milvus_server.py``, ``llama_server.py``) share: a server started as a context manager,
started-or-skipped for a test, and its process group signalled and polled (``os.killpg``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ServerProcess:
    """A server with ``start() -> address`` and ``stop()``, usable as ``with Server(...) as s``."""

    def start(self) -> str:  # pragma: no cover - each server defines it
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - each server defines it
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def running_or_skip(server: ServerProcess, error: type[Exception], what: str) -> Iterator[str]:
    """Start ``server`` and give its address, stopping it on the way out; when it cannot start (``error``), skip
    the test that asked for it, saying why (for tests and fixtures: it imports pytest)."""
    import pytest

    try:
        try:
            address = server.start()
        except error as exc:
            pytest.skip(f"{what} cannot start here: {exc}")
        yield address
    finally:
        server.stop()


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a process group; a group that is gone already is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is still alive."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen | None, timeout: float, error: type[Exception], what: str) -> None:
    """Stop a server that leads its own process group (``start_new_session=True``) and every process of it:
    SIGTERM, then SIGKILL after ``timeout`` seconds, until none is left (10 s at most). ``None``: nothing to do.

    Raises:
        error: a process of the group survived SIGKILL.
    """
    if proc is None:
        return
    pgid = proc.pid
    signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        signal_group(pgid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        signal_group(pgid, signal.SIGKILL)
        time.sleep(0.1)
    if group_alive(pgid):
        raise error(f"processes of {what}'s group {pgid} survived SIGKILL")
