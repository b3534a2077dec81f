"""hcqr against a real OpenAI-compatible server: llama-cpp-python's own (tests/support/llama_server.py), serving the
smallest packaged model on 127.0.0.1, reached under the prefixes users give vLLM and generic endpoints
(``hosted_vllm/``, ``openai/`` with ``--api-base``), one and several questions in flight.

What must come through: the output schema (HCQR_RESPONSE_FORMAT=json_object, the dialect llama-cpp-python's
server takes; hcqr_dspy/lm/adapter.py), token usage in every row, a reply cut at max_tokens counted as an invalid
cause, and at temperature 0 the very replies of hcqr's in-process engine on the same model and prompts: the
server runs the same ``Llama`` class with the same chat template, sampler and settings.

A prompt's arithmetic depends on what the engine computed before it: llama.cpp resumes from the KV cache of the
longest prefix it holds (the previous prompt's, or a state the prompt cache kept) and computes only the rest, in
other batches, and a near-tie can then break the other way. So the exact comparisons run both engines over the same
history: the prompt cache off on both (``HCQR_PROMPT_CACHE_MB=0``: each resumes only from its previous prompt), the
in-process engine this module's own (its window :data:`N_CTX` keys it apart from other modules' engines), each
sent :data:`PROBE` first (the question ``check_lm`` asks a remote LM before a run), and one question in flight.
With several in flight the server's order differs from a sequential run's: those runs are held to what does not
depend on it. SmolLM2-135M cannot answer medical questions; agreement, not accuracy, is asserted.
"""

import json
import urllib.error
import urllib.request
from pathlib import Path

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError
from helpers import alive, children
from support.cli_args import server_args
from support.llama_server import LocalLlamaServer, running_or_skip

from hcqr_dspy.cli import main
from hcqr_dspy.errors import LMCapabilityError
from hcqr_dspy.judge.labels import LABELS
from hcqr_dspy.lm import build_lm
from hcqr_dspy.lm.adapter import RESPONSE_FORMAT_VARIABLE, HCQRAdapter
from hcqr_dspy.programs.signatures import AnswerQuestion, restrict_letters

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"
QIDS = ["demo-002", "demo-013", "demo-014"]
HCQR = ["--method", "hcqr", "--budget", "3"]  # three passages: short prompts on a shared 2-core machine
KEY_VARIABLE = "LLAMA_SERVER_KEY"  # openai/ needs a key; this server checks none
N_CTX = 7680  # this module's in-process engine and server (30 x 256 tokens, as llama.cpp pads the window)
PROBE = "Reply with the word OK."  # check_lm's question (hcqr_dspy/lm/build.py): a remote run's first prompt


@pytest.fixture(scope="module")
def server():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(RESPONSE_FORMAT_VARIABLE, "json_object")
        mp.setenv(KEY_VARIABLE, "sk-local-test")
        mp.setenv("HCQR_PROMPT_CACHE_MB", "0")  # read by the server's command line and the engine made below
        mp.setenv("HCQR_N_THREADS", "1")  # flash attention's sums depend on the thread count: equal on both sides
        # without flash attention, as these tests were first run: with it on, the openai/ predict test's first
        # request (check_lm's 5-token probe) got no reply within its 60 s timeout, a cause not yet traced
        mp.setenv("HCQR_FLASH_ATTN", "0")
        srv = LocalLlamaServer(n_ctx=N_CTX)
        with running_or_skip(srv):
            yield srv


@pytest.fixture(scope="module")
def local_lm(server):
    """The in-process LM on this module's own engine (made now, with the prompt cache off)."""
    lm = build_lm("local:smollm2-135m", n_ctx=N_CTX, cache=False)
    assert lm.engine.settings.prompt_cache_mb == 0
    return lm


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo questions and a BM25 index of the demo corpus."""
    root = tmp_path_factory.mktemp("openai-server")
    assert (
        main(["index", "--corpus", str(DEMO / "corpus.jsonl"), "--retriever", "bm25", "--out", str(root / "idx")]) == 0
    )
    return root


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


@pytest.fixture(scope="module")
def in_process(demo, local_lm):
    local_lm(PROBE, max_tokens=5)  # the engine's last prompt before the run, as the server's will be
    return run(demo, "local", *HCQR, "--lm", "local:smollm2-135m", "--n-ctx", str(N_CTX))


@pytest.fixture(scope="module")
def over_vllm(demo, server, in_process):
    return run(demo, "vllm", *HCQR, *lm_args("hosted_vllm", server))


def assert_same_replies(remote: dict[str, dict], local: dict[str, dict]) -> None:
    """Row for row: the same hypothesis, queries, reasoning and answer, and per LM stage the same prompt and reply
    token counts (the server's usage against llama.cpp's own), each recorded and above zero."""
    assert sorted(remote) == sorted(local) == sorted(QIDS)
    for qid, row in remote.items():
        ref = local[qid]
        for key in ("prediction", "valid", "invalid_cause", "hypothesis", "queries", "reasoning"):
            assert row[key] == ref[key], (qid, key)
        for name in ("hypothesis", "rewrite", "answer"):
            got, want = row["stages"][name], ref["stages"][name]
            assert got["lm_calls"] == want["lm_calls"] == 1, (qid, name)
            assert got["prompt_tokens"] == want["prompt_tokens"] > 0, (qid, name)
            assert got["completion_tokens"] == want["completion_tokens"] > 0, (qid, name)
        assert row["prompt_tokens"] == ref["prompt_tokens"] and row["completion_tokens"] == ref["completion_tokens"]


def test_eval_over_hosted_vllm_gives_the_in_process_replies(demo, in_process, over_vllm):
    assert_same_replies(over_vllm, in_process)
    assert all(r["valid"] for r in over_vllm.values())  # every step's reply obeyed its schema
    lm = json.loads((demo / "vllm" / "config.json").read_text())["lm"]
    assert (lm["spec"], lm["response_format"]) == ("hosted_vllm/smollm2-135m", "json_object")


def test_predict_over_openai_with_three_in_flight(demo, server, in_process):
    """Three questions at once: every step answered under its schema and its tokens recorded; the first step's
    prompt (the question alone) is the in-process one to the token. Later steps' prompts hold earlier replies,
    which the server's order of requests can change (the module's notes)."""
    rows = run(demo, "openai", *HCQR, "--threads", "3", *lm_args("openai", server), command="predict")
    assert sorted(rows) == sorted(QIDS) and all(r["valid"] for r in rows.values())
    for qid, row in rows.items():
        for name in ("hypothesis", "rewrite", "answer"):
            stage = row["stages"][name]
            assert stage["lm_calls"] == 1 and stage["prompt_tokens"] > 0 and stage["completion_tokens"] > 0
        assert row["stages"]["hypothesis"]["prompt_tokens"] == in_process[qid]["stages"]["hypothesis"]["prompt_tokens"]
    answers = [json.loads(line) for line in (demo / "openai.jsonl").read_text().splitlines()]
    assert {a["qid"] for a in answers} == set(QIDS)


def ask(lm, adapter: HCQRAdapter):
    """The answer step's signature, its letter narrowed to A-C, asked one demo question through ``adapter``."""
    q = json.loads((DEMO / "questions.json").read_text())["demo-013"]
    options = "\n".join(f"{k}. {v}" for k, v in list(q["options"].items())[:3])
    signature = restrict_letters(AnswerQuestion, "answer", ["A", "B", "C"])
    with dspy.context(lm=lm, adapter=adapter):
        return dspy.Predict(signature)(question=q["question"], options=options, context="")


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
    qids = QIDS[:2]
    rows = run(demo, f"cut-{prefix}", "--method", "cot", "--max-tokens", "8", *lm_args(prefix, server), qids=qids)
    for row in rows.values():
        assert (row["valid"], row["invalid_stage"], row["invalid_cause"]) == (False, "answer", "truncated")
        assert "max_tokens=8" in row["error"] and row["stages"]["answer"]["completion_tokens"] == 8
    metrics = json.loads((demo / f"cut-{prefix}" / "metrics.json").read_text())
    assert metrics["invalid_answer_truncated"] == len(qids)


def test_judge_over_the_server(demo, server, over_vllm):
    argv = ["judge", str(demo / "vllm"), "--ids", QIDS[0], "--threads", "2", "--no-mlflow"]
    assert main([*argv, "--judge-lm", f"hosted_vllm/{server.alias}", "--api-base", server.base]) == 0
    [judged] = [json.loads(line) for line in (demo / "vllm" / "judgments.jsonl").read_text().splitlines()]
    assert judged["qid"] == QIDS[0] and judged["valid"] and judged["label"] in LABELS  # the label's enum obeyed
    assert sum(s["prompt_tokens"] for s in judged["stages"].values()) > 0
    assert sum(s["completion_tokens"] for s in judged["stages"].values()) > 0
    assert (demo / "vllm" / "dur.json").is_file()


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
