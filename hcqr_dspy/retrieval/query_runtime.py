"""Query encoding through ONNX Runtime or OpenVINO, exported locally from an encoder's own weights.

HCQR's retrieval step embeds three short queries per question; with a
PyTorch encoder on a CPU that embedding, not the vector search, is most of
the step's time. A :class:`QueryRuntime` runs the *query side* of a loaded
sentence-transformers encoder through another inference engine:

``torch``
    sentence-transformers itself (the reference; no runtime object).
``onnx``
    the query side's forward pass (transformer, pooling, normalization, as
    the model's own sentence-transformers modules do it) exported to ONNX by
    ``torch.onnx.export`` (the TorchScript exporter, dynamic batch and
    sequence axes) and run by ONNX Runtime on the CPU.
``onnx-int8``
    that ONNX graph with its weights quantized to int8 by ONNX Runtime's
    dynamic quantization (``onnxruntime.quantization.quantize_dynamic``,
    QInt8 weights, activations quantized per batch at run time).
``openvino``
    that ONNX graph converted by ``openvino.convert_model`` (fp32 weights
    kept) and compiled for the CPU with fp32 inference precision.
``openvino-bf16``
    the same OpenVINO model compiled with bf16 inference precision
    (``INFERENCE_PRECISION_HINT="bf16"``: matrix products in bfloat16 on
    CPUs with AVX512_BF16 or AMX, weights stored fp32). Refused with one
    line on a CPU whose OpenVINO plugin lacks the ``BF16`` capability,
    where OpenVINO would quietly run it as fp32.

Both OpenVINO runtimes compile the model for static shapes: a batch of
``n`` queries whose longest has ``s`` tokens runs on a model reshaped to
``(n, s')``, ``s'`` = :func:`sequence_bucket` of ``s``, the extra
positions padded on the right with attention mask 0 (exact: masked
positions change neither the attention of real tokens nor mask-weighted
pooling). OpenVINO's CPU plugin runs static shapes faster than its
shape-agnostic kernels (measured on the bench's queries, 2026-12-01: bf16
6.8 ms static against 9.6 ms dynamic per 3-query batch). Each new shape
costs one compile (about 0.3-0.7 s here) and holds its own copy of the
weights (all-MiniLM-L6-v2: about 33 MB in bf16, 50 MB in fp32, measured
by RSS growth); the last :data:`MAX_COMPILED_SHAPES` shapes are kept.

Tokenization stays the encoder's own (``SentenceTransformer.preprocess``
with ``task="query"``, so a query/passage pair routes to its query model),
and the vectors are L2-normalized afterwards when the encoder's spec says
so, as ``encode_query(normalize_embeddings=True)`` does.

Why not sentence-transformers' ``backend="onnx"``: it loads through
``optimum-onnx`` / ``optimum-intel``, whose releases on PyPI (optimum-onnx
0.1.0, optimum-intel 2.2.0) require ``transformers<4.58`` / ``<5.6``, while
this project runs transformers 5.x; the export here uses only torch,
``onnx``, ``onnxruntime`` and ``openvino``.

Exports are made offline from the weights sentence-transformers already
loaded (nothing is downloaded) and cached in ``$HCQR_QUERY_RUNTIMES/<key>/``, else
``$HCQR_CACHE/query-runtimes/<key>/`` (default ``~/.cache/hcqr-dspy/query-runtimes``), keyed by the query
side's description, where its weights were read from (their files' sizes
and modification times), and the torch and exporter versions; each file is
written under a temporary name and renamed, so a killed export leaves no
half file. Passages are always embedded by PyTorch: the embedding store
holds the reference vectors, and an index built with PyTorch is searched
with any runtime (the runtime is not part of the encoder's manifest record).

Whether a runtime may replace PyTorch for an index is a measured question:
``bench/scale.py`` records the top-15 agreement of each runtime's
hits with PyTorch's on the shared queries and keeps only those at or above
0.99 (see bench/RESULTS.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hcqr_dspy.errors import HCQRError

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

RUNTIMES = ("torch", "onnx", "onnx-int8", "openvino", "openvino-bf16")
DEFAULT_RUNTIME = "torch"
EXPORT_FORMAT_VERSION = 1
ONNX_FILE = "query.onnx"
ONNX_INT8_FILE = "query-int8.onnx"
OPENVINO_XML = "query-openvino.xml"
RECORD_FILE = "export.json"
ONNX_OPSET = 17
OUTPUT_NAME = "sentence_embedding"
MAX_COMPILED_SHAPES = 4  # OpenVINO: compiled (batch, sequence) shapes kept per runtime, least recently used dropped
# What each runtime needs beyond the project's base dependencies (pyproject extra "onnx" / "openvino").
_NEEDS = {"onnx": ("onnx", "onnxruntime"), "onnx-int8": ("onnx", "onnxruntime"), "openvino": ("onnx", "openvino"),
          "openvino-bf16": ("onnx", "openvino")}
_OPENVINO_PRECISION = {"openvino": "f32", "openvino-bf16": "bf16"}


class QueryRuntimeError(HCQRError):
    """A query runtime is unknown, its library is missing, or the export failed."""


def check_runtime(name: str | None) -> str:
    """``name`` checked against :data:`RUNTIMES` (``None`` means ``torch``).

    Raises:
        QueryRuntimeError: an unknown runtime (the known ones are listed).
    """
    if name is None:
        return DEFAULT_RUNTIME
    if name not in RUNTIMES:
        raise QueryRuntimeError(f"unknown encoder backend {name!r}; choose one of {', '.join(RUNTIMES)}")
    return name


def default_cache_root() -> Path:
    """``$HCQR_QUERY_RUNTIMES``, else ``$HCQR_CACHE/query-runtimes`` (default ``~/.cache/hcqr-dspy/query-runtimes``)."""
    if os.environ.get("HCQR_QUERY_RUNTIMES"):
        return Path(os.environ["HCQR_QUERY_RUNTIMES"])
    return Path(os.environ.get("HCQR_CACHE", Path.home() / ".cache" / "hcqr-dspy")) / "query-runtimes"


def _require(runtime: str) -> None:
    import importlib.util

    missing = [m for m in _NEEDS.get(runtime, ()) if importlib.util.find_spec(m) is None]
    if missing:
        extra = "openvino" if runtime.startswith("openvino") else "onnx"
        raise QueryRuntimeError(
            f"encoder backend {runtime!r} needs the package(s) {', '.join(missing)}: "
            f"pip install 'hcqr-dspy[{extra}]' (or use --encoder-backend torch)"
        )


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

    blob = json.dumps({"format": EXPORT_FORMAT_VERSION, "query_encoder": query_side, "weights": weights_path,
                       "files": _weights_fingerprint(weights_path), "torch": torch.__version__, "opset": ONNX_OPSET},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


class _QuerySide:
    """The query path of a SentenceTransformer as a module of tensors -> sentence embeddings (for export)."""

    def __new__(cls, model: "SentenceTransformer", input_names: Sequence[str]):
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


def preprocess_queries(model: "SentenceTransformer", queries: Sequence[str]) -> dict[str, Any]:
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


class QueryRuntime:
    """The query side of an encoder, run by ONNX Runtime or OpenVINO.

    Build with :func:`load_query_runtime`. :meth:`encode` returns what
    ``Encoder.encode_queries`` returns: float32 ``(n, dimension)``,
    C-contiguous, unit rows when ``normalize``.

    Attributes:
        runtime: ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-bf16``.
        folder: The export folder (cache).
        input_names: The graph's inputs, as the tokenizer names them.
    """

    def __init__(self, runtime: str, model: "SentenceTransformer", folder: Path, input_names: list[str], normalize: bool):
        self.runtime = runtime
        self.model = model
        self.folder = folder
        self.input_names = input_names
        self.normalize = normalize
        self._lock = threading.Lock()
        if runtime in ("onnx", "onnx-int8"):
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            path = folder / (ONNX_FILE if runtime == "onnx" else ONNX_INT8_FILE)
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            self._run = lambda feeds: self._session.run([OUTPUT_NAME], feeds)[0]
        else:
            self._openvino = _StaticShapes(folder / OPENVINO_XML, _OPENVINO_PRECISION[runtime], input_names,
                                           _max_length(model))
            self._run = self._openvino.infer

    def encode(self, queries: Sequence[str]) -> np.ndarray:
        """Embed queries: float32 ``(len(queries), dimension)``."""
        features = preprocess_queries(self.model, queries)
        feeds = {name: features[name].numpy().astype(np.int64, copy=False) for name in self.input_names}
        with self._lock:  # an OpenVINO infer request (and its shape cache) serve one call at a time
            out = np.array(self._run(feeds), dtype=np.float32, copy=True)
        if self.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)  # torch.nn.functional.normalize's eps
        return np.ascontiguousarray(out)


def sequence_bucket(length: int, max_length: int | None) -> int:
    """The padded length OpenVINO compiles for ``length`` tokens: a multiple of 8 up to 32, of 16 up to 64, of 32
    up to 128, then of 64 (past 32 tokens the padding stays under half the length), never beyond ``max_length`` (the
    encoder's own maximum; ``None``: ``length`` itself, unpadded)."""
    if max_length is None:
        return length
    step = 8 if length <= 32 else 16 if length <= 64 else 32 if length <= 128 else 64
    return max(length, min(-(-length // step) * step, max_length))


def cpu_has_bf16(core: Any = None) -> bool:
    """Whether OpenVINO's CPU plugin computes in bf16 here (its ``OPTIMIZATION_CAPABILITIES`` lists ``BF16``)."""
    import openvino as ov

    return "BF16" in (core or ov.Core()).get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _max_length(model: "SentenceTransformer") -> int | None:
    """The query side's token limit, as its own tokenization truncates a very long query; ``None`` where it does not."""
    length = preprocess_queries(model, ["word " * 4096])["input_ids"].shape[1]
    return int(length) if length < 4096 else None


class _StaticShapes:
    """An OpenVINO model compiled once per (batch, sequence bucket) shape, the inputs padded up to the bucket."""

    def __init__(self, xml: Path, precision: str, input_names: list[str], max_length: int | None):
        from collections import OrderedDict

        import openvino as ov

        self.core = ov.Core()
        if precision == "bf16" and not cpu_has_bf16(self.core):
            raise QueryRuntimeError("encoder backend 'openvino-bf16' needs a CPU with bf16 instructions (AVX512_BF16 or "
                                    "AMX), which this one lacks; use --encoder-backend openvino (fp32)")
        self.model = self.core.read_model(str(xml))
        self.config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"}
        self.input_names = input_names
        # Padding is exact only where an attention mask hides the padded positions; otherwise each exact shape compiles.
        self.max_length = max_length if "attention_mask" in input_names else None
        self.requests: OrderedDict[tuple[int, int], Any] = OrderedDict()

    def infer(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        batch, length = feeds[self.input_names[0]].shape
        bucket = sequence_bucket(length, self.max_length)
        if bucket != length:
            feeds = {name: np.pad(v, ((0, 0), (0, bucket - length))) for name, v in feeds.items()}  # zeros: mask 0
        key = (batch, bucket)
        request = self.requests.pop(key, None)
        if request is None:
            model = self.model.clone()
            model.reshape({name: [batch, bucket] for name in self.input_names})
            request = self.core.compile_model(model, "CPU", self.config).create_infer_request()
            if len(self.requests) >= MAX_COMPILED_SHAPES:
                self.requests.popitem(last=False)
        self.requests[key] = request
        return request.infer(feeds)[0]


_export_lock = threading.Lock()


def load_query_runtime(runtime: str, model: "SentenceTransformer", query_side: dict[str, Any], weights_path: str | None,
                       normalize: bool, cache_root: str | Path | None = None) -> QueryRuntime:
    """Export (once, cached) and load the query side of ``model`` for ``runtime``.

    Args:
        runtime: ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-bf16``.
        model: The loaded sentence-transformers encoder (one model or a query/document ``Router``).
        query_side: The query side's description (part of the cache key).
        weights_path: Where its weights were read from (part of the cache key), or ``None``.
        normalize: L2-normalize the output vectors.
        cache_root: Root of the export cache (default :func:`default_cache_root`).

    Raises:
        QueryRuntimeError: unknown runtime, a missing library (naming the
            extra to install), an export or conversion that failed, or a
            cached export that cannot be loaded (one line, naming the cache
            folder to delete).
    """
    runtime = check_runtime(runtime)
    if runtime == DEFAULT_RUNTIME:
        raise QueryRuntimeError("the torch runtime is sentence-transformers itself; no export is needed")
    _require(runtime)
    folder = Path(cache_root) if cache_root is not None else default_cache_root()
    folder = folder / export_key(query_side, weights_path)
    with _export_lock:
        try:
            cached = folder.is_dir() and any(folder.iterdir())
        except OSError:  # unreadable: the export below says why
            cached = False
        damaged = f"; {folder} holds an earlier export that may be damaged: delete that folder to export again" if cached else ""
        try:
            folder.mkdir(parents=True, exist_ok=True)
            record = _export_onnx(model, folder, query_side, weights_path)
            if runtime == "onnx-int8":
                _quantize_int8(folder)
            elif runtime.startswith("openvino"):
                _convert_openvino(folder)
        except QueryRuntimeError:
            raise
        except OSError as exc:
            raise QueryRuntimeError(f"cannot write the {runtime} export into {folder}: {exc.strerror or exc}") from None
        except Exception as exc:  # exporters raise many types; one line, naming the step
            text = " ".join(str(exc).split())[:300]
            raise QueryRuntimeError(f"exporting the query encoder to {runtime} failed ({type(exc).__name__}: {text})"
                                    f"{damaged}") from None
        try:
            return QueryRuntime(runtime, model, folder, record["input_names"], normalize)
        except QueryRuntimeError:
            raise
        except Exception as exc:  # a truncated or foreign file in the cache: ONNX Runtime / OpenVINO parse errors
            text = " ".join(str(exc).split())[:300]
            raise QueryRuntimeError(f"the cached {runtime} export in {folder} cannot be loaded ({type(exc).__name__}: "
                                    f"{text}); delete that folder to export again") from None


def _export_onnx(model: "SentenceTransformer", folder: Path, query_side: dict[str, Any], weights_path: str | None
                 ) -> dict[str, Any]:
    """``query.onnx`` (fp32) and ``export.json``, unless already there."""
    record_path = folder / RECORD_FILE
    if (folder / ONNX_FILE).is_file() and record_path.is_file():
        return json.loads(record_path.read_text(encoding="utf-8"))
    import torch

    # Two queries of different lengths: a padded batch, so nothing is traced as if every row had the same length.
    sample = preprocess_queries(model, ["digoxin toxicity visual changes", "iron deficiency anemia versus anemia of "
                                        "chronic disease in an elderly woman with fatigue"])
    names = list(sample)
    module = _QuerySide(model, names)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[OUTPUT_NAME] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings about shape-dependent branches (constant for this model)
        with torch.no_grad():
            _atomic(folder / ONNX_FILE, lambda tmp: torch.onnx.export(
                module, tuple(sample[n] for n in names), str(tmp), dynamo=False, input_names=names,
                output_names=[OUTPUT_NAME], dynamic_axes=axes, opset_version=ONNX_OPSET, do_constant_folding=True))
    record = {"format_version": EXPORT_FORMAT_VERSION, "query_encoder": query_side, "weights": weights_path,
              "input_names": names, "opset": ONNX_OPSET, "torch": torch.__version__, "exporter": "torch.onnx (TorchScript)"}
    _atomic(record_path, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8"))
    return record


def _quantize_int8(folder: Path) -> None:
    if (folder / ONNX_INT8_FILE).is_file():
        return
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _atomic(folder / ONNX_INT8_FILE, lambda tmp: quantize_dynamic(str(folder / ONNX_FILE), str(tmp),
                                                                  weight_type=QuantType.QInt8))


def _convert_openvino(folder: Path) -> None:
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
