"""`hcqr split`: seeded, reproducible, non-overlapping train / validation / test files whose union is the source
file; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hcqr_dspy.cli import main
from hcqr_dspy.data import load_questions
from hcqr_dspy.workflows.split import part_sizes

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo" / "questions.json"
PARTS = ("train", "val", "test")


def split(capsys, source, out, *extra: str) -> tuple[int, list[str]]:
    """``hcqr split source --out out extra...``: its exit code and its stderr lines."""
    code = main(["split", str(source), "--out", str(out), *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def as_rows(examples) -> dict[str, tuple]:
    return {e.qid: (e.question, dict(e.options), e.answer) for e in examples}


def test_a_split_is_seeded_reproducible_non_overlapping_and_its_union_is_the_file(tmp_path, capsys):
    assert split(capsys, DEMO, tmp_path / "a", "--seed", "3")[0] == 0
    assert split(capsys, DEMO, tmp_path / "b", "--seed", "3")[0] == 0
    assert split(capsys, DEMO, tmp_path / "c", "--seed", "4")[0] == 0
    assert contents(tmp_path / "a") == contents(tmp_path / "b")  # same file, fractions and seed: same bytes
    assert sorted(contents(tmp_path / "a")) == ["split.json", "test.json", "train.json", "val.json"]
    parts = {p: load_questions(tmp_path / "a" / f"{p}.json") for p in PARTS}
    other = load_questions(tmp_path / "c" / "train.json")
    assert [e.qid for e in other] != [e.qid for e in parts["train"]]  # another seed, another draw
    assert {p: len(v) for p, v in parts.items()} == {"train": 10, "val": 4, "test": 6}  # 0.5,0.2,0.3 of 20
    ids = [set(as_rows(v)) for v in parts.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    source = load_questions(DEMO)
    union = {qid: row for v in parts.values() for qid, row in as_rows(v).items()}
    assert union == as_rows(source)
    order = [e.qid for e in source]
    for examples in parts.values():  # each part in the source file's order, its rows as the file holds them
        assert [e.qid for e in examples] == [q for q in order if q in {e.qid for e in examples}]
    raw = json.loads(DEMO.read_text(encoding="utf-8"))
    train = json.loads((tmp_path / "a" / "train.json").read_text(encoding="utf-8"))
    assert train == {qid: raw[qid] for qid in train}
    record = json.loads((tmp_path / "a" / "split.json").read_text(encoding="utf-8"))
    assert record["seed"] == 3 and record["fractions"] == {"train": 0.5, "val": 0.2, "test": 0.3}
    assert record["source"]["questions"] == 20 and len(record["source"]["sha256"]) == 64
    assert {p: record["parts"][p]["ids"] for p in PARTS} == {p: [e.qid for e in parts[p]] for p in PARTS}


def test_a_json_lines_file_splits_into_mirage_json_files(tmp_path, capsys):
    rows = [{"id": f"q{i}", "question": f"Question {i}?", "options": ["x", "y"], "answer": "A"} for i in range(6)]
    source = tmp_path / "qs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert split(capsys, source, tmp_path / "s")[0] == 0
    parts = {p: load_questions(tmp_path / "s" / f"{p}.json") for p in PARTS}
    assert [len(parts[p]) for p in PARTS] == [3, 1, 2]  # 3, 1.2, 1.8: the left-over question to the largest remainder
    assert {q for v in parts.values() for q in as_rows(v)} == {f"q{i}" for i in range(6)}


@pytest.mark.parametrize("count", [3, 7, 20, 101, 1089])
@pytest.mark.parametrize("fractions", [(0.5, 0.2, 0.3), (0.29, 0.36, 0.35), (0.8, 0.1, 0.1), (1 / 3, 1 / 3, 1 / 3)])
def test_part_sizes_add_up_to_the_count_and_follow_the_fractions(count, fractions):
    sizes = part_sizes(count, fractions)
    assert sum(sizes) == count
    assert all(abs(n - f * count) < 1 for n, f in zip(sizes, fractions))


@pytest.mark.parametrize(
    "fractions, message",
    [
        (
            "0.7,0.3",
            "--fractions '0.7,0.3' has 2 part(s); give three numbers, train,validation,test (e.g. 0.5,0.2,0.3)",
        ),
        ("0.5,x,0.5", "--fractions '0.5,x,0.5': the validation fraction 'x' is not a number"),
        ("0.5,0.5,nan", "--fractions '0.5,0.5,nan': the test fraction 'nan' is not a number"),
        ("0.6,-0.1,0.5", "--fractions '0.6,-0.1,0.5': the validation fraction -0.1 is negative"),
        ("0.5,0.2,0.2", "--fractions '0.5,0.2,0.2' sum to 0.9; they must sum to 1"),
        ("0.5,0.2,0.300001", "--fractions '0.5,0.2,0.300001' sum to 1.000001; they must sum to 1"),
        (
            "0.98,0.01,0.01",
            "20 questions split by --fractions 0.98,0.01,0.01 give train 20, validation 0, test 0; every part needs at "
            "least one question: give the empty ones a larger fraction, or split a larger file",
        ),
        (
            "0.5,0,0.5",
            "20 questions split by --fractions 0.5,0,0.5 give train 10, validation 0, test 10; every part needs at "
            "least one question: give the empty ones a larger fraction, or split a larger file",
        ),
    ],
)
def test_bad_fractions_are_one_line_and_nothing_is_written(tmp_path, capsys, fractions, message):
    code, err = split(capsys, DEMO, tmp_path / "s", "--fractions", fractions)
    assert (code, err) == (2, [f"hcqr: error: {message}"])
    assert not (tmp_path / "s").exists()


def test_fractions_within_1e_9_of_one_are_accepted(tmp_path, capsys):
    assert split(capsys, DEMO, tmp_path / "s", "--fractions", "0.5,0.2,0.3000000000001")[0] == 0


def test_an_out_that_holds_other_records_or_a_split_is_refused_unless_replaced(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    code, err = split(capsys, DEMO, run)
    assert (code, err) == (
        2,
        [
            f"hcqr: error: --out {run} is a run folder (it holds config.json, written by `hcqr eval`); write the split "
            "to a folder of its own"
        ],
    )
    assert contents(run) == {"config.json": b"{}"}
    file = tmp_path / "file"
    file.write_text("x")
    assert split(capsys, DEMO, file) == (
        2,
        [f"hcqr: error: --out {file} exists and is not a folder; choose another --out"],
    )

    out = tmp_path / "s"
    assert split(capsys, DEMO, out)[0] == 0
    before = contents(out)
    code, err = split(capsys, DEMO, out, "--seed", "1")
    assert (code, err) == (
        2,
        [
            f"hcqr: error: --out {out} holds a split (train.json, val.json, test.json, split.json: seed 0, fractions "
            f"0.5,0.2,0.3 of {DEMO}); give --replace to split over it, or choose another --out"
        ],
    )
    assert contents(out) == before
    train = out / "train.json"
    code, err = split(capsys, train, out, "--replace")
    assert (code, err) == (
        2,
        [f"hcqr: error: the question file {train} is --out's train.json, which the split writes; choose another --out"],
    )
    assert contents(out) == before
    assert split(capsys, DEMO, out, "--seed", "1", "--replace")[0] == 0
    assert json.loads((out / "split.json").read_text())["seed"] == 1 and contents(out) != before


def test_a_file_that_is_not_there_or_not_questions_is_one_line(tmp_path, capsys):
    assert split(capsys, tmp_path / "none.json", tmp_path / "s") == (
        2,
        [f"hcqr: error: question file {tmp_path / 'none.json'} not found"],
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"q1": {"question": "Q?", "options": {"A": "a", "B": "b"}, "answer": "E"}}')
    code, err = split(capsys, bad, tmp_path / "s")
    assert code == 2 and len(err) == 1 and "has answer 'E', not one of its options" in err[0]
    assert not (tmp_path / "s").exists()
