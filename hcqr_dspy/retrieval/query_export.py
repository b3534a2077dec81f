"""Exporting an encoder's query side for ONNX Runtime or OpenVINO, locally from its own weights.

What :mod:`hcqr_dspy.retrieval.query_runtime` runs, made here:

``query.onnx``
    the query side's forward pass (transformer, pooling, normalization, as
    the model's own sentence-transformers modules do it) exported to ONNX by
    ``torch.onnx.export`` (the TorchScript exporter, dynamic batch and
    sequence axes) (:func:`export_onnx`).
``query-int8.onnx``
    that ONNX graph with its weights quantized to int8 by ONNX Runtime's
    dynamic quantization (``onnxruntime.quantization.quantize_dynamic``,
    QInt8 weights, activations quantized per batch at run time)
    (:func:`quantize_int8`).
``query-openvino.xml`` / ``.bin``
    that ONNX graph converted by ``openvino.convert_model`` (fp32 weights
    kept) (:func:`convert_openvino`).

Tokenization stays the encoder's own (``SentenceTransformer.preprocess``
with ``task="query"``, so a query/passage pair routes to its query model:
:func:`preprocess_queries`).

Why not sentence-transformers' ``backend="onnx"``: it loads through
``optimum-onnx`` / ``optimum-intel``, whose releases on PyPI (optimum-onnx
0.1.0, optimum-intel 2.2.0) require ``transformers<4.58`` / ``<5.6``, while
this project runs transformers 5.x; the export here uses only torch,
``onnx``, ``onnxruntime`` and ``openvino``.

Exports are made offline from the weights sentence-transformers already
loaded (nothing is downloaded) and cached in ``$HCQR_QUERY_RUNTIMES/<key>/``, else
``$HCQR_CACHE/query-runtimes/<key>/`` (default ``~/.cache/hcqr-dspy/query-runtimes``), keyed by the query
side's description, where its weights were read from (their files' sizes
and modification times), and the torch and exporter versions
(:func:`export_key`); each file is written under a temporary name and
renamed, so a killed export leaves no half file.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

EXPORT_FORMAT_VERSION = 1
ONNX_FILE = "query.onnx"
ONNX_INT8_FILE = "query-int8.onnx"
OPENVINO_XML = "query-openvino.xml"
RECORD_FILE = "export.json"
ONNX_OPSET = 17
OUTPUT_NAME = "sentence_embedding"


def default_cache_root() -> Path:
    """``$HCQR_QUERY_RUNTIMES``, else ``$HCQR_CACHE/query-runtimes`` (default ``~/.cache/hcqr-dspy/query-runtimes``)."""
    if os.environ.get("HCQR_QUERY_RUNTIMES"):
        return Path(os.environ["HCQR_QUERY_RUNTIMES"])
    return Path(os.environ.get("HCQR_CACHE", Path.home() / ".cache" / "hcqr-dspy")) / "query-runtimes"


def _weights_fingerprint(path: str | None) -> list:
    """(file, size, mtime_ns) of every file under a local weights folder; [] for a hub name."""
    if not path or not Path(path).is_dir():
        return []
    out = []
    for f in sorted(Path(path).rglob("*")):
        if f.is_file():
            st = f.stat()
            out.append([str(f.relative_to(path)), st.st_size, st.st_mtime_ns])
    return out


def export_key(query_side: dict[str, Any], weights_path: str | None) -> str:
    """The cache folder name of one encoder's query-side export: 24 hex digits of a SHA-256."""
    import torch

    blob = json.dumps(
        {
            "format": EXPORT_FORMAT_VERSION,
            "query_encoder": query_side,
            "weights": weights_path,
            "files": _weights_fingerprint(weights_path),
            "torch": torch.__version__,
            "opset": ONNX_OPSET,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


class _QuerySide:
    """The query path of a SentenceTransformer as a module of tensors -> sentence embeddings (for export)."""

    def __new__(cls, model: SentenceTransformer, input_names: Sequence[str]):
        import torch

        class QuerySide(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.input_names = list(input_names)

            def forward(self, *tensors):
                features = dict(zip(self.input_names, tensors))
                features["modality"] = "text"
                return self.model(features, task="query")[OUTPUT_NAME]

        return QuerySide().eval()


def preprocess_queries(model: SentenceTransformer, queries: Sequence[str]) -> dict[str, Any]:
    """The encoder's own tokenization of queries (``task="query"``): name -> int64 tensor ``(n, seq)``."""
    features = model.preprocess(list(queries), task="query")
    return {k: v for k, v in features.items() if hasattr(v, "shape")}


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def export_onnx(
    model: SentenceTransformer, folder: Path, query_side: dict[str, Any], weights_path: str | None
) -> dict[str, Any]:
    """``query.onnx`` (fp32) and ``export.json``, unless already there."""
    record_path = folder / RECORD_FILE
    if (folder / ONNX_FILE).is_file() and record_path.is_file():
        return json.loads(record_path.read_text(encoding="utf-8"))
    import torch

    # Two queries of different lengths: a padded batch, so nothing is traced as if every row had the same length.
    sample = preprocess_queries(
        model,
        [
            "digoxin toxicity visual changes",
            "iron deficiency anemia versus anemia of chronic disease in an elderly woman with fatigue",
        ],
    )
    names = list(sample)
    module = _QuerySide(model, names)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[OUTPUT_NAME] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings about shape-dependent branches (constant for this model)
        with torch.no_grad():
            _atomic(
                folder / ONNX_FILE,
                lambda tmp: torch.onnx.export(
                    module,
                    tuple(sample[n] for n in names),
                    str(tmp),
                    dynamo=False,
                    input_names=names,
                    output_names=[OUTPUT_NAME],
                    dynamic_axes=axes,
                    opset_version=ONNX_OPSET,
                    do_constant_folding=True,
                ),
            )
    record = {
        "format_version": EXPORT_FORMAT_VERSION,
        "query_encoder": query_side,
        "weights": weights_path,
        "input_names": names,
        "opset": ONNX_OPSET,
        "torch": torch.__version__,
        "exporter": "torch.onnx (TorchScript)",
    }
    _atomic(record_path, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8"))
    return record


def quantize_int8(folder: Path) -> None:
    """``query-int8.onnx``: ``query.onnx`` with int8 weights (dynamic quantization), unless already there."""
    if (folder / ONNX_INT8_FILE).is_file():
        return
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _atomic(
        folder / ONNX_INT8_FILE,
        lambda tmp: quantize_dynamic(str(folder / ONNX_FILE), str(tmp), weight_type=QuantType.QInt8),
    )


def convert_openvino(folder: Path) -> None:
    """``query-openvino.xml`` / ``.bin``: ``query.onnx`` converted by OpenVINO (fp32 weights), unless already there."""
    xml = folder / OPENVINO_XML
    if xml.is_file() and xml.with_suffix(".bin").is_file():
        return
    import openvino as ov

    converted = ov.convert_model(str(folder / ONNX_FILE))
    # The .bin is written first and the .xml last, so an .xml present means a finished pair.
    tmp = folder / f"tmp{os.getpid()}-{OPENVINO_XML}"
    try:
        ov.save_model(converted, str(tmp), compress_to_fp16=False)
        os.replace(tmp.with_suffix(".bin"), xml.with_suffix(".bin"))
        os.replace(tmp, xml)
    finally:
        for leftover in (tmp, tmp.with_suffix(".bin")):
            if leftover.exists():
                leftover.unlink()
