"""`hcqr index` / `hcqr search`: output and exit code 2 with one clear message on bad input."""

import json

import pytest

from helpers import snippet, write_jsonl
from hcqr_dspy.cli import main


@pytest.fixture
def bm25_index(tmp_path, tiny_corpus_file, capsys):
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_corpus_file), "--retriever", "bm25", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passages"] == 8 and report["size_bytes"] > 0
    return out


def test_index_then_search_prints_ranked_titles(bm25_index, capsys):
    assert main(["search", "--index", str(bm25_index), "--k", "2", "digoxin yellow vision", "ptosis acetylcholine"]) == 0
    out = capsys.readouterr().out
    assert "## digoxin yellow vision" in out and "## ptosis acetylcholine" in out
    first = out.split("## ptosis")[0]
    assert "  1  " in first and "[p3] Digoxin toxicity" in first
    assert "[p7] Myasthenia gravis" in out.split("## ptosis")[1]


def error_of(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_search_empty_query_exit_2(bm25_index, capsys):
    code, err = error_of(capsys, ["search", "--index", str(bm25_index), "  "])
    assert code == 2 and err == ["hcqr: error: query 1 is empty"]


def test_search_bad_k_exit_2(bm25_index, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--index", str(bm25_index), "--k", "0", "anemia"])
    assert exc.value.code == 2
    assert "expected a positive integer, got 0" in capsys.readouterr().err


def test_search_index_for_another_corpus_exit_2(bm25_index, tmp_path, capsys):
    other = write_jsonl(tmp_path / "other.jsonl", [snippet("z", "Z", "something else")])
    code, err = error_of(capsys, ["search", "--index", str(bm25_index), "--corpus", str(other), "anemia"])
    assert code == 2 and len(err) == 1 and "was built for corpus" in err[0] and "other.jsonl" in err[0]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "holds no passages"),
        (b'{"id": "a", "title": "t"}\n', "bad.jsonl:1: row 'a' has no 'content'"),
        (b'{"id": "a", "content": "x"}\n{"id": "a", "content": "y"}\n', "bad.jsonl:2: duplicate passage id 'a'"),
        (b'{"id": "a", "content": "\xff"}\n', "bad.jsonl:1: not valid UTF-8"),
    ],
)
def test_index_bad_corpus_exit_2(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    out = tmp_path / "idx"
    code, err = error_of(capsys, ["index", "--corpus", str(bad), "--retriever", "bm25", "--out", str(out)])
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not out.exists()


def test_search_not_an_index_exit_2(tmp_path, capsys):
    code, err = error_of(capsys, ["search", "--index", str(tmp_path), "anemia"])
    assert code == 2 and "not an hcqr index folder" in err[0]
