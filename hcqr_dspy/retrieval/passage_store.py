"""The passage store: a corpus's passages in one memory-mapped Arrow file.

A store is a folder (an index folder, or a staging folder while an index is
built) holding the files of :mod:`hcqr_dspy.retrieval.store_format`:

* ``passages.arrow`` (``id``, ``title``, ``content``, in corpus order) is
  opened with :func:`pyarrow.memory_map`, so the text stays on disk; single
  passages (``get``, hit ids) are read with positional reads (``os.pread``)
  at the byte offsets of Arrow's buffers in the file, so a lookup copies a
  few hundred bytes out of the page cache instead of mapping file pages into
  the process (measured on Linux/ext4: a mapped random read faulted in about
  300 KB of file pages each, all counted in the process's RSS);
* ``passage_ids.hash.npy`` / ``passage_ids.row.npy`` (sorted id hashes and
  their rows) are memory-mapped: ``get(passage_id)`` is a binary search plus
  one id comparison per hash match, with no Python object per passage;
* ``passages.json`` holds count, fingerprint, source and duplicate-id policy.

Opening a store creates a constant number of Python objects whatever the
corpus size (one per Arrow record batch of up to 65,536 rows, on the C++
side). Any backend can read passages from it (a Milvus backend keeps only
vectors and row numbers and resolves text here). A store can also live in
memory (same layout, Arrow buffers instead of files), for small corpora
built in code and tests. Building one streams the rows
(:mod:`hcqr_dspy.retrieval.store_writer`).
"""

from __future__ import annotations

import json
import os
import shutil
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hcqr_dspy.errors import CorpusError, RetrievalIndexError
from hcqr_dspy.retrieval.store_format import (
    BATCH_ROWS,
    DUPLICATE_POLICIES,
    ID_HASH_FILE,
    ID_ROW_FILE,
    PASSAGES_FILE,
    STORE_FILES,
    STORE_FORMAT,
    STORE_FORMAT_VERSION,
    STORE_META_FILE,
    Passage,
    id_hash,
)
from hcqr_dspy.retrieval.store_writer import write_store


class _StringColumn:
    """Random access to one string column: ``column[row]`` and ``take(rows)`` without concatenating chunks.

    For a store on disk, values are read with ``os.pread`` from the file
    positions of each chunk's offsets and data buffers (found once, from the
    memory map's addresses); in memory, from the Arrow chunk itself.
    """

    def __init__(self, column: Any, fd: int | None = None, base: int | None = None):
        self._chunks = column.chunks
        self._starts = np.cumsum([0] + [len(ch) for ch in self._chunks]).astype(np.int64)
        self._fd = fd
        if fd is not None:
            self._offset = np.array([ch.offset for ch in self._chunks], dtype=np.int64)
            self._offsets_at = np.array([ch.buffers()[1].address - base for ch in self._chunks], dtype=np.int64)
            self._data_at = np.array(
                [(ch.buffers()[2].address - base) if ch.buffers()[2] is not None else -1 for ch in self._chunks],
                dtype=np.int64,
            )

    def __getitem__(self, row: int) -> str:
        k = int(np.searchsorted(self._starts, row, side="right")) - 1
        j = row - int(self._starts[k])
        if self._fd is None:
            return self._chunks[k][j].as_py()
        at = int(self._offsets_at[k]) + 4 * (int(self._offset[k]) + j)
        start, stop = np.frombuffer(os.pread(self._fd, 8, at), "<i4")
        if stop == start:
            return ""
        return os.pread(self._fd, int(stop - start), int(self._data_at[k]) + int(start)).decode("utf-8")

    def take(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        if self._fd is not None:
            return [self[int(r)] for r in rows]
        rows = np.asarray(rows, dtype=np.int64)
        which = np.searchsorted(self._starts, rows, side="right") - 1
        out: list[str] = [""] * len(rows)
        for k in np.unique(which):
            at = np.nonzero(which == k)[0]
            values = self._chunks[int(k)].take(rows[at] - self._starts[k]).to_pylist()
            for i, v in zip(at.tolist(), values):
                out[i] = v
        return out


class PassageStore:
    """Passages of one corpus, in order, read from an Arrow table (memory-mapped when on disk).

    Build one with :meth:`build` (from rows) or open a folder with
    :meth:`open`; :class:`hcqr_dspy.retrieval.corpus.Corpus` is the same type
    with a constructor from a list of passages.

    Attributes:
        folder: The store's folder, or ``None`` for an in-memory store.
        source: Where the passages came from (path or hub name).
        fingerprint: SHA-256 (hex) over every passage's id, title and
            content, in order; two stores with the same fingerprint index
            identically.
        duplicate_ids: How repeated ids in the source were handled
            (``"error"`` or ``"rename"``).
        renamed: How many passages had a repeated id renamed ``<id>#N``.
    """

    def __init__(
        self,
        table: Any,
        id_hashes: np.ndarray,
        id_rows: np.ndarray,
        meta: dict[str, Any],
        folder: Path | None = None,
        fd: int | None = None,
        base: int | None = None,
    ):
        self._table = table
        self._fd = fd
        if table.column("id").null_count or table.column("title").null_count or table.column("content").null_count:
            raise RetrievalIndexError(
                f"passage store {folder or '<memory>'} holds null strings; rebuild it with `hcqr index`"
            )
        self._ids = _StringColumn(table.column("id"), fd, base)
        self._titles = _StringColumn(table.column("title"), fd, base)
        self._contents = _StringColumn(table.column("content"), fd, base)
        self._hashes = id_hashes
        self._rows = id_rows
        self.meta = dict(meta)
        self.folder = folder
        self.source: str = meta["source"]
        self.fingerprint: str = meta["fingerprint"]
        self.duplicate_ids: str = meta.get("duplicate_ids", "error")
        self.renamed: int = int(meta.get("renamed", 0))
        self._n = int(meta["count"])
        if table.num_rows != self._n or len(id_hashes) != self._n or len(id_rows) != self._n:
            raise RetrievalIndexError(
                f"passage store {folder or '<memory>'} is inconsistent: {table.num_rows} rows, "
                f"{len(id_hashes)} id hashes, "
                f"{len(id_rows)} id rows, {self._n} in {STORE_META_FILE}; rebuild it with `hcqr index`"
            )

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | Path) -> PassageStore:
        """Open the store in ``folder``, memory-mapped (nothing but the metadata is read).

        Raises:
            RetrievalIndexError: a store file is missing or unreadable.
        """
        import pyarrow as pa

        folder = Path(folder)
        missing = [f for f in STORE_FILES if not (folder / f).is_file()]
        if missing:
            raise RetrievalIndexError(
                f"{folder} holds no passage store ({', '.join(missing)} missing); rebuild it with `hcqr index`"
            )
        try:
            meta = json.loads((folder / STORE_META_FILE).read_text(encoding="utf-8"))
            if meta.get("format") != STORE_FORMAT or meta.get("format_version", 0) > STORE_FORMAT_VERSION:
                raise ValueError(f"unknown store format {meta.get('format')!r} version {meta.get('format_version')!r}")
            mapped = pa.memory_map(str(folder / PASSAGES_FILE), "r")
            base = mapped.read_buffer(1).address  # where the file starts in memory: buffer address - base = file offset
            mapped.seek(0)
            table = pa.ipc.open_file(mapped).read_all()
            hashes = np.load(folder / ID_HASH_FILE, mmap_mode="r", allow_pickle=False)
            rows = np.load(folder / ID_ROW_FILE, mmap_mode="r", allow_pickle=False)
            fd = os.open(folder / PASSAGES_FILE, os.O_RDONLY) if hasattr(os, "pread") else None
        except (OSError, ValueError, json.JSONDecodeError, pa.ArrowException) as exc:
            raise RetrievalIndexError(
                f"passage store {folder} is unreadable ({exc}); rebuild it with `hcqr index`"
            ) from None
        store = cls._from_parts(table, hashes, rows, meta, folder, fd, base if fd is not None else None)
        if fd is not None:
            weakref.finalize(store, os.close, fd)
        return store

    @classmethod
    def _from_parts(cls, table, hashes, rows, meta, folder, fd=None, base=None) -> PassageStore:
        store = cls.__new__(cls)
        PassageStore.__init__(store, table, hashes, rows, meta, folder, fd, base)
        return store

    @classmethod
    def build(
        cls,
        rows: Iterable[tuple[Passage, str]],
        folder: str | Path | None = None,
        *,
        source: str = "<memory>",
        duplicate_ids: str = "error",
        relocate: Callable[[], Iterable[tuple[Passage, str]]] | None = None,
    ) -> PassageStore:
        """Write passages into a new store and open it.

        Args:
            rows: ``(passage, where)`` pairs in corpus order; ``where`` names
                the row's origin (``file:line``) for error messages.
            folder: Folder to write the store files into (created; existing
                store files there are replaced); ``None`` keeps the store in
                memory.
            source: Where the passages came from, recorded in the store.
            duplicate_ids: ``"error"`` refuses a repeated id; ``"rename"``
                keeps every row, renaming the 2nd, 3rd ... row of an id to
                ``<id>#2``, ``<id>#3`` in corpus order (never to an id the
                corpus already holds).
            relocate: Re-reads ``rows`` from the start; used only to name
                both rows of a refused repeated id (``rows`` is consumed
                once otherwise).

        Raises:
            CorpusError: no passages, or a repeated id under ``"error"``
                (naming both rows' origins).
            RetrievalIndexError: ``folder`` cannot be written (full disk,
                no permission).
        """
        if duplicate_ids not in DUPLICATE_POLICIES:
            raise CorpusError(f"duplicate_ids must be one of {', '.join(DUPLICATE_POLICIES)}, got {duplicate_ids!r}")
        folder = Path(folder) if folder is not None else None
        try:
            parts = write_store(rows, folder, source, duplicate_ids, relocate)
            return cls.open(folder) if folder is not None else cls._from_parts(*parts)
        except OSError as exc:  # (a corpus file that cannot be read is a CorpusError raised by the reader)
            raise RetrievalIndexError(f"cannot write the passage store in {folder}: {exc.strerror or exc}") from None

    def save(self, folder: str | Path) -> None:
        """Put this store's files into ``folder`` (an index being written).

        A store on disk is hard-linked when ``folder`` is on the same file
        system (no copy of the text), else copied; an in-memory store is
        written out.
        """
        import pyarrow as pa

        folder = Path(folder)
        if self.folder is not None:
            for name in STORE_FILES:
                src, dst = self.folder / name, folder / name
                if dst.exists():
                    dst.unlink()
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copyfile(src, dst)
            return
        with pa.OSFile(str(folder / PASSAGES_FILE), "wb") as sink, pa.ipc.new_file(sink, self._table.schema) as writer:
            writer.write_table(self._table, max_chunksize=BATCH_ROWS)
        np.save(folder / ID_HASH_FILE, np.asarray(self._hashes), allow_pickle=False)
        np.save(folder / ID_ROW_FILE, np.asarray(self._rows), allow_pickle=False)
        (folder / STORE_META_FILE).write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")

    # -- reading -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Passage]:
        for _, ids, titles, contents in self.iter_batches():
            yield from (Passage(i, t, c) for i, t, c in zip(ids, titles, contents))

    def __getitem__(self, position: int) -> Passage:
        """The passage at row ``position`` (negative counts from the end).

        Raises:
            IndexError: out of range.
        """
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
            raise TypeError(f"a corpus position is an integer, got {type(position).__name__}")
        position = int(position)
        if position < 0:
            position += self._n
        if not 0 <= position < self._n:
            raise IndexError(f"corpus position {position} out of range (0..{self._n - 1})")
        return Passage(self._ids[position], self._titles[position], self._contents[position])

    def __contains__(self, passage_id: object) -> bool:
        return isinstance(passage_id, str) and self._find(passage_id) is not None

    def position(self, passage_id: str) -> int:
        """Row number of a passage id (its position in corpus and index order).

        Raises:
            KeyError: no passage has this id.
        """
        row = self._find(passage_id) if isinstance(passage_id, str) else None
        if row is None:
            raise KeyError(f"no passage with id {passage_id!r} in corpus {self.source!r}")
        return row

    def get(self, passage_id: str) -> Passage:
        """The passage with this id.

        Raises:
            KeyError: no passage has this id.
        """
        return self[self.position(passage_id)]

    def ids(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        """Passage ids at the given rows, in that order (rows must be in range)."""
        return self._ids.take(rows) if len(rows) else []

    def iter_batches(
        self, batch_size: int = 4096, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, list[str], list[str], list[str]]]:
        """Rows ``start..stop`` in slices: ``(first row, ids, titles, contents)``, at most ``batch_size`` rows each.

        Only one slice's strings exist as Python objects at a time.
        """
        stop = self._n if stop is None else min(stop, self._n)
        for first in range(start, stop, batch_size):
            part = self._table.slice(first, min(batch_size, stop - first))
            yield (
                first,
                part.column("id").to_pylist(),
                part.column("title").to_pylist(),
                part.column("content").to_pylist(),
            )

    def texts(self, batch_size: int = 4096) -> Iterator[str]:
        """Every passage's :attr:`Passage.text`, in order, streamed."""
        for _, _, titles, contents in self.iter_batches(batch_size):
            yield from (f"{t}\n{c}" if t else c for t, c in zip(titles, contents))

    def _find(self, passage_id: str) -> int | None:
        h = np.uint64(id_hash(passage_id))
        i = int(np.searchsorted(self._hashes, h, side="left"))
        while i < self._n and self._hashes[i] == h:
            row = int(self._rows[i])
            if self._ids[row] == passage_id:
                return row
            i += 1
        return None
