"""Which llama.cpp build ``make setup-llm`` installs: the fastest variant this CPU runs, kept only after a crash check.

llama-cpp-python has no binary wheel on PyPI; it is compiled from source with ``CMAKE_ARGS`` (its README,
"Installation Configuration"). One wheel is built per variant and kept in ``$HCQR_CACHE/wheels-<variant>``:

* ``avx512-…``: the portable flags plus ggml's AVX-512 kernels (``GGML_AVX512``) and the extensions the CPU has
  (``GGML_AVX512_VBMI``, ``_VNNI``, ``_BF16``), named after them (``avx512-vbmi-vnni-bf16``). Chosen when
  ``/proc/cpuinfo`` lists AVX-512 F, CD, VL, DQ and BW. AMX is not built: ggml uses it only through its extra
  buffer types (weight repacking), which crashed on this project's Xeons and are off by default
  (:mod:`hcqr_dspy.lm.engine_settings`).
* ``portable``: x86-64 with AVX2, FMA, F16C and BMI2 and ``GGML_NATIVE=OFF``, which runs on any machine of the
  last decade.

A variant is kept only if every installed packaged model loads and decodes a multi-token prompt through it in a
child process (:func:`crash_check`; a native build whose AMX repack path is broken crashes exactly there, on any
prompt longer than one token). Otherwise the next variant is tried, and the reason is printed.

Run as ``python -m hcqr_dspy.lm.llama_builds setup|verify|check`` (the Makefile does).
``HCQR_LLAMA_BUILD=portable`` forces the portable build.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LLAMA_CPP_VERSION = "0.3.36"
PORTABLE_ARGS = (
    "-DLLAVA_BUILD=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
)
AVX512_BASE = frozenset({"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"})
# /proc/cpuinfo flag -> (ggml CMake option, short name)
AVX512_EXTENSIONS = (
    ("avx512vbmi", "-DGGML_AVX512_VBMI=ON", "vbmi"),
    ("avx512_vnni", "-DGGML_AVX512_VNNI=ON", "vnni"),
    ("avx512_bf16", "-DGGML_AVX512_BF16=ON", "bf16"),
)
CHECK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Variant:
    """A llama.cpp build: its name (the wheel folder's suffix) and CMake arguments."""

    name: str
    cmake_args: tuple[str, ...]


PORTABLE = Variant("portable", PORTABLE_ARGS)


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line of ``/proc/cpuinfo``); empty where there is none."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def candidates(flags: frozenset[str], forced: str | None = None) -> list[Variant]:
    """The variants to try on a CPU with ``flags``, fastest first; ``forced`` (``HCQR_LLAMA_BUILD``) keeps only
    the variant of that name (``portable``, or ``avx512`` for whichever AVX-512 variant the CPU has)."""
    out = []
    if AVX512_BASE <= flags:
        extensions = [(arg, short) for flag, arg, short in AVX512_EXTENSIONS if flag in flags]
        name = "-".join(["avx512", *(short for _, short in extensions)])
        out.append(Variant(name, PORTABLE_ARGS + ("-DGGML_AVX512=ON",) + tuple(arg for arg, _ in extensions)))
    out.append(PORTABLE)
    if forced:
        kept = [v for v in out if v.name.split("-")[0] == forced]
        if not kept:
            raise SystemExit(f"HCQR_LLAMA_BUILD={forced!r}: this CPU offers {', '.join(v.name for v in out)}")
        return kept
    return out


def wheel_dir(variant: Variant, cache: Path) -> Path:
    """Where a variant's wheel is kept (``<cache>/wheels-<name>``)."""
    return cache / f"wheels-{variant.name}"


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def ensure_wheel(variant: Variant, cache: Path, version: str = LLAMA_CPP_VERSION) -> Path:
    """The variant's wheel, built once (``pip wheel`` with its ``CMAKE_ARGS``; 4-9 min on 2 cores).

    Raises:
        subprocess.CalledProcessError: the build failed (pip's output is on the terminal).
    """
    folder = wheel_dir(variant, cache)
    found = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    print(f"building llama-cpp-python {version} ({variant.name}) once for this machine (4-9 min) into {folder}")
    env = {**os.environ, "CMAKE_ARGS": " ".join(variant.cmake_args), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count())}
    # --no-cache-dir: pip's own wheel cache ignores CMAKE_ARGS and would hand back another variant's build
    subprocess.run(
        _pip("wheel", "--no-cache-dir", "--quiet", "--no-deps", "-w", str(folder), f"llama-cpp-python=={version}"),
        env=env,
        check=True,
    )
    return sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))[-1]


def install(wheel: Path) -> None:
    """Install a wheel over whatever llama-cpp-python is installed (its dependencies from the registry)."""
    subprocess.run(_pip("install", "--quiet", "--force-reinstall", "--no-deps", str(wheel)), check=True)
    subprocess.run(_pip("install", "--quiet", str(wheel)), check=True)


CHECK_COMMAND = (sys.executable, "-m", "hcqr_dspy.lm.llama_builds", "check")


def crash_check(timeout: float = CHECK_TIMEOUT_S, command: tuple[str, ...] = CHECK_COMMAND) -> str | None:
    """Decode a multi-token prompt with every installed packaged model in a child process (``command``,
    :func:`check_models`), with the engine's default settings.

    Returns:
        ``None`` if every model passed, else why not (the signal that killed the child, or its last line).
    """
    try:
        proc = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"the crash check did not finish in {timeout:.0f} s"
    print(proc.stdout, end="")
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        return f"the crash check died of {signal.Signals(-proc.returncode).name}"
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return f"the crash check failed: {lines[-1] if lines else f'exit status {proc.returncode}'}"


def check_models() -> int:
    """The child of :func:`crash_check`: load each installed packaged model, decode about 300 prompt tokens
    (several physical batches' worth of work) and generate 4 tokens. Returns 0 or raises."""
    from hcqr_dspy.errors import LMSpecError
    from hcqr_dspy.lm.llama_cpp import LlamaCppEngine
    from hcqr_dspy.lm.packaged import PACKAGED_MODELS, packaged_model_path

    prompt = " ".join(f"Passage {i}: the renal tubule reabsorbs sodium and water." for i in range(30))
    checked = 0
    for name in PACKAGED_MODELS:
        try:
            path = packaged_model_path(name)
        except LMSpecError:
            continue  # not installed: nothing to check
        engine = LlamaCppEngine(path, n_ctx=1024)
        out = engine.llm.create_completion(prompt, max_tokens=4, temperature=0.0)
        print(f"crash check: {name} on {engine.build}: {out['usage']['prompt_tokens']} prompt tokens decoded")
        checked += 1
    if not checked:
        print("crash check: no packaged model installed yet (each `make setup-model-*` checks its model)")
    return 0


def installed_variant(variants: list[Variant]) -> Variant | None:
    """The variant of ``variants`` whose CPU kernels the installed build reports (``None`` if none matches)."""
    probe = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    from hcqr_dspy.lm.engine_settings import build_features

    kernels = build_features(proc.stdout)
    for variant in variants:
        if variant.name.split("-")[0] == {"avx2": "portable"}.get(kernels, kernels):
            return variant
    return None


def setup(cache: Path, version: str, skip: tuple[str, ...] = ()) -> int:
    """Install the fastest variant that passes :func:`crash_check`, trying the next one after a failure.

    Returns:
        0 once a variant is installed and checked, 1 if none passed (each reason printed).
    """
    variants = [v for v in candidates(cpu_flags(), os.environ.get("HCQR_LLAMA_BUILD")) if v.name not in skip]
    for variant in variants:
        install(ensure_wheel(variant, cache, version))
        why = crash_check()
        if why is None:
            print(f"llama.cpp build: {variant.name} (wheel kept in {wheel_dir(variant, cache)})")
            return 0
        log.warning(f"llama.cpp build {variant.name} is not used on this machine: {why}")
    log.warning("no llama.cpp build passed the crash check; local models cannot run here")
    return 1


def verify(cache: Path, version: str) -> int:
    """After a packaged model is installed: check the installed build with it; if it fails, fall back
    (:func:`setup` without the failed variant)."""
    why = crash_check()
    if why is None:
        return 0
    variants = candidates(cpu_flags(), os.environ.get("HCQR_LLAMA_BUILD"))
    current = installed_variant(variants)
    log.warning(f"llama.cpp build {current.name if current else '?'} failed with the new model: {why}")
    return setup(cache, version, skip=(current.name,) if current else ())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hcqr_dspy.lm.llama_builds", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("setup", "verify", "check", "show"))
    parser.add_argument("--version", default=LLAMA_CPP_VERSION)
    parser.add_argument("--cache", type=Path, default=None, help="wheel folder parent (default: $HCQR_CACHE)")
    args = parser.parse_args(argv)
    from hcqr_dspy.lm.packaged import cache_dir

    cache = args.cache or cache_dir()
    if args.action == "check":
        return check_models()
    if args.action == "show":
        for variant in candidates(cpu_flags(), os.environ.get("HCQR_LLAMA_BUILD")):
            print(variant.name, " ".join(variant.cmake_args))
        return 0
    return (setup if args.action == "setup" else verify)(cache, args.version)


if __name__ == "__main__":
    sys.exit(main())
