"""Corpus loading in MedRAG's snippet schema.

A corpus is an ordered list of :class:`Passage` read from

* one ``.jsonl`` file (one JSON object per line),
* a folder of ``.jsonl`` files (read recursively, in sorted path order), or
* a Hugging Face hub dataset name such as ``MedRAG/textbooks`` through
  :func:`datasets.load_dataset` (needs network access).

Each row needs ``id`` and ``content``; ``title`` may be empty; ``contents``
(MedRAG's title + content field) is accepted and ignored, since it is derived.
The schema is MedRAG's (Xiong et al. 2024, "Benchmarking Retrieval-Augmented
Generation for Medicine", ``chunk/*.jsonl``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from hcqr_dspy.errors import CorpusError


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
        """Title and content joined by a newline: the text that is indexed."""
        return f"{self.title}\n{self.content}" if self.title else self.content


class Corpus:
    """An ordered, id-unique collection of passages.

    Args:
        passages: The passages, in index order.
        source: Where they came from (a path or hub name), recorded in index
            manifests so an index can reload its corpus.

    Raises:
        CorpusError: if ``passages`` is empty or two passages share an id.
    """

    def __init__(self, passages: Iterable[Passage], source: str = "<memory>"):
        self.passages: list[Passage] = list(passages)
        self.source = source
        if not self.passages:
            raise CorpusError(f"corpus {source!r} holds no passages")
        self._position: dict[str, int] = {}
        for i, p in enumerate(self.passages):
            if p.id in self._position:
                raise CorpusError(f"corpus {source!r}: duplicate passage id {p.id!r}")
            self._position[p.id] = i
        self._fingerprint: str | None = None
        self.duplicate_ids = "error"  # how repeated ids in the source were handled (see load_corpus)
        self.renamed = 0  # passages whose repeated id was renamed

    def __len__(self) -> int:
        return len(self.passages)

    def __iter__(self) -> Iterator[Passage]:
        return iter(self.passages)

    def __getitem__(self, position: int) -> Passage:
        return self.passages[position]

    def get(self, passage_id: str) -> Passage:
        """Return the passage with this id.

        Raises:
            KeyError: if no passage has this id.
        """
        try:
            return self.passages[self._position[passage_id]]
        except KeyError:
            raise KeyError(f"no passage with id {passage_id!r} in corpus {self.source!r}") from None

    def position(self, passage_id: str) -> int:
        """Row number of a passage id (its position in index order)."""
        return self._position[passage_id]

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) over every passage's id, title and content, in order.

        Two corpora with the same fingerprint index identically; indexes store
        it in their manifest and refuse to load against another corpus.
        """
        if self._fingerprint is None:
            h = hashlib.sha256()
            for p in self.passages:
                for part in (p.id, p.title, p.content):
                    h.update(part.encode("utf-8"))
                    h.update(b"\x1f")
                h.update(b"\x1e")
            self._fingerprint = h.hexdigest()
        return self._fingerprint


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


DUPLICATE_POLICIES = ("error", "rename")


def _collect(rows: Iterable[tuple[Passage, str]], source: str, duplicate_ids: str = "error") -> Corpus:
    passages: list[Passage] = []
    seen: dict[str, str] = {}
    repeats: dict[str, int] = {}
    for passage, where in rows:
        if passage.id in seen:
            if duplicate_ids != "rename":
                raise CorpusError(
                    f"{where}: duplicate passage id {passage.id!r} (first seen at {seen[passage.id]}); "
                    "pass duplicate_ids='rename' (hcqr index --duplicate-ids rename) to keep both as '<id>#2' ..."
                )
            repeats[passage.id] = repeats.get(passage.id, 1) + 1
            new_id = f"{passage.id}#{repeats[passage.id]}"
            while new_id in seen:
                repeats[passage.id] += 1
                new_id = f"{passage.id}#{repeats[passage.id]}"
            passage = Passage(new_id, passage.title, passage.content)
        seen[passage.id] = where
        passages.append(passage)
    if not passages:
        raise CorpusError(f"corpus {source!r} holds no passages")
    corpus = Corpus(passages, source=source)
    corpus.duplicate_ids = duplicate_ids
    corpus.renamed = sum(n - 1 for n in repeats.values())
    return corpus


def _load_hub(name: str, split: str, duplicate_ids: str) -> Corpus:
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
    return _collect(((_row_to_passage(r, f"{name}[{i}]"), f"{name}[{i}]") for i, r in enumerate(ds)), name, duplicate_ids)


def load_corpus(source: str | Path, split: str = "train", duplicate_ids: str = "error") -> Corpus:
    """Load a corpus from a ``.jsonl`` file, a folder of them, or a hub dataset.

    Args:
        source: Path to a ``.jsonl`` file or a folder (searched recursively for
            ``*.jsonl``), or a hub dataset name ``owner/name`` when no such
            path exists.
        split: Dataset split for hub datasets (MedRAG corpora use ``train``).
        duplicate_ids: ``"error"`` (default) refuses a repeated passage id;
            ``"rename"`` keeps every row, renaming the 2nd, 3rd ... row of an
            id to ``<id>#2``, ``<id>#3`` in file order (the shared MedQuAD
            snippets give 11 ids to 52 different passages).

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
        return _collect(_read_jsonl(path), str(path), duplicate_ids)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise CorpusError(f"corpus folder {path} contains no .jsonl files")
        return _collect((item for f in files for item in _read_jsonl(f)), str(path), duplicate_ids)
    text = str(source)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not path.suffix:
        return _load_hub(text, split, duplicate_ids)
    raise CorpusError(f"corpus {text!r} not found: give a .jsonl file, a folder of them, or a hub dataset name")
