"""The datasets of the scale and Milvus benchmarks: the real shared corpus and a synthetic corpus made from it.

``real``
    All ~41k shared passages (``../shared/data/corpus``, repeated ids
    renamed) in a passage store, embedded once with the packaged
    all-MiniLM-L6-v2 into the embedding store (``$HCQR_EMBEDDINGS`` or
    ``~/.cache/hcqr-dspy/embeddings``; the first time that is the ~25-30
    minute encoding, reused afterwards by every index type and engine).
``N`` synthetic passages (e.g. 1,000,000)
    Made from the real passages and their real embeddings, so nothing is
    downloaded and no encoder runs (encoding 1M passages at ~27 passages/s
    would take ten hours here). With a seeded generator (``SYNTHETIC_SEED``),
    synthetic passage ``i`` draws two real passages ``a`` (its source) and
    ``b`` (a second source, ``b != a``) and a weight ``w`` uniform in
    [0.6, 0.9]:

    * id ``syn-{i:07d}`` (new ids); title: ``a``'s title; content:
      ``a``'s content, a space, then ``b``'s content, cut to at most
      1,000 characters in all (MedRAG snippet scale) — texts reused and
      recombined;
    * vector: ``normalize(w * e_a + (1 - w) * e_b + noise)`` with ``e`` the
      real unit embeddings and ``noise`` Gaussian, 0.02 per dimension
      (norm about 0.39 for 384-d), so no two synthetic vectors coincide and
      each stays near its sources (cosine to ``e_a`` about 0.85 to 0.95).

    Its queries are the same real queries (encoded by the real query
    encoder) as the real corpus's. The passage store and the embedding store
    are written into a work folder and reused by a later run with the same
    size, seed and source corpus (the milvus and scale benches share them).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("HCQR_SHARED_DATA", REPO.parent / "shared" / "data"))
DEFAULT_CORPUS = SHARED_DATA / "corpus"
DEFAULT_WORK = Path(os.environ.get("HCQR_CACHE", Path.home() / ".cache" / "hcqr-dspy")) / "bench-scale"
SYNTHETIC_SEED = 20261201
SYNTHETIC_CHUNK = 65_536
MIX_WEIGHT = (0.6, 0.9)
NOISE_STD = 0.02
MAX_CHARS = 1000
RECIPE = (
    f"seed {SYNTHETIC_SEED}; passage i = source a + second source b (uniform, b != a); id syn-{{i:07d}}; title a's; "
    f"content a's + ' ' + b's cut to {MAX_CHARS} chars; vector normalize(w e_a + (1-w) e_b + N(0, {NOISE_STD}^2 I)), "
    f"w ~ U{MIX_WEIGHT}"
)


def load_real(corpus_path: str | Path, work: Path, n: int | None = None):
    """The real corpus (or a seeded slice of ``n``) in a passage store, and its complete embedding store.

    Returns:
        ``(corpus, store, info)``; ``info`` says how many chunks were encoded now and, when every chunk was,
        the encoding rate (passages/s).
    """
    from hcqr_dspy.retrieval import EmbeddingStore, PassageStore, load_corpus, load_encoder
    from hcqr_dspy.retrieval.store_format import Passage

    corpus = load_corpus(corpus_path, duplicate_ids="rename", store=work / "real-store")
    if n is not None and n < len(corpus):
        rows = sorted(random.Random(0).sample(range(len(corpus)), n))
        corpus = PassageStore.build(
            ((Passage(p.id, p.title, p.content), f"row {r}") for r in rows for p in [corpus[r]]),
            work / f"real-slice-{n}",
            source=f"{corpus.source} (seeded slice of {n})",
        )
    encoder = load_encoder(None)
    store = EmbeddingStore.open(corpus, encoder)
    t0 = time.perf_counter()
    filled = store.fill(corpus, encoder, show_progress=True)
    seconds = time.perf_counter() - t0
    info = {
        "passages": len(corpus),
        "kind": "real",
        "encoder": encoder.spec.name,
        "embeddings": str(store.folder),
        "encoded_chunks": filled["encoded_chunks"],
        "reused_chunks": filled["reused_chunks"],
    }
    if filled["encoded_chunks"] == store.n_chunks:
        info["encode_passages_per_second"] = round(len(corpus) / seconds, 1)
    return corpus, store, info


def synthesize(n: int, real_corpus, real_store, work: Path, show_progress: bool = True):
    """``n`` synthetic passages and vectors made from the real ones (see the module docstring), written once.

    Returns:
        ``(corpus, store, info)``: the synthetic passage store, its embedding store, and what it is.
    """
    from tqdm.auto import tqdm

    from hcqr_dspy.retrieval import EmbeddingStore, PassageStore, load_encoder
    from hcqr_dspy.retrieval.store_format import Passage

    folder = work / f"synthetic-{n}"
    record_path = folder / "synthetic.json"
    record = {
        "passages": n,
        "recipe": RECIPE,
        "source_fingerprint": real_corpus.fingerprint,
        "source_passages": len(real_corpus),
    }
    rng = np.random.default_rng(SYNTHETIC_SEED)
    a = rng.integers(0, len(real_corpus), n)
    b = (a + rng.integers(1, len(real_corpus), n)) % len(real_corpus)  # uniform over the others
    w = rng.uniform(*MIX_WEIGHT, n).astype(np.float32)
    encoder = load_encoder(None)  # names the embedding store's passage side (the vectors come from its embeddings)
    if record_path.is_file() and json.loads(record_path.read_text()) == record:
        corpus = PassageStore.open(folder / "store")
        store = EmbeddingStore.open(corpus, encoder, root=folder / "embeddings", chunk_size=SYNTHETIC_CHUNK)
        if store.complete:
            return corpus, store, {**record, "kind": "synthetic", "prepared": "reused"}
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def rows():
        for i in tqdm(range(n), desc="synthetic passages", unit="passage", disable=not show_progress, mininterval=5):
            pa, pb = real_corpus[int(a[i])], real_corpus[int(b[i])]
            yield Passage(f"syn-{i:07d}", pa.title, f"{pa.content} {pb.content}"[:MAX_CHARS]), f"synthetic {i}"

    corpus = PassageStore.build(rows(), folder / "store", source=f"synthetic ({n} passages from {real_corpus.source})")
    store = EmbeddingStore.open(corpus, encoder, root=folder / "embeddings", chunk_size=SYNTHETIC_CHUNK)
    real = np.concatenate([np.asarray(chunk) for _, chunk in real_store.iter_chunks()])  # 41k x 384 float32: 63 MB
    noise_rng = np.random.default_rng(SYNTHETIC_SEED + 1)
    for i in tqdm(range(store.n_chunks), desc="synthetic vectors", unit="chunk", disable=not show_progress):
        start, stop = store.chunk_rows(i)
        v = w[start:stop, None] * real[a[start:stop]] + (1 - w[start:stop, None]) * real[b[start:stop]]
        v += noise_rng.normal(0.0, NOISE_STD, v.shape).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        store._write_chunk(i, np.ascontiguousarray(v, dtype=np.float32))
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return corpus, store, {**record, "kind": "synthetic", "prepared": f"made in {time.perf_counter() - t0:.0f} s"}


def real_queries():
    """The retrieval bench's 8 HCQR-shaped triples and the recall queries (those 24 + 100 MedQA-US questions)."""
    from retrieval import TRIPLES, benchmark_queries

    return [list(t) for t in TRIPLES], benchmark_queries()
