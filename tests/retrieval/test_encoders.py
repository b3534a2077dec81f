"""Query/passage encoder pairs: MedCPT's recipe over two tiny BERTs built in the test, checked against transformers."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hcqr_dspy.errors import HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval import DenseRetriever, load_corpus, load_encoder, load_index, parse_encoder, read_manifest

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)

QUERIES = [
    "microcytic anemia low ferritin",
    "fatigable ptosis acetylcholine receptor antibodies",
    "exophthalmos tsh receptor antibodies",
    # longer than MedCPT's 64 query tokens: the query side must truncate where the reference does
    " ".join(["digoxin toxicity yellow vision nausea hypokalemia"] * 15),
]


def test_medcpt_spec_records_both_encoders_without_loading():
    spec = parse_encoder("medcpt")
    d = spec.describe()
    assert d["query_encoder"] == {"model": "ncbi/MedCPT-Query-Encoder", "pooling": "cls", "max_length": 64}
    assert d["passage_encoder"] == {"model": "ncbi/MedCPT-Article-Encoder", "pooling": "cls", "max_length": 512}
    assert d["normalize"] is False and d["similarity"] == "inner_product" and d["passage_input"] == "[title, content]"
    assert (
        parse_encoder("medcpt:/a/q, /a/p").describe() == d
    )  # folders are where weights come from, not what the encoder is
    assert parse_encoder(None).describe()["normalize"] is True and not parse_encoder(None).paired
    with pytest.raises(HCQRError, match="medcpt:QUERY_DIR,ARTICLE_DIR"):
        parse_encoder("medcpt:/only/one")
    with pytest.raises(HCQRError, match="QUERY_MODEL,PASSAGE_MODEL"):
        parse_encoder("a,b,c")


def test_queries_go_through_the_query_encoder_and_passages_through_the_passage_encoder(medcpt_spec, brute, tiny_corpus):
    enc = load_encoder(medcpt_spec)
    ref_q = brute.queries(QUERIES)
    got_q = enc.encode_queries(QUERIES)
    assert got_q.dtype == np.float32 and got_q.shape == (len(QUERIES), 16)
    np.testing.assert_allclose(got_q, ref_q, rtol=1e-5, atol=1e-5)
    passages = list(tiny_corpus)
    titles, contents = [p.title for p in passages], [p.content for p in passages]
    got_p = enc.encode_passages(titles, contents)
    np.testing.assert_allclose(got_p, brute.articles(titles, contents), rtol=1e-5, atol=1e-5)
    # the two sides are different models: the query side given the passages' text is not the passage side
    assert not np.allclose(enc.encode_queries([p.text for p in passages]), got_p, atol=1e-3)


def test_dense_hits_equal_brute_force_with_the_two_encoders(medcpt_spec, brute, tiny_corpus, tmp_path):
    r = DenseRetriever(tiny_corpus, encoder=medcpt_spec, show_progress=False, embeddings_dir=tmp_path / "emb")
    expected = brute.search(QUERIES, list(tiny_corpus), k=5)
    for hits, want in zip(r.search(QUERIES, k=5), expected):
        assert [h.passage_id for h in hits] == [pid for pid, _ in want]
        np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-4, atol=1e-4)
    out = r.save(tmp_path / "idx")
    manifest = read_manifest(out)
    assert manifest["encoder"] == "medcpt"
    assert manifest["encoders"]["query_encoder"]["model"] == "ncbi/MedCPT-Query-Encoder"
    assert manifest["encoders"]["passage_encoder"]["model"] == "ncbi/MedCPT-Article-Encoder"
    assert manifest["encoder_paths"] == {
        "query": medcpt_spec.split(":", 1)[1].split(",")[0],
        "passage": medcpt_spec.split(",")[1],
    }
    assert load_index(out).search(QUERIES, 5) == r.search(QUERIES, 5)  # reloaded from the recorded folders


def test_searching_with_another_encoder_is_refused_naming_both(medcpt_spec, tiny_pair, tiny_corpus, tmp_path):
    out = DenseRetriever(tiny_corpus, encoder=medcpt_spec, show_progress=False, embeddings_dir=tmp_path / "emb").save(
        tmp_path / "idx"
    )
    q, a = tiny_pair
    with pytest.raises(
        RetrievalIndexError,
        match=r"built with encoder 'medcpt' \(query encoder ncbi/MedCPT-Query-Encoder, "
        r"passage encoder ncbi/MedCPT-Article-Encoder\), not '.*query,.*article' "
        r"\(query encoder .*query, passage encoder .*article\)",
    ):
        load_index(out, encoder=f"{q},{a}")  # the same two models as a generic pair: mean pooling, normalized
    with pytest.raises(
        RetrievalIndexError, match=r"built with encoder 'medcpt' .* not 'sentence-transformers/all-MiniLM-L6-v2'"
    ):
        load_index(out, encoder="default")
    # the same pair from other folders is the same encoder
    moved_q, moved_a = shutil.copytree(q, tmp_path / "mq"), shutil.copytree(a, tmp_path / "ma")
    r = load_index(out, encoder=f"medcpt:{moved_q},{moved_a}")
    assert r.encoder.spec.paths() == {"query": str(moved_q), "passage": str(moved_a)}
    assert r.search(QUERIES[:1], 3) == load_index(out).search(QUERIES[:1], 3)


def test_a_generic_pair_routes_each_side_through_its_own_model(tiny_pair, tiny_corpus):
    from sentence_transformers import SentenceTransformer

    q, a = tiny_pair
    enc = load_encoder(f"{q},{a}")
    assert enc.spec.paired and enc.spec.normalize
    want_q = SentenceTransformer(str(q), device="cpu").encode(QUERIES, normalize_embeddings=True)
    np.testing.assert_allclose(enc.encode_queries(QUERIES), want_q, rtol=1e-5, atol=1e-5)
    texts = [p.text for p in tiny_corpus]
    want_p = SentenceTransformer(str(a), device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(
        enc.encode_passages([p.title for p in tiny_corpus], [p.content for p in tiny_corpus]),
        want_p,
        rtol=1e-5,
        atol=1e-5,
    )


def test_offline_medcpt_without_weights_fails_with_one_line_before_reading_the_corpus(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}  # an empty hub cache
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hcqr_dspy.cli",
            "index",
            "--corpus",
            str(tmp_path / "not-read.jsonl"),
            "--encoder",
            "medcpt",
            "--out",
            str(tmp_path / "idx"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("hcqr: error:")]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    line = lines[0]
    assert "ncbi/MedCPT-Query-Encoder" in line and "ncbi/MedCPT-Article-Encoder" in line
    assert "--encoder medcpt:QUERY_DIR,ARTICLE_DIR" in line and "hub cache" in line
    assert not (tmp_path / "idx").exists()


def test_cli_builds_and_searches_the_medcpt_pair(medcpt_spec, brute, tiny_corpus_file, tmp_path, capsys):
    from hcqr_dspy.cli import main

    out = tmp_path / "idx"
    assert (
        main(
            [
                "index",
                "--corpus",
                str(tiny_corpus_file),
                "--encoder",
                medcpt_spec,
                "--embeddings",
                str(tmp_path / "e"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["encoder"] == "medcpt" and summary["faiss"] == "Flat" and summary["encoded_chunks"] == 1
    assert main(["search", "--index", str(out), "--k", "1", QUERIES[0]]) == 0
    printed = capsys.readouterr().out
    top_id, top_score = brute.search(QUERIES[:1], list(load_corpus(tiny_corpus_file)), 1)[0][0]
    assert f"{top_score:8.4f}  [{top_id}]" in printed
