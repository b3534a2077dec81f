"""Transient failures a long study meets, made for real: an LM gateway that turns to HTML or cuts its JSON short
mid-run (the stub OpenAI-compatible server of stub_server.py), and a real Milvus 2.3.5 standalone server process on
127.0.0.1 that is stopped (SIGTERM) or frozen (SIGSTOP) mid-evaluation. Each is retried with back-off; one that
outlasts the retries stops the run as an outage in one line, resumable, never as a bug; one that passes within them
lets the run go on. The retry windows are made short through their settings (``num_retries``,
``$HCQR_MILVUS_RETRY_SECONDS``, ``$HCQR_MILVUS_SEARCH_TIMEOUT``), nothing is mocked."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
import urllib.request
from contextlib import contextmanager

import pytest
from stub_server import Stub

from hcqr_dspy.errors import BackendUnavailableError, LMUnavailableError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm import build_lm
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

SAVED_AND_RESUME = r"; (\d+)/6 questions are saved in \S+predictions\.jsonl; run the same command again to resume$"


def stub_lm(stub: Stub, retries: int = 1):
    """The stub's LM, built as `hcqr eval` builds one; ``retries``: DSPy's ``num_retries``, which sets ours too."""
    return build_lm("openai/stub-model", api_base=stub.base, api_key_env="STUB_KEY", cache=False, num_retries=retries)


def run_eval(bench, stub: Stub, name: str, method: str = "cot", index=None, on_row=None):
    spec = EvalSpec(
        method=method,
        dataset=str(bench / "qs.json"),
        index=index and str(index),
        lm="openai/stub-model",
        api_base=stub.base,
        api_key_env="STUB_KEY",
        run_dir=str(bench / name),
    )
    result, _, _ = run_evaluation(spec, progress=False, track=False, lm=stub_lm(stub), on_row=on_row)
    return result


def untimed(rows: list[dict]) -> list:
    """Rows without what differs between two runs of the same questions: durations, the CPU contention measured
    over them, and trace ids."""

    def strip(value):
        if isinstance(value, dict):
            return {
                k: strip(v) for k, v in value.items() if "seconds" not in k and k not in ("trace_id", "cpu_pressure")
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(rows)


def assert_matches_a_fresh_run(bench, stub: Stub, rows: list[dict]) -> None:
    """``rows`` are those of an uninterrupted run of the same questions (run now, into ``bench/fresh``)."""
    fresh = run_eval(bench, stub, "fresh")
    assert untimed(rows) == untimed(fresh.rows)


def assert_one_line_outage(message: str, saved: int, capfd) -> None:
    assert "\n" not in message and "this is a bug" not in message, message
    found = re.search(SAVED_AND_RESUME, message)
    assert found and int(found.group(1)) == saved, message
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]  # no library traceback logged on the way


class Records(logging.Handler):
    """Keeps every log record it is handed."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def pymilvus_log():
    """What pymilvus logs, as its own console handler gets it: records of its "pymilvus.*" loggers that pass their
    levels reach the "pymilvus" logger's handlers (its import configures them, pymilvus/settings.py), where capfd,
    which sees only streams opened during the test, cannot look."""
    import pymilvus  # noqa: F401

    handler, logger = Records(), logging.getLogger("pymilvus")
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def no_library_traceback(records: list[logging.LogRecord]) -> bool:
    return not [r for r in records if r.exc_info or "Traceback" in r.getMessage()]


def no_tracebacks_saved(run_dir) -> bool:
    folder = run_dir / "tracebacks"
    return not folder.exists() or not any(folder.iterdir())


# -- an LM gateway that stops speaking the API -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["html", "html502", "truncated"])
def test_a_gateway_turning_to_html_or_cut_json_mid_run_is_retried_then_an_lm_outage_that_resumes(bench, mode, capfd):
    """HTML behind HTTP 200, HTML behind HTTP 502, a JSON body cut in half: after three good replies the fourth
    question's tries (the first and one retry, ``num_retries=1``) all get it; the run stops with one line, and once the
    gateway answers again the same command finishes with the rows of an uninterrupted run."""
    stub = Stub(switch_after=3, switch_to=mode)
    try:
        with pytest.raises(LMUnavailableError) as stop:
            run_eval(bench, stub, "run")
        message = str(stop.value)
        assert message.startswith("the LM stopped answering"), message
        assert_one_line_outage(message, 3, capfd)
        assert stub.count == 3 + 2  # the fourth question was tried, then tried again after its back-off
        assert [r["qid"] for r in RunFolder.open(bench / "run").rows()] == ["q0", "q1", "q2"]
        assert no_tracebacks_saved(bench / "run")
        stub.mode = "ok"
        resumed = run_eval(bench, stub, "run")
        assert (resumed.resumed, resumed.ran) == (3, 3)
        assert_matches_a_fresh_run(bench, stub, resumed.rows)
    finally:
        stub.stop()


@pytest.mark.parametrize("mode", ["html", "truncated"])
def test_a_gateway_that_answers_html_once_is_retried_and_the_run_goes_on(bench, mode):
    stub = Stub(switch_after=3, switch_to=mode, switch_for=1)  # one bad reply, then good ones again
    try:
        result = run_eval(bench, stub, "run")
        assert (result.ran, stub.count) == (6, 7)
        assert_matches_a_fresh_run(bench, stub, result.rows)
    finally:
        stub.stop()


# -- a Milvus server that goes away --------------------------------------------------------------------------------
class Milvus:
    """This file's own Milvus server (stopping it touches no other test file) and a dense index of the tiny corpus
    on it, built by `hcqr index --backend milvus`."""

    def __init__(self, server, index):
        self.server, self.index = server, index

    def ensure_up(self) -> None:
        """Start the server again if a test stopped it (on its data: the index's collection is still there)."""
        if self.server.process is None:
            self.server.start()

    def signal(self, sig: int) -> None:
        os.killpg(self.server.process.pid, sig)  # the server leads its own process group


@contextmanager
def served_tiny_index(folder, **server_options):
    """A Milvus server with its data in ``folder`` and the tiny corpus's index on it, stopped on the way out (the
    test is skipped, saying why, where the server cannot start)."""
    from helpers import TINY_ROWS, snippet, write_jsonl
    from support.cli_args import milvus_index_argv
    from support.milvus_server import LocalMilvusServer, running_or_skip

    from hcqr_dspy.cli import main

    server = LocalMilvusServer(data_dir=folder / "server", **server_options)
    with running_or_skip(server) as uri:
        corpus = write_jsonl(folder / "tiny.jsonl", [snippet(*r) for r in TINY_ROWS])
        assert main(milvus_index_argv(corpus, uri, "tiny", folder / "index")) == 0
        yield Milvus(server, folder / "index")


@pytest.fixture(scope="module")
def milvus(tmp_path_factory):
    with served_tiny_index(tmp_path_factory.mktemp("milvus-outages")) as m:
        yield m


@pytest.fixture
def restartable_milvus(tmp_path_factory):
    """A server of its own whose coordinators' etcd sessions last 3 s (``common.session.ttl``, 30 s by default):
    restarted on its data it serves again 4 to 15 s after it stopped, not about 55 s, through the same phases. The
    module's server keeps the default, since a server frozen (SIGSTOP) for longer than its sessions last loses them."""
    with served_tiny_index(tmp_path_factory.mktemp("milvus-restart"), session_ttl=3) as m:
        yield m


@pytest.fixture
def milvus_up(milvus):
    milvus.ensure_up()
    return milvus


# What pymilvus 3.0 raised searching a Milvus 2.3.5 standalone server in the seconds after its SIGTERM.
RESTARTING_SERVER_MESSAGES = (
    'empty grpc client: failed to connect 127.0.0.1:35031, reason: connection error: desc = "transport: error while '
    'dialing: dial tcp 127.0.0.1:35031: connect: connection refused"',
    "empty grpc client: find no available rootcoord, check rootcoord state",
)


def milvus_error(code: int, message: str):
    """The ``MilvusException`` pymilvus raises for a call whose answer carries this status (``check_status``)."""
    from pymilvus.exceptions import MilvusException
    from pymilvus.grpc_gen import common_pb2

    status = common_pb2.Status(code=code, reason=message, error_code=common_pb2.UnexpectedError)
    return MilvusException.from_status(status)


@pytest.mark.parametrize("message", RESTARTING_SERVER_MESSAGES)
def test_a_restarting_servers_empty_grpc_client_is_transient_and_other_unexpected_errors_are_not(message):
    """Code 65535 is Milvus's code for any error it has no code of its own for: only a restarting server's message
    under it is tried again; the same message under a code that names another fault is not."""
    from hcqr_dspy.retrieval.milvus.retries import transient

    assert transient(milvus_error(65535, message))
    assert not transient(milvus_error(1100, message))  # invalid parameter
    assert not transient(milvus_error(65535, "failed to search: segcore error: unknown data type"))
    assert not transient(milvus_error(65535, "empty grpc client: etcdserver: permission denied"))


def retry_milvus_searches(monkeypatch, window: str, search_timeout: str | None = None) -> None:
    """Milvus searches are retried for ``window`` seconds in all, each try given ``search_timeout`` seconds."""
    monkeypatch.setenv("HCQR_MILVUS_RETRY_SECONDS", window)
    if search_timeout is not None:
        monkeypatch.setenv("HCQR_MILVUS_SEARCH_TIMEOUT", search_timeout)


def after_rows(n: int, action):
    """An ``on_row`` that runs ``action`` once ``n`` rows are written (in the run's thread, before the next
    question starts)."""
    written = []

    def on_row(row):
        written.append(row["qid"])
        if len(written) == n:
            action()

    return on_row


def test_a_milvus_server_that_stops_answering_mid_eval_is_an_outage_and_the_run_resumes(
    bench, milvus_up, monkeypatch, capfd, pymilvus_log
):
    """The server process is frozen (SIGSTOP) after two questions, for longer than the retry window: every search try
    times out, the run stops with one line; thawed (SIGCONT), the same command finishes with the rows of an
    uninterrupted run."""
    m = milvus_up
    stub = Stub()
    try:
        fresh = run_eval(bench, stub, "fresh", "simple_rag", m.index)
        retry_milvus_searches(monkeypatch, "3", search_timeout="0.5")
        capfd.readouterr()
        try:
            freeze = after_rows(2, lambda: m.signal(signal.SIGSTOP))
            with pytest.raises(BackendUnavailableError) as stop:
                run_eval(bench, stub, "run", "simple_rag", m.index, on_row=freeze)
        finally:
            m.signal(signal.SIGCONT)
        message = str(stop.value)
        assert message.startswith(f"Milvus search in collection 'tiny' at {m.server.uri} failed (")
        assert re.search(r"\((\d+) tries over \d+ s\): gRPC DEADLINE_EXCEEDED", message), message
        assert int(re.search(r"\((\d+) tries", message).group(1)) >= 2  # retried before it gave up
        assert_one_line_outage(message, 2, capfd)
        assert no_library_traceback(pymilvus_log) and no_tracebacks_saved(bench / "run")
        resumed = run_eval(bench, stub, "run", "simple_rag", m.index)
        assert (resumed.resumed, resumed.ran) == (2, 4)
        assert untimed(resumed.rows) == untimed(fresh.rows) and all(r["passages"] for r in resumed.rows)
    finally:
        stub.stop()


def test_a_milvus_server_back_within_the_retry_window_lets_the_run_go_on(bench, milvus_up, monkeypatch):
    """Frozen for 2 s after two questions, with search tries of 0.5 s and a 30 s window: the third question's search
    is tried again until the server answers, and the run ends with every row, as an uninterrupted one."""
    m = milvus_up
    stub = Stub()
    try:
        fresh = run_eval(bench, stub, "fresh", "simple_rag", m.index)
        retry_milvus_searches(monkeypatch, "30", search_timeout="0.5")
        thaw = threading.Timer(2.0, m.signal, (signal.SIGCONT,))

        def freeze():
            m.signal(signal.SIGSTOP)
            thaw.start()

        t0 = time.monotonic()
        try:
            result = run_eval(bench, stub, "run", "simple_rag", m.index, on_row=after_rows(2, freeze))
        finally:
            if thaw.ident is not None:  # it was started: the server is thawed before anything else runs
                thaw.join()
        assert time.monotonic() - t0 >= 2.0  # it waited for the server, then went on
        assert (result.ran, len(result.rows)) == (6, 6)
        assert untimed(result.rows) == untimed(fresh.rows)
    finally:
        stub.stop()


def test_a_milvus_server_stopped_mid_eval_is_retried_then_an_outage_in_one_line(
    bench, milvus_up, monkeypatch, capfd, pymilvus_log
):
    """The server process is stopped for good (SIGTERM, its whole process group) after two questions: the third
    question's search finds nothing listening, is tried again for the 2 s window, and the run stops with one line.
    (Its resumption is the frozen server's above, the same run-folder logic; a server back within the window is the
    restarted one's below. This server, restarted on its data, would answer only once its old etcd sessions have
    expired, about 55 s, so this test leaves it down for the fixture to stop.)"""
    m = milvus_up
    stub = Stub()
    retry_milvus_searches(monkeypatch, "2")
    capfd.readouterr()
    try:
        with pytest.raises(BackendUnavailableError) as stop:
            run_eval(bench, stub, "run", "simple_rag", m.index, on_row=after_rows(2, m.server.stop))
        message = str(stop.value)
        assert message.startswith("Milvus search in collection 'tiny' at ")
        found = re.search(r"\((\d+) tries over (\d+) s\): .*Fail connecting to server", message)
        assert found and int(found.group(1)) >= 2 and int(found.group(2)) >= 1, message
        assert_one_line_outage(message, 2, capfd)
        assert no_library_traceback(pymilvus_log) and no_tracebacks_saved(bench / "run")
        assert [r["qid"] for r in RunFolder.open(bench / "run").rows()] == ["q0", "q1"]
    finally:
        stub.stop()


class Restart:
    """Stops a server with SIGTERM and starts it again on its data folder, in a thread of its own."""

    def __init__(self, server):
        self.server, self.error = server, None
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self.server.stop()  # SIGTERM to its process group; waits for it to exit
            self.server.start()
        except BaseException as exc:  # raised again by join(), in the test's thread
            self.error = exc

    def begin(self) -> None:
        """Start the restart; return once the server has begun to stop (its health check no longer answers OK, a few
        milliseconds after SIGTERM), while its proxy still answers for a few seconds."""
        health = f"http://127.0.0.1:{self.server.metrics_port}/healthz"
        self.thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(health, timeout=1) as resp:
                    if b"OK" not in resp.read():
                        return
            except OSError:  # an HTTP error status, or nothing listening
                return
            time.sleep(0.05)

    def join(self) -> None:
        if self.thread.ident is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error


def test_a_milvus_server_restarted_mid_eval_is_retried_and_the_run_goes_on(bench, restartable_milvus, monkeypatch):
    """The server is stopped with SIGTERM after two questions and started again on its data. The third question's
    search meets the phases of the restart: the proxy answering while the coordinators behind it have stopped (code
    65535, "empty grpc client: failed to connect ...: connect: connection refused" or "empty grpc client: find no
    available rootcoord, check rootcoord state"), nothing listening ("Fail connecting to server", or gRPC UNAVAILABLE),
    the collection reloading (101, "collection not loaded"). It is tried again until the server answers, and the run
    ends with the rows of an uninterrupted one."""
    m = restartable_milvus
    stub = Stub()
    try:
        fresh = run_eval(bench, stub, "fresh", "simple_rag", m.index)
        retry_milvus_searches(monkeypatch, "60", search_timeout="5")
        before, restart = m.server.process.pid, Restart(m.server)
        try:
            result = run_eval(bench, stub, "run", "simple_rag", m.index, on_row=after_rows(2, restart.begin))
        finally:
            restart.join()
        assert m.server.process.pid != before  # restarted: another process serves the same data and address
        assert (result.ran, len(result.rows)) == (6, 6)
        assert untimed(result.rows) == untimed(fresh.rows)
    finally:
        stub.stop()
