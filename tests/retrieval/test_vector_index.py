"""Approximate faiss indexes in the product: factory strings, seeded training, search-time nprobe / efSearch."""

import json

import faiss
import numpy as np
import pytest
from support.cli_args import index_argv

from hcqr_dspy.errors import HCQRError, RetrievalIndexError
from hcqr_dspy.retrieval import build_retriever, load_corpus, load_index, read_manifest

QUERIES = [
    "microcytic anemia low ferritin",
    "fatigable ptosis acetylcholine receptor",
    "exophthalmos tsh yellow vision",
    "graves disease goiter",
    "hypokalemia digoxin block",
]


@pytest.fixture(scope="module")
def corpus(synthetic_corpus_file):
    return load_corpus(synthetic_corpus_file)


@pytest.fixture(scope="module")
def emb(tmp_path_factory):
    return tmp_path_factory.mktemp("emb")


def build(corpus, spec, emb, factory, **kw):
    return build_retriever(corpus, "dense", encoder=spec, faiss=factory, embeddings_dir=emb, show_progress=False, **kw)


def ids(results):
    return [[h.passage_id for h in hits] for hits in results]


def test_approximate_types_are_built_recorded_and_reloaded(corpus, medcpt_spec, emb, tmp_path):
    exact = build(corpus, medcpt_spec, emb, "Flat")
    truth = ids(exact.search(QUERIES, 10))
    for factory, kind, trained in (
        ("HNSW32", "IndexHNSWFlat", 0),
        ("IVF8,Flat", "IndexIVFFlat", 300),
        ("IVF4,PQ4x4", "IndexIVFPQ", 300),
        ("IVF4,SQ8", "IndexIVFScalarQuantizer", 300),
    ):
        r = build(corpus, medcpt_spec, emb, factory)
        out = r.save(tmp_path / factory.replace(",", "-"))
        record = read_manifest(out)["vector_index"]
        assert (record["backend"], record["factory"], record["type"], record["metric"]) == (
            "faiss",
            factory,
            kind,
            "inner_product",
        )
        assert record["ntotal"] == len(corpus) and record["trained_on"] == trained and record["seed"] == 0
        loaded = load_index(out)
        assert loaded.search(QUERIES, 10) == r.search(QUERIES, 10)
        assert all(len(h) == 10 for h in ids(loaded.search(QUERIES, 10)))
    # IVF visiting every list is exhaustive: the same hits as exact search
    ivf = load_index(tmp_path / "IVF8-Flat", search_options={"nprobe": 8})
    assert ivf.search_options == {"nprobe": 8} and ids(ivf.search(QUERIES, 10)) == truth
    # compressed codes: PQ4x4 stores 4 x 4 bits a vector, SQ8 one byte a dimension, Flat 4 bytes a dimension
    sizes = {
        f: read_manifest(tmp_path / f.replace(",", "-"))["vector_index"]["code_bytes_per_vector"]
        for f in ("IVF4,PQ4x4", "IVF4,SQ8", "HNSW32")
    }
    assert sizes == {"IVF4,PQ4x4": 2.0, "IVF4,SQ8": 16.0, "HNSW32": 64.0}
    assert exact.index.describe()["code_bytes_per_vector"] == 64.0


def test_training_sample_is_seeded(corpus, medcpt_spec, emb):
    a = build(corpus, medcpt_spec, emb, "IVF4,PQ4x4", backend_options={"train_size": 100})
    b = build(corpus, medcpt_spec, emb, "IVF4,PQ4x4", backend_options={"train_size": 100})
    c = build(corpus, medcpt_spec, emb, "IVF4,PQ4x4", backend_options={"train_size": 100, "seed": 7})
    assert a.index.describe()["trained_on"] == 100
    assert np.array_equal(faiss.serialize_index(a.index.index), faiss.serialize_index(b.index.index))
    assert not np.array_equal(faiss.serialize_index(a.index.index), faiss.serialize_index(c.index.index))


def test_pq_builds_skip_polysemous_training(corpus, medcpt_spec, emb):
    # faiss reorders PQ centroids for Hamming search unless told not to (factory suffix "np"); hcqr never searches
    # that way, and the reordering took minutes of a 41k IVF256,PQ96 build: its builds equal the "np" builds
    for factory in ("IVF4,PQ4", "OPQ4,IVF4,PQ4"):
        ours = build(corpus, medcpt_spec, emb, factory, backend_options={"train_size": 300}).index.index
        reference = build(corpus, medcpt_spec, emb, factory + "np", backend_options={"train_size": 300}).index.index
        assert not faiss.downcast_index(faiss.extract_index_ivf(ours)).do_polysemous_training, factory
        assert np.array_equal(faiss.serialize_index(ours), faiss.serialize_index(reference)), factory


def test_search_options_change_what_hnsw_and_ivf_visit(corpus, medcpt_spec, emb, tmp_path):
    out = build(corpus, medcpt_spec, emb, "IVF16,Flat").save(tmp_path / "ivf")
    narrow = load_index(out, search_options={"nprobe": 1}).search(QUERIES, 20)
    wide = load_index(out, search_options={"nprobe": 16}).search(QUERIES, 20)
    assert ids(narrow) != ids(wide)
    hnsw = build(corpus, medcpt_spec, emb, "HNSW32").save(tmp_path / "hnsw")
    r = load_index(hnsw, search_options={"efSearch": 7})
    assert faiss.downcast_index(r.index.index).hnsw.efSearch == 7 and r.search_options == {"efSearch": 7}


def test_refine_indexes_rescore_exactly_from_a_memory_mapped_file(corpus, medcpt_spec, emb, tmp_path):
    flat = build(corpus, medcpt_spec, emb, "Flat")
    exact = flat.search(QUERIES, 10)
    out = build(corpus, medcpt_spec, emb, "IVF4,PQ4x4,RFlat").save(tmp_path / "refine")
    record = read_manifest(out)["vector_index"]
    assert (record["type"], record["memory_mapped"], record["code_bytes_per_vector"]) == ("IndexRefineFlat", True, 2.0)
    coarse = load_index(out, search_options={"nprobe": 4, "k_factor": 1})  # the PQ codes' own order
    assert ids(coarse.search(QUERIES, 10)) != ids(exact)
    refined = load_index(out, search_options={"nprobe": 4, "k_factor": 30})  # 300 candidates: every passage re-scored
    assert refined.search_options == {"nprobe": 4, "k_factor": 30}
    again = refined.search(QUERIES, 10)
    assert ids(again) == ids(exact)
    assert [h.score for q in again for h in q] == pytest.approx([h.score for q in exact for h in q], abs=1e-5)
    # read through a file mapping (faiss.IO_FLAG_MMAP_IFC), not copied into memory
    assert str((out / "faiss.index").resolve()) in open("/proc/self/maps").read()
    plain = load_index(flat.save(tmp_path / "flat"))  # other types are read into memory as before
    assert ids(plain.search(QUERIES, 10)) == ids(exact)
    assert str((tmp_path / "flat" / "faiss.index").resolve()) not in open("/proc/self/maps").read()


@pytest.mark.parametrize(
    "factory, options, message",
    [
        ("Flat", {"nprobe": 4}, "search option nprobe does not apply to faiss index 'Flat'"),
        ("HNSW32", {"nprobe": 4}, "search option nprobe does not apply to faiss index 'HNSW32'"),
        ("IVF4,Flat", {"efSearch": 4}, "search option efSearch does not apply to faiss index 'IVF4,Flat'"),
        ("IVF4,Flat", {"k_factor": 4}, "search option k_factor does not apply to faiss index 'IVF4,Flat'"),
        ("Flat", {"nprob": 4}, "unknown search option 'nprob'"),
        ("Flat", {"nprobe": 0}, "nprobe must be a positive integer"),
    ],
)
def test_search_options_that_do_not_apply_are_refused(corpus, medcpt_spec, emb, tmp_path, factory, options, message):
    out = build(corpus, medcpt_spec, emb, factory).save(tmp_path / "idx")
    with pytest.raises(RetrievalIndexError, match=message):
        load_index(out, search_options=options)


def test_bm25_refuses_search_options(tiny_corpus, tmp_path):
    out = build_retriever(tiny_corpus, "bm25", show_progress=False).save(tmp_path / "bm25")
    with pytest.raises(
        RetrievalIndexError, match="is a BM25 index: search options \\(nprobe\\) apply to dense indexes"
    ):
        load_index(out, search_options={"nprobe": 2})


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            "Blah",
            r"--faiss 'Blah' is not a faiss index_factory string usable with 16-d vectors \(not one of the supported "
            r"forms\); supported: Flat, SQ<t>, ",
        ),
        ("IVF4,PQ5", r"usable with 16-d vectors \(.*multiple of the number of subquantizers"),
        ("IVF1024,Flat", r"needs at least 1024 training vectors but the corpus has 300 passages"),
    ],
)
def test_bad_factories_are_refused_in_one_line(corpus, medcpt_spec, emb, factory, message):
    with pytest.raises(RetrievalIndexError, match=message) as err:
        build(corpus, medcpt_spec, emb, factory)
    assert "\n" not in str(err.value)


def test_cli_index_faiss_and_search_ef_search(medcpt_spec, synthetic_corpus_file, tmp_path, capsys):
    from hcqr_dspy.cli import main

    out = tmp_path / "idx"
    hnsw = ("--encoder", medcpt_spec, "--faiss", "HNSW32", "--embeddings", str(tmp_path / "e"))
    assert main(index_argv(synthetic_corpus_file, out, *hnsw)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["faiss"], summary["backend"]) == ("HNSW32", "faiss")
    assert main(["search", "--index", str(out), "--ef-search", "32", "--k", "2", "graves"]) == 0
    assert main(["search", "--index", str(out), "--nprobe", "4", "graves"]) == 2
    assert "search option nprobe does not apply to faiss index 'HNSW32'" in capsys.readouterr().err
    assert main(index_argv(synthetic_corpus_file, tmp_path / "b", "--retriever", "bm25", "--faiss", "HNSW32")) == 2
    assert "--faiss applies to dense and hybrid indexes, not --retriever bm25" in capsys.readouterr().err
    too_many_lists = ("--encoder", medcpt_spec, "--faiss", "IVF9999,Flat")
    assert main(index_argv(synthetic_corpus_file, tmp_path / "c", *too_many_lists)) == 2
    assert "needs at least 9999 training vectors" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_eval_and_experiments_apply_and_record_search_options(medcpt_spec, synthetic_corpus_file, tmp_path):
    from hcqr_dspy.errors import ExperimentError
    from hcqr_dspy.workflows.experiment_file import load_experiment
    from hcqr_dspy.workflows.specs import EvalSpec, resolve

    index = build_retriever(
        load_corpus(synthetic_corpus_file),
        "dense",
        encoder=medcpt_spec,
        faiss="IVF4,Flat",
        embeddings_dir=tmp_path / "e",
        show_progress=False,
    ).save(tmp_path / "idx")
    dataset = tmp_path / "qs.json"
    dataset.write_text(
        json.dumps({"q1": {"question": "Which?", "options": {"A": "graves", "B": "tsh"}, "answer": "A"}})
    )
    config, _, program = resolve(
        EvalSpec(
            method="simple_rag", dataset=str(dataset), index=str(index), lm="openai/x", search_options={"nprobe": 3}
        )
    )
    assert config["index"]["search_options"] == {"nprobe": 3} and config["index"]["vector_index"] == "IVF4,Flat"
    assert faiss.extract_index_ivf(program.retriever.index.index).nprobe == 3
    with pytest.raises(HCQRError, match="method 'cot' retrieves nothing"):
        resolve(EvalSpec(method="cot", dataset=str(dataset), lm="openai/x", search_options={"nprobe": 3}))
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"name: t\nlm: openai/x\nindex: {index}\ndatasets: {{d: {dataset}}}\nmethods: [simple_rag]\n"
        "search_options: {nprobe: 2}\n"
    )
    assert load_experiment(exp).search_options == {"nprobe": 2}
    exp.write_text(exp.read_text().replace("nprobe: 2", "nprobes: 2"))
    with pytest.raises(ExperimentError, match="unknown search option 'nprobes'"):
        load_experiment(exp)


# Factory strings faiss accepts and then aborts or crashes on while building (exit 134, 139, 136), and
# malformed ones: each is refused in one line before the corpus is read, leaving the output's folder empty.
BAD_FACTORIES = [
    ("HNSW0", r"\(HNSW0: HNSW's M \(neighbours per node\) must be 2 to 512, got 0\)"),
    ("HNSW1", r"\(HNSW1: HNSW's M \(neighbours per node\) must be 2 to 512, got 1\)"),
    ("IVF4_HNSW0,Flat", r"\(IVF4_HNSW0: HNSW's M \(neighbours per node\) must be 2 to 512, got 0\)"),
    ("IVF0,Flat", r"\(IVF0: IVF's lists must be 1 to 1,048,576, got 0\)"),
    ("IVF4,PQ0", r"\(PQ0: PQ's sub-quantizers must be 1 to 16, got 0\)"),
    ("IVF4,PQ5", r"\(PQ5: the dimension \(16\) must be a multiple of the number of subquantizers \(5\)\)"),
    ("PQ4x0", r"\(PQ4x0: PQ's bits per code must be 1 to 16, got 0\)"),
    ("IVF1,PQ8x24", r"\(PQ8x24: PQ's bits per code must be 1 to 16, got 24\)"),  # 2^24 centroids: ~25 GB at 384-d
    ("OPQ4_0,PQ4", r"\(OPQ4_0: OPQ's output dimension must be 1 to 16, got 0\)"),
    ("IVF4,SQ0", r"\(SQ0: IVF stores Flat, SQ<t> \(t: 4, 6, 8, fp16, bf16\) or PQ<m>\[x<bits>\]\[np\] codes\)"),
    ("IVF1e3,Flat", r"\(not one of the supported forms\)"),
    ("HNSW-1", r"\(not one of the supported forms\)"),
    ("PCA8,Flat", r"\(not one of the supported forms\)"),
    ("", r"\(empty\)"),  # never the default Flat in silence
]
# Builds every factory string given in one child process, so that a string faiss aborts on fails this test
# (the child's exit status) instead of killing the test session.
BUILD_EACH = """
import sys
from hcqr_dspy.cli import main
corpus, encoder, emb, root = sys.argv[1:5]
for i, factory in enumerate(sys.argv[5:]):
    print(main(["index", "--corpus", corpus, "--encoder", encoder, "--faiss", factory, "--embeddings", emb,
                "--out", f"{root}/{i}/idx"]), flush=True)
"""


def test_factories_faiss_would_abort_on_are_refused_in_one_line_leaving_nothing(
    medcpt_spec, synthetic_corpus_file, tmp_path
):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    factories = [f for f, _ in BAD_FACTORIES]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            BUILD_EACH,
            str(synthetic_corpus_file),
            medcpt_spec,
            str(tmp_path / "emb"),
            str(tmp_path / "out"),
            *factories,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == ["2"] * len(factories)
    errors = [line for line in done.stderr.splitlines() if line.startswith("hcqr: error: ")]
    assert len(errors) == len(factories), done.stderr[-3000:]
    for (factory, reason), line in zip(BAD_FACTORIES, errors):
        assert line.startswith(
            f"hcqr: error: --faiss {factory!r} is not a faiss index_factory string usable with 16-d vectors ("
        ), line
        assert re.search(reason, line) and line.endswith("IVF1024,PQ96,RFlat"), (factory, line)
    assert [list((tmp_path / "out" / str(i)).iterdir()) for i in range(len(factories))] == [[]] * len(factories)


@pytest.mark.parametrize(
    "factory",
    [
        "Flat",
        "HNSW",
        "HNSW32",
        "IVF1024,PQ32",
        "IVF4096,SQ8",
        "IVF1024,PQ96,RFlat",
        "IVF256,PQ128x4np",
        "IVF65536_HNSW32,SQfp16",
        "OPQ96_384,IVF1024,PQ96",
        "HNSW32,PQ48x8,RFlat",
        "PQ384x1",
        "SQbf16",
    ],
)
def test_documented_factories_are_accepted(factory):
    from hcqr_dspy.retrieval.faiss_factory import check_factory

    assert check_factory(f" {factory} ", 384) == factory


def test_the_smallest_graph_and_a_rotated_refined_pq_still_build(medcpt_spec, synthetic_corpus_file, tmp_path, capsys):
    from hcqr_dspy.cli import main

    for i, factory in enumerate(["HNSW2", "OPQ4_8,IVF4,PQ2x4np,RFlat"]):
        out = tmp_path / str(i)
        dense = ("--encoder", medcpt_spec, "--faiss", factory, "--embeddings", str(tmp_path / "emb"))
        assert main(index_argv(synthetic_corpus_file, out, *dense)) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["faiss"] == factory
        assert len(load_index(out).search(QUERIES, 5)[0]) == 5
