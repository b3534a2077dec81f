import pytest
from helpers import TINY_ROWS, snippet, write_jsonl

from hcqr_dspy.errors import CorpusError
from hcqr_dspy.retrieval import Corpus, Passage, load_corpus


def test_load_file_keeps_order_and_fields(tiny_corpus_file):
    corpus = load_corpus(tiny_corpus_file)
    assert len(corpus) == len(TINY_ROWS)
    assert [p.id for p in corpus] == [r[0] for r in TINY_ROWS]
    p = corpus.get("p3")
    assert p.title == "Digoxin toxicity" and p.content.startswith("Nausea")
    assert p.text == "Digoxin toxicity\n" + p.content


def test_load_folder_reads_all_files_sorted(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [snippet("b1", "B", "second file")])
    write_jsonl(tmp_path / "sub" / "a.jsonl", [snippet("a1", "A", "nested file")])
    write_jsonl(tmp_path / "a.jsonl", [snippet("a0", "A", "first file")])
    (tmp_path / "notes.txt").write_text("ignored")
    corpus = load_corpus(tmp_path)
    assert [p.id for p in corpus] == ["a0", "b1", "a1"]


def test_fingerprint_tracks_content(tmp_path, tiny_corpus_file):
    a = load_corpus(tiny_corpus_file)
    b = load_corpus(tiny_corpus_file)
    assert a.fingerprint == b.fingerprint
    rows = [snippet(*r) for r in TINY_ROWS]
    rows[0]["content"] += " changed"
    c = load_corpus(write_jsonl(tmp_path / "changed.jsonl", rows))
    assert c.fingerprint != a.fingerprint


def test_numeric_ids_become_strings(tmp_path):
    corpus = load_corpus(write_jsonl(tmp_path / "n.jsonl", [{"id": 7, "title": "", "content": "x y"}]))
    assert corpus.get("7").content == "x y"


@pytest.mark.parametrize(
    "lines, message",
    [
        ([], "holds no passages"),
        (['{"id": "a", "title": "t"}'], "no 'content'"),
        (['{"id": "a", "title": "t", "content": "   "}'], "no 'content'"),
        (['{"title": "t", "content": "c"}'], "no 'id'"),
        (['{"id": "a", "content": "c"}', '{"id": "a", "content": "d"}'], "duplicate passage id 'a'"),
        (
            [
                '{"id": "a", "content": "c"',
            ],
            "not valid JSON",
        ),
        (['["a", "b"]'], "expected a JSON object"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    with pytest.raises(CorpusError, match=message) as err:
        load_corpus(path)
    if lines:
        assert f"{path}:{len(lines)}" in str(err.value)


def test_duplicate_across_files_names_both(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [snippet("x", "A", "one")])
    write_jsonl(tmp_path / "b.jsonl", [snippet("x", "B", "two")])
    with pytest.raises(CorpusError, match=r"b\.jsonl:1: duplicate passage id 'x' \(first seen at .*a\.jsonl:1\)"):
        load_corpus(tmp_path)


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "a", "content": "ok"}\n{"id": "b", "content": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"latin1\.jsonl:2: not valid UTF-8"):
        load_corpus(path)


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match="no .jsonl files"):
        load_corpus(tmp_path)


def test_hub_name_offline_gives_clear_error():
    with pytest.raises(CorpusError, match=r"could not load hub dataset 'MedRAG/textbooks'.*network"):
        load_corpus("MedRAG/textbooks")


def test_in_memory_corpus_rejects_empty_and_duplicates():
    with pytest.raises(CorpusError, match="no passages"):
        Corpus([])
    with pytest.raises(CorpusError, match="duplicate"):
        Corpus([Passage("a", "", "x"), Passage("a", "", "y")])


def test_real_textbook_file_loads(shared_data):
    corpus = load_corpus(shared_data / "corpus" / "textbooks" / "Pathoma_Husain.jsonl")
    assert len(corpus) > 100
    assert all(p.content for p in corpus)


def test_duplicate_ids_can_be_renamed_losslessly(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [snippet("x", "A", "one"), snippet("y", "B", "two"), snippet("x", "C", "three"), snippet("x", "D", "four")],
    )
    with pytest.raises(CorpusError, match="duplicate passage id 'x'.*--duplicate-ids rename"):
        load_corpus(path)
    corpus = load_corpus(path, duplicate_ids="rename")
    assert [p.id for p in corpus] == ["x", "y", "x#2", "x#3"]
    assert corpus.get("x#3").content == "four" and corpus.renamed == 2
    with pytest.raises(CorpusError, match="duplicate_ids must be one of"):
        load_corpus(path, duplicate_ids="drop")


def test_renamed_index_reloads_its_corpus_with_the_same_policy(tmp_path):
    from hcqr_dspy.retrieval import BM25Retriever, load_index

    path = write_jsonl(
        tmp_path / "d.jsonl", [snippet("x", "Anemia", "iron deficiency"), snippet("x", "Thyroid", "graves")]
    )
    out = BM25Retriever(load_corpus(path, duplicate_ids="rename"), show_progress=False).save(tmp_path / "idx")
    r = load_index(out)
    assert r.search(["graves"], 1)[0][0].passage_id == "x#2"
