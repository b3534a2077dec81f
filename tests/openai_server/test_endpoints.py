"""What each endpoint prefix sends and what the server makes of it: the same prompt and schema as the in-process
engine, free text without the schema, a refused schema dialect, a reply cut at max_tokens, a compile over the
server, and the server stopping with its whole process group."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from dspy.utils.exceptions import AdapterParseError
from helpers import alive, children
from support.llama_server import LocalLlamaServer, running_or_skip
from support.openai_server import DEMO, KEY_VARIABLE, PROBE, QIDS, ask, lm_args, run

from hcqr_dspy.cli import main
from hcqr_dspy.errors import LMCapabilityError
from hcqr_dspy.lm import build_lm
from hcqr_dspy.lm.adapter import HCQRAdapter

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("prefix", ["hosted_vllm", "openai"])
def test_both_paths_send_the_same_prompt_and_schema_and_get_the_same_reply(server, local_lm, monkeypatch, prefix):
    engine, sent = local_lm.engine, []

    def spy(**kwargs):  # what the in-process engine hands llama.cpp
        sent.append(kwargs)
        return real(**kwargs)

    real = engine.llm.create_chat_completion
    key = KEY_VARIABLE if prefix == "openai" else None
    remote = build_lm(f"{prefix}/{server.alias}", api_base=server.base, api_key_env=key, cache=False, num_retries=0)
    for lm in (local_lm, remote):
        lm(PROBE, max_tokens=5)  # the same previous prompt on both
    monkeypatch.setattr(engine.llm, "create_chat_completion", spy)
    mine, theirs = ask(local_lm, HCQRAdapter()), ask(remote, HCQRAdapter())
    [call] = sent
    entry = remote.history[-1]
    assert entry["messages"] == call["messages"]  # the same system and user messages, word for word
    assert entry["kwargs"]["response_format"] == call["response_format"]  # the same schema, so the same grammar
    assert call["response_format"]["schema"]["properties"]["answer"]["enum"] == ["A", "B", "C"]
    assert entry["usage"]["prompt_tokens"] == local_lm.history[-1]["usage"]["prompt_tokens"]  # rendered alike
    assert (theirs.reasoning, theirs.answer) == (mine.reasoning, mine.answer)
    reply = json.loads(entry["outputs"][0])  # the schema was obeyed: its fields, in order, a letter it allows
    assert list(reply) == ["reasoning", "answer"] and reply["answer"] in "ABC"


def test_without_the_schema_the_server_writes_free_text(server):
    """The control: DSPy alone sends this unlisted model no response_format (the disagreement users saw)."""
    remote = build_lm(f"hosted_vllm/{server.alias}", api_base=server.base, cache=False, num_retries=0)
    with pytest.raises(AdapterParseError):
        ask(remote, HCQRAdapter("off"))
    assert "response_format" not in remote.history[-1]["kwargs"]


def test_a_schema_dialect_the_server_refuses_stops_with_the_setting_to_change(server):
    remote = build_lm(f"hosted_vllm/{server.alias}", api_base=server.base, cache=False, num_retries=0)
    with pytest.raises(LMCapabilityError) as caught:
        ask(remote, HCQRAdapter("json_schema"))  # OpenAI's dialect: llama-cpp-python's server answers HTTP 500
    message = str(caught.value)
    assert "\n" not in message and "set HCQR_RESPONSE_FORMAT=json_object (llama-cpp-python's server)" in message
    assert "Input should be 'text' or 'json_object'" in message


@pytest.mark.parametrize("prefix", ["hosted_vllm", "openai"])
def test_a_reply_cut_at_max_tokens_is_an_invalid_cause(demo, server, prefix):
    rows = run(demo, f"cut-{prefix}", "--method", "cot", "--max-tokens", "8", *lm_args(prefix, server))
    for row in rows.values():
        assert (row["valid"], row["invalid_stage"], row["invalid_cause"]) == (False, "answer", "truncated")
        assert "max_tokens=8" in row["error"] and row["stages"]["answer"]["completion_tokens"] == 8
    metrics = json.loads((demo / f"cut-{prefix}" / "metrics.json").read_text())
    assert metrics["invalid_answer_truncated"] == len(QIDS)


def test_compile_over_the_server(demo, server):
    train = demo / "train.json"
    questions = json.loads((DEMO / "questions.json").read_text())
    train.write_text(json.dumps({qid: questions[qid] for qid in sorted(questions)[:4]}))
    out = demo / "compiled"
    argv = ["compile", "--recipe", "bootstrap_fewshot", "--program", "cot", "--train", str(train), "--train-size", "4"]
    assert main([*argv, "--out", str(out), "--no-mlflow", *lm_args("openai", server)]) == 0
    assert (out / "meta.json").is_file()


def test_the_server_stops_with_its_whole_process_group():
    srv = LocalLlamaServer()
    with running_or_skip(srv) as base:
        tree = [srv.process.pid, *children(srv.process.pid)]
        with urllib.request.urlopen(f"{base}/models", timeout=10) as reply:
            assert [m["id"] for m in json.load(reply)["data"]] == ["smollm2-135m"]
    assert srv.process is None and [p for p in tree if alive(p)] == []
    with pytest.raises(urllib.error.URLError):  # nothing answers on its port any more
        urllib.request.urlopen(f"{base}/models", timeout=5)


def test_the_server_dies_with_the_process_that_started_it():
    """A test process killed outright (SIGKILL: no fixture teardown) leaves no server behind: the server gets
    SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``)."""
    script = (
        f"import sys, time; sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from support.llama_server import LocalLlamaServer, LlamaServerError\n"
        "s = LocalLlamaServer()\n"
        "try:\n    s.start()\nexcept LlamaServerError as exc:\n    print('skip', exc, flush=True); sys.exit(0)\n"
        "print(s.process.pid, flush=True); time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    line = ""
    try:
        line = starter.stdout.readline().strip()
        if line.startswith("skip"):
            pytest.skip(f"the server could not start: {line}")
        assert line.isdigit(), f"the starting process printed no server pid (exit code {starter.poll()})"
        server = int(line)
        assert alive(server)
        starter.kill()
        starter.wait(10)
        deadline = time.monotonic() + 30
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server)
    finally:
        starter.kill()
        starter.wait(10)
        if line.isdigit() and alive(int(line)):  # the test failed: do not leave the server running
            os.killpg(int(line), signal.SIGKILL)
