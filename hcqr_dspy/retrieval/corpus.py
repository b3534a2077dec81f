"""Corpus loading in MedRAG's snippet schema, into a memory-mapped passage store.

A corpus is an ordered collection of :class:`Passage` read from

* one ``.jsonl`` file (one JSON object per line),
* a folder of ``.jsonl`` files (read recursively, in sorted path order), or
* a Hugging Face hub dataset name such as ``MedRAG/textbooks`` through
  :func:`datasets.load_dataset` (needs network access).

Each row needs ``id`` and ``content``; ``title`` may be empty; ``contents``
(MedRAG's title + content field) is accepted and ignored, since it is derived.
The schema is MedRAG's (Xiong et al. 2024, "Benchmarking Retrieval-Augmented
Generation for Medicine", ``chunk/*.jsonl``).

Rows are streamed into a :class:`~hcqr_dspy.retrieval.passage_store.PassageStore`
(an Arrow file, memory-mapped; in memory when no folder is given), so a
loaded corpus holds a constant number of Python objects whatever its size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from hcqr_dspy.errors import CorpusError
from hcqr_dspy.retrieval.passage_store import PassageStore
from hcqr_dspy.retrieval.store_format import DUPLICATE_POLICIES, Passage

__all__ = ["Corpus", "Passage", "load_corpus", "DUPLICATE_POLICIES"]


class Corpus(PassageStore):
    """An ordered, id-unique collection of passages: a :class:`PassageStore`.

    ``Corpus(passages, source)`` builds an in-memory store from a list (small
    corpora, tests); :func:`load_corpus` streams a source into one, and
    :meth:`PassageStore.open` opens an index folder's store, memory-mapped.
    Both return a :class:`Corpus`.

    Args:
        passages: The passages, in index order.
        source: Where they came from (a path or hub name), recorded in index
            manifests.

    Raises:
        CorpusError: if ``passages`` is empty or two passages share an id.
    """

    def __init__(self, passages: Iterable[Passage], source: str = "<memory>"):
        rows = ((p, f"corpus {source!r} row {i + 1}") for i, p in enumerate(passages))
        built = PassageStore.build(rows, None, source=source)
        super().__init__(built._table, built._hashes, built._rows, built.meta, None)


def _row_to_passage(row: object, where: str) -> Passage:
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    pid = row.get("id")
    if pid is None or (isinstance(pid, str) and not pid.strip()):
        raise CorpusError(f"{where}: row has no 'id'")
    if not isinstance(pid, (str, int)):
        raise CorpusError(f"{where}: 'id' must be a string, got {type(pid).__name__}")
    content = row.get("content")
    if not isinstance(content, str) or not content.strip():
        raise CorpusError(f"{where}: row {pid!r} has no 'content' (a non-empty string is required)")
    title = row.get("title") or ""
    if not isinstance(title, str):
        raise CorpusError(f"{where}: row {pid!r} has a non-string 'title'")
    return Passage(id=str(pid), title=title, content=content)


def _read_jsonl(path: Path) -> Iterator[tuple[Passage, str]]:
    try:
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                where = f"{path}:{lineno}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise CorpusError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CorpusError(f"{where}: not valid JSON ({exc.msg})") from None
                yield _row_to_passage(row, where), where
    except OSError as exc:
        raise CorpusError(f"cannot read corpus file {path}: {exc.strerror}") from None


def _hub_rows(name: str, split: str) -> Iterator[tuple[Passage, str]]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a hard dependency
        raise CorpusError(f"loading hub dataset {name!r} needs the 'datasets' package") from exc
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many types for offline/missing
        raise CorpusError(
            f"could not load hub dataset {name!r} (split {split!r}): {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. It needs network access to the "
            "Hugging Face hub (HF_HUB_OFFLINE must be unset) or a local copy; pass a .jsonl "
            "file or folder instead."
        ) from None
    return ((_row_to_passage(r, f"{name}[{i}]"), f"{name}[{i}]") for i, r in enumerate(ds))


def load_corpus(
    source: str | Path, split: str = "train", duplicate_ids: str = "error", store: str | Path | None = None
) -> Corpus:
    """Load a corpus from a ``.jsonl`` file, a folder of them, or a hub dataset.

    Rows are streamed into a passage store: one Arrow file written into
    ``store`` and memory-mapped (what ``hcqr index`` does, so a corpus bigger
    than RAM can be indexed), or kept in memory when ``store`` is ``None``.

    Args:
        source: Path to a ``.jsonl`` file or a folder (searched recursively for
            ``*.jsonl``), or a hub dataset name ``owner/name`` when no such
            path exists.
        split: Dataset split for hub datasets (MedRAG corpora use ``train``).
        duplicate_ids: ``"error"`` (default) refuses a repeated passage id;
            ``"rename"`` keeps every row, renaming the 2nd, 3rd ... row of an
            id to ``<id>#2``, ``<id>#3`` in file order (the shared MedQuAD
            snippets give 11 ids to 52 different passages).
        store: Folder for the passage store's files (created; store files
            already there are replaced), or ``None`` for an in-memory store.

    Returns:
        The :class:`Corpus`, passages in file order (files in sorted order).

    Raises:
        CorpusError: empty corpus, a row without ``id``/``content``, duplicate
            ids, invalid UTF-8 or JSON (each naming file and line), a missing
            path, or a hub dataset that cannot be loaded (offline).
    """
    if duplicate_ids not in DUPLICATE_POLICIES:
        raise CorpusError(f"duplicate_ids must be one of {', '.join(DUPLICATE_POLICIES)}, got {duplicate_ids!r}")
    path = Path(source)
    if path.is_file():

        def rows():
            return _read_jsonl(path)
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise CorpusError(f"corpus folder {path} contains no .jsonl files")

        def rows():
            return (item for f in files for item in _read_jsonl(f))
    else:
        text = str(source)
        if not (text.count("/") == 1 and not text.startswith((".", "/", "~")) and not path.suffix):
            raise CorpusError(f"corpus {text!r} not found: give a .jsonl file, a folder of them, or a hub dataset name")
        hub = _hub_rows(text, split)
        return Corpus.build(
            hub, store, source=text, duplicate_ids=duplicate_ids, relocate=lambda: _hub_rows(text, split)
        )
    return Corpus.build(rows(), store, source=str(path), duplicate_ids=duplicate_ids, relocate=rows)
