"""The retriever contract shared by every search backend.

``search(queries, k) -> list[list[Hit]]`` is batched: one hit list per query,
best first, at most ``k`` hits each (fewer only when the corpus is smaller or
the query matches nothing). ``get(passage_id) -> Passage`` resolves hits.
The contract follows BEIR's single search interface (Thakur et al. 2021)
with hit lists instead of ``{query_id: {doc_id: score}}`` dicts, because
rank order matters to fusion.

Indexes are folders: the corpus's passage store (``passages.arrow`` and its
id lookup, memory-mapped at load: see :mod:`hcqr_dspy.retrieval.passage_store`), the
backend's files, and ``manifest.json`` holding the retriever kind, the
corpus fingerprint, the encoder, dimension and vector-index backend of dense
indexes, the passage count, library versions and the size and SHA-256 of
every file. Loading checks every file's presence and size; it re-hashes them
too unless they total more than ``FULL_VERIFY_MAX_BYTES`` (hashing a
MedCorp-size index would read ~150 GB at every load), which
``verify_files=True`` forces. Indexes are written to a temporary sibling
folder and renamed into place, so a crash never leaves a valid-looking half
index.

Index format 2 (this one) stores the passages in the index folder; format 1
folders (which re-read the corpus from its source path) are refused with a
one-line "rebuild it with `hcqr index`" error.

Retriever classes register under their kind
(:func:`hcqr_dspy.retrieval.retriever_registry.register`); :func:`load_index` finds
the class from the manifest's ``retriever`` field.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from hcqr_dspy.errors import QueryError, RetrievalIndexError
from hcqr_dspy.files import file_sha256
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.retriever_registry import get_retriever_class
from hcqr_dspy.retrieval.store_format import PASSAGES_FILE, Passage

MANIFEST = "manifest.json"
INDEX_FORMAT = "hcqr-index"
INDEX_FORMAT_VERSION = 2


log = logging.getLogger(__name__)

# Above this many bytes of index files, a default load checks sizes, not SHA-256: hashing ran at 1.0 GB/s here
# (a 1M-passage Flat index's 2.62 GB of files in 2.6 s, about half of its 5.1 s load in bench/RESULTS.md), so
# 1 GiB costs ~1 s and MedCorp's ~150 GB would cost minutes at every load.
FULL_VERIFY_MAX_BYTES = 1 << 30


class Hit(NamedTuple):
    """One search result: a passage id and the backend's score (higher is better)."""

    passage_id: str
    score: float


def check_queries(queries: Sequence[str]) -> list[str]:
    """Validate a batch of queries.

    Raises:
        QueryError: if ``queries`` is a bare string, empty, or holds a
            non-string query or one without a visible character (only
            spaces, zero-width or control characters); its position is named.
    """
    if isinstance(queries, str):
        raise QueryError("queries must be a list of strings, not one string")
    queries = list(queries)
    if not queries:
        raise QueryError("no queries given")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise QueryError(f"query {i + 1} is not a string ({type(q).__name__})")
        if not any(c.isprintable() and not c.isspace() for c in q):  # blank, or only zero-width / control characters
            raise QueryError(f"query {i + 1} is empty")
    return queries


def check_k(k: int) -> int:
    """Validate ``k`` (hits per query).

    Raises:
        QueryError: if ``k`` is not a positive integer.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise QueryError(f"k must be a positive integer, got {k!r}")
    return k


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (``"missing"`` if absent)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


class Retriever(ABC):
    """A search backend over one corpus (a :class:`~hcqr_dspy.retrieval.passage_store.PassageStore`).

    Subclasses register with ``@register(kind)`` and implement
    :meth:`_search` (queries already validated, ``k`` clipped to the corpus
    size), :meth:`_write` and :meth:`_read`.

    Attributes:
        kind: The registered kind (set by the ``register`` decorator).
        required_fields: Manifest fields (dotted) this kind needs to load.
        uses_encoder: Whether the kind embeds queries (``encoder=`` applies).
        search_options: Search-time options in effect (``nprobe``,
            ``efSearch``, ``k_factor``); empty when none were given.
    """

    def __deepcopy__(self, memo):
        # A retriever is a shared, read-only resource: DSPy optimizers deep-copy programs
        # (candidates, teachers), and every copy must search the same index, not a copy of it.
        return self

    kind: ClassVar[str]
    required_fields: ClassVar[tuple[str, ...]] = ()
    uses_encoder: ClassVar[bool] = False

    def __init__(self, corpus: PassageStore):
        self.corpus = corpus
        self.search_options: dict[str, int] = {}

    # -- searching -----------------------------------------------------
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Search a batch of queries.

        Args:
            queries: Query strings, ``n >= 1`` of them, none empty.
            k: Hits per query, ``k >= 1``; clipped to the corpus size.

        Returns:
            ``n`` lists of at most ``k`` :class:`Hit`, best first.

        Raises:
            QueryError: empty query list or query, or ``k <= 0``.
        """
        queries = check_queries(queries)
        k = min(check_k(k), len(self.corpus))
        return self._search(queries, k)

    def get(self, passage_id: str) -> Passage:
        """The passage behind a hit.

        Raises:
            KeyError: unknown passage id.
        """
        return self.corpus.get(passage_id)

    @abstractmethod
    def _search(self, queries: list[str], k: int) -> list[list[Hit]]: ...

    # -- persistence ---------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Backend settings recorded in the manifest (encoder, dimension ...)."""
        return {}

    @abstractmethod
    def _write(self, folder: Path) -> None:
        """Write the backend's files into ``folder`` (exists, empty)."""

    @classmethod
    @abstractmethod
    def _read(cls, folder: Path, manifest: dict[str, Any], corpus: PassageStore, **options: Any) -> Retriever:
        """Rebuild the retriever from ``folder`` (manifest already verified).

        ``options``: ``encoder`` (a spec the caller expects, or ``None``) and
        ``search_options`` (validated ``nprobe`` / ``efSearch`` / ``k_factor``; refused by
        kinds they do not apply to).
        """

    def save(self, path: str | Path) -> Path:
        """Save the index to a folder, atomically.

        The passage store and the backend's files are written to a
        temporary sibling folder, checksummed into ``manifest.json``, then
        renamed to ``path`` (replacing an existing index there only once the
        new one is complete). A store on disk is hard-linked when it is on
        the same file system, not copied.

        Returns:
            The index folder.

        Raises:
            RetrievalIndexError: if ``path`` exists and is not an index folder.
        """
        path = check_index_target(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        tmp.chmod(0o755)  # mkdtemp makes it 0700; an index is shareable like any output folder
        try:
            self.corpus.save(tmp)
            self._write(tmp)
            manifest = self._manifest(tmp)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            if path.exists():
                old = path.with_name(f".{path.name}.old-{os.getpid()}")
                path.rename(old)
                tmp.rename(path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def _manifest(self, folder: Path) -> dict[str, Any]:
        paths = [p for p in sorted(folder.rglob("*")) if p.is_file()]
        files = {str(p.relative_to(folder)): file_sha256(p) for p in paths}
        sizes = {str(p.relative_to(folder)): p.stat().st_size for p in paths}
        return {
            "format": INDEX_FORMAT,
            "format_version": INDEX_FORMAT_VERSION,
            "retriever": self.kind,
            "corpus": {
                "source": _portable_source(self.corpus.source),
                "fingerprint": self.corpus.fingerprint,
                "count": len(self.corpus),
                "duplicate_ids": self.corpus.duplicate_ids,
                "renamed_ids": self.corpus.renamed,
                "store": PASSAGES_FILE,
            },
            **self.describe(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": library_versions(
                "hcqr-dspy", "faiss-cpu", "bm25s", "sentence-transformers", "numpy", "pyarrow"
            ),
            "files": files,
            "file_bytes": sizes,
        }


def check_index_target(path: str | Path) -> Path:
    """Check (before any work) that an index can be written at ``path``; create its parent.

    Raises:
        RetrievalIndexError: ``path`` exists and is not an index folder (it
            is never overwritten), holds anything its build did not write
            (:func:`foreign_entry`; a rebuild replaces the whole folder), or
            its parent cannot be created.
    """
    path = Path(path)
    if path.exists() and not (path / MANIFEST).is_file():
        if not path.is_dir() or any(path.iterdir()):
            raise RetrievalIndexError(f"{path} exists and is not an hcqr index folder; refusing to overwrite it")
    if path.is_dir() and (foreign := foreign_entry(path)) is not None:
        kind = "folder" if foreign.is_dir() else "file"
        raise RetrievalIndexError(
            f"index {path} holds the {kind} {foreign}, which `hcqr index` did not write, and a rebuild replaces the "
            f"whole folder; move it out of {path} or give --out another folder"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RetrievalIndexError(f"cannot create the folder for index {path}: {exc.strerror or exc}") from None
    return path


def foreign_entry(folder: Path) -> Path | None:
    """The first path (sorted, top-most) in index folder ``folder`` that its build did not write: neither
    ``manifest.json``, a file its ``files`` list, nor a folder holding one (a run folder, notes, an ``mlruns/``
    store put there); ``None`` when there is none. An unreadable manifest lists no file."""
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    written = {MANIFEST, *(listed if isinstance(listed, dict) else ())}
    parents = {str(parent) for name in written for parent in Path(name).parents}
    pending = [folder]
    while pending:
        for entry in sorted(pending.pop(0).iterdir()):
            name = str(entry.relative_to(folder))
            if entry.is_dir() and not entry.is_symlink() and name in parents:
                pending.append(entry)
            elif name not in written or not entry.is_file():
                return entry
    return None


REQUIRED_FIELDS = ("retriever", "corpus.source", "corpus.fingerprint", "corpus.count")


def _check_fields(manifest: dict[str, Any], mpath: Path) -> None:
    for dotted in REQUIRED_FIELDS + get_retriever_class(manifest.get("retriever")).required_fields:
        node: Any = manifest
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise RetrievalIndexError(f"{mpath} lacks the field {dotted!r}; rebuild the index with `hcqr index`")


def _portable_source(source: str) -> str:
    p = Path(source)
    return str(p.resolve()) if p.exists() else source


def read_manifest(path: str | Path, verify_files: bool | None = None) -> dict[str, Any]:
    """Read and check an index folder's manifest.

    Args:
        path: The index folder.
        verify_files: ``True``: every file present, of its recorded size,
            and matching its SHA-256. ``None`` (default): the same, except
            that above ``FULL_VERIFY_MAX_BYTES`` of files the hashes are
            skipped (said in one warning). ``False``: the manifest alone.

    Raises:
        RetrievalIndexError: no folder, no or unreadable manifest, another
            format or a newer version, a missing file, a size or checksum
            mismatch (a corrupted or truncated index).
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not path.exists():
        raise RetrievalIndexError(f"index folder {path} does not exist; build one with `hcqr index`")
    if not mpath.is_file():
        raise RetrievalIndexError(f"{path} is not an hcqr index folder (no {MANIFEST}); build one with `hcqr index`")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RetrievalIndexError(f"{mpath} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != INDEX_FORMAT:
        raise RetrievalIndexError(f"{mpath} is not an hcqr index manifest")
    version = manifest.get("format_version", 0)
    if not isinstance(version, int) or version > INDEX_FORMAT_VERSION:
        raise RetrievalIndexError(
            f"{path} was written by a newer hcqr-dspy (index format {version}, "
            f"this one reads up to {INDEX_FORMAT_VERSION}); upgrade hcqr-dspy"
        )
    if version < INDEX_FORMAT_VERSION:
        raise RetrievalIndexError(
            f"{path} was written by an older hcqr-dspy (index format {version}, which re-read its corpus from the "
            f"source; format {INDEX_FORMAT_VERSION} stores the passages in the index): rebuild it with `hcqr index`"
        )
    _check_fields(manifest, mpath)
    if verify_files is False:
        return manifest
    files, sizes = manifest.get("files", {}), manifest.get("file_bytes", {})
    total = 0
    for name in files:
        f = path / name
        if not f.is_file():
            raise RetrievalIndexError(f"index {path} is incomplete: {name} is missing")
        size = f.stat().st_size
        if name in sizes and size != sizes[name]:
            raise RetrievalIndexError(
                f"index {path} is corrupted: {name} has {size:,} bytes, its manifest records "
                f"{sizes[name]:,}; rebuild the index"
            )
        total += size
    if verify_files is None and total > FULL_VERIFY_MAX_BYTES:
        log.warning(
            "index %s: %.1f GB of files checked by size, not SHA-256 (load_index(..., verify_files=True) hashes them)",
            path,
            total / 1e9,
        )
        return manifest
    for name, digest in files.items():
        if file_sha256(path / name) != digest:
            raise RetrievalIndexError(
                f"index {path} is corrupted: {name} does not match its checksum in {MANIFEST}; rebuild the index"
            )
    return manifest


def check_corpus(manifest: dict[str, Any], corpus: PassageStore, where: Path) -> None:
    """Refuse a corpus other than the one the index was built for.

    Raises:
        RetrievalIndexError: naming both corpora and their fingerprints.
    """
    built = manifest["corpus"]
    if corpus.fingerprint != built["fingerprint"]:
        raise RetrievalIndexError(
            f"index {where} was built for corpus {built['source']!r} ({built['count']} passages, "
            f"fingerprint {built['fingerprint'][:12]}) but was given corpus {corpus.source!r} "
            f"({len(corpus)} passages, fingerprint {corpus.fingerprint[:12]}); rebuild the index "
            "or pass the corpus it was built for"
        )
