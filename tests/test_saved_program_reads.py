"""A saved program is read once per command: `hcqr eval` of a saved program, or of a fresh method answering with a
saved program's answer step, opens the program's program.json and meta.json once each, tracked in a real MLflow
store. The LM is the stub OpenAI-compatible server; the index a tiny BM25 one."""

import builtins
import io
import json
import os
from pathlib import Path

import pytest
from helpers import TINY_ROWS, snippet, write_jsonl
from stub_server import OPTIONS, SECRET, Stub

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.files import file_sha256


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    from hcqr_dspy.optimize.saved import save_program
    from hcqr_dspy.programs import HCQR
    from hcqr_dspy.retrieval import load_index

    monkeypatch.setenv("STUB_KEY", SECRET)
    write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
    index = ["index", "--corpus", str(tmp_path / "corpus.jsonl"), "--retriever", "bm25", "--out", str(tmp_path / "idx")]
    assert main(index) == 0
    save_program(HCQR(load_index(tmp_path / "idx"), budget=4), tmp_path / "prog")
    rows = {f"q{n}": {"question": f"Question number {n}?", "options": OPTIONS, "answer": "C"} for n in (1, 2)}
    (tmp_path / "questions.json").write_text(json.dumps(rows))
    capsys.readouterr()
    stub = Stub()
    yield {"root": tmp_path, "lm": ["--lm", "openai/stub-model", "--api-base", stub.base, "--api-key-env", "STUB_KEY"]}
    stub.stop()


def opens_in(monkeypatch, folder: Path) -> list[str]:
    """The names of the files in ``folder`` opened from now on (every ``open``: builtins, ``io`` and ``Path``'s)."""
    opened, real, where = [], io.open, folder.resolve()

    def counting(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file).resolve().parent == where:
            opened.append(Path(file).name)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting)
    monkeypatch.setattr(builtins, "open", counting)
    return opened


def evaluate(world, *args) -> int:
    root = world["root"]
    return main(
        [
            "eval",
            "--dataset",
            str(root / "questions.json"),
            "--index",
            str(root / "idx"),
            "--run-dir",
            str(root / "run"),
            "--mlflow-dir",
            str(root / "mlruns"),
            *world["lm"],
            *args,
        ]
    )


def test_an_eval_of_a_saved_program_reads_its_program_json_once(world, monkeypatch):
    prog = world["root"] / "prog"
    opened = opens_in(monkeypatch, prog)
    assert evaluate(world, "--program", str(prog)) == 0
    assert sorted(opened) == ["meta.json", "program.json"]  # each once: meta, hash, overlap, load, record
    monkeypatch.undo()
    record = RunFolder.open(world["root"] / "run").config["saved_program"]
    assert record["program_sha256"] == file_sha256(prog / "program.json") and record["train_count"] == 0


def test_an_eval_with_a_saved_answer_step_reads_its_program_json_once(world, monkeypatch):
    prog = world["root"] / "prog"
    opened = opens_in(monkeypatch, prog)
    assert evaluate(world, "--method", "simple_rag", "--answer-step", str(prog)) == 0
    assert sorted(opened) == ["meta.json", "program.json"]
    monkeypatch.undo()
    record = RunFolder.open(world["root"] / "run").config["answer_step"]
    assert record["program_sha256"] == file_sha256(prog / "program.json")
