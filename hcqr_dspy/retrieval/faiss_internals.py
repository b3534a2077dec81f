"""What the faiss backend (:class:`~hcqr_dspy.retrieval.vector_index.FaissIndex`) reads from and sets on faiss
index objects: the training points an index needs, polysemous training turned off, the useful clause of a
faiss C++ error, and the bytes of each stored vector's code.
"""

from __future__ import annotations

from typing import Any


def min_training_points(index: Any) -> int:
    import faiss

    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        return 1


def skip_polysemous_training(index: Any) -> None:
    """Turn off faiss's polysemous training of PQ codes (``IndexPQ``, ``IndexIVFPQ``), as the factory suffix
    ``np`` does.

    faiss trains PQ codebooks and then, by default, reorders their centroids so that
    Hamming distances between codes track real distances (polysemous codes, Douze,
    Jegou & Perronnin, ECCV 2016; ``do_polysemous_training``). That simulated annealing
    only serves polysemous search (``polysemous_ht``), which hcqr never uses: it searches
    by asymmetric distance, whose results the reordering does not change. With many
    sub-quantizers it is most of the build (``IVF256,PQ96`` over 41k 384-d vectors:
    minutes of annealing after seconds of k-means).
    """
    import faiss

    parts = [faiss.downcast_index(index)]
    if isinstance(parts[0], faiss.IndexPreTransform):
        parts.append(faiss.downcast_index(parts[0].index))
    try:
        parts.append(faiss.downcast_index(faiss.extract_index_ivf(index)))
    except RuntimeError:  # not an IVF index
        pass
    for part in parts:
        if hasattr(part, "do_polysemous_training"):
            part.do_polysemous_training = False


def faiss_reason(exc: BaseException) -> str:
    """The useful clause of a faiss C++ error (after ``failed:`` or the last ``: ``), at most 200 characters."""
    text = " ".join(str(exc).split())
    if "failed: " in text:
        text = text.split("failed: ", 1)[1]
    elif ": " in text:
        text = text.rsplit(": ", 1)[1]
    return text[:200]


def code_bytes(index: Any) -> float | None:
    """Bytes of each stored vector's code (faiss ``code_size``; for IVF types the inverted lists' codes),
    not counting the 8-byte ids of IVF lists nor HNSW graph links."""
    import faiss

    try:
        return float(faiss.extract_index_ivf(index).code_size)
    except RuntimeError:
        pass
    for candidate in (index, getattr(faiss.downcast_index(index), "storage", None)):  # HNSW: its storage's codes
        try:
            return float(candidate.sa_code_size())
        except (RuntimeError, AttributeError):
            continue
    return None
