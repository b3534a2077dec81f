"""Corpus loading, passage store, encoders, retrievers (dense, BM25, hybrid) and multi-query fusion.

Importing this package registers every built-in retriever kind (``dense``,
``bm25``, ``hybrid``, ``milvus``) and vector-index backend (``faiss``,
``milvus``) with
:mod:`hcqr_dspy.retrieval.retriever_registry`.
"""

from hcqr_dspy.retrieval.bm25 import BM25Retriever
from hcqr_dspy.retrieval.corpus import Corpus, load_corpus
from hcqr_dspy.retrieval.dense import DenseRetriever
from hcqr_dspy.retrieval.embeddings import EmbeddingStore
from hcqr_dspy.retrieval.encoder import Encoder, load_encoder
from hcqr_dspy.retrieval.encoder_spec import EncoderSpec, parse_encoder
from hcqr_dspy.retrieval.fusion import STRATEGIES, FusedPassage, fuse
from hcqr_dspy.retrieval.hybrid import HybridRetriever
from hcqr_dspy.retrieval.index_kinds import KINDS, build_retriever, load_index
from hcqr_dspy.retrieval.milvus import MilvusIndex, MilvusRetriever, MilvusSettings
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.retriever_base import Hit, Retriever, read_manifest
from hcqr_dspy.retrieval.retriever_registry import get_backend_class, get_retriever_class, register, register_backend
from hcqr_dspy.retrieval.store_format import Passage
from hcqr_dspy.retrieval.vector_index import FaissIndex, VectorIndex

__all__ = [
    "BM25Retriever",
    "Corpus",
    "DenseRetriever",
    "EmbeddingStore",
    "Encoder",
    "EncoderSpec",
    "FaissIndex",
    "FusedPassage",
    "Hit",
    "HybridRetriever",
    "KINDS",
    "MilvusIndex",
    "MilvusRetriever",
    "MilvusSettings",
    "Passage",
    "PassageStore",
    "Retriever",
    "STRATEGIES",
    "VectorIndex",
    "build_retriever",
    "fuse",
    "get_backend_class",
    "get_retriever_class",
    "load_corpus",
    "load_encoder",
    "load_index",
    "parse_encoder",
    "read_manifest",
    "register",
    "register_backend",
]
