"""LM-path benchmark: raw llama.cpp prefill and generation rates per packaged model, build variant and setting.

Usage:
    python bench/lm.py [--models qwen2.5-coder-1.5b,...] [--lengths 300,1000,3000] [--out bench/results.json]

Each build variant whose wheel is cached (``$HCQR_CACHE/wheels-<variant>``, made by ``make setup-llm``;
:mod:`hcqr_dspy.lm.llama_builds`) is unpacked into a temporary folder and measured in its own child process with
that folder first on ``sys.path``, so the builds are compared on the same machine in one run without reinstalling.
In the child, for each model and each of :data:`SETTINGS` (weight repacking ``use_extra_bufts`` and flash attention,
:mod:`hcqr_dspy.lm.engine_settings`; the engine's defaults first, llama-cpp-python's own last):

* prefill: a prompt of N tokens (medical passage text, the shape of our answer step's context) is decoded from an
  empty KV cache with ``Llama.eval`` (``n_batch`` 512): N / seconds, best of ``--repeats``;
* generation: 64 tokens, one ``Llama.eval`` each (greedy argmax of the last logits) after a 300-token prompt
  (shorter if every length is): 64 / seconds, best of ``--repeats``.

These are the raw rates: llama.cpp's own decode loop with no sampling, grammar, chat template or DSPy around it.
Each (model, setting) records ``cpu_pressure``: the share of its measuring time in which some task waited for a
CPU (:mod:`hcqr_dspy.evaluation.cpu_pressure`; ``None`` without PSI), where other work would have slowed the rates.
Threads: ``$HCQR_N_THREADS`` or every core. Results are merged into ``--out`` under ``lm``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (
    "Acute tubular necrosis follows prolonged renal ischemia or nephrotoxins such as aminoglycosides; muddy brown "
    "granular casts appear in the urine and the fractional excretion of sodium exceeds two percent. "
)
GEN_TOKENS = 64
# name -> (use_extra_bufts, flash_attn); llama-cpp-python's defaults last. The engine's defaults: flash attention
# on, repacking as default_extra_bufts says for the build (off for AVX-512, on for the portable build).
SETTINGS = {
    "bufts off, fa on": (False, True),
    "bufts off, fa off": (False, False),
    "bufts on, fa on": (True, True),
    "bufts on, fa off": (True, False),
}
LLAMA_CPP_DEFAULT = "bufts on, fa off"


def engine_default(build: str) -> str:
    """The :data:`SETTINGS` name of the engine's defaults on a build (``avx512``, ``avx2``)."""
    from hcqr_dspy.lm.engine_settings import default_extra_bufts

    return f"bufts {'on' if default_extra_bufts(build) else 'off'}, fa on"


def measure(model: str, lengths: list[int], repeats: int, use_extra_bufts: bool, flash_attn: bool) -> dict:
    """Child side: raw prefill tokens/s per prompt length and generation tokens/s for one model and setting."""
    from dataclasses import replace

    import numpy as np

    from hcqr_dspy.evaluation.cpu_pressure import PressureWindow
    from hcqr_dspy.lm.engine_settings import EngineSettings
    from hcqr_dspy.lm.llama_cpp import LlamaCppEngine
    from hcqr_dspy.lm.packaged import packaged_model_path

    settings = replace(EngineSettings.from_env(), use_extra_bufts=use_extra_bufts, flash_attn=flash_attn)
    engine = LlamaCppEngine(packaged_model_path(model), n_ctx=max(lengths) + GEN_TOKENS + 16, settings=settings)
    pressure = PressureWindow()  # the measurements' CPU contention, from their first eval to their last
    llm = engine.llm
    pool = llm.tokenize((TEXT * (max(lengths) // 20 + 1)).encode(), add_bos=False)
    out: dict = {"build": engine.build, "settings": settings.record(), "prefill_tokens_per_s": {}}
    for n in lengths:
        best = float("inf")
        for _ in range(repeats):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(pool[:n])
            best = min(best, time.perf_counter() - t0)
        out["prefill_tokens_per_s"][str(n)] = round(n / best, 1)
    best = float("inf")
    for _ in range(repeats):
        llm.reset()
        llm.eval(pool[: min(300, max(lengths))])
        t0 = time.perf_counter()
        for _ in range(GEN_TOKENS):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            llm.eval([int(logits.argmax())])
        best = min(best, time.perf_counter() - t0)
    out["generation_tokens_per_s"] = round(GEN_TOKENS / best, 1)
    out["cpu_pressure"] = pressure.share()  # None without PSI
    return out


def cached_builds() -> dict[str, Path]:
    """``{variant name: wheel}`` for every cached llama-cpp-python wheel."""
    from hcqr_dspy.lm.llama_builds import LLAMA_CPP_VERSION
    from hcqr_dspy.lm.packaged import cache_dir

    found = {}
    for folder in sorted(cache_dir().glob("wheels-*")):
        wheels = sorted(folder.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl"))
        if wheels:
            found[folder.name.removeprefix("wheels-")] = wheels[-1]
    return found


def run_child(wheel: Path, models: list[str], lengths: list[int], repeats: int) -> dict:
    """Measure one build in a child process that imports llama_cpp from the unpacked wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(wheel).extractall(tmp)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(REPO)])}
        cmd = [sys.executable, __file__, "--child", "--models", ",".join(models)]
        cmd += ["--lengths", ",".join(map(str, lengths)), "--repeats", str(repeats)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(proc.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b,smollm2-135m")
    ap.add_argument("--lengths", default="300,1000,3000")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    args = ap.parse_args(argv)
    models = args.models.split(",")
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.child:
        from hcqr_dspy.errors import LMSpecError
        from hcqr_dspy.lm.packaged import packaged_model_path

        out = {}
        for model in models:
            try:
                packaged_model_path(model)
            except LMSpecError as exc:  # not installed: said in the results, not measured
                print(f"bench: {model}: {exc}", file=sys.stderr)
                continue
            out[model] = {name: measure(model, lengths, args.repeats, *flags) for name, flags in SETTINGS.items()}
        print(json.dumps(out))
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    from report import checked_out, write_results

    out_path = checked_out(ap, args.out)  # refused before measuring
    builds = cached_builds()
    if not builds:
        print("bench: no cached llama-cpp-python wheel; run `make setup-llm` first", file=sys.stderr)
        return 2
    section: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "threads": os.environ.get("HCQR_N_THREADS") or os.cpu_count(),
        "lengths": lengths,
        "builds": {},
    }
    for name, wheel in builds.items():
        print(f"bench: lm {name} ...", file=sys.stderr, flush=True)
        section["builds"][name] = run_child(wheel, models, lengths, args.repeats)
        print(json.dumps({name: section["builds"][name]}), file=sys.stderr, flush=True)
    portable = section["builds"].get("portable", {})
    fastest = next((b for b in section["builds"] if b != "portable" and "error" not in section["builds"][b]), None)
    if fastest and "error" not in portable:
        top = str(lengths[-1])
        ratios = {}
        for model in models:
            if model not in section["builds"][fastest] or model not in portable:
                continue
            ours = section["builds"][fastest][model]
            ours = ours[engine_default(next(iter(ours.values()))["build"])]
            theirs = portable[model][LLAMA_CPP_DEFAULT]
            ratios[model] = {
                "prefill": round(ours["prefill_tokens_per_s"][top] / theirs["prefill_tokens_per_s"][top], 2),
                "generation": round(ours["generation_tokens_per_s"] / theirs["generation_tokens_per_s"], 2),
            }
        section["fastest_over_portable"] = ratios
    write_results(out_path, section, key="lm")
    print(f"bench: wrote {out_path} and {out_path.with_name('RESULTS.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
