"""Each retriever on a tiny corpus, with the real packaged encoder (offline)."""

import json
import logging

import pytest

from hcqr_dspy.errors import QueryError, RetrievalIndexError
from hcqr_dspy.retrieval import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    build_retriever,
    load_corpus,
    load_index,
    read_manifest,
    retriever_base,
)

QUERIES = [
    "microcytic anemia low ferritin",
    "fatigable ptosis acetylcholine receptor antibodies",
    "exophthalmos TSH receptor antibodies",
]
EXPECTED_TOP = ["p1", "p7", "p4"]


@pytest.fixture(scope="module")
def dense(tiny_corpus):
    return DenseRetriever(tiny_corpus, show_progress=False)


@pytest.fixture(scope="module")
def bm25(tiny_corpus):
    return BM25Retriever(tiny_corpus, show_progress=False)


@pytest.fixture(scope="module")
def hybrid(dense, bm25):
    return HybridRetriever([dense, bm25])


@pytest.fixture(params=["dense", "bm25", "hybrid"])
def retriever(request):
    return request.getfixturevalue(request.param)


def test_batched_search_finds_the_right_passage(retriever):
    results = retriever.search(QUERIES, k=3)
    assert len(results) == 3
    assert [hits[0].passage_id for hits in results] == EXPECTED_TOP
    for hits in results:
        assert len(hits) <= 3
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len({h.passage_id for h in hits}) == len(hits)


def test_get_resolves_hits(retriever):
    hit = retriever.search(["Digoxin yellow vision"], k=1)[0][0]
    assert retriever.get(hit.passage_id).title == "Digoxin toxicity"
    with pytest.raises(KeyError, match="nope"):
        retriever.get("nope")


def test_k_larger_than_corpus_is_clipped(retriever, tiny_corpus):
    hits = retriever.search(["anemia"], k=1000)[0]
    assert 1 <= len(hits) <= len(tiny_corpus)


@pytest.mark.parametrize("k", [0, -3, 2.5, True])
def test_bad_k(retriever, k):
    with pytest.raises(QueryError, match="k must be a positive integer"):
        retriever.search(["anemia"], k=k)


@pytest.mark.parametrize(
    "queries, message",
    [
        ([], "no queries"),
        (["ok", "  "], "query 2 is empty"),
        ("anemia", "not one string"),
        (["ok", "\u200b\u200b"], "query 2 is empty"),
        (["ok", 5], r"query 2 is not a string \(int\)"),
    ],
)
def test_bad_queries(retriever, queries, message):
    with pytest.raises(QueryError, match=message):
        retriever.search(queries, k=2)


def test_dense_scores_are_cosines(dense):
    hits = dense.search(["Graves disease exophthalmos"], k=8)[0]
    assert all(-1.0001 <= h.score <= 1.0001 for h in hits)
    assert dense.dimension == 384


def test_bm25_stopword_only_query_matches_nothing(bm25):
    assert bm25.search(["the of and", "anemia"], k=2)[0] == []


@pytest.mark.parametrize("kind", ["dense", "bm25", "hybrid"])
def test_save_load_round_trip(tmp_path, tiny_corpus_file, kind):
    corpus = load_corpus(tiny_corpus_file)
    built = build_retriever(corpus, kind, show_progress=False)
    out = built.save(tmp_path / f"idx-{kind}")
    manifest = read_manifest(out)
    assert manifest["retriever"] == kind
    assert manifest["corpus"]["count"] == len(corpus)
    assert manifest["corpus"]["fingerprint"] == corpus.fingerprint
    assert manifest["versions"]["hcqr-dspy"] != "missing"
    if kind == "dense":
        assert manifest["encoder"] == "sentence-transformers/all-MiniLM-L6-v2" and manifest["dimension"] == 384
    loaded = load_index(out)  # corpus reloaded from the manifest's source
    assert loaded.search(QUERIES, 3) == built.search(QUERIES, 3)
    assert not list(tmp_path.glob(".idx-*"))  # no temporary folder left


def test_refuses_another_corpus(tmp_path, tiny_corpus_file, bm25):
    out = bm25.save(tmp_path / "idx")  # built on the in-memory tiny corpus (same rows)
    other = load_corpus(tiny_corpus_file)
    load_index(out, corpus=other)  # same passages: accepted
    rows = [json.loads(line) for line in tiny_corpus_file.read_text().splitlines()][:-1]
    smaller = tmp_path / "smaller.jsonl"
    smaller.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        RetrievalIndexError, match=r"built for corpus 'tiny' \(8 passages.*given corpus .*smaller\.jsonl' \(7 passages"
    ):
        load_index(out, corpus=smaller)


def test_refuses_another_encoder(tmp_path, dense):
    out = dense.save(tmp_path / "idx")
    load_index(out, corpus=dense.corpus, encoder="all-MiniLM-L6-v2")  # alias of the default: accepted
    with pytest.raises(
        RetrievalIndexError,
        match=r"built with encoder 'sentence-transformers/all-MiniLM-L6-v2', not 'BAAI/bge-small-en'",
    ):
        load_index(out, corpus=dense.corpus, encoder="BAAI/bge-small-en")


def test_corrupted_or_truncated_file_detected(tmp_path, dense):
    out = dense.save(tmp_path / "idx")
    f = out / "faiss.index"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # one byte changed, same size: a small index is hashed at every load
    f.write_bytes(bytes(data))
    with pytest.raises(RetrievalIndexError, match="corrupted: faiss.index does not match its checksum"):
        load_index(out, corpus=dense.corpus)
    f.write_bytes(bytes(data[:-100]))
    with pytest.raises(
        RetrievalIndexError, match=r"corrupted: faiss.index has [\d,]+ bytes, its manifest records [\d,]+"
    ):
        load_index(out, corpus=dense.corpus)
    f.unlink()
    with pytest.raises(RetrievalIndexError, match="incomplete: faiss.index is missing"):
        load_index(out, corpus=dense.corpus)


def test_a_large_index_is_checked_by_size_and_hashed_when_asked(tmp_path, dense, monkeypatch, caplog):
    """Above FULL_VERIFY_MAX_BYTES a default load checks sizes only (hashing a MedCorp-size index would read it all)
    and says so; verify_files=True still hashes."""
    out = dense.save(tmp_path / "idx")
    f = out / "faiss.index"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    monkeypatch.setattr(retriever_base, "FULL_VERIFY_MAX_BYTES", 1000)  # this index's files are "large" now
    with caplog.at_level(logging.WARNING, logger="hcqr_dspy.retrieval.retriever_base"):
        assert load_index(out, corpus=dense.corpus).search(["beta blocker"], k=2)
    assert "GB of files checked by size, not SHA-256" in caplog.text
    with pytest.raises(RetrievalIndexError, match="corrupted: faiss.index does not match its checksum"):
        load_index(out, corpus=dense.corpus, verify_files=True)
    f.write_bytes(bytes(data[:-100]))
    with pytest.raises(RetrievalIndexError, match="corrupted: faiss.index has"):
        load_index(out, corpus=dense.corpus)


def test_not_an_index_folder(tmp_path):
    with pytest.raises(RetrievalIndexError, match="not an hcqr index folder"):
        load_index(tmp_path)


def test_save_refuses_to_clobber_a_non_index_folder(tmp_path, bm25):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "thesis.txt").write_text("do not delete")
    with pytest.raises(RetrievalIndexError, match="not an hcqr index folder; refusing"):
        bm25.save(target)
    assert (target / "thesis.txt").read_text() == "do not delete"


def test_failed_save_leaves_no_index(tmp_path, bm25, monkeypatch):
    def boom(folder):
        (folder / "partial.bin").write_bytes(b"x")
        raise OSError("disk full")

    monkeypatch.setattr(bm25, "_write", boom)
    with pytest.raises(OSError, match="disk full"):
        bm25.save(tmp_path / "idx")
    assert list(tmp_path.iterdir()) == []


def test_resave_replaces_existing_index(tmp_path, bm25):
    out = bm25.save(tmp_path / "idx")
    out = bm25.save(tmp_path / "idx")
    assert read_manifest(out)["retriever"] == "bm25"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


def test_bm25_refuses_a_corpus_without_words(tmp_path):
    from hcqr_dspy.errors import CorpusError
    from hcqr_dspy.retrieval import Corpus, Passage

    with pytest.raises(CorpusError, match="no passage has an indexable word"):
        BM25Retriever(
            Corpus([Passage("a", "", "x"), Passage("b", "", "the of")], source="wordless"), show_progress=False
        )


def test_manifest_missing_fields_and_missing_folder(tmp_path, bm25):
    out = bm25.save(tmp_path / "idx")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["retriever"] = "dense"  # hand-edited: a dense index needs an encoder
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RetrievalIndexError, match="lacks the field 'encoder'"):
        load_index(out, corpus=bm25.corpus)
    with pytest.raises(RetrievalIndexError, match="does not exist"):
        load_index(tmp_path / "nowhere")


def test_index_outlives_its_source_corpus(tmp_path, tiny_corpus_file):
    # Format 2 keeps the passages in the index: a moved or deleted source no longer matters.
    out = build_retriever(load_corpus(tiny_corpus_file), "bm25", show_progress=False).save(tmp_path / "idx")
    moved = tiny_corpus_file.rename(tmp_path / "moved.jsonl")
    assert load_index(out, corpus=moved).search(["anemia"], 1)[0]
    moved.unlink()
    r = load_index(out)
    hit = r.search(["Digoxin yellow vision"], 1)[0][0]
    assert r.get(hit.passage_id).title == "Digoxin toxicity"


def test_program_copies_share_the_one_retriever(retriever):
    # DSPy optimizers copy programs (Module.deepcopy, reset_copy, copy.deepcopy); every copy must search
    # the same index object, never a copy of it (Retriever.__deepcopy__).
    import copy

    from hcqr_dspy.programs import HCQR

    program = HCQR(retriever)
    assert copy.deepcopy(retriever) is retriever
    for clone in (program.deepcopy(), program.reset_copy(), copy.deepcopy(program)):
        assert clone is not program and clone.retriever is retriever
