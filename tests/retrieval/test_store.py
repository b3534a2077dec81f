"""The passage store: one memory-mapped Arrow file per index, id lookup without a Python object per passage."""

import hashlib
import json
import os
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
from helpers import TINY_ROWS, snippet, write_jsonl

from hcqr_dspy.errors import CorpusError, RetrievalIndexError
from hcqr_dspy.retrieval import BM25Retriever, Corpus, Passage, PassageStore, build_retriever, load_corpus, load_index


def reference_fingerprint(rows):
    h = hashlib.sha256()
    for pid, title, content in rows:
        for part in (pid, title, content):
            h.update(part.encode("utf-8"))
            h.update(b"\x1f")
        h.update(b"\x1e")
    return h.hexdigest()


def big_corpus_file(path, n):
    return write_jsonl(
        path, [snippet(f"doc-{i}", f"Title {i % 97}", f"passage {i} " + "lorem ipsum dolor " * 20) for i in range(n)]
    )


def test_store_on_disk_round_trips_and_looks_ids_up(tmp_path, tiny_corpus_file):
    corpus = load_corpus(tiny_corpus_file, store=tmp_path / "store")
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [
        "passage_ids.hash.npy",
        "passage_ids.row.npy",
        "passages.arrow",
        "passages.json",
    ]
    assert corpus.fingerprint == reference_fingerprint(TINY_ROWS)  # same definition as index format 1
    opened = PassageStore.open(tmp_path / "store")
    assert len(opened) == 8 and [p.id for p in opened] == [r[0] for r in TINY_ROWS]
    for i, (pid, title, content) in enumerate(TINY_ROWS):
        assert opened.position(pid) == i and opened.get(pid) == Passage(pid, title, content) == opened[i]
    assert opened[-1].id == "p8" and opened.ids([7, 0, 3]) == ["p8", "p1", "p4"]
    assert "p3" in opened and "p33" not in opened and 3 not in opened
    with pytest.raises(KeyError, match="no passage with id 'p33'"):
        opened.get("p33")
    with pytest.raises(IndexError):
        opened[8]
    assert list(opened.texts()) == [Passage(*r).text for r in TINY_ROWS]


def test_opening_a_store_reads_nothing_into_python_objects(tmp_path):
    big = load_corpus(big_corpus_file(tmp_path / "big.jsonl", 20_000), store=tmp_path / "store")
    text_bytes = (tmp_path / "store" / "passages.arrow").stat().st_size
    assert text_bytes > 7_000_000
    del big
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    store = PassageStore.open(tmp_path / "store")
    p = store.get("doc-12345")
    python_bytes = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert p.content.startswith("passage 12345 ")
    # the text stays in the memory-mapped file: neither Arrow's allocator nor Python holds a copy of it
    assert pa.total_allocated_bytes() - arrow_before < 100_000
    assert python_bytes < 200_000, python_bytes
    assert isinstance(store._hashes, np.memmap) and isinstance(store._rows, np.memmap)


def rss_file_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssFile from /proc (Linux)")
def test_random_gets_map_no_text_pages_into_the_process(tmp_path):
    load_corpus(big_corpus_file(tmp_path / "big.jsonl", 20_000), store=tmp_path / "store")
    store = PassageStore.open(tmp_path / "store")
    rng = np.random.default_rng(0)
    store.get("doc-1")
    before = rss_file_kb()
    for i in rng.integers(0, 20_000, size=2000):
        assert store.get(f"doc-{i}").content.startswith(f"passage {i} ")
    ids = store.ids(rng.integers(0, 20_000, size=500))
    grown = rss_file_kb() - before
    # the ~7.7 MB of text is read by positional reads from the page cache, not mapped: only the 320 KB id
    # hash/row arrays may be paged in
    assert grown < 1500, f"RssFile grew by {grown} kB"
    assert len(ids) == 500


def test_repeated_ids_renamed_in_order_never_onto_an_existing_id(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            snippet("x", "A", "one"),
            snippet("x", "B", "two"),
            snippet("x#2", "C", "three"),
            snippet("y", "D", "four"),
            snippet("x", "E", "five"),
        ],
    )
    with pytest.raises(CorpusError, match=r"d\.jsonl:2: duplicate passage id 'x' \(first seen at .*d\.jsonl:1\)"):
        load_corpus(path)
    corpus = load_corpus(path, duplicate_ids="rename", store=tmp_path / "s")
    assert [p.id for p in corpus] == ["x", "x#3", "x#2", "y", "x#4"] and corpus.renamed == 2
    assert corpus.get("x#4").content == "five" and corpus.get("x#2").content == "three"
    assert corpus.fingerprint == reference_fingerprint([(p.id, p.title, p.content) for p in corpus])
    assert [p.id for p in PassageStore.open(tmp_path / "s")] == ["x", "x#3", "x#2", "y", "x#4"]


def test_index_stores_its_passages_once_and_loads_them_memory_mapped(tmp_path, tiny_corpus_file, medcpt_spec):
    corpus = load_corpus(tiny_corpus_file)
    out = build_retriever(corpus, "hybrid", encoder=medcpt_spec, show_progress=False).save(tmp_path / "idx")
    assert len(list(out.rglob("passages.arrow"))) == 1
    r = load_index(out)
    assert r.corpus.folder == out and all(c.corpus is r.corpus for c in r.retrievers)
    bm25 = load_index(build_retriever(corpus, "bm25", show_progress=False).save(tmp_path / "bm25"))
    assert isinstance(bm25.model.scores["data"], np.memmap)  # bm25s arrays memory-mapped too


def test_a_staging_store_is_linked_into_the_index_not_copied(tmp_path, tiny_corpus_file):
    corpus = load_corpus(tiny_corpus_file, store=tmp_path / "staging")
    out = BM25Retriever(corpus, show_progress=False).save(tmp_path / "idx")
    assert (out / "passages.arrow").stat().st_ino == (tmp_path / "staging" / "passages.arrow").stat().st_ino


def test_format_1_index_is_refused_with_a_rebuild_hint(tmp_path, tiny_corpus):
    out = BM25Retriever(tiny_corpus, show_progress=False).save(tmp_path / "idx")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        RetrievalIndexError, match=r"older hcqr-dspy \(index format 1.*rebuild it with `hcqr index`"
    ) as err:
        load_index(out)
    assert "\n" not in str(err.value)


def test_in_memory_corpus_is_a_store_too():
    corpus = Corpus([Passage(*r) for r in TINY_ROWS], source="tiny")
    assert corpus.folder is None and corpus.get("p7").title == "Myasthenia gravis"
    with pytest.raises(CorpusError, match="duplicate passage id 'a'"):
        Corpus([Passage("a", "", "x"), Passage("a", "", "y")])


def test_an_unwritable_store_folder_is_one_line(tmp_path, tiny_corpus_file):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RetrievalIndexError, match=r"cannot write the passage store in .*file/store: Not a directory"):
        load_corpus(tiny_corpus_file, store=blocker / "store")
