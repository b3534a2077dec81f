"""hcqr's JSON adapter (hcqr_dspy/lm/adapter.py) without a server: the dialects of the output schema, a reply cut at
max_tokens made a bad reply of cause ``truncated``, and an endpoint's refusal of the schema told in one line.
tests/openai_server/ runs the same against a real OpenAI-compatible server."""

import json
import uuid

import dspy
import pytest
from dspy.utils.exceptions import LMServerError
from helpers import SchemaEngine

from hcqr_dspy.errors import LMSpecError, TruncatedReplyError
from hcqr_dspy.lm import build_lm
from hcqr_dspy.lm.adapter import (
    RESPONSE_FORMAT_VARIABLE,
    HCQRAdapter,
    finish_reasons,
    format_refusal,
    response_format_dialect,
    schema_response_format,
)
from hcqr_dspy.programs import PROGRAMS
from hcqr_dspy.programs.signatures import AnswerQuestion

OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}


class CutEngine(SchemaEngine):
    """Replies with a JSON object cut after its answer letter, as a reply stopped at max_tokens ends: DSPy's parser
    repairs it into a whole answer."""

    def __init__(self, finish_reason="length"):
        super().__init__()
        self.finish_reason = finish_reason

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, Usage

        return Response(
            id=None,
            model="cut",
            message=Message.assistant([TextPart('{"reasoning": "Yellow vision points to it.", "answer": "A')]),
            finish_reason=self.finish_reason,
            usage=Usage(input_tokens=100, output_tokens=12, total_tokens=112),
        )


def cut_lm(finish_reason="length"):
    return dspy.LM(f"cut/{uuid.uuid4().hex}", engine=CutEngine(finish_reason), temperature=0.0, max_tokens=12)


def test_a_reply_cut_at_max_tokens_is_an_invalid_cause_not_a_repaired_answer():
    cot = PROGRAMS["cot"]()
    with dspy.context(lm=cut_lm(), adapter=dspy.JSONAdapter()):  # DSPy alone: repaired, read as a whole answer
        assert cot(question="Yellow vision?", options=OPTIONS).answer == "A"
    with dspy.context(lm=cut_lm(), adapter=HCQRAdapter()):
        pred = cot(question="Yellow vision?", options=OPTIONS)
    assert (pred.answer, pred.valid, pred.invalid_stage, pred.invalid_cause) == (None, False, "answer", "truncated")
    assert "max_tokens=12" in pred.error and "finish reason 'length'" in pred.error and "\n" not in pred.error
    assert pred.stages["answer"]["completion_tokens"] == 12  # the cut reply's cost is still counted
    with dspy.context(lm=cut_lm("stop"), adapter=HCQRAdapter()):  # the same text, finished: an answer
        assert cot(question="Yellow vision?", options=OPTIONS).answer == "A"


def test_finish_reasons_of_every_reply_shape():
    lm = cut_lm()
    with dspy.context(lm=lm, adapter=HCQRAdapter()), pytest.raises(TruncatedReplyError, match="max_tokens=12"):
        dspy.Predict(AnswerQuestion)(question="q", options="A. a", context="")
    assert finish_reasons(lm, lm.history[-1]["outputs"]) == ["length"]  # an lm15 Response (engines, native routes)
    outputs = ["text"]  # an OpenAI-shaped reply (LiteLLM's, or its cached dict), found by the outputs' identity
    lm.history.append({"outputs": outputs, "response": {"choices": [{"finish_reason": "length"}]}})
    assert finish_reasons(lm, outputs) == ["length"]
    assert finish_reasons(lm, ["text"]) == []  # an equal list is another call's


def test_dialects_of_the_schema(monkeypatch):
    from dspy.clients.legacy_requests import _strict_json_schema

    signature = AnswerQuestion
    model = schema_response_format(signature, "json_schema")
    assert isinstance(model, type)  # DSPy sends its generated model as OpenAI's strict json_schema
    fmt = schema_response_format(signature, "json_object")
    assert fmt == {"type": "json_object", "schema": _strict_json_schema(model.model_json_schema())}
    assert (
        list(fmt["schema"]["properties"]) == ["reasoning", "answer"] and fmt["schema"]["additionalProperties"] is False
    )
    monkeypatch.delenv(RESPONSE_FORMAT_VARIABLE, raising=False)
    assert response_format_dialect() == "json_schema"
    monkeypatch.setenv(RESPONSE_FORMAT_VARIABLE, "json")
    with pytest.raises(LMSpecError, match="HCQR_RESPONSE_FORMAT='json': choose one of json_schema, json_object, off"):
        HCQRAdapter()


def test_remote_lms_get_the_schema_in_the_dialect_asked(monkeypatch):
    """What the adapter hands the LM call, for an LM DSPy's catalogue does not list as schema-capable."""
    lm = build_lm("hosted_vllm/some-model", api_base="http://127.0.0.1:9/v1", cache=False)
    seen = {}
    for dialect in ("json_schema", "json_object", "off"):
        kwargs: dict = {}
        HCQRAdapter(dialect)._prepare_response_format(lm, kwargs, AnswerQuestion)
        seen[dialect] = kwargs.get("response_format")
    assert isinstance(seen["json_schema"], type)
    assert seen["json_object"]["type"] == "json_object" and "answer" in seen["json_object"]["schema"]["properties"]
    assert seen["off"] is None  # DSPy's own choice for an unlisted model: nothing
    local = dspy.LM("schema/x", engine=SchemaEngine(), cache=False)  # an in-process engine keeps DSPy's handling
    kwargs = {}
    HCQRAdapter("json_object")._prepare_response_format(local, kwargs, AnswerQuestion)
    assert isinstance(kwargs["response_format"], type)


def test_a_refused_schema_is_one_line_naming_the_setting():
    lm = build_lm("hosted_vllm/some-model", api_base="http://127.0.0.1:9/v1", cache=False)
    body = {"type": "literal_error", "loc": ("body", "response_format", "type"), "msg": "Input should be 'text'"}
    exc = LMServerError(f"[hosted_vllm/some-model] 1 validation error:\n  {json.dumps(body)}")
    message = format_refusal(lm, exc, "json_schema")
    assert "\n" not in message and "set HCQR_RESPONSE_FORMAT=json_object (llama-cpp-python's server)" in message
    assert format_refusal(lm, LMServerError("upstream down"), "json_schema") is None
    local = dspy.LM("schema/x", engine=SchemaEngine(), cache=False)
    assert format_refusal(local, exc, "json_schema") is None
