"""Corpus loading, retrievers (dense, BM25, hybrid; faiss/bm25s or Milvus) and multi-query fusion."""

from hcqr_dspy.retrieval.base import Hit, Retriever, read_manifest
from hcqr_dspy.retrieval.bm25 import BM25Retriever
from hcqr_dspy.retrieval.corpus import Corpus, Passage, load_corpus
from hcqr_dspy.retrieval.dense import DenseRetriever
from hcqr_dspy.retrieval.fusion import STRATEGIES, FusedPassage, fuse
from hcqr_dspy.retrieval.hybrid import HybridRetriever
from hcqr_dspy.retrieval.index import RETRIEVERS, build_retriever, load_index
from hcqr_dspy.retrieval.milvus import MilvusRetriever, MilvusSettings

__all__ = [
    "BM25Retriever",
    "Corpus",
    "DenseRetriever",
    "FusedPassage",
    "Hit",
    "HybridRetriever",
    "MilvusRetriever",
    "MilvusSettings",
    "Passage",
    "RETRIEVERS",
    "Retriever",
    "STRATEGIES",
    "build_retriever",
    "fuse",
    "load_corpus",
    "load_index",
    "read_manifest",
]
