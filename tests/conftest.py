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
from stub_server import OPTIONS, SECRET  # noqa: E402


def pytest_configure(config):
    """Give each test process its share of the cores: llama.cpp (``HCQR_N_THREADS``), torch and faiss (OpenMP)
    each default to every core, and two pytest-xdist workers each spinning that many threads on the same cores wait
    on one another. A worker gets the cores over the workers (at least one); a run without workers, all of them.
    Set before any test module imports torch or faiss, kept where the user set them, inherited by the processes
    tests start. The xdist controller runs no test and sets nothing, since its workers inherit its environment."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers is None and config.getoption("numprocesses", default=None):
        return
    share = str(max(1, (os.cpu_count() or 1) // (workers or 1)))
    os.environ.setdefault("HCQR_N_THREADS", share)
    os.environ.setdefault("OMP_NUM_THREADS", share)


def pytest_collection_modifyitems(config, items):
    """Files that hold a ``slow`` test first, each file's own order kept (a stable sort). ``make test`` hands whole
    files to the pytest-xdist workers in collection order (``--dist loadfile --no-loadscope-reorder``): the long
    files start early and the many short ones fill the end, where xdist's own order (files with the most tests
    first) left a one-test file of minutes running alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session", autouse=True)
def fresh_embeddings_cache(tmp_path_factory):
    """Dense builds keep passage embeddings in a cache folder (hcqr_dspy.retrieval.embeddings): tests use a
    fresh one per session, never the user's ~/.cache, so no test reuses embeddings from an earlier run."""
    os.environ["HCQR_EMBEDDINGS"] = str(tmp_path_factory.mktemp("embeddings"))
    os.environ["HCQR_QUERY_RUNTIMES"] = str(tmp_path_factory.mktemp("query-runtimes"))  # ONNX / OpenVINO exports


@pytest.fixture(scope="session", autouse=True)
def fresh_dspy_cache(tmp_path_factory):
    """DSPy keeps LM replies in a disk cache (~/.dspy_cache) keyed without the API base, so a stub server's
    replies from an earlier session would answer this one's requests and the stub would see none. Tests use
    a fresh cache per session, in this process and in the processes they start (DSPY_CACHEDIR)."""
    import dspy

    folder = tmp_path_factory.mktemp("dspy-cache")
    os.environ["DSPY_CACHEDIR"] = str(folder)
    dspy.configure_cache(disk_cache_dir=str(folder))


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
def demo_bm25(tmp_path_factory) -> Path:
    """A BM25 index of the demo corpus (data/demo/corpus.jsonl, 229 passages), built once per session."""
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    folder = tmp_path_factory.mktemp("demo-bm25") / "bm25"
    BM25Retriever(load_corpus(REPO / "data" / "demo" / "corpus.jsonl"), show_progress=False).save(folder)
    return folder


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    """One SQLite MLflow store per test session (creating one takes seconds)."""
    from hcqr_dspy.tracking import store as tracking

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


@pytest.fixture(scope="session")
def pathoma_vectors(shared_data):
    """Pathoma (~500 real passages) embedded once into the session's embedding store, and 100 real MedQA-US
    questions embedded by the query side: every dense build over Pathoma (faiss or Milvus) reuses the same
    passage vectors, so any difference in the parity tests is the engine's."""
    import json
    from types import SimpleNamespace

    import numpy as np

    from hcqr_dspy.retrieval import EmbeddingStore, load_corpus, load_encoder

    corpus = load_corpus(shared_data / "corpus" / "textbooks" / "Pathoma_Husain.jsonl")
    questions = json.loads((shared_data / "benchmark" / "medqa.json").read_text(encoding="utf-8"))
    texts = [questions[qid]["question"] for qid in sorted(questions)[:100]]
    encoder = load_encoder(None)
    store = EmbeddingStore.open(corpus, encoder)  # under $HCQR_EMBEDDINGS, the session's fresh cache
    store.fill(corpus, encoder, show_progress=False)
    passages = np.concatenate([np.asarray(chunk) for _, chunk in store.iter_chunks()])
    return SimpleNamespace(
        corpus=corpus, encoder=encoder, passages=passages, queries=encoder.encode_queries(texts), texts=texts
    )


@pytest.fixture(scope="session")
def milvus_server():
    """A real Milvus 2.3.5 standalone server (PyPI's `milvus`, from .venv-milvus) on 127.0.0.1, authorization on.

    Started once per session on free ports with a temporary data folder; stopped (its whole process group)
    at the end. Skips, saying why, when it cannot start (no .venv-milvus: `make setup-milvus-server`).
    """
    from support.milvus_server import LocalMilvusServer, running_or_skip

    server = LocalMilvusServer(auth=True)
    with running_or_skip(server):
        print(f"\nMilvus {server.version} server on {server.uri} (ready in {server.startup_seconds:.1f} s)")
        yield server


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """``tmp_path`` holding ``qs.json`` (six labelled questions "Question number i?" that the stub
    OpenAI-compatible server of ``stub_server.py`` answers), with ``STUB_KEY`` set to the stub's key."""
    import json

    monkeypatch.setenv("STUB_KEY", SECRET)
    rows = {
        f"q{i}": {"question": f"Question number {i}?", "options": OPTIONS, "answer": "ABC"[i % 3]} for i in range(6)
    }
    (tmp_path / "qs.json").write_text(json.dumps(rows))
    return tmp_path
