"""Shared fixtures: offline environment, tiny corpora, the real shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("HCQR_SHARED_DATA", REPO.parent / "shared" / "data"))

from helpers import TINY_ROWS, snippet, write_jsonl  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def fresh_embeddings_cache(tmp_path_factory):
    """Dense builds keep passage embeddings in a cache folder (hcqr_dspy.retrieval.embeddings): tests use a
    fresh one per session, never the user's ~/.cache, so no test reuses embeddings from an earlier run."""
    os.environ["HCQR_EMBEDDINGS"] = str(tmp_path_factory.mktemp("embeddings"))


@pytest.fixture
def tiny_corpus_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "tiny.jsonl", [snippet(*r) for r in TINY_ROWS])


@pytest.fixture(scope="session")
def tiny_corpus():
    from hcqr_dspy.retrieval import Corpus, Passage

    return Corpus([Passage(*r) for r in TINY_ROWS], source="tiny")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "corpus").is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (set HCQR_SHARED_DATA to point at shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    """One SQLite MLflow store per test session (creating one takes seconds)."""
    from hcqr_dspy import tracking

    folder = tmp_path_factory.mktemp("mlflow")
    tracking.configure(folder)
    return folder


@pytest.fixture(scope="session")
def pathoma_bm25(shared_data, tmp_path_factory):
    """A small real corpus slice (Pathoma, ~500 passages) indexed with BM25."""
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    corpus = load_corpus(shared_data / "corpus" / "textbooks" / "Pathoma_Husain.jsonl")
    out = tmp_path_factory.mktemp("idx") / "pathoma-bm25"
    BM25Retriever(corpus, show_progress=False).save(out)
    return out
