"""Passage embeddings on disk: chunked, resumable, shared between index types.

A dense build encodes the corpus in fixed chunks of ``chunk_size`` passages
(rows ``i * chunk_size`` to ``(i + 1) * chunk_size``). Each finished chunk
is written to ``chunk-000042.npy`` (float32 ``(rows, d)``; written to a
temporary name, then renamed, so a chunk file exists only once it is
complete). A build killed midway loses at most the chunk in progress: the
same command finds the finished chunks and encodes only the rest, and since
chunk boundaries and batches are the same, the vectors are identical to an
uninterrupted build's.

The folder is keyed by the corpus fingerprint and the passage side of the
encoder (:meth:`EncoderSpec.passage_description`), so building another
index type (``--faiss HNSW32`` after ``Flat``; a hybrid after a dense index)
over the same corpus and passage encoder encodes nothing again. Where:
``<root>/<key>/`` with ``root`` the ``embeddings_dir`` argument
(``hcqr index --embeddings DIR``), else ``$HCQR_EMBEDDINGS``, else
``$HCQR_CACHE/embeddings`` (default ``~/.cache/hcqr-dspy/embeddings``).
The folder may be deleted once the indexes are built (a faiss ``Flat`` or
``HNSW`` index holds the vectors itself); it is needed again only to build
another index type without re-encoding.

Nothing is pickled: chunks are ``.npy`` read with ``allow_pickle=False``
(memory-mapped), the record is JSON. One build at a time per folder: a
second process filling the same folder would remove the first one's
half-written chunk.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hcqr_dspy.errors import RetrievalIndexError

if TYPE_CHECKING:  # pragma: no cover
    from hcqr_dspy.retrieval.encoder import Encoder
    from hcqr_dspy.retrieval.passage_store import PassageStore

DEFAULT_CHUNK_SIZE = 4096
RECORD_FILE = "embeddings.json"
EMBEDDINGS_FORMAT = "hcqr-embeddings"
EMBEDDINGS_FORMAT_VERSION = 1
ENCODE_SLICE_BATCHES = 8  # a chunk is encoded in slices of 8 batches, one progress-bar step each


def default_embeddings_root() -> Path:
    """``$HCQR_EMBEDDINGS``, else ``$HCQR_CACHE/embeddings``, else ``~/.cache/hcqr-dspy/embeddings``."""
    if os.environ.get("HCQR_EMBEDDINGS"):
        return Path(os.environ["HCQR_EMBEDDINGS"])
    return Path(os.environ.get("HCQR_CACHE", Path.home() / ".cache" / "hcqr-dspy")) / "embeddings"


def embeddings_key(corpus_fingerprint: str, count: int, passage_encoder: dict[str, Any]) -> str:
    """Folder name of a corpus's embeddings under one passage encoder: 24 hex digits of a SHA-256."""
    blob = json.dumps(
        {"corpus": corpus_fingerprint, "count": count, "passage_encoder": passage_encoder}, sort_keys=True
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


class EmbeddingStore:
    """The passage embeddings of one corpus under one passage encoder, in chunk files.

    Open (or create) with :meth:`open`; :meth:`fill` encodes what is
    missing; :meth:`iter_chunks` and :meth:`rows` read them back
    memory-mapped.

    Attributes:
        folder: The store's folder.
        key: Its name (see :func:`embeddings_key`).
        count: Passages (rows).
        dimension: Embedding size ``d``.
        chunk_size: Rows per chunk (the last chunk may be shorter).
        n_chunks: ``ceil(count / chunk_size)``.
        record: The ``embeddings.json`` contents.
    """

    def __init__(self, folder: Path, record: dict[str, Any]):
        self.folder = folder
        self.record = record
        self.key: str = record["key"]
        self.count: int = int(record["count"])
        self.dimension: int = int(record["dimension"])
        self.chunk_size: int = int(record["chunk_size"])
        self.n_chunks = -(-self.count // self.chunk_size)

    @classmethod
    def open(
        cls,
        corpus: PassageStore,
        encoder: Encoder,
        root: str | Path | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> EmbeddingStore:
        """The embedding store of ``corpus`` under ``encoder``'s passage side, created if absent.

        An existing store keeps its own chunk size (resuming must not move
        chunk boundaries); ``chunk_size`` applies to a new one.

        Raises:
            RetrievalIndexError: ``chunk_size < 1``; the folder cannot be
                created; its record is unreadable or belongs to another
                corpus, encoder or dimension.
        """
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise RetrievalIndexError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        passage = encoder.spec.passage_description()
        key = embeddings_key(corpus.fingerprint, len(corpus), passage)
        folder = Path(root) if root is not None else default_embeddings_root()
        folder = folder / key
        record_path = folder / RECORD_FILE
        expected = {
            "format": EMBEDDINGS_FORMAT,
            "format_version": EMBEDDINGS_FORMAT_VERSION,
            "key": key,
            "corpus_fingerprint": corpus.fingerprint,
            "count": len(corpus),
            "passage_encoder": passage,
            "dimension": encoder.dimension,
        }
        if record_path.is_file():
            try:
                record = json.loads(record_path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RetrievalIndexError(
                    f"{record_path} is unreadable ({exc}); delete {folder} to re-encode"
                ) from None
            for field, value in expected.items():
                if record.get(field) != value:
                    raise RetrievalIndexError(
                        f"{record_path} records {field} {record.get(field)!r}, expected {value!r}; "
                        f"delete {folder} to re-encode"
                    )
            return cls(folder, record)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RetrievalIndexError(f"cannot create the embeddings folder {folder}: {exc.strerror or exc}") from None
        record = {**expected, "chunk_size": chunk_size, "dtype": "float32", "encoder": encoder.describe()}
        _write_json(record_path, record)
        return cls(folder, record)

    # -- chunks ------------------------------------------------------------------------------------
    def chunk_path(self, i: int) -> Path:
        return self.folder / f"chunk-{i:06d}.npy"

    def chunk_rows(self, i: int) -> tuple[int, int]:
        """First row and end row (exclusive) of chunk ``i``."""
        start = i * self.chunk_size
        return start, min(start + self.chunk_size, self.count)

    def finished(self) -> list[int]:
        """Chunks already encoded (their files exist)."""
        return [i for i in range(self.n_chunks) if self.chunk_path(i).is_file()]

    @property
    def complete(self) -> bool:
        return len(self.finished()) == self.n_chunks

    def chunk(self, i: int) -> np.ndarray:
        """Chunk ``i`` as a read-only memory-mapped float32 array ``(rows, d)``.

        Raises:
            RetrievalIndexError: the chunk is missing or has the wrong shape or type.
        """
        path = self.chunk_path(i)
        start, stop = self.chunk_rows(i)
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise RetrievalIndexError(
                f"embedding chunk {path} is unreadable ({exc}); delete it to re-encode it"
            ) from None
        if arr.dtype != np.float32 or arr.shape != (stop - start, self.dimension):
            raise RetrievalIndexError(
                f"embedding chunk {path} holds {arr.dtype} {arr.shape}, "
                f"expected float32 {(stop - start, self.dimension)}; "
                "delete it to re-encode it"
            )
        return arr

    def fill(
        self, corpus: PassageStore, encoder: Encoder, batch_size: int = 64, show_progress: bool = True
    ) -> dict[str, int]:
        """Encode every chunk not yet on disk, in order, writing each as it finishes.

        Returns:
            ``{"encoded_chunks": n, "reused_chunks": m}`` for this call.

        Raises:
            RetrievalIndexError: a chunk cannot be written (the finished ones stay).
        """
        from tqdm.auto import tqdm

        done = set(self.finished())
        todo = [i for i in range(self.n_chunks) if i not in done]
        for stale in self.folder.glob("chunk-*.npy.tmp*"):  # left by a build killed while writing
            stale.unlink(missing_ok=True)
        if not todo:
            return {"encoded_chunks": 0, "reused_chunks": len(done)}
        done_rows = sum(self.chunk_rows(i)[1] - self.chunk_rows(i)[0] for i in done)
        bar = tqdm(
            total=self.count,
            initial=done_rows,
            unit="passage",
            desc="encoding passages",
            disable=not show_progress,
            dynamic_ncols=True,
        )
        step = batch_size * ENCODE_SLICE_BATCHES
        try:
            for i in todo:
                start, stop = self.chunk_rows(i)
                out = np.empty((stop - start, self.dimension), dtype=np.float32)
                for first, _ids, titles, contents in corpus.iter_batches(step, start, stop):
                    emb = encoder.encode_passages(titles, contents, batch_size=batch_size)
                    out[first - start : first - start + len(titles)] = emb
                    bar.update(len(titles))
                self._write_chunk(i, out)
        finally:
            bar.close()
        return {"encoded_chunks": len(todo), "reused_chunks": len(done)}

    def _write_chunk(self, i: int, vectors: np.ndarray) -> None:
        path = self.chunk_path(i)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        try:
            with tmp.open("wb") as fh:
                np.save(fh, vectors, allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RetrievalIndexError(
                f"cannot write embedding chunk {path}: {exc.strerror or exc}; the finished chunks are kept: "
                "free space and run the same command to resume"
            ) from None

    # -- reading -----------------------------------------------------------------------------------
    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, vectors)`` per chunk, in order; one chunk memory-mapped at a time.

        Raises:
            RetrievalIndexError: a chunk is missing (the store is incomplete).
        """
        for i in range(self.n_chunks):
            if not self.chunk_path(i).is_file():
                raise RetrievalIndexError(f"embeddings in {self.folder} are incomplete: chunk {i} is missing")
            yield self.chunk_rows(i)[0], self.chunk(i)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The vectors at ``rows`` (any order), float32 ``(len(rows), d)`` in memory."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dimension), dtype=np.float32)
        which = rows // self.chunk_size
        for i in np.unique(which):
            mask = which == i
            out[mask] = self.chunk(int(i))[rows[mask] - int(i) * self.chunk_size]
        return out

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``min(n, count)`` vectors drawn without replacement by a seeded generator (rows ascending)."""
        n = min(int(n), self.count)
        rows = np.sort(np.random.default_rng(seed).choice(self.count, size=n, replace=False))
        return self.rows(rows)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
