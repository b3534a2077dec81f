"""The run folder's format number and portable records: a folder written without a format number (format 1, as
every committed run folder is) resumes as the same configuration and keeps its ``config.json`` as it was; another
configuration is still refused; a newer format is refused in one line. A run folder, a saved program and an index
copied to another clone (and its data to another data root) resolve there without overrides, relative records and
other machines' absolute ones alike. DummyLM answers; the demo data and a BM25 index over the demo corpus."""

import json
import logging
import shutil
from pathlib import Path

import dspy
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.resources import shipped_dir


def answering():
    return DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())


def evaluate(**kw):
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    lm = answering()
    result, folder, _ = run_evaluation(EvalSpec(lm="openai/dummy", limit=2, **kw), lm=lm, track=False, progress=False)
    return result, folder, lm


def stop_after_first_row(folder: Path) -> None:
    rows = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(rows[0])


def test_a_folder_without_a_format_number_resumes_as_the_same_configuration_and_another_is_refused(
    tmp_path, capsys, caplog
):
    questions = str(shipped_dir("demo") / "questions.json")
    run_dir = tmp_path / "run"
    _, folder, _ = evaluate(method="cot", dataset=questions, run_dir=str(run_dir))
    written = json.loads((folder / "config.json").read_text())
    assert written["format"] == 2 and RunFolder.open(folder).stored.format == 2
    assert "format" not in RunFolder.open(folder).config  # the number is the file's, not the configuration's

    # a format 1 folder, as the old code wrote it: no format number, the prompts' hash not recorded
    old = {k: v for k, v in written.items() if k not in ("format", "prompts_sha256")}
    (folder / "config.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    stop_after_first_row(folder)
    before = (folder / "config.json").read_bytes()
    with pytest.raises(HCQRError, match=r"another configuration \(differs in: lm\)"):  # still refused
        evaluate(method="cot", dataset=questions, run_dir=str(run_dir), temperature=0.7)
    assert (folder / "config.json").read_bytes() == before  # nothing written
    result, _, lm = evaluate(method="cot", dataset=questions, run_dir=str(run_dir))
    assert result.ran == 1 and len(lm.history) == 1  # resumed: only the question not answered yet
    resumed = json.loads((folder / "config.json").read_text())
    assert "format" not in resumed  # the folder keeps its format
    resumed.pop("mlflow_run_id")  # None: a run not tracked
    assert resumed == {**old, "prompts_sha256": written["prompts_sha256"]}  # and its record, now with the hash
    assert "did not record prompts_sha256" in caplog.text  # a WARNING of the hcqr_dspy logger

    # a format 2 folder lacking an identity it records is another configuration
    (folder / "config.json").write_text(json.dumps({**old, "format": 2}))
    with pytest.raises(HCQRError, match=r"another configuration \(differs in: prompts_sha256\)"):
        evaluate(method="cot", dataset=questions, run_dir=str(run_dir))

    # a newer format: one line, exit 2, nothing written
    (folder / "config.json").write_text(json.dumps({**written, "format": 3}))
    shutil.copytree(folder, tmp_path / "other")
    before = (folder / "config.json").read_bytes()
    capsys.readouterr()
    code = main(["compare", str(folder), str(tmp_path / "other"), "--out", str(tmp_path / "cmp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"hcqr: error: {folder / 'config.json'} is run folder format 3, newer than this hcqr-dspy reads (2); "
        "upgrade hcqr-dspy"
    )
    assert (folder / "config.json").read_bytes() == before and not (tmp_path / "cmp").exists()


def clone(root: Path) -> dict[str, Path]:
    """A project clone at ``root`` (its ``pyproject.toml``) and its data root beside it (``../shared/data``)."""
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    demo = shipped_dir("demo")
    (root / "repo").mkdir(parents=True)
    (root / "repo" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    data = root / "shared" / "data" / "benchmark"
    data.mkdir(parents=True)
    shutil.copy(demo / "questions.json", data / "questions.json")
    BM25Retriever(load_corpus(demo / "corpus.jsonl"), show_progress=False).save(root / "repo" / "indexes" / "bm25")
    return {"repo": root / "repo", "questions": data / "questions.json", "index": root / "repo" / "indexes" / "bm25"}


def test_a_run_a_program_and_an_index_copied_to_another_clone_resolve_there_without_overrides(
    tmp_path, tiny_corpus_file, monkeypatch, capsys, caplog
):
    from hcqr_dspy.optimize.saved import NoRetriever, read_meta, save_program
    from hcqr_dspy.programs import make_program
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus, load_index
    from hcqr_dspy.workflows.programs import run_program
    from hcqr_dspy.workflows.register import serving_index
    from hcqr_dspy.workflows.specs import open_index

    caplog.set_level(logging.INFO, logger="hcqr_dspy")  # notes are logged (the moved-inputs one is INFO)
    monkeypatch.delenv("HCQR_DATA", raising=False)
    a = clone(tmp_path / "a")
    monkeypatch.chdir(a["repo"])  # commands run from the clone's root
    _, index_info = open_index("simple_rag", str(a["index"]))
    program = save_program(make_program("simple_rag", NoRetriever()), a["repo"] / "programs" / "p", index=index_info)
    run_dir = a["repo"] / "runs" / "r"
    evaluate(method=None, program="programs/p", dataset=str(a["questions"]), index="indexes/bm25", run_dir="runs/r")
    recorded = json.loads((run_dir / "config.json").read_text())
    assert recorded["dataset"] == "$HCQR_DATA/benchmark/questions.json"
    assert recorded["index"]["path"] == "indexes/bm25" and recorded["saved_program"]["folder"] == "programs/p"
    assert json.loads((program / "meta.json").read_text())["index"]["path"] == "indexes/bm25"

    # another clone at another place, with its data root: the first one is gone
    b = {"repo": tmp_path / "b" / "repo", "data": tmp_path / "b" / "shared" / "data"}
    shutil.copytree(a["repo"], b["repo"])
    shutil.copytree(tmp_path / "a" / "shared", tmp_path / "b" / "shared")
    shutil.rmtree(tmp_path / "a")
    monkeypatch.chdir(tmp_path)  # no project here: the records are read against their own folders' clone
    folder = RunFolder.open(b["repo"] / "runs" / "r")
    assert folder.dataset == str(b["data"] / "benchmark" / "questions.json")
    assert folder.index_path == str(b["repo"] / "indexes" / "bm25")
    assert folder.saved_program["folder"] == str(b["repo"] / "programs" / "p")
    assert len(folder.load_questions()) == 20 and folder.question_sample()  # the questions' fingerprints match
    assert run_program(folder, load_index(folder.index_path)) is not None  # what rescore and replay rebuild
    meta = read_meta(b["repo"] / "programs" / "p")
    assert serving_index(meta, None, False) == (str(b["repo"] / "indexes" / "bm25"), None)  # no --index needed
    stop_after_first_row(folder.path)
    before = json.loads((folder.path / "config.json").read_text())
    monkeypatch.chdir(b["repo"])
    dataset = "../shared/data/benchmark/questions.json"
    result, _, _ = evaluate(method=None, program="programs/p", dataset=dataset, index="indexes/bm25", run_dir="runs/r")
    assert result.ran == 1 and "other places" not in caplog.text  # the same places: nothing moved
    after = json.loads((folder.path / "config.json").read_text())
    assert after.pop("mlflow_run_id") is None and after == before  # its places as recorded (a run not tracked)

    # a record with another machine's absolute paths (the committed ones): the same place under this clone,
    # matched by fingerprint
    foreign = {
        **recorded,
        "dataset": "/elsewhere/shared/data/benchmark/questions.json",
        "index": {**recorded["index"], "path": "/elsewhere/repo/indexes/bm25"},
        "saved_program": {**recorded["saved_program"], "folder": "/elsewhere/repo/programs/p"},
    }
    del foreign["format"]
    (folder.path / "config.json").write_text(json.dumps(foreign))
    folder = RunFolder.open(folder.path)
    assert folder.dataset == str(b["data"] / "benchmark" / "questions.json")
    assert folder.index_path == str(b["repo"] / "indexes" / "bm25")
    assert folder.saved_program["folder"] == str(b["repo"] / "programs" / "p")
    stop_after_first_row(folder.path)  # a resume keeps those records as they are (no format number, same places)
    result, _, _ = evaluate(method=None, program="programs/p", dataset=dataset, index="indexes/bm25", run_dir="runs/r")
    after = json.loads((folder.path / "config.json").read_text())
    assert result.ran == 1 and after.pop("mlflow_run_id") is None and after == foreign
    # an index of another corpus at that place is not the run's: the recorded path stays, and is missing
    shutil.rmtree(b["repo"] / "indexes" / "bm25")
    BM25Retriever(load_corpus(tiny_corpus_file), show_progress=False).save(b["repo"] / "indexes" / "bm25")
    assert RunFolder.open(folder.path).index_path == "/elsewhere/repo/indexes/bm25"
