"""The passage store's on-disk format: its files, the passage record, id hashes and the corpus fingerprint.

A store is a folder (an index folder, or a staging folder while an index is
built) holding

* ``passages.arrow`` — an uncompressed Arrow IPC file (columns ``id``,
  ``title``, ``content``, strings, in corpus order; :func:`arrow_schema`),
  written in record batches of up to :data:`BATCH_ROWS` rows;
* ``passage_ids.hash.npy`` / ``passage_ids.row.npy`` — a 64-bit BLAKE2b hash
  of every passage id (:func:`id_hash`), sorted, and the row each belongs to
  (numpy arrays, ``allow_pickle=False``);
* ``passages.json`` — count, fingerprint (:class:`Fingerprint`), source and
  duplicate-id policy, format name and version.

Reading is :mod:`hcqr_dspy.retrieval.passage_store`, writing
:mod:`hcqr_dspy.retrieval.store_writer`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

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


def arrow_schema():
    """The Arrow schema of ``passages.arrow``: ``id``, ``title``, ``content``, all strings."""
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("title", pa.string()), ("content", pa.string())])


class Fingerprint:
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
