"""`hcqr ui` runs the real MLflow server on 127.0.0.1 and, when stopped, stops it and all its workers."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (exited, not yet reaped by its new parent) counts as stopped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"hcqr ui exited early with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_hcqr_ui_stops_its_server_and_workers_when_stopped(mlflow_store):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "hcqr_dspy.cli", "ui", "--mlflow-dir", str(mlflow_store),
                             "--port", str(port), "--workers", "2"], env=env, stderr=subprocess.PIPE, text=True)
    tree: list[int] = []
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", proc)
        tree = children(proc.pid)
        # hcqr -> mlflow server -> uvicorn -> 2 workers (and multiprocessing's resource tracker)
        assert len(tree) >= 4, tree
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in tree if alive(p)] == []
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tree:  # a failed test must not leave a server behind
            if alive(p):
                os.kill(p, signal.SIGKILL)
