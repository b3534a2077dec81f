"""`endpoint_card`: whatever a server answers to `GET /v1/models`, the card is recorded or said unavailable, within
its time limit, and never raises (a bad listing must not stop a run). A small HTTP server started here on 127.0.0.1
answers each path with one kind of reply."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hcqr_dspy.lm import parse_lm_spec
from hcqr_dspy.lm.endpoint_card import MAX_LISTING_BYTES, endpoint_card

CARD = {"id": "m", "object": "model", "created": 1, "owned_by": "vllm", "root": "/ckpt", "max_model_len": 4096}
BODIES = {
    "ok": json.dumps({"object": "list", "data": [CARD]}),
    "notjson": "<html>hello</html>",
    "list": json.dumps([CARD]),
    "dataint": json.dumps({"data": 5}),
    "nan": '{"data": [{"id": "m", "max_model_len": NaN}]}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "oddvalue": json.dumps({"data": [{**CARD, "root": {"nested": 1}}]}),
    "ctlvalue": json.dumps({"data": [{**CARD, "root": "/ckpt\u001b[31m"}]}),
    "huge": json.dumps({"data": [{**CARD, "root": "x" * (MAX_LISTING_BYTES + 1)}]}),
    "llamacpp": json.dumps({"data": [{"id": "m", "object": "model", "owned_by": "llamacpp", "created": 1}]}),
    "me": json.dumps({"data": [{"id": "m", "object": "model", "owned_by": "me"}]}),  # llama-cpp-python's server
}
# What each mode's server answers on its version routes (absent: HTTP 404).
VERSION_REPLIES = {
    ("ok", "version"): {"version": "0.11.0"},
    ("llamacpp", "props"): {"build_info": "b6500-a1b2c3d", "total_slots": 1},
    ("versionnum", "version"): {"version": 11},
    ("versionnan", "version"): "NaN",
    ("versionctl", "version"): {"version": "0.11.0\n| pipe |"},  # would break the setups table and one-line errors
    ("versionblank", "version"): {"version": "   "},
    ("versionrlo", "version"): {"version": "\u202e0.11"},  # a right-to-left override reorders what is shown
}


seen: list[str] = []  # the paths asked, in order


@pytest.fixture(scope="module")
def server():
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.path)
            mode, route = self.path.strip("/").split("/")[0], self.path.strip("/").split("/")[-1]
            if route in ("version", "props"):
                reply = VERSION_REPLIES.get((mode, route))
                if reply is None:
                    self.send_error(404)
                    return
                body = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if mode == "badstatus":
                self.wfile.write(b"HELLO THERE\r\n\r\n")
                self.close_connection = True
                return
            if mode == "headerdrip":  # the status line, then a header byte every 0.3 s: each read is quick
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for _ in range(40):
                        self.wfile.write(b"X")
                        self.wfile.flush()
                        time.sleep(0.3)
                except BrokenPipeError:
                    pass
                self.close_connection = True
                return
            if mode == "e500":
                self.send_error(500)
                return
            body = BODIES.get(mode, BODIES["ok"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if mode == "trickle":  # one byte every 0.3 s: each read is quick, the whole is slow
                try:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(0.3)
                except BrokenPipeError:  # the client gave up, as it should
                    pass
                return
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def card(base: str, timeout: float = 5.0) -> dict:
    return endpoint_card(parse_lm_spec("hosted_vllm/m", api_base=base), "key", timeout=timeout)


def test_a_vllm_listing_gives_its_card_without_the_per_request_fields(server):
    assert card(f"{server}/ok/v1") == {
        "url": f"{server}/ok/v1/models",
        "id": "m",
        "owned_by": "vllm",
        "root": "/ckpt",
        "max_model_len": 4096,
        "server_version": "0.11.0",  # GET /version, at the server's root
    }


@pytest.mark.parametrize(
    "mode, version",
    [
        ("llamacpp", "b6500-a1b2c3d"),  # llama-server: GET /props, its build_info
        ("e404", "unavailable (HTTP 404 from /version)"),  # a vLLM card, but no version route (a proxy)
        ("versionnum", "unavailable (/version gives no version as short text)"),
        ("versionnan", "unavailable (ValueError from /version: NaN is not JSON)"),
        ("versionctl", "unavailable (/version gives no version as short text)"),
        ("versionblank", "unavailable (/version gives no version as short text)"),
        ("versionrlo", "unavailable (/version gives no version as short text)"),
    ],
)
def test_a_server_whose_version_route_is_known_has_its_version_recorded_or_said_unavailable(server, mode, version):
    base = f"{server}/{mode}/v1"
    assert card(base)["server_version"] == version
    route = "/props" if mode == "llamacpp" else "/version"
    assert seen[-2:] == [f"/{mode}/v1/models", f"/{mode}{route}"]


def test_a_server_without_a_known_version_route_is_not_asked_for_one(server):
    assert "server_version" not in card(f"{server}/me/v1") and seen[-1] == "/me/v1/models"


@pytest.mark.parametrize(
    "mode, why",
    [
        ("notjson", "JSONDecodeError"),
        ("list", "'m' is not among the models it lists"),
        ("dataint", "'m' is not among the models it lists"),
        ("nan", "NaN is not JSON"),
        ("deep", "RecursionError"),
        ("oddvalue", "not short text or whole numbers"),
        ("ctlvalue", "not short text or whole numbers (['root'])"),
        ("huge", f"larger than {MAX_LISTING_BYTES} bytes"),
        ("badstatus", "BadStatusLine"),
        ("e500", "HTTP 500"),
    ],
)
def test_a_bad_listing_is_recorded_as_unavailable(server, mode, why):
    got = card(f"{server}/{mode}/v1")
    assert set(got) == {"url", "unavailable"} and why in got["unavailable"]


def test_a_listing_that_trickles_in_is_cut_at_the_time_limit(server):
    t0 = time.monotonic()
    got = card(f"{server}/trickle/v1", timeout=1.0)
    assert got["unavailable"] == "ValueError: the listing took more than 1 s" and time.monotonic() - t0 < 3


def test_a_reply_whose_headers_trickle_in_is_cut_at_the_time_limit(server):
    t0 = time.monotonic()
    got = card(f"{server}/headerdrip/v1", timeout=1.0)
    assert got["unavailable"] == "ValueError: the listing took more than 1 s" and time.monotonic() - t0 < 2


def test_a_malformed_address_is_recorded_not_raised():
    assert card("http://[::1")["unavailable"] == "ValueError: Invalid IPv6 URL"
