"""At temperature 0 the server gives hcqr's in-process replies, question for question and stage for stage, one
question in flight; with two in flight, what does not depend on the server's order of requests; a judge over the
server (the module notes of tests/openai_server/conftest.py say why the comparisons hold)."""

import json

import pytest
from support.openai_server import HCQR, N_CTX, PROBE, QIDS, lm_args, run

from hcqr_dspy.cli import main
from hcqr_dspy.judge.labels import LABELS

pytestmark = pytest.mark.slow


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


def test_eval_over_hosted_vllm_gives_the_in_process_replies(demo, server, in_process, over_vllm):
    assert_same_replies(over_vllm, in_process)
    assert all(r["valid"] for r in over_vllm.values())  # every step's reply obeyed its schema
    lm = json.loads((demo / "vllm" / "config.json").read_text())["lm"]
    assert (lm["spec"], lm["response_format"]) == ("hosted_vllm/smollm2-135m", "json_object")
    [session] = [json.loads(line) for line in (demo / "vllm" / "sessions.jsonl").read_text().splitlines()]
    assert session["endpoint"] == {"url": f"{server.base}/models", "id": server.alias, "owned_by": "me"}


def test_predict_over_openai_with_two_in_flight(demo, server, in_process):
    """Two questions at once: every step answered under its schema and its tokens recorded; the first step's
    prompt (the question alone) is the in-process one to the token. Later steps' prompts hold earlier replies,
    which the server's order of requests can change (the module's notes)."""
    rows = run(demo, "openai", *HCQR, "--threads", "2", *lm_args("openai", server), command="predict")
    assert sorted(rows) == sorted(QIDS) and all(r["valid"] for r in rows.values())
    for qid, row in rows.items():
        for name in ("hypothesis", "rewrite", "answer"):
            stage = row["stages"][name]
            assert stage["lm_calls"] == 1 and stage["prompt_tokens"] > 0 and stage["completion_tokens"] > 0
        assert row["stages"]["hypothesis"]["prompt_tokens"] == in_process[qid]["stages"]["hypothesis"]["prompt_tokens"]
    answers = [json.loads(line) for line in (demo / "openai.jsonl").read_text().splitlines()]
    assert {a["qid"] for a in answers} == set(QIDS)


def test_judge_over_the_server(demo, server, over_vllm):
    argv = ["judge", str(demo / "vllm"), "--ids", QIDS[0], "--threads", "2", "--no-mlflow"]
    assert main([*argv, "--judge-lm", f"hosted_vllm/{server.alias}", "--api-base", server.base]) == 0
    [judged] = [json.loads(line) for line in (demo / "vllm" / "judgments.jsonl").read_text().splitlines()]
    assert judged["qid"] == QIDS[0] and judged["valid"] and judged["label"] in LABELS  # the label's enum obeyed
    assert sum(s["prompt_tokens"] for s in judged["stages"].values()) > 0
    assert sum(s["completion_tokens"] for s in judged["stages"].values()) > 0
    assert (demo / "vllm" / "dur.json").is_file()
