"""The passage store: a corpus's passages in one memory-mapped Arrow file.

A store is a folder (an index folder, or a staging folder while an index is
built) holding

* ``passages.arrow`` — an uncompressed Arrow IPC file (columns ``id``,
  ``title``, ``content``, strings, in corpus order), opened with
  :func:`pyarrow.memory_map`, so the text stays on disk and the operating
  system pages in what is read;
* ``passage_ids.hash.npy`` / ``passage_ids.row.npy`` — a 64-bit BLAKE2b hash
  of every passage id, sorted, and the row each belongs to (numpy arrays,
  memory-mapped, ``allow_pickle=False``): ``get(passage_id)`` is a binary
  search plus one id comparison per hash match, with no Python object per
  passage;
* ``passages.json`` — count, fingerprint, source and duplicate-id policy.

Opening a store creates a constant number of Python objects whatever the
corpus size (one per Arrow record batch of up to 65,536 rows, on the C++
side). Any backend can read passages from it (a Milvus backend keeps only
vectors and row numbers and resolves text here). A store can also live in
memory (same layout, Arrow buffers instead of files), for small corpora
built in code and tests.

Writing streams: rows are appended in record batches, ids are hashed as
they come, and repeated ids are found afterwards by sorting the hashes
(16 bytes per passage), so a build never holds one Python object per
passage either.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from hcqr_dspy.errors import CorpusError, RetrievalIndexError

PASSAGES_FILE = "passages.arrow"
ID_HASH_FILE = "passage_ids.hash.npy"
ID_ROW_FILE = "passage_ids.row.npy"
STORE_META_FILE = "passages.json"
STORE_FILES = (PASSAGES_FILE, ID_HASH_FILE, ID_ROW_FILE, STORE_META_FILE)
STORE_FORMAT = "hcqr-passages"
STORE_FORMAT_VERSION = 1
BATCH_ROWS = 65_536
DUPLICATE_POLICIES = ("error", "rename")


@dataclass(frozen=True)
class Passage:
    """One retrievable passage.

    Attributes:
        id: Unique passage id within its corpus.
        title: Title of the source document (may be empty).
        content: Passage text.
    """

    id: str
    title: str
    content: str

    @property
    def text(self) -> str:
        """Title and content joined by a newline: the text a single-model encoder and BM25 index."""
        return f"{self.title}\n{self.content}" if self.title else self.content


def id_hash(passage_id: str) -> int:
    """64-bit BLAKE2b hash of a passage id (stable across processes and machines)."""
    return int.from_bytes(hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest(), "little")


def _schema():
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("title", pa.string()), ("content", pa.string())])


class _Fingerprint:
    """SHA-256 over every passage's id, title and content, in order (unit/record separators between)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, pid: str, title: str, content: str) -> None:
        h = self._h
        for part in (pid, title, content):
            h.update(part.encode("utf-8"))
            h.update(b"\x1f")
        h.update(b"\x1e")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


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

    def __init__(self, table: Any, id_hashes: np.ndarray, id_rows: np.ndarray, meta: dict[str, Any],
                 folder: Path | None = None):
        self._table = table
        self._ids = table.column("id")
        self._titles = table.column("title")
        self._contents = table.column("content")
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
                f"passage store {folder or '<memory>'} is inconsistent: {table.num_rows} rows, {len(id_hashes)} id hashes, "
                f"{len(id_rows)} id rows, {self._n} in {STORE_META_FILE}; rebuild it with `hcqr index`"
            )

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | Path) -> "PassageStore":
        """Open the store in ``folder``, memory-mapped (nothing but the metadata is read).

        Raises:
            RetrievalIndexError: a store file is missing or unreadable.
        """
        import pyarrow as pa

        folder = Path(folder)
        missing = [f for f in STORE_FILES if not (folder / f).is_file()]
        if missing:
            raise RetrievalIndexError(f"{folder} holds no passage store ({', '.join(missing)} missing); rebuild it with `hcqr index`")
        try:
            meta = json.loads((folder / STORE_META_FILE).read_text(encoding="utf-8"))
            if meta.get("format") != STORE_FORMAT or meta.get("format_version", 0) > STORE_FORMAT_VERSION:
                raise ValueError(f"unknown store format {meta.get('format')!r} version {meta.get('format_version')!r}")
            table = pa.ipc.open_file(pa.memory_map(str(folder / PASSAGES_FILE), "r")).read_all()
            hashes = np.load(folder / ID_HASH_FILE, mmap_mode="r", allow_pickle=False)
            rows = np.load(folder / ID_ROW_FILE, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, json.JSONDecodeError, pa.ArrowException) as exc:
            raise RetrievalIndexError(f"passage store {folder} is unreadable ({exc}); rebuild it with `hcqr index`") from None
        return cls._from_parts(table, hashes, rows, meta, folder)

    @classmethod
    def _from_parts(cls, table, hashes, rows, meta, folder) -> "PassageStore":
        store = cls.__new__(cls)
        PassageStore.__init__(store, table, hashes, rows, meta, folder)
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
    ) -> "PassageStore":
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
        """
        if duplicate_ids not in DUPLICATE_POLICIES:
            raise CorpusError(f"duplicate_ids must be one of {', '.join(DUPLICATE_POLICIES)}, got {duplicate_ids!r}")
        folder = Path(folder) if folder is not None else None
        return cls._from_parts(*_write(rows, folder, source, duplicate_ids, relocate))

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
        return Passage(self._ids[position].as_py(), self._titles[position].as_py(), self._contents[position].as_py())

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
        """Passage ids at the given rows (one Arrow ``take``; rows must be in range)."""
        import pyarrow as pa

        if len(rows) == 0:
            return []
        return self._ids.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()

    def iter_batches(self, batch_size: int = 4096, start: int = 0, stop: int | None = None
                     ) -> Iterator[tuple[int, list[str], list[str], list[str]]]:
        """Rows ``start..stop`` in slices: ``(first row, ids, titles, contents)``, at most ``batch_size`` rows each.

        Only one slice's strings exist as Python objects at a time.
        """
        stop = self._n if stop is None else min(stop, self._n)
        for first in range(start, stop, batch_size):
            part = self._table.slice(first, min(batch_size, stop - first))
            yield first, part.column("id").to_pylist(), part.column("title").to_pylist(), part.column("content").to_pylist()

    def texts(self, batch_size: int = 4096) -> Iterator[str]:
        """Every passage's :attr:`Passage.text`, in order, streamed."""
        for _, _, titles, contents in self.iter_batches(batch_size):
            yield from (f"{t}\n{c}" if t else c for t, c in zip(titles, contents))

    def _find(self, passage_id: str) -> int | None:
        h = np.uint64(id_hash(passage_id))
        i = int(np.searchsorted(self._hashes, h, side="left"))
        while i < self._n and self._hashes[i] == h:
            row = int(self._rows[i])
            if self._ids[row].as_py() == passage_id:
                return row
            i += 1
        return None


# -- writing ---------------------------------------------------------------------------------------
def _write(rows, folder, source, duplicate_ids, relocate):
    import pyarrow as pa

    schema = _schema()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in STORE_FILES:
            (folder / name).unlink(missing_ok=True)
        path = folder / PASSAGES_FILE
        sink = pa.OSFile(str(path), "wb")
    else:
        sink = pa.BufferOutputStream()
    fingerprint = _Fingerprint()
    hash_parts: list[np.ndarray] = []
    ids: list[str] = []
    titles: list[str] = []
    contents: list[str] = []
    count = 0
    writer = pa.ipc.new_file(sink, schema)

    def flush() -> None:
        if ids:
            writer.write_batch(pa.record_batch([pa.array(ids, pa.string()), pa.array(titles, pa.string()),
                                                pa.array(contents, pa.string())], schema=schema))
            hash_parts.append(np.fromiter((id_hash(i) for i in ids), dtype=np.uint64, count=len(ids)))
            ids.clear()
            titles.clear()
            contents.clear()

    try:
        for passage, _where in rows:
            ids.append(passage.id)
            titles.append(passage.title)
            contents.append(passage.content)
            fingerprint.add(passage.id, passage.title, passage.content)
            count += 1
            if len(ids) == BATCH_ROWS:
                flush()
        flush()
        writer.close()
    finally:
        if folder is not None:
            sink.close()
    if count == 0:
        raise CorpusError(f"corpus {source!r} holds no passages")
    table = _read_table(folder, sink)
    hashes = np.concatenate(hash_parts)
    order = np.argsort(hashes, kind="stable")
    repeated = _repeated_ids(table, hashes, order)
    renamed = 0
    if repeated:
        if duplicate_ids != "rename":
            pid, (first, second) = min(((pid, rs[:2]) for pid, rs in repeated.items()), key=lambda item: item[1][1])
            where = _locate(relocate, (first, second), source)
            raise CorpusError(
                f"{where[second]}: duplicate passage id {pid!r} (first seen at {where[first]}); "
                "pass duplicate_ids='rename' (hcqr index --duplicate-ids rename) to keep both as '<id>#2' ..."
            )
        new_ids = _rename(repeated, table, hashes, order)
        renamed = len(new_ids)
        table, fingerprint = _rewrite_ids(table, new_ids, folder, schema)
        for row, pid in new_ids.items():
            hashes[row] = id_hash(pid)
        order = np.argsort(hashes, kind="stable")
    sorted_hashes = np.ascontiguousarray(hashes[order])
    order = order.astype(np.int64)
    meta = {"format": STORE_FORMAT, "format_version": STORE_FORMAT_VERSION, "count": count,
            "fingerprint": fingerprint.hexdigest(), "source": source, "duplicate_ids": duplicate_ids,
            "renamed": renamed, "id_hash": "blake2b-64"}
    if folder is None:
        return table, sorted_hashes, order, meta, None
    np.save(folder / ID_HASH_FILE, sorted_hashes, allow_pickle=False)
    np.save(folder / ID_ROW_FILE, order, allow_pickle=False)
    (folder / STORE_META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    del table
    store = PassageStore.open(folder)
    return store._table, store._hashes, store._rows, store.meta, folder


def _read_table(folder, sink):
    import pyarrow as pa

    if folder is not None:
        return pa.ipc.open_file(pa.memory_map(str(folder / PASSAGES_FILE), "r")).read_all()
    return pa.ipc.open_file(sink.getvalue()).read_all()


def _repeated_ids(table, hashes: np.ndarray, order: np.ndarray) -> dict[str, list[int]]:
    """Ids held by more than one row -> their rows, ascending (found through equal hashes)."""
    sorted_h = hashes[order]
    same = np.nonzero(sorted_h[1:] == sorted_h[:-1])[0]
    if same.size == 0:
        return {}
    rows = np.unique(np.concatenate([order[same], order[same + 1]]))
    ids = table.column("id").take(rows).to_pylist()
    groups: dict[str, list[int]] = {}
    for row, pid in zip(rows.tolist(), ids):
        groups.setdefault(pid, []).append(row)
    return {pid: sorted(rs) for pid, rs in groups.items() if len(rs) > 1}


def _rename(repeated: dict[str, list[int]], table, hashes: np.ndarray, order: np.ndarray) -> dict[int, str]:
    """New ids for the 2nd, 3rd ... row of each repeated id: ``<id>#2``, ``<id>#3`` ... skipping ids in use."""
    sorted_h = hashes[order]
    id_column = table.column("id")
    assigned: set[str] = set()

    def taken(pid: str) -> bool:
        if pid in assigned:
            return True
        h = np.uint64(id_hash(pid))
        i = int(np.searchsorted(sorted_h, h, side="left"))
        while i < len(sorted_h) and sorted_h[i] == h:
            if id_column[int(order[i])].as_py() == pid:
                return True
            i += 1
        return False

    new_ids: dict[int, str] = {}
    repeats: dict[str, int] = {}
    for row, pid in sorted((row, pid) for pid, rs in repeated.items() for row in rs[1:]):
        n = repeats.get(pid, 1) + 1
        while taken(f"{pid}#{n}"):
            n += 1
        repeats[pid] = n
        new_ids[row] = f"{pid}#{n}"
        assigned.add(new_ids[row])
    return new_ids


def _rewrite_ids(table, new_ids: dict[int, str], folder: Path | None, schema):
    """The table with some ids replaced (rewritten batch by batch) and the new fingerprint."""
    import pyarrow as pa

    fingerprint = _Fingerprint()
    if folder is not None:
        tmp = folder / (PASSAGES_FILE + ".renaming")
        sink = pa.OSFile(str(tmp), "wb")
    else:
        sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for first in range(0, table.num_rows, BATCH_ROWS):
            part = table.slice(first, BATCH_ROWS)
            ids = part.column("id").to_pylist()
            for row in range(first, first + len(ids)):
                if row in new_ids:
                    ids[row - first] = new_ids[row]
            titles, contents = part.column("title").to_pylist(), part.column("content").to_pylist()
            for pid, title, content in zip(ids, titles, contents):
                fingerprint.add(pid, title, content)
            writer.write_batch(pa.record_batch([pa.array(ids, pa.string()), part.column("title").combine_chunks(),
                                                part.column("content").combine_chunks()], schema=schema))
    if folder is not None:
        sink.close()
        del table
        os.replace(tmp, folder / PASSAGES_FILE)
    return _read_table(folder, sink), fingerprint


def _locate(relocate, rows: tuple[int, ...], source: str) -> dict[int, str]:
    """The origin (``file:line``) of the given rows, by re-reading the source; ``row N`` without one."""
    found = {row: f"corpus {source!r} row {row + 1}" for row in rows}
    if relocate is None:
        return found
    wanted, last = set(rows), max(rows)
    for row, (_, where) in enumerate(relocate()):
        if row in wanted:
            found[row] = where
        if row >= last:
            break
    return found
