"""What a ``gguf:`` model file is: a file that is there (:func:`require_gguf_file`), and the SHA-256 of its bytes,
remembered per file so that a large file is read once.

The path and size alone do not tell two files apart (a fine-tune re-quantized to the same type has the same
tensor shapes), so the run configuration (:func:`hcqr_dspy.workflows.specs.build_config`) and DSPy's cache key
(:func:`hcqr_dspy.lm.dspy_lm.engine_model_name`) use the hash. It is remembered in
``$HCQR_CACHE/file-hashes`` and reused while the file's size, inode, modification and change times
(``st_ctime_ns``: set by the kernel on every write, never by the user) are those it was computed for. A model
split into several files (``-00001-of-0000N.gguf``) is identified by the file it is named by, its first.

The context window a model was trained with (:func:`trained_context`) is read from the file's own GGUF metadata
(``<architecture>.context_length``, the key llama.cpp reads as ``n_ctx_train``), so a window above it is refused
before llama.cpp reserves its KV cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.files import file_sha256
from hcqr_dspy.lm.packaged import cache_dir


def require_gguf_file(path: str | Path, context: str = "") -> Path:
    """``path`` as given, once it is a file.

    Raises:
        LMSpecError: no file there, or a folder: ``"<context>GGUF file <path> is a folder, not a file"`` or
            ``"... not found"``.
    """
    path = Path(path)
    if not path.is_file():
        raise LMSpecError(f"{context}GGUF file {path} {'is a folder, not a file' if path.is_dir() else 'not found'}")
    return path


def trained_context(path: str | Path) -> int | None:
    """The context window, in tokens, the model in GGUF file ``path`` was trained with: its metadata key
    ``<general.architecture>.context_length``, read with llama.cpp's vocabulary-only load (no weights, no context,
    no KV cache; quiet, as ``Llama(verbose=False)`` loads a model).

    Returns ``None`` where the file does not state one or llama.cpp cannot read it (loading the model then says why).
    """
    import ctypes

    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr  # what Llama(verbose=False) loads a model under

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    # quiet at the file descriptors: the vocabulary's load logs at length and warns of a model's odd tokens
    with suppress_stdout_stderr(disable=False):
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return None
    try:
        value = ctypes.create_string_buffer(256)

        def meta(key: str) -> str:
            n = llama_cpp.llama_model_meta_val_str(model, key.encode(), value, len(value))
            return value.value.decode("utf-8", "replace") if n >= 0 else ""

        window = meta(f"{meta('general.architecture')}.context_length")
    finally:
        llama_cpp.llama_model_free(model)
    return int(window) if window.isdigit() else None


def gguf_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a model file's bytes, computed once per version of the file.

    Raises:
        OSError: the file cannot be read.
    """
    path = Path(path).resolve()
    st = path.stat()
    stamp = {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
    memo = cache_dir() / "file-hashes" / (hashlib.sha256(os.fsencode(path)).hexdigest()[:32] + ".json")
    try:
        known = json.loads(memo.read_text())
        if isinstance(known, dict) and known.get("path") == str(path) and known.get("stamp") == stamp:
            if isinstance(known.get("sha256"), str) and len(known["sha256"]) == 64:
                return known["sha256"]
    except (OSError, ValueError):
        pass  # not computed yet, or unreadable: computed below
    digest = file_sha256(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(path), "stamp": stamp, "sha256": digest}, ensure_ascii=True))
        tmp.replace(memo)
    except OSError:
        pass  # a read-only cache: the hash is computed again next time, never wrong
    return digest
