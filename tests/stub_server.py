"""A stub OpenAI-compatible chat-completions server on 127.0.0.1 for fault and CLI tests (no real LM)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "sk-test-7f3a9c2e51d84b6f"  # a key value that must never be written anywhere
OPTIONS = {"A": "alpha", "B": "beta", "C": "gamma"}
# What a gateway in front of an LM server sends instead of the API's JSON (nginx's error page, as a proxy whose
# upstream is down, or whose login page answers, would send it).
HTML_PAGE = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
    "</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


def mlflow_judge_reply(prompt: str) -> dict[str, str]:
    """The reply to a prompt of MLflow's built-in judges (``{"rationale", "result"}``): ``RetrievalRelevance``'s
    (one ``<document>``) is ``yes`` when the document mentions vision, ``RetrievalGroundedness``'s (a ``<claim>``)
    is ``no``; any other such prompt (a probe) ``yes``."""
    if "<claim>" in prompt:
        return {"rationale": "Let's think step by step: the letter is not stated.", "result": "no"}
    document = prompt.split("<document>")[1].split("</document>")[0] if "<document>" in prompt else "vision"
    relevant = "vision" in document.lower()
    return {
        "rationale": f"Let's think step by step: {'on' if relevant else 'off'} topic.",
        "result": "yes" if relevant else "no",
    }


class Stub:
    """An OpenAI chat-completions endpoint: answers ``{"reasoning", "answer"}`` by question number.

    ``mode`` switches behaviour while it runs: ``ok``, ``slow`` (sleeps past the client's
    timeout), ``huge`` (a 1 MB reply), ``empty`` (an empty reply), ``auth`` (HTTP 401, the key is
    refused), ``html`` (HTTP 200 with a ``text/html`` page, as a proxy's login or error page),
    ``html502`` (HTTP 502 with a ``text/html`` page, as a reverse proxy whose upstream is down),
    ``auth_echo`` (HTTP 401 whose message echoes the refused key, as some gateways do),
    ``truncated`` (HTTP 200, ``application/json``, the first half of a good reply's JSON, its
    ``Content-Length`` matching what is sent). In ``ok`` mode a prompt asking for HCQR's hypothesis
    or queries (its output field names) gets fields of that shape, and one in the JSON format of MLflow's built-in
    judges gets :func:`mlflow_judge_reply`. ``down_after`` requests, it
    closes its socket: later connections are refused. ``switch_after`` requests answered in
    ``ok`` mode, it turns to mode ``switch_to`` (set ``mode`` back to ``"ok"`` to recover, or give
    ``switch_for``: the number of requests answered in ``switch_to`` before it is ``ok`` again). ``delay``
    seconds pass before each reply; ``shift`` moves every answer letter along by that many (a server of
    another checkpoint under the same model name); ``reasoning`` is the answer step's reasoning text. Every
    request's headers and body are kept in ``seen``. ``GET /v1/models`` lists ``stub-model`` as vLLM would; with a
    ``version`` (settable while it runs, as a server upgraded in place), its card is owned by ``vllm`` and
    ``GET /version`` gives ``{"version": version}``, as vLLM's.
    ``port``: where to listen (default any free port; a stopped stub's port to restart it at the same address).
    """

    def __init__(
        self,
        down_after=None,
        switch_after=None,
        switch_to=None,
        delay=0.0,
        shift=0,
        reasoning="r",
        switch_for=None,
        port=0,
        version=None,
    ):
        self.version = version  # what GET /version reports (None: no such route, as a server not vLLM)
        self.mode, self.down_after, self.count, self.seen = "ok", down_after, 0, []
        self.delay, self.shift = delay, shift  # seconds before each reply; letters shifted (another checkpoint)
        self.reasoning = reasoning  # the answer step's reasoning text
        self.switch_after, self.switch_to, self.switch_for = switch_after, switch_to, switch_for
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                """``/v1/models``: a vLLM-shaped listing of ``stub-model``, its checkpoint named by ``shift``
                (``created`` and ``permission`` new on every request, as vLLM's); ``/version``: ``version``; neither
                counted in ``count``."""
                if self.path.rstrip("/") == "/version" and stub.version is not None:
                    payload = json.dumps({"version": stub.version}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if self.path.rstrip("/") != "/v1/models":
                    self.send_error(404)
                    return
                now = int(time.time() * 1000)
                card = {
                    "id": "stub-model",
                    "object": "model",
                    "created": now,
                    "owned_by": "stub" if stub.version is None else "vllm",
                    "root": f"/models/stub-checkpoint-{stub.shift}",
                    "parent": None,
                    "max_model_len": 4096,
                    "permission": [{"id": f"modelperm-{now}", "created": now}],
                }
                payload = json.dumps({"object": "list", "data": [card]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                stub.seen.append((dict(self.headers), body))
                stub.count += 1
                if stub.switch_after is not None and stub.count == stub.switch_after + 1:
                    stub.mode = stub.switch_to
                if stub.switch_for and stub.count == stub.switch_after + stub.switch_for + 1:
                    stub.mode = "ok"
                if stub.mode == "slow":
                    time.sleep(3)
                time.sleep(stub.delay)
                prompt = json.loads(body)["messages"][-1]["content"]
                n = int(prompt.split("Question number ")[1].split("?")[0]) if "Question number " in prompt else 0
                letter = "ABC"[(n * 2 + stub.shift) % 3]
                if '"result": "yes|no"' in prompt:  # an MLflow built-in judge (its prompt's JSON format)
                    ok = mlflow_judge_reply(prompt)
                elif "`support_query`" in prompt:
                    ok = {
                        "support_query": "digoxin toxicity nausea",
                        "distinction_query": "digoxin versus hypokalemia",
                        "key_feature_query": "yellow vision elderly",
                    }
                elif "`discriminating_features`" in prompt:
                    ok = {
                        "discriminating_features": "yellow vision",
                        "reasoning": "r",
                        "working_hypothesis": letter,
                        "confirming_evidence": "low potassium",
                    }
                else:
                    ok = {"reasoning": stub.reasoning, "answer": letter}
                content = {
                    "ok": json.dumps(ok),
                    "truncated": json.dumps(ok),
                    "slow": "{}",
                    "huge": "x" * 1_000_000,
                    "empty": "",
                }.get(stub.mode, "")
                if stub.mode in ("html", "html502"):
                    page = HTML_PAGE.encode()
                    self.send_response(200 if stub.mode == "html" else 502)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                if stub.mode in ("auth", "auth_echo"):
                    key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    echo = f": {key} (at {self.path})" if stub.mode == "auth_echo" else ""
                    error = json.dumps(
                        {
                            "error": {
                                "message": f"Incorrect API key provided{echo}",
                                "type": "invalid_request_error",
                                "code": "invalid_api_key",
                            }
                        }
                    ).encode()
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(error)))
                    self.end_headers()
                    self.wfile.write(error)
                    return
                payload = json.dumps(
                    {
                        "id": f"c{stub.count}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "stub",
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }
                ).encode()
                if stub.mode == "truncated":
                    payload = payload[: len(payload) // 2]
                if stub.down_after is not None and stub.count >= stub.down_after:
                    # Close the listening socket before this reply goes out, so the client's next
                    # connection is refused for certain (stopping from another thread raced with it).
                    stub.stop()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port 0: any free one
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
