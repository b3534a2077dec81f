"""Vector-index backends of dense retrieval, and the faiss backend.

A :class:`VectorIndex` maps query vectors to the rows (passage positions in
the corpus's :class:`~hcqr_dspy.retrieval.passage_store.PassageStore`) of their
nearest passage vectors by inner product. It is built from an
:class:`~hcqr_dspy.retrieval.embeddings.EmbeddingStore`, written into and
read from an index folder, and described in the manifest under
``"vector_index"``; the dense retriever owns the encoder, the passage store
and the hit list. Backends register with
:func:`hcqr_dspy.retrieval.retriever_registry.register_backend`.

faiss backend (Johnson, Douze & Jégou 2019, "Billion-scale similarity
search with GPUs"): ``faiss.index_factory`` strings of the forms
:mod:`hcqr_dspy.retrieval.faiss_factory` checks (faiss aborts the process on
some bad numbers), inner-product metric — ``Flat`` (exact; the default),
``HNSW32`` (graph), ``IVF1024,PQ32`` (inverted lists over product-quantized
codes), ``IVF4096,SQ8`` ... Types
that need training are trained on a seeded sample of the stored embeddings;
vectors are then added chunk by chunk, so a build holds the index's own
bytes plus one chunk. Search-time options: ``nprobe`` (IVF lists visited),
``efSearch`` (HNSW candidate list) and ``k_factor`` (refine indexes: the
base index returns ``k x k_factor`` candidates, re-scored exactly), set
through ``faiss.ParameterSpace``.

Compressed codes with exact re-ranking (faiss's ``RFlat`` suffix, e.g.
``IVF1024,PQ96,RFlat``: ``IndexRefineFlat`` over an ``IndexIVFPQ``): the
index file holds the PQ codes and the full float32 vectors; it is read
memory-mapped (``faiss.IO_FLAG_MMAP_IFC``), so reading copies nothing and
the vectors are paged in from disk as searches touch them (the probed lists'
codes, ``k x k_factor`` vectors per query). Recall is near-exact, and the
mapped pages are reclaimable page cache: left alone the whole file ends up
resident, but under a memory limit of 1/8 of a Flat index's bytes the same
searches keep their recall, reading pages from disk (bench/RESULTS.md,
"Memory-capped search": 1M passages, 183 MB cap, recall@15 0.9656).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval.faiss_factory import check_factory
from hcqr_dspy.retrieval.faiss_internals import code_bytes, faiss_reason, min_training_points, skip_polysemous_training
from hcqr_dspy.retrieval.retriever_registry import register_backend

if TYPE_CHECKING:  # pragma: no cover
    from hcqr_dspy.retrieval.embeddings import EmbeddingStore

SEARCH_OPTIONS = ("nprobe", "efSearch", "k_factor")
# Our option names -> faiss.ParameterSpace's (IndexRefine's k_factor is "k_factor_rf" there).
_FAISS_PARAMETER = {"nprobe": "nprobe", "efSearch": "efSearch", "k_factor": "k_factor_rf"}


def _is_refine(type_name: str | None) -> bool:
    """Whether a faiss index class name (``describe()["type"]``) is a refine index, read memory-mapped."""
    return type_name in ("IndexRefine", "IndexRefineFlat")


def check_search_options(options: Mapping[str, Any] | None) -> dict[str, int]:
    """Validate search-time options: names among ``nprobe``, ``efSearch``, ``k_factor``; values positive integers.

    Raises:
        RetrievalIndexError: an unknown name or a bad value.
    """
    out = {}
    for name, value in (options or {}).items():
        if value is None:
            continue
        if name not in SEARCH_OPTIONS:
            raise RetrievalIndexError(f"unknown search option {name!r}; known: {', '.join(SEARCH_OPTIONS)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RetrievalIndexError(f"search option {name} must be a positive integer, got {value!r}")
        out[name] = value
    return out


class VectorIndex(ABC):
    """Inner-product nearest-neighbour search over a corpus's passage vectors.

    Subclasses register with ``@register_backend(name)`` and implement the
    abstract methods. Rows are passage positions in the corpus's store.
    """

    backend: ClassVar[str]

    @classmethod
    def check_settings(cls, dimension: int, **settings: Any) -> None:
        """Refuse bad build settings before any encoding (default: accept).

        Raises:
            RetrievalIndexError: a setting this backend cannot build with.
        """
        return None  # the default accepts every setting; a backend overrides it to refuse some

    @classmethod
    @abstractmethod
    def build(
        cls, embeddings: EmbeddingStore, show_progress: bool = True, corpus: Any = None, **settings: Any
    ) -> VectorIndex:
        """Build from finished embeddings (``embeddings.complete``); ``settings`` are the backend's build options.

        ``corpus`` is the passage store the rows belong to, for backends that
        record what they were built from outside the index folder (Milvus).

        Raises:
            RetrievalIndexError: bad settings (one line).
        """

    @abstractmethod
    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Search float32 query vectors ``(n, d)``.

        Returns:
            ``(scores, rows)``, both ``(n, k)``, best first; ``rows == -1``
            where fewer than ``k`` vectors were found.
        """

    @abstractmethod
    def set_search_options(self, options: Mapping[str, int]) -> None:
        """Apply search-time options (validated by :func:`check_search_options`).

        Raises:
            RetrievalIndexError: an option that does not apply to this index.
        """

    @property
    @abstractmethod
    def ntotal(self) -> int: ...

    @property
    @abstractmethod
    def dimension(self) -> int: ...

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The manifest record (``manifest["vector_index"]``); includes ``"backend"``."""

    @abstractmethod
    def write(self, folder: Path) -> None:
        """Write the index's files into ``folder`` (an index being written)."""

    @classmethod
    @abstractmethod
    def read(cls, folder: Path, record: dict[str, Any]) -> VectorIndex:
        """Read an index written by :meth:`write`; ``record`` is its :meth:`describe` from the manifest."""


FAISS_FILE = "faiss.index"
DEFAULT_FACTORY = "Flat"
TRAIN_PER_LIST = 64  # training vectors per IVF list (faiss warns under 39 per centroid)
MIN_TRAIN = 16_384
MAX_TRAIN = 500_000


@register_backend("faiss")
class FaissIndex(VectorIndex):
    """A faiss index (an ``index_factory`` string of the supported forms, inner-product metric).

    Args:
        index: The ``faiss.Index``.
        factory: The ``index_factory`` string it was made from.
        trained_on: Vectors it was trained on (0 when no training is needed).
        seed: Seed of the training sample.
    """

    def __init__(self, index: Any, factory: str, trained_on: int = 0, seed: int = 0):
        self.index = index
        self.factory = factory
        self.trained_on = trained_on
        self.seed = seed
        self.search_options: dict[str, int] = {}

    @staticmethod
    def make(factory: str, dimension: int) -> Any:
        """An empty ``faiss.Index`` from ``factory``, inner-product metric.

        Raises:
            RetrievalIndexError: not a valid factory string for this dimension (one line).
        """
        import faiss

        if not isinstance(factory, str) or not factory.strip():
            raise RetrievalIndexError(
                f"--faiss needs a faiss index_factory string (Flat, HNSW32, IVF1024,PQ32 ...), got {factory!r}"
            )
        try:
            return faiss.index_factory(int(dimension), factory.strip(), faiss.METRIC_INNER_PRODUCT)
        except (RuntimeError, MemoryError) as exc:  # MemoryError: std::bad_alloc
            raise RetrievalIndexError(
                f"--faiss {factory!r} is not a faiss index_factory string usable with {dimension}-d vectors "
                f"({faiss_reason(exc)}); "
                "examples: Flat, HNSW32, IVF1024,PQ32, IVF4096,SQ8"
            ) from None

    @staticmethod
    def default_train_size(index: Any, count: int) -> int:
        """Training vectors: ``64 x nlist`` for IVF types, at least 16,384, at most 500,000, at most ``count``."""
        import faiss

        nlist = 0
        try:
            nlist = faiss.extract_index_ivf(index).nlist
        except RuntimeError:
            pass
        return min(count, max(MIN_TRAIN, min(MAX_TRAIN, TRAIN_PER_LIST * nlist)))

    @classmethod
    def check_settings(
        cls,
        dimension: int,
        factory: str = DEFAULT_FACTORY,
        train_size: int | None = None,
        seed: int = 0,
        **unknown: Any,
    ) -> None:
        """Refuse bad build settings before anything is read or encoded: unknown options, a bad ``train_size``,
        and a factory string that is not one of the forms hcqr builds with its numbers in range
        (:func:`~hcqr_dspy.retrieval.faiss_factory.check_factory`: faiss itself aborts the process on some,
        e.g. ``HNSW0``) or that faiss does not accept for ``dimension``-d vectors.

        Raises:
            RetrievalIndexError: one line.
        """
        if unknown:
            raise RetrievalIndexError(
                f"unknown faiss build option(s) {', '.join(sorted(unknown))}; known: factory, train_size, seed"
            )
        if train_size is not None and (
            isinstance(train_size, bool) or not isinstance(train_size, int) or train_size < 1
        ):
            raise RetrievalIndexError(f"train_size must be a positive integer, got {train_size!r}")
        cls.make(check_factory(DEFAULT_FACTORY if factory is None else factory, dimension), dimension)

    @classmethod
    def build(
        cls,
        embeddings: EmbeddingStore,
        show_progress: bool = True,
        corpus: Any = None,
        factory: str = DEFAULT_FACTORY,
        train_size: int | None = None,
        seed: int = 0,
        **unknown: Any,
    ) -> FaissIndex:
        """Build from ``embeddings``: make, train on a seeded sample if needed, add chunk by chunk.

        Args:
            embeddings: Complete passage embeddings.
            factory: ``faiss.index_factory`` string (``Flat``, ``HNSW32``, ``IVF1024,PQ32`` ...).
            train_size: Training sample size (default :meth:`default_train_size`).
            seed: Seed of the training sample.

        Raises:
            RetrievalIndexError: unknown setting, bad factory string, or too
                few passages to train (e.g. fewer than ``nlist``).
        """
        from tqdm.auto import tqdm

        cls.check_settings(embeddings.dimension, factory, train_size, seed, **unknown)
        factory = (factory or DEFAULT_FACTORY).strip()
        index = cls.make(factory, embeddings.dimension)
        skip_polysemous_training(index)
        trained_on = 0
        if not index.is_trained:
            n = (
                cls.default_train_size(index, embeddings.count)
                if train_size is None
                else min(int(train_size), embeddings.count)
            )
            needed = min_training_points(index)
            if n < needed:
                raise RetrievalIndexError(
                    f"faiss {factory!r} needs at least {needed} training vectors but the corpus has {embeddings.count} "
                    f"passages{'' if train_size is None else f' (train_size {train_size})'}; "
                    "pick a smaller nlist/codebook or Flat/HNSW for a corpus this small"
                )
            try:
                index.train(embeddings.sample(n, seed))
            except RuntimeError as exc:
                raise RetrievalIndexError(
                    f"faiss {factory!r} could not be trained on {n} vectors: {faiss_reason(exc)}"
                ) from None
            trained_on = n
        with tqdm(
            total=embeddings.count,
            unit="vector",
            desc=f"adding to faiss {factory}",
            disable=not show_progress,
            dynamic_ncols=True,
        ) as bar:
            for _, chunk in embeddings.iter_chunks():
                index.add(np.ascontiguousarray(chunk, dtype=np.float32))
                bar.update(len(chunk))
        return cls(index, factory, trained_on, seed)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return scores, rows

    def set_search_options(self, options: Mapping[str, int]) -> None:
        import faiss

        options = check_search_options(options)
        for name, value in options.items():
            try:
                faiss.ParameterSpace().set_index_parameter(self.index, _FAISS_PARAMETER[name], value)
            except RuntimeError:
                raise RetrievalIndexError(
                    f"search option {name} does not apply to faiss index {self.factory!r} "
                    "(nprobe applies to IVF indexes, efSearch to HNSW indexes, k_factor to refine indexes such as "
                    "IVF1024,PQ96,RFlat)"
                ) from None
        self.search_options.update(options)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dimension(self) -> int:
        return int(self.index.d)

    def describe(self) -> dict[str, Any]:
        import faiss

        return {
            "backend": "faiss",
            "factory": self.factory,
            "type": type(self.index).__name__,
            "metric": "inner_product",
            "ntotal": self.ntotal,
            "trained_on": self.trained_on,
            "seed": self.seed,
            "code_bytes_per_vector": code_bytes(self.index),
            "memory_mapped": _is_refine(type(faiss.downcast_index(self.index)).__name__),
        }

    def write(self, folder: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(folder / FAISS_FILE))

    @classmethod
    def read(cls, folder: Path, record: dict[str, Any]) -> FaissIndex:
        import faiss

        # faiss.read_index parses faiss's own binary format; it does not unpickle. A refine index is mapped, not
        # read: its full vectors stay on disk and only what a search touches is paged in (module docstring).
        flags = faiss.IO_FLAG_MMAP_IFC if _is_refine(record.get("type")) else 0
        try:
            index = faiss.read_index(str(folder / FAISS_FILE), flags)
        except RuntimeError as exc:
            raise RetrievalIndexError(
                f"{folder / FAISS_FILE} is not a readable faiss index: {faiss_reason(exc)}"
            ) from None
        return cls(index, record.get("factory", DEFAULT_FACTORY), record.get("trained_on", 0), record.get("seed", 0))
