"""Streaming dense builds: chunks on disk, a killed build resumes to identical vectors, embeddings are reused."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval import EmbeddingStore, Encoder, build_retriever, load_corpus, load_encoder, load_index

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)

QUERIES = ["microcytic anemia low ferritin", "fatigable ptosis acetylcholine receptor", "exophthalmos tsh"]

# Runs `hcqr index` in a child process that SIGKILLs itself when chunk KILL_AT is about to be written
# (chunks 0 .. KILL_AT-1 are on disk): a real kill of a real build, the encoder untouched.
CHILD = """
import os, signal, sys
from hcqr_dspy.retrieval.embeddings import EmbeddingStore
write = EmbeddingStore._write_chunk
def write_or_die(self, i, vectors):
    if i == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    write(self, i, vectors)
EmbeddingStore._write_chunk = write_or_die
from hcqr_dspy.cli import main
sys.exit(main(sys.argv[1:]))
"""


def chunks(folder):
    files = sorted(folder.rglob("chunk-*.npy"))
    return [np.load(f, allow_pickle=False) for f in files]


def test_killed_build_resumes_from_the_last_finished_chunk_and_matches_an_uninterrupted_one(
    medcpt_spec, tiny_corpus_file, tmp_path, capsys
):
    from hcqr_dspy.cli import main

    args = [
        "index",
        "--corpus",
        str(tiny_corpus_file),
        "--encoder",
        medcpt_spec,
        "--chunk-size",
        "2",
        "--embeddings",
        str(tmp_path / "emb"),
        "--out",
        str(tmp_path / "idx"),
    ]
    killed = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env={**os.environ, "KILL_AT": "2"}, capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "idx").exists()  # no half index
    [folder] = [p for p in (tmp_path / "emb").iterdir()]
    assert sorted(p.name for p in folder.glob("chunk-*.npy")) == ["chunk-000000.npy", "chunk-000001.npy"]
    (folder / "chunk-000002.npy.tmp12345").write_bytes(b"\x93NUMPY half a chunk")  # as if killed mid-write

    assert main(args) == 0  # the same command resumes
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["encoded_chunks"], summary["reused_chunks"]) == (2, 2)
    assert not list(folder.glob("*.tmp*"))

    fresh = [a if a not in (str(tmp_path / "emb"), str(tmp_path / "idx")) else a + "-fresh" for a in args]
    assert main(fresh) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["encoded_chunks"] == 4
    resumed, uninterrupted = chunks(tmp_path / "emb"), chunks(tmp_path / "emb-fresh")
    assert len(resumed) == len(uninterrupted) == 4
    assert all(np.array_equal(a, b) for a, b in zip(resumed, uninterrupted))  # bit for bit
    r, u = load_index(tmp_path / "idx"), load_index(tmp_path / "idx-fresh")
    assert np.array_equal(r.index.index.reconstruct_n(0, 8), u.index.index.reconstruct_n(0, 8))
    assert r.search(QUERIES, 8) == u.search(QUERIES, 8)


def test_a_second_index_type_over_the_same_corpus_and_encoder_encodes_nothing(
    medcpt_spec, synthetic_corpus_file, tmp_path, monkeypatch
):
    corpus = load_corpus(synthetic_corpus_file)
    calls = []
    encode = Encoder.encode_passages

    def counting(self, titles, contents, **kw):
        calls.append(len(titles))
        return encode(self, titles, contents, **kw)

    monkeypatch.setattr(Encoder, "encode_passages", counting)
    emb = tmp_path / "emb"
    flat = build_retriever(
        corpus, "dense", encoder=medcpt_spec, faiss="Flat", embeddings_dir=emb, chunk_size=64, show_progress=False
    )
    assert sum(calls) == len(corpus) and flat.build_stats["encoded_chunks"] == 5
    calls.clear()
    hnsw = build_retriever(
        corpus, "dense", encoder=medcpt_spec, faiss="HNSW32", embeddings_dir=emb, chunk_size=64, show_progress=False
    )
    hybrid = build_retriever(
        corpus, "hybrid", encoder=medcpt_spec, faiss="IVF4,Flat", embeddings_dir=emb, show_progress=False
    )
    assert calls == []  # nothing encoded again
    assert hnsw.build_stats == {**flat.build_stats, "encoded_chunks": 0, "reused_chunks": 5}
    assert hybrid.retrievers[0].build_stats["reused_chunks"] == 5
    assert np.array_equal(
        hnsw.index.index.reconstruct_n(0, len(corpus)), flat.index.index.reconstruct_n(0, len(corpus))
    )
    # another passage encoder is another store: it encodes
    build_retriever(corpus, "dense", embeddings_dir=emb, show_progress=False)
    assert sum(calls) == len(corpus) and len(list(emb.iterdir())) == 2


def test_store_refuses_foreign_or_damaged_chunks(medcpt_spec, tiny_corpus, tmp_path):
    enc = load_encoder(medcpt_spec)
    store = EmbeddingStore.open(tiny_corpus, enc, tmp_path, chunk_size=3)
    assert store.fill(tiny_corpus, enc, show_progress=False) == {"encoded_chunks": 3, "reused_chunks": 0}
    assert store.complete and [len(c) for _, c in store.iter_chunks()] == [3, 3, 2]
    again = EmbeddingStore.open(tiny_corpus, enc, tmp_path, chunk_size=5)  # an existing store keeps its boundaries
    assert again.chunk_size == 3 and again.fill(tiny_corpus, enc, show_progress=False)["reused_chunks"] == 3
    np.save(store.chunk_path(1), np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(
        RetrievalIndexError, match=r"chunk-000001.npy holds float32 \(3, 4\), expected float32 \(3, 16\); delete it"
    ):
        list(store.iter_chunks())
    record = json.loads((store.folder / "embeddings.json").read_text())
    record["corpus_fingerprint"] = "0" * 64
    (store.folder / "embeddings.json").write_text(json.dumps(record))
    with pytest.raises(RetrievalIndexError, match="records corpus_fingerprint '0000.*delete .* to re-encode"):
        EmbeddingStore.open(tiny_corpus, enc, tmp_path)
    with pytest.raises(RetrievalIndexError, match="chunk_size must be a positive integer"):
        EmbeddingStore.open(tiny_corpus, enc, tmp_path / "other", chunk_size=0)


def test_seeded_sample_is_reproducible(medcpt_spec, synthetic_corpus_file, tmp_path):
    corpus = load_corpus(synthetic_corpus_file)
    enc = load_encoder(medcpt_spec)
    store = EmbeddingStore.open(corpus, enc, tmp_path, chunk_size=50)
    store.fill(corpus, enc, show_progress=False)
    a, b, c = store.sample(40, seed=0), store.sample(40, seed=0), store.sample(40, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    rows = np.sort(np.random.default_rng(0).choice(len(corpus), size=40, replace=False))
    want = enc.encode_passages([corpus[int(i)].title for i in rows], [corpus[int(i)].content for i in rows])
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)


def test_a_full_disk_mid_build_stops_in_one_line_and_keeps_finished_chunks(
    medcpt_spec, tiny_corpus, tmp_path, monkeypatch
):
    import errno

    from hcqr_dspy.retrieval import embeddings

    enc = load_encoder(medcpt_spec)
    store = EmbeddingStore.open(tiny_corpus, enc, tmp_path, chunk_size=3)
    save, saved = np.save, []

    def save_until_full(fh, arr, allow_pickle):  # the disk fills up on the second chunk
        if saved:
            raise OSError(errno.ENOSPC, "No space left on device")
        saved.append(1)
        save(fh, arr, allow_pickle=allow_pickle)

    monkeypatch.setattr(embeddings.np, "save", save_until_full)
    with pytest.raises(
        RetrievalIndexError,
        match=r"cannot write embedding chunk .*chunk-000001.npy: No space left on device; "
        r"the finished chunks are kept",
    ) as err:
        store.fill(tiny_corpus, enc, show_progress=False)
    assert "\n" not in str(err.value) and store.finished() == [0] and not list(store.folder.glob("*.tmp*"))
    monkeypatch.setattr(embeddings.np, "save", save)
    assert store.fill(tiny_corpus, enc, show_progress=False) == {"encoded_chunks": 2, "reused_chunks": 1}
