"""The MLflow UI (``hcqr ui``): ``mlflow server`` on the store, checked before it starts and stopped with all
its workers."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.tracking.store import tracking_uri

# Signals that stop `hcqr ui` (SIGKILL cannot be caught: the server then gets SIGTERM from the kernel, below).
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
STOP_GRACE_SECONDS = 5.0


def serve_ui(path: str | Path | None = None, host: str = "127.0.0.1", port: int = 5000, workers: int = 1) -> int:
    """Run the MLflow UI (``mlflow server``) for the store at ``path`` until it exits or this process is stopped.

    The server runs in its own process group (session): MLflow starts a uvicorn parent with worker
    processes, so stopping only the process we started would leave the workers serving. On any of
    :data:`STOP_SIGNALS`, and on any exit of this function, the whole group gets SIGTERM, then SIGKILL
    after :data:`STOP_GRACE_SECONDS`. On Linux the server also gets SIGTERM if this process dies
    (``PR_SET_PDEATHSIG``), so even a SIGKILL of ``hcqr ui`` does not leave it running.
    MLflow's server-side job runner (online scoring, judges run from the UI) is turned off
    (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``): it starts seven more worker processes.

    The port is checked first (:func:`check_port`). A server that exits without being stopped is a
    failure: MLflow's server exits 0 when uvicorn cannot bind its port (taken between the check and
    the bind), and otherwise it stops only when told to.

    Returns:
        0 when it was stopped by a signal.

    Raises:
        HCQRError: the port cannot be bound (:func:`check_port`), or the server stopped by itself
            (its exit code, and whether another program holds the port now).
    """
    check_port(host, port)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        ui_command(path, host, port, workers), env=env, start_new_session=True, preexec_fn=die_with_parent
    )
    stopped: list[int] = []

    def on_signal(signum, _frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = {name: signal.signal(getattr(signal, name), on_signal) for name in STOP_SIGNALS if hasattr(signal, name)}
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
        stop_process_group(proc)
    if stopped:
        return 0
    try:
        check_port(host, port)
        why = "its log is above"
    except HCQRError as exc:
        why = str(exc)
    raise HCQRError(f"the MLflow server for {host}:{port} stopped by itself (exit code {code}): {why}")


def check_port(host: str, port: int) -> None:
    """Refuse to serve on ``host:port`` when this machine cannot bind it: another program listens there, the
    host is not one of this machine's addresses, or the port needs privileges. The socket is bound as
    uvicorn binds it (IPv6 when ``host`` holds a ``:``, ``SO_REUSEADDR`` set, so a port left in TIME_WAIT is
    free) and closed at once.

    Raises:
        HCQRError: one line naming the host and port and what to do.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except socket.gaierror as exc:
        raise HCQRError(
            f"cannot serve on {host}:{port}: {host!r} is not a known host name ({exc.strerror}); "
            "give --host an address of this machine"
        ) from None
    except OverflowError:
        raise HCQRError(f"cannot serve on {host}:{port}: a port is 1 to 65535") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise HCQRError(
                f"port {port} on {host} is already in use by another program; stop it or choose another --port"
            ) from None
        raise HCQRError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def ui_command(
    path: str | Path | None = None, host: str = "127.0.0.1", port: int = 5000, workers: int = 1
) -> list[str]:
    """The ``mlflow server`` command line of :func:`serve_ui`."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        tracking_uri(path),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except OSError:
            pass


def stop_process_group(proc, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process group led by ``proc`` (started with ``start_new_session=True``), wait up
    to ``grace`` seconds for its leader, then SIGKILL whatever is left of the group."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return  # the group is empty
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
