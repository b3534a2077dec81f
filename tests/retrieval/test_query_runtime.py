"""Query runtimes: tiny encoders exported to ONNX / int8 ONNX / OpenVINO in the test, against PyTorch's vectors
and hits."""

import json

import numpy as np
import pytest

from hcqr_dspy.errors import HCQRError, QueryRuntimeError, RetrievalIndexError
from hcqr_dspy.retrieval import DenseRetriever, load_encoder, load_index, parse_encoder, read_manifest
from hcqr_dspy.retrieval.query_export import ONNX_FILE
from hcqr_dspy.retrieval.query_runtime import RUNTIMES

pytest.importorskip("onnxruntime", reason="the onnx runtimes need onnxruntime (pip install 'hcqr-dspy[onnx]')")
pytest.importorskip("onnx", reason="the onnx export needs onnx (pip install 'hcqr-dspy[onnx]')")

# Different lengths in one batch: padded rows must embed as they do alone (dynamic batch and sequence axes).
QUERIES = [
    "microcytic anemia low ferritin",
    "fatigable ptosis",
    "exophthalmos tsh receptor antibodies yellow vision acetylcholine receptor antibodies microcytic",
]


@pytest.fixture(scope="module")
def tiny_model(tiny_pair):
    """One tiny BERT (random weights, seeded; built in tests/retrieval/conftest.py) for queries and passages:
    sentence-transformers' mean pooling, normalized."""
    return str(tiny_pair[0])


@pytest.fixture(scope="module")
def torch_index(tiny_model, tiny_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "dense"
    DenseRetriever(tiny_corpus, encoder=tiny_model, show_progress=False).save(out)
    return out


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_fp32_runtimes_give_pytorchs_vectors_and_hits(runtime, tiny_model, torch_index, tiny_corpus):
    if runtime == "openvino":
        pytest.importorskip(
            "openvino", reason="the openvino runtime needs openvino (pip install 'hcqr-dspy[openvino]')"
        )
    reference = load_encoder(tiny_model)
    other = load_encoder(parse_encoder(tiny_model).with_runtime(runtime))
    assert other.runtime is not None and other.model is reference.model  # one set of weights, another engine
    ref = reference.encode_queries(QUERIES)
    got = other.encode_queries(QUERIES)
    assert got.dtype == np.float32 and got.shape == ref.shape and got.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(got, ref, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # one query alone embeds as it does inside a padded batch
    np.testing.assert_allclose(other.encode_queries(QUERIES[1:2])[0], got[1], atol=2e-5)

    torch_hits = load_index(torch_index).search(QUERIES, k=5)
    runtime_hits = load_index(torch_index, encoder_backend=runtime).search(QUERIES, k=5)
    for a, b in zip(torch_hits, runtime_hits):
        assert [h.passage_id for h in a] == [h.passage_id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-4)


def test_int8_stays_close_to_pytorch(tiny_model):
    reference = load_encoder(tiny_model).encode_queries(QUERIES)
    got = load_encoder(parse_encoder(tiny_model).with_runtime("onnx-int8")).encode_queries(QUERIES)
    cosine = (got * reference).sum(axis=1)
    assert got.shape == reference.shape and np.all(cosine > 0.9)
    assert not np.allclose(got, reference, atol=1e-6)  # int8 weights: close, not identical (it is not the fp32 graph)


def _bf16_cpu() -> bool:
    pytest.importorskip("openvino", reason="the openvino runtimes need openvino (pip install 'hcqr-dspy[openvino]')")
    from hcqr_dspy.retrieval.query_runtime import cpu_has_bf16

    return cpu_has_bf16()


def test_openvino_compiles_one_shape_per_sequence_bucket(tiny_model):
    pytest.importorskip("openvino", reason="the openvino runtime needs openvino (pip install 'hcqr-dspy[openvino]')")
    from hcqr_dspy.retrieval.query_export import preprocess_queries
    from hcqr_dspy.retrieval.query_runtime import MAX_COMPILED_SHAPES, sequence_bucket

    encoder = load_encoder(parse_encoder(tiny_model).with_runtime("openvino"))
    shapes = encoder.runtime._openvino.requests
    shapes.clear()  # the encoder is shared in this process: an earlier test may have compiled shapes
    lengths = [preprocess_queries(encoder.model, [q])["input_ids"].shape[1] for q in QUERIES]
    bucket = lambda n: sequence_bucket(n, 600)  # noqa: E731  (the tiny BERT's max_seq_length)
    assert len({bucket(n) for n in lengths[:2]}) == 1 and lengths[0] != lengths[1]  # two lengths, one bucket
    first = encoder.encode_queries(QUERIES[:1])
    second = encoder.encode_queries(QUERIES[1:2])
    assert list(shapes) == [(1, bucket(lengths[0]))]  # the second length reused the first one's compiled shape
    encoder.encode_queries(QUERIES)
    assert list(shapes) == [(1, bucket(lengths[0])), (3, bucket(max(lengths)))]
    np.testing.assert_allclose(encoder.encode_queries(QUERIES)[:2], np.concatenate([first, second]), atol=2e-5)
    for n in range(2, MAX_COMPILED_SHAPES + 3):  # more shapes than kept: the least recently used go
        encoder.encode_queries(["fatigable ptosis"] * n)
    assert len(shapes) == MAX_COMPILED_SHAPES and (1, bucket(lengths[0])) not in shapes


def test_sequence_buckets_grow_with_the_query_and_stop_at_the_models_limit():
    from hcqr_dspy.retrieval.query_runtime import sequence_bucket

    assert [sequence_bucket(n, 512) for n in (1, 8, 9, 32, 33, 64, 65, 129, 500, 512)] == [
        8,
        8,
        16,
        32,
        48,
        64,
        96,
        192,
        512,
        512,
    ]
    assert sequence_bucket(60, 64) == 64 and sequence_bucket(63, 62) == 63  # MedCPT queries: 64 tokens at most
    assert sequence_bucket(13, None) == 13  # no known limit: no padding


def test_a_damaged_export_cache_is_one_line_naming_the_folder(tiny_model, tmp_path):
    pytest.importorskip("openvino", reason="the openvino runtime needs openvino (pip install 'hcqr-dspy[openvino]')")
    from hcqr_dspy.retrieval.query_export import OPENVINO_XML
    from hcqr_dspy.retrieval.query_runtime import load_query_runtime

    model = load_encoder(tiny_model).model
    side = parse_encoder(tiny_model).query.describe()
    folder = load_query_runtime("openvino", model, side, tiny_model, True, cache_root=tmp_path).folder
    for name, runtime in ((OPENVINO_XML, "openvino"), (ONNX_FILE, "onnx")):  # fp32: bf16 needs AVX512_BF16 or AMX
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])  # a truncated file, as a full disk or a killed copy leaves
        with pytest.raises(QueryRuntimeError) as err:
            load_query_runtime(runtime, model, side, tiny_model, True, cache_root=tmp_path)
        assert f"the cached {runtime} export in {folder} cannot be loaded" in str(err.value)
        assert str(err.value).endswith("delete that folder to export again") and "\n" not in str(err.value)
    (folder / "export.json").write_text("{")
    with pytest.raises(
        QueryRuntimeError, match="failed .*JSONDecodeError.* holds an earlier export that may be damaged"
    ):
        load_query_runtime("onnx", model, side, tiny_model, True, cache_root=tmp_path)


def test_openvino_bf16_stays_close_to_pytorch(tiny_model, torch_index):
    if not _bf16_cpu():
        pytest.skip("this CPU has no bf16 instructions (AVX512_BF16 or AMX); openvino-bf16 is refused here")
    reference = load_encoder(tiny_model).encode_queries(QUERIES)
    encoder = load_encoder(parse_encoder(tiny_model).with_runtime("openvino-bf16"))
    got = encoder.encode_queries(QUERIES)
    cosine = (got * reference).sum(axis=1)
    assert got.dtype == np.float32 and got.shape == reference.shape and np.all(cosine > 0.99)
    assert np.abs(got - reference).max() > 1e-6  # bf16 products: close, not the fp32 vectors (fp32 OpenVINO: ~6e-8)
    assert [
        r.get_compiled_model().get_property("INFERENCE_PRECISION_HINT").get_type_name()
        for r in encoder.runtime._openvino.requests.values()
    ] == ["bf16"]


def test_openvino_bf16_is_refused_on_a_cpu_without_bf16(tiny_model, monkeypatch, tmp_path):
    pytest.importorskip("openvino", reason="the openvino runtimes need openvino (pip install 'hcqr-dspy[openvino]')")
    from hcqr_dspy.retrieval import query_runtime

    model = load_encoder(tiny_model).model
    spec = parse_encoder(tiny_model)
    monkeypatch.setattr(query_runtime, "cpu_has_bf16", lambda core=None: False)  # the CPU, not the code under test
    with pytest.raises(
        QueryRuntimeError, match="'openvino-bf16' needs a CPU with bf16 instructions .* use --encoder-backend openvino"
    ):
        query_runtime.load_query_runtime(
            "openvino-bf16", model, spec.query.describe(), tiny_model, True, cache_root=tmp_path
        )
    query_runtime.load_query_runtime("openvino", model, spec.query.describe(), tiny_model, True, cache_root=tmp_path)


def test_the_pair_query_side_is_exported_not_the_passage_side(medcpt_spec, brute):
    got = load_encoder(parse_encoder(medcpt_spec).with_runtime("onnx")).encode_queries(QUERIES)
    np.testing.assert_allclose(got, brute.queries(QUERIES), atol=2e-5)  # MedCPT: CLS of the query model, raw


def test_the_runtime_is_not_the_encoders_identity(tiny_model, torch_index):
    spec = parse_encoder(tiny_model)
    assert spec.with_runtime("onnx").describe() == spec.describe()
    assert spec.with_runtime("onnx").passage_description() == spec.passage_description()
    before = (torch_index / "manifest.json").read_bytes()
    r = load_index(torch_index, encoder_backend="onnx", encoder=tiny_model)  # same encoder, other runtime
    assert r.encoder.spec.query_runtime == "onnx" and r.describe()["encoders"] == read_manifest(torch_index)["encoders"]
    assert (torch_index / "manifest.json").read_bytes() == before


def test_the_export_is_made_once_and_reused(tiny_model, tmp_path):
    from hcqr_dspy.retrieval.query_runtime import load_query_runtime

    model = load_encoder(tiny_model).model
    spec = parse_encoder(tiny_model)
    first = load_query_runtime("onnx", model, spec.query.describe(), tiny_model, True, cache_root=tmp_path)
    stamp = (first.folder / ONNX_FILE).stat().st_mtime_ns
    record = json.loads((first.folder / "export.json").read_text())
    assert record["input_names"] == first.input_names and "input_ids" in record["input_names"]
    second = load_query_runtime("onnx", model, spec.query.describe(), tiny_model, True, cache_root=tmp_path)
    assert second.folder == first.folder and (second.folder / ONNX_FILE).stat().st_mtime_ns == stamp
    assert not list(first.folder.glob("*.tmp*"))


def test_bad_runtimes_are_one_line(tiny_model, tmp_path, tiny_corpus):
    from hcqr_dspy.retrieval import BM25Retriever

    assert RUNTIMES == ("torch", "onnx", "onnx-int8", "openvino", "openvino-bf16")
    with pytest.raises(QueryRuntimeError, match="unknown encoder backend 'tensorrt'; choose one of torch, onnx"):
        parse_encoder(tiny_model).with_runtime("tensorrt")
    bm25 = BM25Retriever(tiny_corpus, show_progress=False).save(tmp_path / "bm25")
    with pytest.raises(
        RetrievalIndexError, match="bm25 index and embeds no queries: --encoder-backend onnx does not apply"
    ):
        load_index(bm25, encoder_backend="onnx")
    load_index(bm25, encoder_backend="torch")  # the default is no change
    assert issubclass(QueryRuntimeError, HCQRError)


def test_cli_search_with_onnx_prints_pytorchs_hits(torch_index, capsys):
    from hcqr_dspy.cli import main

    assert main(["search", "--index", str(torch_index), "--k", "3", *QUERIES[:2]]) == 0
    torch_out = capsys.readouterr().out
    assert main(["search", "--index", str(torch_index), "--k", "3", "--encoder-backend", "onnx", *QUERIES[:2]]) == 0
    onnx_out = capsys.readouterr().out
    ids = lambda text: [line.split("[")[1].split("]")[0] for line in text.splitlines() if "[" in line]  # noqa: E731
    assert ids(onnx_out) == ids(torch_out) and len(ids(torch_out)) == 6
    with pytest.raises(SystemExit) as exit_:
        main(["search", "--index", str(torch_index), "--encoder-backend", "tensorrt", "q"])
    assert exit_.value.code == 2 and "invalid choice: 'tensorrt'" in capsys.readouterr().err
