"""What a finished or partial run is checked against when it is read again or resumed: its questions
(`RunFolder.load_questions`, used by judge, rescore, replay and compare: the recorded question fingerprint, and
`--dataset` once the data moved) and its prompts (`prompts_sha256`). DummyLM-made runs over a copy of the demo
questions and a demo BM25 index."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hcqr_dspy.cli import main
from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.evaluation.run_questions import move_dataset

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
IDS = ["demo-003", "demo-007", "demo-011"]


@pytest.fixture(scope="module")
def bm25(tmp_path_factory):
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    root = tmp_path_factory.mktemp("bm25")
    return BM25Retriever(load_corpus(DEMO / "corpus.jsonl"), show_progress=False).save(root / "bm25")


def simple_rag_run(tmp_path: Path, bm25: Path, **sample) -> tuple[Path, Path]:
    """A Simple RAG run (every answer A) over a copy of the demo questions: (run folder, dataset copy)."""
    import dspy
    from dspy.utils import DummyLM

    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    data = Path(shutil.copy(DEMO / "questions.json", tmp_path / "questions.json"))
    spec = EvalSpec(
        method="simple_rag", dataset=str(data), index=str(bm25), lm="dummy/x", run_dir=str(tmp_path / "run"), **sample
    )
    lm = DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())
    return run_evaluation(spec, progress=False, track=False, lm=lm)[1], data


def edit(data: Path, qid: str, out: Path | None = None) -> Path:
    """``data`` with question ``qid``'s gold answer changed (same ids), written to ``out`` (default: in place)."""
    questions = json.loads(data.read_text())
    questions[qid]["answer"] = next(k for k in questions[qid]["options"] if k != questions[qid]["answer"])
    out = out or data
    out.write_text(json.dumps(questions))
    return out


def sampled(folder: Path) -> list[str]:
    return [json.loads(line)["qid"] for line in (folder / "predictions.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("sample", [{"limit": 3, "seed": 1}, {"ids": IDS}], ids=["limit-seed", "id-list"])
def test_a_dataset_edited_since_the_run_is_refused(tmp_path, bm25, sample):
    folder, data = simple_rag_run(tmp_path, bm25, **sample)
    qids = sampled(folder)
    assert len(RunFolder.open(folder).load_questions()) == 20  # unchanged: read as it was
    outside = next(q for q in json.loads(data.read_text()) if q not in qids)
    edit(data, outside)  # a question the run did not draw: its sample is unchanged
    assert len(RunFolder.open(folder).load_questions()) == 20
    edit(data, qids[1])
    with pytest.raises(RunError, match="not the ones the run was made with .*content fingerprint differs"):
        RunFolder.open(folder).load_questions()


def test_an_unfinished_id_list_run_is_checked_by_its_ids_alone(tmp_path, bm25):
    """Its sample cannot be rebuilt (the ids it was given are not recorded, only their hash), so an edited
    question's content goes unseen where the run lies until it is finished (run_questions.py says so); moved
    with --dataset, it is refused."""
    folder, data = simple_rag_run(tmp_path, bm25, ids=IDS)
    lines = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(lines[0])
    edit(data, json.loads(lines[0])["qid"])
    assert len(RunFolder.open(folder).load_questions()) == 20
    with pytest.raises(RunError, match="its question sample cannot be rebuilt from .* to check its content"):
        move_dataset(RunFolder.open(folder), str(shutil.copy(data, tmp_path / "copy.json")))


def test_a_reordered_file_is_checked_in_the_runs_own_order(tmp_path, bm25):
    """A finished run answered one question at a time: its rows give the sample's order, so a file whose
    questions were reordered is still checked by content (an edited answer refused)."""
    folder, data = simple_rag_run(tmp_path, bm25, limit=3, seed=1)
    questions = json.loads(data.read_text())
    data.write_text(json.dumps(dict(reversed(questions.items()))))
    assert len(RunFolder.open(folder).load_questions()) == 20
    edit(data, sampled(folder)[2])
    with pytest.raises(RunError, match="content fingerprint differs"):
        RunFolder.open(folder).load_questions()


def test_dataset_moves_a_runs_questions_once_they_are_checked(tmp_path, bm25, capsys):
    folder, data = simple_rag_run(tmp_path, bm25, limit=3)
    recorded = RunFolder.open(folder).config["dataset"]
    (tmp_path / "mounted").mkdir()
    moved = Path(shutil.move(data, tmp_path / "mounted" / "questions.json"))
    with pytest.raises(RunError, match="its dataset cannot be read"):
        RunFolder.open(folder).load_questions()
    # another file with the same ids is refused: nothing recorded, nothing loaded
    other = edit(moved, next(q for q in sampled(folder) if q not in IDS), out=tmp_path / "edited.json")
    assert main(["rescore", str(folder), "--dataset", str(other)]) == 2
    assert "content fingerprint differs" in capsys.readouterr().err
    assert RunFolder.open(folder).config["dataset"] == recorded
    # a command refused after the move (replay's --index missing) moves nothing
    assert main(["replay", str(folder), "--index", str(tmp_path / "nowhere"), "--dataset", str(moved)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert RunFolder.open(folder).config["dataset"] == recorded
    # several runs, the file right for the first and not for the second: none is moved
    (tmp_path / "stranger").mkdir()
    stranger, _ = simple_rag_run(tmp_path / "stranger", bm25, ids=IDS)
    before = RunFolder.open(stranger).config["dataset"]
    assert main(["replay", str(stranger), str(folder), "--index", str(bm25), "--dataset", str(other)]) == 2
    assert "content fingerprint differs" in capsys.readouterr().err
    assert RunFolder.open(folder).config["dataset"] == recorded
    assert RunFolder.open(stranger).config["dataset"] == before
    # the moved file: recorded once checked, and the command goes on with it
    assert main(["replay", str(folder), "--index", str(bm25), "--dataset", str(moved)]) == 0
    captured = capsys.readouterr()
    assert f"its questions are read from {moved} now (recorded: {recorded})" in captured.err
    assert captured.out.startswith("# Query replay against")
    assert RunFolder.open(folder).config["dataset"] == str(moved.resolve())
    assert len(RunFolder.open(folder).load_questions()) == 20
    # the same place again: nothing to say, nothing written
    assert main(["replay", str(folder), "--index", str(bm25), "--dataset", str(moved)]) == 0
    assert "its questions are read from" not in capsys.readouterr().err


def test_judge_refuses_dataset_without_run_folders_and_a_folder_or_nothing_as_dataset(tmp_path, capsys):
    assert main(["judge", "--labelled-set", "--judge-lm", "openai/x", "--dataset", "q.json"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hcqr: error: --dataset says where run folders' dataset lies now: give run folders with it"
    )
    for bad, message in [(str(tmp_path), "is a folder: give the runs' question file"), (" ", "needs the path")]:
        assert main(["judge", str(tmp_path / "run"), "--dataset", bad]) == 2
        assert message in capsys.readouterr().err


def test_a_run_is_not_resumed_with_other_prompts(tmp_path, monkeypatch, capsys, caplog):
    """A signature reworded since the run started (an upgrade, an edit of the code) sends other prompts: the
    resume is refused. A format 1 run folder (no format number) without the prompts' hash resumes and records it from
    then on."""
    import dspy
    from dspy.utils import DummyLM

    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.programs import cot
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.programs import run_program
    from hcqr_dspy.workflows.specs import EvalSpec

    spec = EvalSpec(
        method="cot", dataset=str(DEMO / "questions.json"), lm="dummy/x", limit=2, run_dir=str(tmp_path / "run")
    )

    def answering():
        return DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())

    _, folder, _ = run_evaluation(spec, lm=answering(), track=False, progress=False)
    recorded = RunFolder.open(folder).config["prompts_sha256"]
    rows = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(rows[0])  # the run stopped after its first question
    reworded = cot.AnswerQuestionNoContext.with_instructions("Answer the question; think step by step first.")
    monkeypatch.setattr(cot, "AnswerQuestionNoContext", reworded)
    lm = answering()
    with pytest.raises(HCQRError, match=r"another configuration \(differs in: prompts_sha256\)"):
        run_evaluation(spec, lm=lm, track=False, progress=False)
    assert lm.history == []
    with pytest.raises(RunError, match="sends other prompts than the run did"):
        run_program(RunFolder.open(folder))  # rescore and replay rebuild it: refused too
    monkeypatch.undo()
    assert run_program(RunFolder.open(folder)) is not None
    config = json.loads((folder / "config.json").read_text())
    del config["prompts_sha256"], config["format"]  # a format 1 folder, which may lack the prompts' hash
    (folder / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    result, _, _ = run_evaluation(spec, lm=answering(), track=False, progress=False)
    assert result.ran == 1 and RunFolder.open(folder).config["prompts_sha256"] == recorded
    assert "written by an earlier version that did not record prompts_sha256" in caplog.text
