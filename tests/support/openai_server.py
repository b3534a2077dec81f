"""What the tests against a real OpenAI-compatible server share (tests/openai_server/): llama-cpp-python's own server
(tests/support/llama_server.py) serving the smallest packaged model on 127.0.0.1, the demo questions, and the
in-process engine they are held against. The fixtures are in tests/openai_server/conftest.py; each test file there
starts its own server and engine (module scope), so pytest-xdist can run the files on different workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import dspy

from hcqr_dspy.cli import main
from hcqr_dspy.programs.signatures import AnswerQuestion, restrict_letters
from support.cli_args import server_args
from support.llama_server import LocalLlamaServer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "demo"
QIDS = ["demo-002", "demo-013"]  # two: HCQR answers each three times (in-process, hosted_vllm/, openai/)
HCQR = ["--method", "hcqr", "--budget", "3"]  # three passages: short prompts on a shared 2-core machine
KEY_VARIABLE = "LLAMA_SERVER_KEY"  # openai/ needs a key; this server checks none
N_CTX = 7680  # the in-process engine and server here (30 x 256 tokens, as llama.cpp pads the window)
PROBE = "Reply with the word OK."  # check_lm's question (hcqr_dspy/lm/dspy_lm.py): a remote run's first prompt


def lm_args(prefix: str, server: LocalLlamaServer) -> list[str]:
    return server_args(prefix, server, KEY_VARIABLE if prefix == "openai" else None)


def run(demo: Path, name: str, *argv: str, command: str = "eval", qids=QIDS) -> dict[str, dict]:
    """``hcqr COMMAND`` of the demo questions ``qids`` into the run folder ``name``; its rows by qid."""
    questions = ["--dataset", str(DEMO / "questions.json")]
    if command == "predict":
        questions = ["--input", str(DEMO / "questions.json"), "--out", str(demo / f"{name}.jsonl")]
    where = ["--index", str(demo / "idx"), "--ids", ",".join(qids), "--no-mlflow", "--run-dir", str(demo / name)]
    assert main([command, *questions, *where, *argv]) == 0
    return {r["qid"]: r for r in map(json.loads, (demo / name / "predictions.jsonl").read_text().splitlines())}


def ask(lm, adapter):
    """The answer step's signature, its letter narrowed to A-C, asked one demo question through ``adapter``."""
    q = json.loads((DEMO / "questions.json").read_text())["demo-013"]
    options = "\n".join(f"{k}. {v}" for k, v in list(q["options"].items())[:3])
    signature = restrict_letters(AnswerQuestion, "answer", ["A", "B", "C"])
    with dspy.context(lm=lm, adapter=adapter):
        return dspy.Predict(signature)(question=q["question"], options=options, context="")
