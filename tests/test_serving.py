"""A compiled program registered by `hcqr compile --register` and served by MLflow's real scoring server
(`mlflow models serve --env-manager local` on 127.0.0.1): a question posted over REST gets HCQR's answer,
hypothesis, queries and passages; a malformed record is rejected on its own, and a request none of whose records
can be answered is an HTTP 400 naming each record and field. The LM is the stub OpenAI-compatible server
(tests/stub_server.py). One server serves every test of this module."""

import contextlib
import io
import json
import os
import shlex
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path

import pytest
from helpers import (
    TINY_ROWS,
    alive,
    children,
    free_port,
    snippet,
    start_scoring_server,
    stop_process_group,
    write_jsonl,
)
from stub_server import OPTIONS, SECRET, Stub

from hcqr_dspy.cli import main
from hcqr_dspy.tracking.serving import SERVE_TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc"),
    pytest.mark.slow,  # a file of a minute or more on 2 cores: scheduled first (conftest.py)
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Compile HCQR with the stub LM, register it, and serve it exactly as the compile hint says (on a free port).
    Yields ``{"url", "stub", "out" (the compile's stdout), "store", "tracking_uri", "tmp"}``; stops the server's
    whole process group afterwards and checks that none of its processes is left."""
    tmp = tmp_path_factory.mktemp("serving")
    stub = Stub()
    store = tmp / "mlruns"
    tree: list[int] = []
    server = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUB_KEY", SECRET)
        try:
            write_jsonl(tmp / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
            assert (
                main(["index", "--corpus", str(tmp / "corpus.jsonl"), "--retriever", "bm25", "--out", str(tmp / "idx")])
                == 0
            )
            train = {
                f"{i:04d}": {
                    "question": f"Question number {i}? A patient on digoxin sees yellow halos.",
                    "options": OPTIONS,
                    "answer": "ABC"[(i * 2) % 3],
                }
                for i in range(4)
            }
            (tmp / "train.json").write_text(json.dumps(train))
            lm = ["--lm", "openai/stub-model", "--api-base", stub.base, "--api-key-env", "STUB_KEY"]
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                assert (
                    main(
                        [
                            "compile",
                            "--recipe",
                            "bootstrap_fewshot",
                            "--program",
                            "hcqr",
                            "--train",
                            str(tmp / "train.json"),
                            "--train-size",
                            "4",
                            "--index",
                            str(tmp / "idx"),
                            "--out",
                            str(tmp / "prog"),
                            "--register",
                            "served-hcqr",
                            "--mlflow-dir",
                            str(store),
                            *lm,
                        ]
                    )
                    == 0
                )
            out = printed.getvalue()
            [hint] = [line for line in out.splitlines() if " mlflow models serve " in line]
            store_var, _, *serve_args = shlex.split(hint)
            tracking_uri = store_var.split("=", 1)[1]
            port = free_port()
            serve_args[serve_args.index("-p") + 1] = str(port)
            server, url = start_scoring_server(serve_args, tracking_uri)
            tree = [server.pid, *children(server.pid)]
            yield {
                "url": url,
                "stub": stub,
                "out": out,
                "store": store,
                "tracking_uri": tracking_uri,
                "tmp": tmp,
            }
        finally:
            if server is not None:
                stop_process_group(server)
            deadline = time.monotonic() + 10
            while any(alive(p) for p in tree) and time.monotonic() < deadline:
                time.sleep(0.2)
            for p in tree:
                if alive(p):
                    os.kill(p, signal.SIGKILL)
            stub.stop()
    assert [p for p in tree if alive(p)] == []


def post(url: str, records) -> tuple[int, dict]:
    """POST ``{"dataframe_records": records}``: the HTTP status and the JSON body."""
    return post_body(url, {"dataframe_records": records})


def post_body(url: str, body: dict) -> tuple[int, dict]:
    """POST ``body`` as JSON: the HTTP status and the JSON reply."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_registered_compiled_program_is_served_over_rest(served):
    out, store, stub = served["out"], served["store"], served["stub"]
    assert "registered as models:/served-hcqr/1" in out
    # the server is started exactly as the hint says: a request may take SERVE_TIMEOUT_S, not MLflow's 60 s
    # default, which a local model on a CPU exceeds on one HCQR question (HTTP 504)
    [hint] = [line for line in out.splitlines() if " mlflow models serve " in line]
    store_var, mlflow_cmd, *serve_args = shlex.split(hint)
    variable, tracking_uri = store_var.split("=", 1)
    assert (variable, mlflow_cmd) == ("MLFLOW_TRACKING_URI", "mlflow")
    assert tracking_uri.endswith(f"{store.name}/mlflow.db")
    assert serve_args[:3] == ["models", "serve", "-m"] and serve_args[3] == "models:/served-hcqr/1"
    assert serve_args[serve_args.index("-t") + 1] == str(SERVE_TIMEOUT_S) and SERVE_TIMEOUT_S >= 600
    assert serve_args[serve_args.index("-h") + 1] == "127.0.0.1"

    seen = len(stub.seen)
    status, body = post(
        served["url"], [{"question": "Question number 7? Yellow halos after a new drug.", "options": OPTIONS}]
    )
    assert status == 200
    [answer] = body["predictions"]
    # the stub answers question 7 with "ABC"[14 % 3] = "C", through the hypothesis, rewrite and answer steps
    assert answer["answer"] == "C" and answer["answer_text"] == OPTIONS["C"] and answer["valid"] is True
    assert answer["qid"] == "0" and answer["rejected"] is None
    assert answer["hypothesis"]["working_hypothesis"] == "C"
    assert answer["queries"] == ["digoxin toxicity nausea", "digoxin versus hypokalemia", "yellow vision elderly"]
    assert answer["passages"] and {"id", "title", "score", "found_by"} <= set(answer["passages"][0])
    assert len(stub.seen) - seen == 3  # hypothesis, rewrite, answer: the served program called the LM itself
    # the compiled demos reached the served prompts (the answer step shows bootstrapped examples)
    assert "Question number 0?" in stub.seen[-1][1] or "Question number 1?" in stub.seen[-1][1]


def assert_clean_400(status: int, body: dict, served, *named: str) -> str:
    """A 400 whose JSON body names ``named`` and holds no stack trace and no path of the server; its message."""
    assert status == 400, body
    text = json.dumps(body)
    assert body["error_code"] == "INVALID_PARAMETER_VALUE" and "stack_trace" not in body and "Traceback" not in text
    for path in (str(REPO), str(served["tmp"]), "site-packages", sys.prefix, "/tmp/"):
        assert path not in text, (path, text)
    message = body["message"]
    assert message.startswith("no record of the request can be answered: ") and "Failed to predict" not in message
    for part in named:
        assert part in message, (part, message)
    return message


def test_malformed_requests_are_refused_or_rejected_record_by_record(served):
    url, stub = served["url"], served["stub"]
    good = {"question": "Question number 8? Yellow halos.", "options": OPTIONS}
    seen = len(stub.seen)
    # what the signature says (fields, types, the required letters A and B) MLflow's schema enforcement refuses
    # before the model is asked: an HTTP 400 whose message ends with the reason
    for record, reason in [
        ({"question": "Q?"}, "Model is missing inputs ['options']"),
        ({"question": "Q?", "options": {"A": "alpha"}}, "Missing required properties: {'B'}"),
        ({"question": "Q?", "options": ["alpha", "beta"]}, "Expected data to be dictionary, got list"),
        ({"question": "Q?", "options": {"A": 1, "B": 2}}, "for key `A`. Expected type string, received type int"),
        ({"question": 7, "options": OPTIONS}, "question"),
    ]:
        status, body = post(url, [record])
        assert status == 400 and body["error_code"] in ("BAD_REQUEST", "INVALID_PARAMETER_VALUE"), body
        assert "stack_trace" not in body and "Traceback" not in json.dumps(body)
        assert reason in body["message"], (reason, body["message"])
    # what a schema cannot say the model checks record by record, with a one-line message naming record and field
    cases = [
        ({"question": "   ", "options": OPTIONS}, "record 0 (qid '0'): question: empty"),
        (
            {"qid": "q-num", "question": "Q?", "options": {"A": "alpha", "B": "beta", "D": "delta"}},
            "record 0 (qid 'q-num'): options: labels must be the letters A, B, C, got A, B, D",
        ),
        ({"question": "Q?", "options": {"A": "alpha", "B": " "}}, "record 0 (qid '0'): options.B: empty"),
        (
            {"question": "Q?" * 10_001, "options": OPTIONS},
            "record 0 (qid '0'): question: 20002 characters, more than the 20000 a served question may have",
        ),
        (
            {"question": "Q?", "options": {"A": "a" * 5001, "B": "beta"}},
            "record 0 (qid '0'): options.A: 5001 characters, more than the 5000 an option may have",
        ),
    ]
    for record, said in cases:
        status, body = post(url, [record])
        message = assert_clean_400(status, body, served, said)
        assert "\n" not in message
        [rejected] = body["rejected"]
        assert rejected["row"] == 0 and rejected["field"] == message.split(": ")[2]
    # a deadline that is not seconds above 0
    for bad in (-5, 0):
        status, body = post_body(url, {"dataframe_records": [good], "params": {"deadline_s": bad}})
        assert status == 400 and body["message"].endswith(f"params.deadline_s: must be seconds above 0, got {bad}")
    # several bad records and no good one: one 400 naming each record (row and qid) and its field
    status, body = post(
        url,
        [{"qid": "a", "question": "", "options": OPTIONS}, {"question": "Q?", "options": {"A": "alpha", "B": ""}}],
    )
    assert_clean_400(status, body, served, "record 0 (qid 'a'): question: empty", "record 1 (qid '1'): options.B: ")
    assert [(r["row"], r["qid"], r["field"]) for r in body["rejected"]] == [(0, "a", "question"), (1, "1", "options.B")]
    assert len(stub.seen) == seen  # nothing of a refused request reached the LM

    # one bad record among good ones: the good ones are answered, the bad one rejected, in request order; a record
    # without a qid (NaN in pandas beside records that have one) gets its row number, and integer qids stay integers
    # (pandas makes them floats beside a missing one)
    status, body = post(
        url,
        [
            {**good, "qid": 5},
            {"qid": 6, "question": "Q?", "options": {"A": "alpha", "B": "beta", "D": "delta"}},
            {"question": "Question number 9? Yellow halos.", "options": OPTIONS},
        ],
    )
    assert status == 200, body
    first, bad, last = body["predictions"]
    assert (first["qid"], first["answer"], first["valid"], first["rejected"]) == ("5", "B", True, None)
    assert (last["qid"], last["answer"], last["valid"], last["rejected"]) == ("2", "A", True, None)
    assert bad == {
        "qid": "6",
        "answer": None,
        "answer_text": None,
        "valid": False,
        "error": None,
        "hypothesis": None,
        "queries": [],
        "passages": [],
        "rejected": "options: labels must be the letters A, B, C, got A, B, D",
    }
    assert len(stub.seen) - seen == 6  # three LM calls for each good record, none for the bad one


def send(url: str, body: bytes, content_type: str | None, declared: int | None = None) -> tuple[int, dict]:
    """POST raw ``body`` (``Content-Type`` left out when ``None``; sent chunked, without a length, when ``declared``
    is -1; else with ``Content-Length: declared`` or the body's length): the HTTP status and the JSON reply."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    try:
        conn.putrequest("POST", where.path)
        if content_type is not None:
            conn.putheader("Content-Type", content_type)
        if declared == -1:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for start in range(0, len(body), 1 << 20):
                part = body[start : start + (1 << 20)]
                conn.send(b"%x\r\n%s\r\n" % (len(part), part))
            conn.send(b"0\r\n\r\n")
        else:
            conn.putheader("Content-Length", str(len(body) if declared is None else declared))
            conn.endheaders()
            conn.send(body)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def assert_no_trace(body: dict, served) -> None:
    """An error body with a one-line message, no stack trace and no path of the server."""
    text = json.dumps(body)
    assert "stack_trace" not in body and "Traceback" not in text, text[:2000]
    for path in (str(REPO), str(served["tmp"]), "site-packages", sys.prefix, "/tmp/"):
        assert path not in text, (path, text[:2000])
    assert "\n" not in body["message"], body["message"]


def test_requests_mlflow_would_answer_with_a_stack_trace_or_a_500_are_a_4xx_with_one_line(served):
    url, stub = served["url"], served["stub"]
    seen = len(stub.seen)
    good = {"dataframe_records": [{"question": "Question number 12? Yellow halos.", "options": OPTIONS}]}  # "A"
    csv = b'question,options\nQ?,"{""A"": ""alpha"", ""B"": ""beta""}"\n'
    cases = [  # MLflow alone: a 400 with a stack trace, 500, 500, a 400 with a stack trace
        (csv, "text/csv", 415, "Content-Type text/csv cannot carry a record's options"),
        (json.dumps(good).encode(), None, 415, "the request has no Content-Type; send application/json"),
        (b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json", 400, "nested deeper than the 32"),
        (b"abc", "application/vnd.apache.parquet", 400, "Failed to parse input as a Pandas DataFrame"),
    ]
    for body, content_type, status, said in cases:
        got, reply = send(url, body, content_type)
        assert got == status and said in reply["message"], (content_type, got, reply)
        assert_no_trace(reply, served)
    # a body that is not JSON: one line, not MLflow's message that echoes the body over several lines
    status, reply = send(url, b'{"dataframe_records": [\n', "application/json")
    assert (status, reply["message"]) == (400, "the body is not valid JSON: Expecting value: line 2 column 1 (char 24)")
    # 33 levels are refused, the 5 of dataframe_split are answered (test_..._every_request_format_is_answered)
    status, reply = send(url, b"[" * 33 + b"]" * 33, "application/json")
    assert (status, reply["error_code"]) == (400, "BAD_REQUEST") and "32 levels" in reply["message"], reply
    assert len(stub.seen) == seen  # nothing refused reached the LM
    status, reply = send(url, json.dumps(good).encode(), "application/json; charset=utf-8")
    assert status == 200 and reply["predictions"][0]["answer"] == "A", reply


def test_a_request_body_over_the_limit_is_refused_with_413(served):
    from hcqr_dspy.tracking.serve_guard import MAX_REQUEST_BYTES

    url, stub = served["url"], served["stub"]
    seen = len(stub.seen)
    record = {"question": "Question number 13? Yellow halos.", "options": OPTIONS}  # "ABC"[26 % 3] = "C"
    body = json.dumps({"dataframe_records": [record]}).encode()
    full = body + b" " * (MAX_REQUEST_BYTES - len(body))  # valid JSON of exactly the limit
    over = f"the request body has {MAX_REQUEST_BYTES + 1} bytes, over the {MAX_REQUEST_BYTES} bytes a request may have"
    # a 100 MB body refused by its Content-Length before any of it is read; one byte over the limit; one sent
    # in chunks, without a length, refused as it arrives
    for payload, declared, said in [
        (b"", 100_000_000, "the request body has 100000000 bytes, over the"),
        (full + b" ", None, over),
        (full + b" ", -1, f"the request body is over the {MAX_REQUEST_BYTES} bytes a request may have"),
    ]:
        status, reply = send(url, payload, "application/json", declared)
        assert (status, reply["error_code"]) == (413, "REQUEST_TOO_LARGE"), reply
        assert reply["message"].startswith(said) and "HCQR_SERVE_MAX_REQUEST_BYTES" in reply["message"], reply
        assert_no_trace(reply, served)
    assert len(stub.seen) == seen
    for declared in (None, -1):  # a body of exactly the limit is answered
        status, reply = send(url, full, "application/json", declared)
        assert status == 200 and reply["predictions"][0]["answer"] == "C", reply


def test_the_request_size_limit_is_read_from_its_variable(monkeypatch):
    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.tracking.serve_guard import MAX_REQUEST_BYTES, max_request_bytes

    monkeypatch.delenv("HCQR_SERVE_MAX_REQUEST_BYTES", raising=False)
    assert max_request_bytes() == MAX_REQUEST_BYTES == 16 * 1024 * 1024
    monkeypatch.setenv("HCQR_SERVE_MAX_REQUEST_BYTES", "1048576")
    assert max_request_bytes() == 1048576
    for bad in ("0", "-5", "16M", "1e6"):
        monkeypatch.setenv("HCQR_SERVE_MAX_REQUEST_BYTES", bad)
        with pytest.raises(
            HCQRError, match=f"^HCQR_SERVE_MAX_REQUEST_BYTES must be a number of bytes above 0, got '{bad}'$"
        ):
            max_request_bytes()


def test_registered_program_predicts_in_process(served, monkeypatch, request):
    """``mlflow.pyfunc.load_model(...).predict`` takes a DataFrame, a list of records or one record; a request that
    cannot be answered raises the same one-line error the server answers with HTTP 400."""
    import mlflow
    import mlflow.dspy
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from hcqr_dspy.errors import HCQRError

    # loading the model starts a serving process's tracing (MLflow's DSPy callback) in this test process: undone
    # after, or the later tests of this worker would trace their LM calls into whatever store they configure
    request.addfinalizer(lambda: mlflow.dspy.autolog(disable=True, silent=True))

    monkeypatch.setenv("STUB_KEY", SECRET)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(served["tracking_uri"])
    try:
        model = mlflow.pyfunc.load_model("models:/served-hcqr/1")
    finally:
        mlflow.set_tracking_uri(previous)
    question = {"question": "Question number 10? Yellow halos.", "options": OPTIONS}  # "ABC"[20 % 3] = "C"
    for given in (pd.DataFrame([question, {**question, "qid": "q2"}]), [question, {**question, "qid": "q2"}]):
        assert [(a["qid"], a["answer"], a["rejected"]) for a in model.predict(given)] == [
            ("0", "C", None),
            ("q2", "C", None),
        ]
    [answer] = model.predict({**question, "qid": "one"})
    assert (answer["qid"], answer["answer"], answer["answer_text"]) == ("one", "C", OPTIONS["C"])
    with pytest.raises(MlflowException) as refused:
        model.predict([{"question": "Q?", "options": {"A": "alpha", "B": ""}}])
    assert isinstance(refused.value, HCQRError) and refused.value.get_http_status_code() == 400
    assert str(refused.value) == "no record of the request can be answered: record 0 (qid '0'): options.B: empty"
    with pytest.raises(MlflowException, match="Expected data to be dictionary, got list"):
        model.predict([{"question": "Q?", "options": ["alpha", "beta"]}])
    # outside MLflow's scoring server, loading the model leaves MLflow's request handling as it is
    from mlflow.pyfunc import scoring_server

    assert not getattr(scoring_server._async_catch_mlflow_exception, "hcqr_guarded", False)


def test_registered_program_has_a_signature_and_every_request_format_is_answered(served):
    """The model's signature and input example are in its MLmodel (the UI's Inputs and Outputs); the scoring server
    answers the same question posted as ``dataframe_records``, ``dataframe_split``, ``inputs`` and ``instances``."""
    import mlflow
    from mlflow.models import Model

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(served["tracking_uri"])
    try:
        info = mlflow.models.get_model_info("models:/served-hcqr/1")
        example_dir = mlflow.artifacts.download_artifacts(info.model_uri)
    finally:
        mlflow.set_tracking_uri(previous)
    inputs = {spec["name"]: spec for spec in info.signature.inputs.to_dict()}
    assert set(inputs) == {"question", "options", "qid"}
    assert inputs["question"]["type"] == "string" and inputs["qid"]["required"] is False
    letters = inputs["options"]["properties"]
    assert [k for k, v in letters.items() if v.get("required", True)] == ["A", "B"] and "Z" in letters
    outputs = {spec["name"] for spec in info.signature.outputs.to_dict()}
    assert {"answer", "answer_text", "valid", "hypothesis", "queries", "passages", "rejected"} <= outputs
    example = Model.load(example_dir).load_input_example(example_dir)
    assert example and set(example[0]) == {"qid", "question", "options"}

    record = {"qid": "f1", "question": "Question number 11? Yellow halos.", "options": OPTIONS}  # "ABC"[22 % 3]
    split = {"columns": ["qid", "question", "options"], "data": [[record["qid"], record["question"], OPTIONS]]}
    # `instances` carries one record as an object: MLflow turns a list of instances into columns, which its schema
    # enforcement cannot read back for an object column (a 400; docs/serving.md says so)
    bodies = [{"dataframe_records": [record]}, {"dataframe_split": split}, {"inputs": [record]}, {"instances": record}]
    for body in bodies:
        request = urllib.request.Request(
            served["url"], data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                [answer] = json.loads(reply.read())["predictions"]
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{list(body)}: {error.read()}") from None
        assert (answer["qid"], answer["answer"], answer["valid"]) == ("f1", "B", True), (list(body), answer)
    status, body = post_body(served["url"], {"instances": [record]})
    assert status == 400 and "Expected data to be dictionary" in body["message"]


def served_traces(served, qids: set[str], timeout: float = 30.0) -> list:
    """The traces tagged ``kind=served`` of questions ``qids`` in the served store (waiting for the server's
    background export)."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(served["tracking_uri"])
    try:
        experiment = mlflow.get_experiment_by_name("hcqr-dspy")
        deadline = time.monotonic() + timeout
        while True:
            traces = [
                t
                for t in mlflow.search_traces(
                    experiment_ids=[experiment.experiment_id],
                    filter_string="tags.kind = 'served'",
                    return_type="list",
                    max_results=1000,
                )
                if t.info.tags.get("qid") in qids
            ]
            if len(traces) >= len(qids) or time.monotonic() > deadline:
                return traces
            time.sleep(0.5)
    finally:
        mlflow.set_tracking_uri(previous)


def test_a_request_runs_its_questions_concurrently_and_each_leaves_a_served_trace(served):
    stub, tag = served["stub"], uuid.uuid4().hex[:8]
    records = [
        {"qid": f"c{i}-{tag}", "question": f"Question number {20 + i}? Run {tag}.", "options": OPTIONS}
        for i in range(8)
    ]
    stub.delay = 0.4  # seconds per LM call: 8 questions x 3 calls take 9.6 s one after another
    try:
        start = time.monotonic()
        status, body = post(served["url"], records)
        wall = time.monotonic() - start
    finally:
        stub.delay = 0.0
    assert status == 200, body
    assert [a["answer"] for a in body["predictions"]] == ["ABC"[(2 * (20 + i)) % 3] for i in range(8)]
    assert wall < 9.6 / 2, wall  # concurrent: about 3 x 0.4 s plus overhead
    traces = served_traces(served, {r["qid"] for r in records})
    assert len(traces) == 8
    for trace in traces:
        tags = trace.info.tags
        assert (tags["kind"], tags["method"], tags["model_name"], tags["model_version"]) == (
            "served",
            "hcqr",
            "served-hcqr",
            "1",
        )
        assert tags["model_id"].startswith("m-")
    # `hcqr served` lists them, newest first, filtered by model and version
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = ["--mlflow-dir", str(served["store"])]
        assert main(["served", *store, "--model", "served-hcqr/1", "--limit", "8", "--json"]) == 0
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]  # MLflow's deprecations, none printed
    listed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {r["qid"] for r in listed} == {r["qid"] for r in records}
    assert {(r["model"], r["valid"]) for r in listed} == {("served-hcqr v1", True)}
    assert {r["qid"]: r["answer"] for r in listed} == {
        r["qid"]: a["answer"] for r, a in zip(records, body["predictions"])
    }
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["served", "--mlflow-dir", str(served["store"]), "--model", "served-hcqr/2"]) == 0
    assert out.getvalue() == "no served questions of served-hcqr/2\n"
    assert main(["served", "--mlflow-dir", str(served["store"]), "--model", "x/y"]) == 2


def test_a_request_deadline_stops_questions_not_yet_started(served):
    stub, tag = served["stub"], uuid.uuid4().hex[:8]
    records = [
        {"qid": f"d{i}", "question": f"Question number {40 + i}? Deadline {tag}.", "options": OPTIONS}
        for i in range(10)
    ]
    stub.delay = 0.4  # a question takes 1.2 s; 8 run at once, the last 2 would start after 1.2 s
    try:
        status, body = post_body(served["url"], {"dataframe_records": records, "params": {"deadline_s": 0.6}})
    finally:
        stub.delay = 0.0
    assert status == 200, body
    answers = body["predictions"]
    assert [a["valid"] for a in answers] == [True] * 8 + [False] * 2
    for late in answers[8:]:
        assert late["answer"] is None and late["rejected"] is None
        assert late["error"] == "deadline: not started within the request's 0.6 s (deadline_s)"
