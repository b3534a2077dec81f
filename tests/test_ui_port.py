"""`hcqr ui` on a port another program holds: an error in one line, no link printed, never exit 0."""

import os
import socket

import pytest
from helpers import alive, children

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.tracking import ui as tracking


@pytest.fixture
def taken_port():
    """A port another program listens on at 127.0.0.1 (a real socket, held for the test)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_taken_port_is_an_error_before_any_link_is_printed(mlflow_store, taken_port, capsys):
    assert main(["ui", "--mlflow-dir", str(mlflow_store), "--port", str(taken_port)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"hcqr: error: port {taken_port} on 127.0.0.1 is already in use by another program; stop it or choose "
        "another --port"
    ]


def test_a_host_that_is_not_this_machines_is_one_line(mlflow_store, capsys):
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is never an address of this machine
    assert main(["ui", "--mlflow-dir", str(mlflow_store), "--host", "192.0.2.1", "--port", "5000"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("hcqr: error: cannot serve on 192.0.2.1:5000: ")


def test_a_server_that_loses_the_port_after_the_check_is_an_error_not_exit_0(mlflow_store, taken_port, monkeypatch):
    """The port is taken between the check and MLflow's own bind: uvicorn logs the bind error and MLflow's
    server exits 0; serve_ui reports it as a failure, naming the port, and leaves no server process."""
    real = tracking.check_port
    calls = []
    # children this worker had already (a multiprocessing resource tracker an earlier test file left) are not ours
    before = set(children(os.getpid()))

    def free_at_first(host, port):  # the race: free when checked, taken when the server binds
        calls.append(port)
        if len(calls) > 1:
            real(host, port)

    monkeypatch.setattr(tracking, "check_port", free_at_first)
    with pytest.raises(HCQRError) as caught:
        tracking.serve_ui(mlflow_store, port=taken_port)
    message = str(caught.value)
    assert message == (
        f"the MLflow server for 127.0.0.1:{taken_port} stopped by itself (exit code 0): "
        f"port {taken_port} on 127.0.0.1 is already in use by another program; stop it or choose "
        "another --port"
    )
    assert [p for p in children(os.getpid()) if alive(p) and p not in before] == []
