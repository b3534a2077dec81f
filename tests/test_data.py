import json

import pytest

from hcqr_dspy.data import check_question, format_options, load_questions, select
from hcqr_dspy.errors import DataError


def write(tmp_path, data, name="bench.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


GOOD = {"q1": {"question": "Which?", "options": {"A": "x", "B": "y", "C": "z"}, "answer": "B"}}


def test_load_mirage_file(tmp_path):
    [ex] = load_questions(write(tmp_path, GOOD))
    assert ex.qid == "q1" and ex.answer == "B" and ex.options == {"A": "x", "B": "y", "C": "z"}
    assert set(ex.inputs().keys()) == {"question", "options"}


def test_any_number_of_options(tmp_path):
    rows = {
        "yn": {"question": "Yes or no?", "options": {"A": "yes", "B": "no"}, "answer": "A"},
        "five": {"question": "Five?", "options": dict(zip("ABCDE", "vwxyz")), "answer": "E"},
    }
    exs = load_questions(write(tmp_path, rows))
    assert [len(e.options) for e in exs] == [2, 5]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "q", "options": {"A": "x"}, "answer": "A"}, "has 1 option"),
        ({"question": "q", "options": {"1": "x", "2": "y"}, "answer": "1"}, "labels must be the letters A, B"),
        ({"question": "q", "options": {"A": "x", "C": "y"}, "answer": "A"}, "labels must be the letters A, B"),
        ({"question": "q", "options": {"A": "x", "B": "y"}, "answer": "C"}, "answer 'C', not one of its options"),
        ({"question": "", "options": {"A": "x", "B": "y"}, "answer": "A"}, "no 'question' text"),
        ({"question": "q", "options": {"A": "x", "B": " "}, "answer": "A"}, "option B is empty"),
        ("just text", "not a JSON object"),
    ],
)
def test_malformed_rows(tmp_path, row, message):
    with pytest.raises(DataError, match=message) as err:
        load_questions(write(tmp_path, {"bad1": row}))
    assert "bad1" in str(err.value) and "bench.json" in str(err.value)


def test_invalid_json_names_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"a": {\n  "question": }', encoding="utf-8")
    with pytest.raises(DataError, match=r"broken\.json:2: not valid JSON"):
        load_questions(path)


@pytest.mark.parametrize("name", ["bench.json", "bench.jsonl"])
def test_non_utf8_question_file_names_the_line(tmp_path, name):
    row = json.dumps({"question": "Gr\u00e4fe?", "options": {"A": "a", "B": "b"}, "answer": "A"}, ensure_ascii=False)
    text = (
        f'{{"q1":\n{row}}}'
        if name.endswith(".json")
        else f'{{"id": "q0", "question": "ok?", "options": {{"A": "a", "B": "b"}}, "answer": "A"}}\n{row}'
    )
    (tmp_path / name).write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError, match=rf"{name}:2: not valid UTF-8 text \(byte 0xe4 at column \d+\)") as err:
        load_questions(tmp_path / name)
    assert "\n" not in str(err.value)


def test_a_repeated_option_letter_is_named_as_an_option_not_an_id(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text('{"q1": {"question": "?", "options": {"A": "x", "A": "y"}, "answer": "A"}}', encoding="utf-8")
    with pytest.raises(DataError, match=r"bench\.json: key 'A' appears twice in one JSON object") as err:
        load_questions(path)
    assert "question ids must be unique" not in str(err.value)


def test_select_is_deterministic_and_ordered():
    exs = [
        check_question(f"q{i}", {"question": "?", "options": {"A": "a", "B": "b"}, "answer": "A"}, "x")
        for i in range(50)
    ]
    a = select(exs, limit=10, seed=3)
    assert a == select(exs, limit=10, seed=3)
    assert [e.qid for e in a] == sorted((e.qid for e in a), key=lambda q: int(q[1:]))
    assert select(exs, limit=10, seed=4) != a
    assert [e.qid for e in select(exs, ids=["q7", "q2"])] == ["q2", "q7"]
    with pytest.raises(DataError, match="unknown question ids: nope"):
        select(exs, ids=["nope"])


def test_format_options():
    assert format_options({"A": "x", "B": "y"}) == "A. x\nB. y"


def test_real_benchmarks_load(shared_data):
    medqa = load_questions(shared_data / "benchmark" / "medqa.json")
    assert len(medqa) == 1273 and medqa[0].qid == "0000"
    mmlu = load_questions(shared_data / "benchmark" / "mmlu.json")
    assert len(mmlu) == 1089


def test_repeated_question_ids_are_refused(tmp_path):
    q = {"question": "Which?", "options": {"A": "x", "B": "y"}, "answer": "A"}
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"id": "q1", **q}, {"id": "q1", **q}]))
    with pytest.raises(DataError, match="question id 'q1' appears twice"):
        load_questions(listed)
    keyed = tmp_path / "keys.json"
    keyed.write_text(f'{{"q1": {json.dumps(q)}, "q1": {json.dumps(q)}}}')
    with pytest.raises(DataError, match=r"keys\.json: key 'q1' appears twice"):
        load_questions(keyed)


def test_non_text_option(tmp_path):
    with pytest.raises(DataError, match=r"option A is not text \(int\)"):
        load_questions(write(tmp_path, {"q": {"question": "?", "options": {"A": 1, "B": "y"}, "answer": "A"}}))
