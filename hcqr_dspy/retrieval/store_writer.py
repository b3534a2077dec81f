"""Writing a passage store: rows streamed into the files of :mod:`hcqr_dspy.retrieval.store_format`.

Rows are appended in record batches, ids are hashed as they come, and
repeated ids are found afterwards by sorting the hashes (16 bytes per
passage), so a build never holds one Python object per passage. A repeated
id is refused (naming both rows' origins) or, under ``duplicate_ids="rename"``,
the 2nd, 3rd ... row of an id becomes ``<id>#2``, ``<id>#3`` (never an id the
corpus already holds), rewriting the Arrow file batch by batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

import hcqr_dspy.retrieval.store_format as fmt
from hcqr_dspy.errors import CorpusError
from hcqr_dspy.retrieval.store_format import Fingerprint, arrow_schema, id_hash


def write_store(rows, folder: Path | None, source: str, duplicate_ids: str, relocate):
    """Stream ``(passage, where)`` rows into store files in ``folder`` (or into memory when ``None``).

    Returns ``None`` for a folder (open it with
    :meth:`~hcqr_dspy.retrieval.passage_store.PassageStore.open`), else the parts of an
    in-memory store: ``(table, sorted id hashes, their rows, meta, None)``.
    Arguments and errors as :meth:`~hcqr_dspy.retrieval.passage_store.PassageStore.build`
    (``OSError`` is left to it).
    """
    import pyarrow as pa

    schema = arrow_schema()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in fmt.STORE_FILES:
            (folder / name).unlink(missing_ok=True)
        path = folder / fmt.PASSAGES_FILE
        sink = pa.OSFile(str(path), "wb")
    else:
        sink = pa.BufferOutputStream()
    fingerprint = Fingerprint()
    hash_parts: list[np.ndarray] = []
    ids: list[str] = []
    titles: list[str] = []
    contents: list[str] = []
    count = 0
    writer = pa.ipc.new_file(sink, schema)

    def flush() -> None:
        if ids:
            writer.write_batch(
                pa.record_batch(
                    [pa.array(ids, pa.string()), pa.array(titles, pa.string()), pa.array(contents, pa.string())],
                    schema=schema,
                )
            )
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
            if len(ids) == fmt.BATCH_ROWS:
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
    meta = {
        "format": fmt.STORE_FORMAT,
        "format_version": fmt.STORE_FORMAT_VERSION,
        "count": count,
        "fingerprint": fingerprint.hexdigest(),
        "source": source,
        "duplicate_ids": duplicate_ids,
        "renamed": renamed,
        "id_hash": "blake2b-64",
    }
    if folder is None:
        return table, sorted_hashes, order, meta, None
    np.save(folder / fmt.ID_HASH_FILE, sorted_hashes, allow_pickle=False)
    np.save(folder / fmt.ID_ROW_FILE, order, allow_pickle=False)
    (folder / fmt.STORE_META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return None  # (PassageStore.build opens the folder)


def _read_table(folder, sink):
    import pyarrow as pa

    if folder is not None:
        return pa.ipc.open_file(pa.memory_map(str(folder / fmt.PASSAGES_FILE), "r")).read_all()
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

    fingerprint = Fingerprint()
    if folder is not None:
        tmp = folder / (fmt.PASSAGES_FILE + ".renaming")
        sink = pa.OSFile(str(tmp), "wb")
    else:
        sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for first in range(0, table.num_rows, fmt.BATCH_ROWS):
            part = table.slice(first, fmt.BATCH_ROWS)
            ids = part.column("id").to_pylist()
            for row in range(first, first + len(ids)):
                if row in new_ids:
                    ids[row - first] = new_ids[row]
            titles, contents = part.column("title").to_pylist(), part.column("content").to_pylist()
            for pid, title, content in zip(ids, titles, contents):
                fingerprint.add(pid, title, content)
            writer.write_batch(
                pa.record_batch(
                    [
                        pa.array(ids, pa.string()),
                        part.column("title").combine_chunks(),
                        part.column("content").combine_chunks(),
                    ],
                    schema=schema,
                )
            )
    if folder is not None:
        sink.close()
        del table
        os.replace(tmp, folder / fmt.PASSAGES_FILE)
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
