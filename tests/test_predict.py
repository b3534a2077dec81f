"""`hcqr predict`: a file of questions without gold answers (MIRAGE JSON or JSON Lines) answered by a saved
program through the run-folder machinery (resumable, tracked as a prediction run); a file with answers is
scored too; `hcqr eval` still requires gold answers. The LM is the stub OpenAI-compatible server."""

import json

import mlflow
import pytest
from helpers import TINY_ROWS, snippet, write_jsonl
from stub_server import OPTIONS, SECRET, Stub

from hcqr_dspy.cli import main
from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import DataError


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    from hcqr_dspy.optimize.saved import save_program
    from hcqr_dspy.programs import HCQR
    from hcqr_dspy.retrieval import load_index

    monkeypatch.setenv("STUB_KEY", SECRET)
    write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS])
    assert (
        main(
            ["index", "--corpus", str(tmp_path / "corpus.jsonl"), "--retriever", "bm25", "--out", str(tmp_path / "idx")]
        )
        == 0
    )
    save_program(HCQR(load_index(tmp_path / "idx"), budget=4), tmp_path / "prog")
    capsys.readouterr()
    stub = Stub()
    yield {
        "root": tmp_path,
        "stub": stub,
        "lm": ["--lm", "openai/stub-model", "--api-base", stub.base, "--api-key-env", "STUB_KEY"],
    }
    stub.stop()


def predict(world, input_file, out, *extra):
    return main(
        [
            "predict",
            "--program",
            str(world["root"] / "prog"),
            "--index",
            str(world["root"] / "idx"),
            "--input",
            str(input_file),
            "--out",
            str(out),
            "--mlflow-dir",
            str(world["root"] / "mlruns"),
            *world["lm"],
            *extra,
        ]
    )


def test_unlabelled_questions_are_answered_with_hypothesis_queries_and_passages_and_resume(world, capsys):
    root = world["root"]
    lines = [
        {"id": f"u{n}", "question": f"Question number {n}? Yellow halos after a new drug.", "options": OPTIONS}
        for n in (1, 2, 4)
    ]
    write_jsonl(root / "unlabelled.jsonl", lines)
    assert predict(world, root / "unlabelled.jsonl", root / "answers.jsonl", "--threads", "2") == 0
    report = capsys.readouterr().out
    assert "3 answers written to" in report and "– (no gold answers)" in report
    answers = [json.loads(line) for line in (root / "answers.jsonl").read_text().splitlines()]
    # the stub answers question n with "ABC"[(2n) % 3]: 1 -> C, 2 -> B, 4 -> C
    assert [(a["qid"], a["answer"], a["answer_text"]) for a in answers] == [
        ("u1", "C", "gamma"),
        ("u2", "B", "beta"),
        ("u4", "C", "gamma"),
    ]
    for a in answers:
        assert a["valid"] and a["hypothesis"]["working_hypothesis"] == a["answer"] and len(a["queries"]) == 3
        assert a["passages"] and set(a["passages"][0]) == {"id", "title", "score", "found_by"}
        assert "gold" not in a and "correct" not in a
    # tracked as a prediction run: questions as its input, traces without gold, only validity scored
    [run] = mlflow.search_runs(
        search_all_experiments=True, filter_string="tags.kind = 'prediction'", output_format="list"
    )
    assert run.info.run_name == "predict hcqr+saved · unlabelled · openai/stub-model"
    assert run.data.metrics["valid/mean"] == 1.0 and "correct/mean" not in run.data.metrics
    assert "accuracy" not in run.data.metrics and run.data.metrics["n"] == 3
    # the same command resumes: no question is asked again (the LM only gets its one-question check)
    calls = world["stub"].count
    assert predict(world, root / "unlabelled.jsonl", root / "answers.jsonl") == 0
    assert "0 questions run now, 3 resumed" in capsys.readouterr().out and world["stub"].count - calls <= 1


def test_a_file_with_answers_is_scored_and_json_answers_are_keyed_by_qid(world, capsys):
    root = world["root"]
    rows = {
        f"l{n}": {"question": f"Question number {n}?", "options": OPTIONS, "answer": gold}
        for n, gold in ((1, "C"), (2, "A"))
    }
    (root / "labelled.json").write_text(json.dumps(rows))
    assert predict(world, root / "labelled.json", root / "answers.json", "--no-mlflow") == 0
    assert "| 2 | 50.0% |" in capsys.readouterr().out
    answers = json.loads((root / "answers.json").read_text())
    assert (answers["l1"]["gold"], answers["l1"]["correct"]) == ("C", True)
    assert (answers["l2"]["answer"], answers["l2"]["correct"]) == ("B", False)


def test_eval_still_requires_gold_answers_and_predict_refuses_a_bad_out(world, capsys):
    root = world["root"]
    write_jsonl(root / "unlabelled.jsonl", [{"question": "Question number 1?", "options": OPTIONS}])
    assert (
        main(["eval", "--method", "cot", "--dataset", str(root / "unlabelled.jsonl"), "--no-mlflow", *world["lm"]]) == 2
    )
    assert "question '1' has answer None, not one of its options" in capsys.readouterr().err
    assert predict(world, root / "unlabelled.jsonl", root) == 2  # --out is a folder
    assert "is a folder" in capsys.readouterr().err and world["stub"].count == 0
    # a given answer must still be an option, and JSON Lines errors name the line
    write_jsonl(root / "bad.jsonl", [{"question": "Q?", "options": OPTIONS, "answer": "Z"}])
    with pytest.raises(DataError, match="has answer 'Z', not one of its options"):
        load_questions(root / "bad.jsonl", labelled=False)
    (root / "broken.jsonl").write_text('{"question": "Q?", "options": ["a", "b"]}\n{not json\n')
    with pytest.raises(DataError, match=r"broken.jsonl:2: not valid JSON"):
        load_questions(root / "broken.jsonl", labelled=False)
