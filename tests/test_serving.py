"""A compiled program registered by `hcqr compile --register` and served by MLflow's real scoring server
(`mlflow models serve --env-manager local` on 127.0.0.1): a question posted over REST gets HCQR's answer,
hypothesis, queries and passages. The LM is the stub OpenAI-compatible server (tests/stub_server.py)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import TINY_ROWS, alive, children, free_port, snippet, wait_until_serving, write_jsonl
from hcqr_dspy.cli import main
from hcqr_dspy.serving import SERVE_TIMEOUT_S
from stub_server import OPTIONS, SECRET, Stub

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_registered_compiled_program_is_served_over_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STUB_KEY", SECRET)
    stub = Stub()
    store = tmp_path / "mlruns"
    write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
    assert main(["index", "--corpus", str(tmp_path / "corpus.jsonl"), "--retriever", "bm25", "--out", str(tmp_path / "idx")]) == 0
    train = {f"{i:04d}": {"question": f"Question number {i}? A patient on digoxin sees yellow halos.", "options": OPTIONS,
                          "answer": "ABC"[(i * 2) % 3]} for i in range(4)}
    (tmp_path / "train.json").write_text(json.dumps(train))
    lm = ["--lm", "openai/stub-model", "--api-base", stub.base, "--api-key-env", "STUB_KEY"]
    assert main(["compile", "--recipe", "bootstrap_fewshot", "--program", "hcqr", "--train", str(tmp_path / "train.json"),
                 "--train-size", "4", "--index", str(tmp_path / "idx"), "--out", str(tmp_path / "prog"),
                 "--register", "served-hcqr", "--mlflow-dir", str(store), *lm]) == 0
    out = capsys.readouterr().out
    assert "registered as models:/served-hcqr/1" in out
    # the server is started exactly as the hint says (on a free port): a request may take SERVE_TIMEOUT_S, not
    # MLflow's 60 s default, which a local model on a CPU exceeds on one HCQR question (HTTP 504)
    [hint] = [line for line in out.splitlines() if " mlflow models serve " in line]
    store_var, mlflow_cmd, *serve_args = shlex.split(hint)
    variable, tracking_uri = store_var.split("=", 1)
    assert (variable, mlflow_cmd) == ("MLFLOW_TRACKING_URI", "mlflow") and tracking_uri.endswith(f"{store.name}/mlflow.db")
    assert serve_args[:3] == ["models", "serve", "-m"] and serve_args[3] == "models:/served-hcqr/1"
    assert serve_args[serve_args.index("-t") + 1] == str(SERVE_TIMEOUT_S) and SERVE_TIMEOUT_S >= 600
    assert serve_args[serve_args.index("-h") + 1] == "127.0.0.1"

    port = free_port()
    serve_args[serve_args.index("-p") + 1] = str(port)
    # MLflow's scoring server runs `uvicorn` from PATH: the virtualenv's bin folder, as when it is activated
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen([sys.executable, "-m", "mlflow", *serve_args],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    tree: list[int] = []
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/ping", server)
        tree = [server.pid, *children(server.pid)]
        seen = len(stub.seen)
        body = json.dumps({"dataframe_records": [{"question": "Question number 7? Yellow halos after a new drug.",
                                                  "options": OPTIONS}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            [answer] = json.loads(reply.read())["predictions"]
        # the stub answers question 7 with "ABC"[14 % 3] = "C", through the hypothesis, rewrite and answer steps
        assert answer["answer"] == "C" and answer["answer_text"] == OPTIONS["C"] and answer["valid"] is True
        assert answer["hypothesis"]["working_hypothesis"] == "C"
        assert answer["queries"] == ["digoxin toxicity nausea", "digoxin versus hypokalemia", "yellow vision elderly"]
        assert answer["passages"] and {"id", "title", "score", "found_by"} <= set(answer["passages"][0])
        assert len(stub.seen) - seen == 3  # hypothesis, rewrite, answer: the served program called the LM itself
        # the compiled demos reached the served prompts (the answer step shows bootstrapped examples)
        assert "Question number 0?" in stub.seen[-1][1] or "Question number 1?" in stub.seen[-1][1]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in tree:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        stub.stop()
    assert [p for p in tree if alive(p)] == []
