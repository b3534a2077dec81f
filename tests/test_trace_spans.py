"""A ``full`` question trace holds one span per LM call, below the stage that made it: the messages sent, the reply and
the endpoint's token usage, and none of DSPy's module or adapter spans (``hcqr eval`` against the stub
OpenAI-compatible server on 127.0.0.1, read back from a real SQLite MLflow store)."""

import json

import mlflow
import pytest
from stub_server import SECRET, Stub
from support.cli_args import eval_argv, stub_args

from hcqr_dspy.cli.main import main
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.retrieval import BM25Retriever

STAGES = {"hcqr", "hypothesis", "rewrite", "retrieval", "fusion", "answer"}
RETRIEVERS = {"retrieve q1 (support)", "retrieve q2 (distinction)", "retrieve q3 (key features)"}
LM_SPAN = "LM openai/stub-model"


@pytest.fixture
def traces(bench, tiny_corpus, mlflow_store):
    """The traces of an HCQR evaluation of two questions (three LM calls each, 10 + 5 tokens per call)."""
    index = BM25Retriever(tiny_corpus, show_progress=False).save(bench / "idx")
    stub = Stub()
    try:
        argv = eval_argv(bench, bench / "run", *stub_args(stub), "--index", str(index), method="hcqr")
        assert main([*argv, "--limit", "2", "--mlflow-dir", str(mlflow_store)]) == 0
    finally:
        stub.stop()
    run_id = RunFolder(bench / "run").mlflow_run_id
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    found = mlflow.search_traces(locations=[experiment_id], run_id=run_id, return_type="list")
    assert len(found) == 2
    return found


def test_each_stage_holds_its_lm_call_as_one_span_and_no_dspy_internals(traces):
    for trace in traces:
        spans = trace.data.spans
        names = [s.name for s in spans]
        # hcqr's own spans and one LM span per stage that calls the LM: no Predict.forward, HCQR.forward,
        # HCQRAdapter.format / parse or LM.__call__
        assert set(names) == STAGES | RETRIEVERS | {LM_SPAN} and len(spans) == 12
        by_id = {s.span_id: s for s in spans}
        lm_spans = [s for s in spans if s.name == LM_SPAN]
        assert sorted(by_id[s.parent_id].name for s in lm_spans) == ["answer", "hypothesis", "rewrite"]
        question = spans[0].inputs["question"]
        for span in lm_spans:
            assert span.span_type == "CHAT_MODEL"
            messages = span.inputs["messages"]
            assert [m["role"] for m in messages] == ["system", "user"] and question in messages[-1]["content"]
            [reply] = span.outputs  # the reply text, as the endpoint sent it
            assert isinstance(json.loads(reply), dict)
            assert span.attributes["mlflow.chat.tokenUsage"] == {
                "input_tokens": 10,
                "output_tokens": 5,
                "total_tokens": 15,
            }
            assert span.attributes["mlflow.llm.model"] == "openai/stub-model"
            assert span.attributes["mlflow.message.format"] == "dspy"
        answer_call = next(s for s in lm_spans if by_id[s.parent_id].name == "answer")
        assert json.loads(answer_call.outputs[0])["answer"] == spans[0].outputs["answer"]
        # MLflow sums the LM spans' usage into the trace's
        assert trace.info.token_usage == {"input_tokens": 30, "output_tokens": 15, "total_tokens": 45}
        assert SECRET not in trace.to_json()  # the key is an LM setting, never an attribute
