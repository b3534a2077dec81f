"""`hcqr ui` runs the real MLflow server on 127.0.0.1 and, when stopped, stops it and all its workers."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import alive, children, free_port, wait_until_serving

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_hcqr_ui_stops_its_server_and_workers_when_stopped(mlflow_store):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hcqr_dspy.cli",
            "ui",
            "--mlflow-dir",
            str(mlflow_store),
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
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
        printed = proc.stderr.read()
        # the links it prints: MLflow 3.17's Evaluation runs page and the every-run table with the key metrics
        assert re.search(rf"evaluation runs: http://127\.0\.0\.1:{port}/#/experiments/\d+/evaluation-runs\n", printed)
        assert re.search(r"/#/experiments/\d+/runs\?viewStateShareKey=hcqr-key-metrics", printed)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tree:  # a failed test must not leave a server behind
            if alive(p):
                os.kill(p, signal.SIGKILL)
