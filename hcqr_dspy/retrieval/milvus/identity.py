"""What a Milvus collection was built from, and the check that refuses a collection built from something else.

A collection's properties (prefixed :data:`PROPERTY_PREFIX`) record the
corpus fingerprint, passage count and source, the passage encoder, the vector
dimension and the retrieval mode; a collection built from another corpus or
encoder is refused, naming both.
"""

from __future__ import annotations

import json
from typing import Any

from hcqr_dspy.errors import RetrievalIndexError

PROPERTY_PREFIX = "hcqr."
COLLECTION_FORMAT = "hcqr-milvus/1"


def collection_identity(
    corpus: Any, retrieval: str, passage_encoder: dict[str, Any] | None, dimension: int | None
) -> dict[str, str]:
    """The collection properties that name what it was built from (all strings, as Milvus properties are).

    Args:
        corpus: The :class:`~hcqr_dspy.retrieval.passage_store.PassageStore` (fingerprint, count, source).
        retrieval: ``dense``, ``bm25`` or ``hybrid``.
        passage_encoder: :meth:`EncoderSpec.passage_description` of the
            encoder whose passage side made the vectors (``None`` for bm25).
        dimension: Vector size (``None`` for bm25).
    """
    return {
        "format": COLLECTION_FORMAT,
        "corpus_fingerprint": corpus.fingerprint,
        "corpus_source": str(corpus.source),
        "corpus_count": str(len(corpus)),
        "passage_encoder": json.dumps(passage_encoder, sort_keys=True) if passage_encoder else "none",
        "dimension": str(dimension or 0),
        "retrieval": retrieval,
    }


def compare_identity(have: dict[str, str], expected: dict[str, str], where: str) -> None:
    """Refuse a collection (properties ``have``, unprefixed) built from another corpus, passage encoder or for
    another retrieval mode than ``expected`` (:func:`collection_identity`).

    Args:
        where: The collection, for the message (``"Milvus collection 'c' at URI"``).

    Raises:
        RetrievalIndexError: naming the collection's and the expected corpus / encoder.
    """
    if have.get("format") != COLLECTION_FORMAT:
        raise RetrievalIndexError(f"{where} was not built by hcqr-dspy (no {PROPERTY_PREFIX}format property)")
    if have.get("corpus_fingerprint") != expected["corpus_fingerprint"]:
        raise RetrievalIndexError(
            f"{where} was built for corpus {have.get('corpus_source')!r} ({have.get('corpus_count')} passages, "
            f"fingerprint {str(have.get('corpus_fingerprint'))[:12]}) but was given corpus "
            f"{expected['corpus_source']!r} ({expected['corpus_count']} passages, fingerprint "
            f"{expected['corpus_fingerprint'][:12]}); use another --collection or the corpus it was built for"
        )
    if have.get("passage_encoder") != expected["passage_encoder"]:
        raise RetrievalIndexError(
            f"{where} holds vectors of passage encoder {_encoder_label(have.get('passage_encoder'))}, not "
            f"{_encoder_label(expected['passage_encoder'])}; use another --collection"
        )
    for key, what in (("dimension", "dimension"), ("retrieval", "retrieval mode")):
        if have.get(key) != expected[key]:
            raise RetrievalIndexError(
                f"{where} was built with {what} {have.get(key)!r}, not {expected[key]!r}; use another --collection"
            )


def _encoder_label(value: str | None) -> str:
    if not value or value == "none":
        return "no encoder"
    try:
        return repr(json.loads(value)["passage_encoder"]["model"])
    except (ValueError, KeyError, TypeError):
        return repr(value)
