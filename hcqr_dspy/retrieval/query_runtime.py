"""Query encoding through ONNX Runtime or OpenVINO, exported locally from an encoder's own weights.

HCQR's retrieval step embeds three short queries per question; with a
PyTorch encoder on a CPU that embedding, not the vector search, is most of
the step's time. A :class:`QueryRuntime` runs the *query side* of a loaded
sentence-transformers encoder through another inference engine, on an
export made by :mod:`hcqr_dspy.retrieval.query_export`:

``torch``
    sentence-transformers itself (the reference; no runtime object).
``onnx``
    the query side's forward pass exported to ONNX, run by ONNX Runtime on
    the CPU.
``onnx-int8``
    that ONNX graph with its weights quantized to int8, run by ONNX Runtime.
``openvino``
    that ONNX graph converted to OpenVINO (fp32 weights kept) and compiled
    for the CPU with fp32 inference precision.
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
shape-agnostic kernels (see bench/RESULTS.md). Each new shape costs one
compile and holds its own copy of the weights (all-MiniLM-L6-v2: about
33 MB in bf16, 50 MB in fp32, measured by RSS growth); the last
:data:`MAX_COMPILED_SHAPES` shapes are kept.

Tokenization stays the encoder's own (``SentenceTransformer.preprocess``
with ``task="query"``), and the vectors are L2-normalized afterwards when
the encoder's spec says so, as ``encode_query(normalize_embeddings=True)``
does.

Passages are always embedded by PyTorch: the embedding store holds the
reference vectors, and an index built with PyTorch is searched with any
runtime (the runtime is not part of the encoder's manifest record).

Whether a runtime may replace PyTorch for an index is a measured question:
``bench/scale.py`` records the top-15 agreement of each runtime's
hits with PyTorch's on the shared queries and keeps only those at or above
0.99 (see bench/RESULTS.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hcqr_dspy.errors import QueryRuntimeError
from hcqr_dspy.retrieval.query_export import (
    ONNX_FILE,
    ONNX_INT8_FILE,
    OPENVINO_XML,
    OUTPUT_NAME,
    convert_openvino,
    default_cache_root,
    export_key,
    export_onnx,
    preprocess_queries,
    quantize_int8,
)

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

RUNTIMES = ("torch", "onnx", "onnx-int8", "openvino", "openvino-bf16")
DEFAULT_RUNTIME = "torch"
MAX_COMPILED_SHAPES = 4  # OpenVINO: compiled (batch, sequence) shapes kept per runtime, least recently used dropped
# What each runtime needs beyond the project's base dependencies (pyproject extra "onnx" / "openvino").
_NEEDS = {
    "onnx": ("onnx", "onnxruntime"),
    "onnx-int8": ("onnx", "onnxruntime"),
    "openvino": ("onnx", "openvino"),
    "openvino-bf16": ("onnx", "openvino"),
}
_OPENVINO_PRECISION = {"openvino": "f32", "openvino-bf16": "bf16"}


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


def _require(runtime: str) -> None:
    import importlib.util

    missing = [m for m in _NEEDS.get(runtime, ()) if importlib.util.find_spec(m) is None]
    if missing:
        extra = "openvino" if runtime.startswith("openvino") else "onnx"
        raise QueryRuntimeError(
            f"encoder backend {runtime!r} needs the package(s) {', '.join(missing)}: "
            f"pip install 'hcqr-dspy[{extra}]' (or use --encoder-backend torch)"
        )


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

    def __init__(self, runtime: str, model: SentenceTransformer, folder: Path, input_names: list[str], normalize: bool):
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
            self._openvino = _StaticShapes(
                folder / OPENVINO_XML, _OPENVINO_PRECISION[runtime], input_names, _max_length(model)
            )
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


def _max_length(model: SentenceTransformer) -> int | None:
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
            raise QueryRuntimeError(
                "encoder backend 'openvino-bf16' needs a CPU with bf16 instructions "
                "(AVX512_BF16 or AMX), which this one lacks; use --encoder-backend openvino (fp32)"
            )
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


def load_query_runtime(
    runtime: str,
    model: SentenceTransformer,
    query_side: dict[str, Any],
    weights_path: str | None,
    normalize: bool,
    cache_root: str | Path | None = None,
) -> QueryRuntime:
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
        damaged = (
            f"; {folder} holds an earlier export that may be damaged: delete that folder to export again"
            if cached
            else ""
        )
        try:
            folder.mkdir(parents=True, exist_ok=True)
            record = export_onnx(model, folder, query_side, weights_path)
            if runtime == "onnx-int8":
                quantize_int8(folder)
            elif runtime.startswith("openvino"):
                convert_openvino(folder)
        except QueryRuntimeError:
            raise
        except OSError as exc:
            raise QueryRuntimeError(f"cannot write the {runtime} export into {folder}: {exc.strerror or exc}") from None
        except Exception as exc:  # exporters raise many types; one line, naming the step
            text = " ".join(str(exc).split())[:300]
            raise QueryRuntimeError(
                f"exporting the query encoder to {runtime} failed ({type(exc).__name__}: {text}){damaged}"
            ) from None
        try:
            return QueryRuntime(runtime, model, folder, record["input_names"], normalize)
        except QueryRuntimeError:
            raise
        except Exception as exc:  # a truncated or foreign file in the cache: ONNX Runtime / OpenVINO parse errors
            text = " ".join(str(exc).split())[:300]
            raise QueryRuntimeError(
                f"the cached {runtime} export in {folder} cannot be loaded ({type(exc).__name__}: "
                f"{text}); delete that folder to export again"
            ) from None
