"""Registries of retriever kinds and dense vector-index backends.

An index folder's manifest names its retriever *kind* (``"dense"``,
``"bm25"``, ``"hybrid"``) and, for dense indexes, its vector-index
*backend* (``"faiss"`` today; another backend such as Milvus registers
under its own name). :func:`hcqr_dspy.retrieval.load_index` dispatches on
those names, so where an index lives and how it searches is a choice
recorded in the index folder, never one of the caller.

A module registers its class when it is imported::

    @register("bm25")
    class BM25Retriever(Retriever): ...

    @register_backend("faiss")
    class FaissIndex(VectorIndex): ...

This module imports no retriever or backend module, and no retriever or
backend module imports a module that imports it back (the package
``hcqr_dspy.retrieval`` imports every built-in one, so they are registered
as soon as anything from the package is used). A third-party backend
registers by being imported before :func:`load_index` is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hcqr_dspy.errors import RetrievalIndexError

T = TypeVar("T", bound=type)

_RETRIEVERS: dict[str, type] = {}
_BACKENDS: dict[str, type] = {}


def _registrar(table: dict[str, type], what: str, name: str) -> Callable[[T], T]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} name must be a non-empty string, got {name!r}")

    def decorate(cls: T) -> T:
        known = table.get(name)
        if known is not None and known is not cls and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"{what} {name!r} is already registered by {known.__module__}.{known.__qualname__}")
        table[name] = cls
        return cls

    return decorate


def register(kind: str) -> Callable[[T], T]:
    """Class decorator: register a :class:`~hcqr_dspy.retrieval.retriever_base.Retriever` subclass under ``kind``.

    The class's ``kind`` attribute is set to ``kind``; the manifest of every
    index it saves records it, and :func:`get_retriever_class` returns it.

    Raises:
        ValueError: ``kind`` is empty or already taken by another class.
    """
    base = _registrar(_RETRIEVERS, "retriever kind", kind)

    def decorate(cls: T) -> T:
        cls.kind = kind  # type: ignore[attr-defined]
        return base(cls)

    return decorate


def get_retriever_class(kind: Any) -> type:
    """The retriever class registered under ``kind``.

    Raises:
        RetrievalIndexError: no class is registered under ``kind`` (the
            registered kinds are listed).
    """
    try:
        return _RETRIEVERS[kind]
    except (KeyError, TypeError):
        raise RetrievalIndexError(
            f"unknown retriever kind {kind!r}; known kinds: {', '.join(sorted(_RETRIEVERS)) or '(none registered)'}"
        ) from None


def retriever_kinds() -> list[str]:
    """Registered retriever kinds, in registration order."""
    return list(_RETRIEVERS)


def register_backend(name: str) -> Callable[[T], T]:
    """Class decorator: register a :class:`~hcqr_dspy.retrieval.vector_index.VectorIndex` subclass as backend ``name``.

    Raises:
        ValueError: ``name`` is empty or already taken by another class.
    """
    base = _registrar(_BACKENDS, "vector-index backend", name)

    def decorate(cls: T) -> T:
        cls.backend = name  # type: ignore[attr-defined]
        return base(cls)

    return decorate


def get_backend_class(name: Any) -> type:
    """The vector-index backend class registered as ``name``.

    Raises:
        RetrievalIndexError: no backend is registered as ``name``.
    """
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise RetrievalIndexError(
            f"unknown vector-index backend {name!r}; "
            f"known backends: {', '.join(sorted(_BACKENDS)) or '(none registered)'}"
        ) from None


def backend_names() -> list[str]:
    """Registered vector-index backends, in registration order."""
    return list(_BACKENDS)
