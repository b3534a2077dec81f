"""``hcqr split``: one question file -> seeded, non-overlapping train / validation / test files.

A split folder holds ``train.json``, ``val.json`` and ``test.json`` (MIRAGE-format JSON objects ``{qid: row}``,
each row as the source file holds it, in the source file's order) and ``split.json``, the record of how they were
drawn: the source file (path, SHA-256 of its bytes, question count, the content fingerprint of
:func:`~hcqr_dspy.evaluation.fingerprints.question_fingerprint`), the seed, the fractions and the ids of each part.

The draw (:func:`draw_split`): the questions' positions are shuffled by ``random.Random(seed)``, the first
``sizes[0]`` go to train, the next ``sizes[1]`` to validation, the rest to test; the sizes are the fractions of the
question count rounded by largest remainder (:func:`part_sizes`), so they always add up to the count. The same file,
fractions and seed give the same files.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import SplitError
from hcqr_dspy.evaluation.fingerprints import question_fingerprint
from hcqr_dspy.evaluation.folders import out_folder_fault
from hcqr_dspy.evaluation.outages import disk_full, disk_full_error
from hcqr_dspy.evaluation.records import remove_empty_folders
from hcqr_dspy.files import file_sha256

PARTS = ("train", "val", "test")
PART_NAMES = {"train": "train", "val": "validation", "test": "test"}  # as messages name them
RECORD = "split.json"
FILES = (*(f"{part}.json" for part in PARTS), RECORD)  # everything a split writes, in --out
TOLERANCE = 1e-9  # how far the fractions' sum may be from 1


def parse_fractions(text: str) -> tuple[float, float, float]:
    """``"0.5,0.2,0.3"`` -> ``(0.5, 0.2, 0.3)``: the train, validation and test shares of the questions.

    Raises:
        SplitError: not three comma-separated numbers, a number that is not finite or is negative, or a sum
            further than :data:`TOLERANCE` from 1.
    """
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != len(PARTS):
        raise SplitError(
            f"--fractions {text!r} has {len(parts)} part(s); give three numbers, train,validation,test "
            "(e.g. 0.5,0.2,0.3)"
        )
    values = []
    for name, part in zip(PARTS, parts):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise SplitError(f"--fractions {text!r}: the {PART_NAMES[name]} fraction {part!r} is not a number")
        if value < 0:
            raise SplitError(f"--fractions {text!r}: the {PART_NAMES[name]} fraction {part} is negative")
        values.append(value)
    total = math.fsum(values)
    if abs(total - 1) > TOLERANCE:
        raise SplitError(f"--fractions {text!r} sum to {total:.12g}; they must sum to 1")
    return values[0], values[1], values[2]


def part_sizes(count: int, fractions: Sequence[float]) -> list[int]:
    """Questions in each part: ``fraction * count`` rounded down, the questions left over given one each to the
    parts with the largest remainders (the earlier part on a tie); the sizes add up to ``count``."""
    exact = [f * count for f in fractions]
    sizes = [math.floor(x + TOLERANCE) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in by_remainder[: max(0, count - sum(sizes))]:
        sizes[i] += 1
    return sizes


def draw_split(qids: Sequence[str], fractions: Sequence[float], seed: int) -> dict[str, list[str]]:
    """The ids of each part (``train``, ``val``, ``test``), each in ``qids``' order; see the module's docstring.

    Raises:
        SplitError: a part would get no question (``qids`` too few for ``fractions``).
    """
    sizes = part_sizes(len(qids), fractions)
    if 0 in sizes:
        given = ",".join(f"{f:g}" for f in fractions)
        counts = ", ".join(f"{PART_NAMES[p]} {n}" for p, n in zip(PARTS, sizes))
        raise SplitError(
            f"{len(qids)} questions split by --fractions {given} give {counts}; every part needs at least one "
            "question: give the empty ones a larger fraction, or split a larger file"
        )
    order = list(range(len(qids)))
    random.Random(seed).shuffle(order)
    parts, start = {}, 0
    for part, size in zip(PARTS, sizes):
        parts[part] = [qids[i] for i in sorted(order[start : start + size])]
        start += size
    return parts


def _raw_rows(path: Path) -> dict[str, Any]:
    """``{qid: row}`` as the file holds them, in file order: a JSON object's own items, or the rows of a JSON list
    or JSON Lines file keyed as :func:`~hcqr_dspy.data.load_questions` keys them (``qid``, ``id``, the position or
    line number). The file has passed :func:`~hcqr_dspy.data.load_questions` already."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = [(n, json.loads(line)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    else:
        data = json.loads(text)
        if isinstance(data, dict):
            return {str(k): v for k, v in data.items()}
        rows = list(enumerate(data))
    return {str(row.get("qid", row.get("id", n))): row for n, row in rows}


def check_out(out: Path, source: Path, replace: bool = False) -> None:
    """Refuse an ``--out`` a split cannot be written to: a file, a folder holding another tool's records
    (:func:`~hcqr_dspy.evaluation.folders.out_folder_fault`), a folder holding a split's files unless ``replace``,
    or one whose split files include ``source`` itself.

    Raises:
        SplitError: one line naming the folder, what it holds and what to do.
    """
    if fault := out_folder_fault(out, "split"):
        raise SplitError(fault)
    for name in FILES:
        if (out / name).exists() and (out / name).resolve() == source.resolve():
            raise SplitError(
                f"the question file {source} is --out's {name}, which the split writes; choose another --out"
            )
    held = [name for name in FILES if (out / name).exists()]
    if held and not replace:
        raise SplitError(
            f"--out {out} holds a split ({', '.join(held)}{_described(out / RECORD)}); give --replace to split over "
            "it, or choose another --out"
        )


def _described(record: Path) -> str:
    """``": seed 0, fractions 0.5,0.2,0.3 of data/demo/questions.json"`` from a readable ``split.json``, else ``""``."""
    try:
        done = json.loads(record.read_text(encoding="utf-8"))
        fractions = ",".join(f"{done['fractions'][p]:g}" for p in PARTS)
        return f": seed {done['seed']}, fractions {fractions} of {done['source']['file']}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _write_all(out: Path, texts: dict[str, str]) -> None:
    """Write every file of ``texts`` (name -> text) into ``out``: all to temporary files first, then each renamed
    over its name, so a failed write leaves the folder as it was (a new folder is removed again).

    Raises:
        DiskFullError: the disk is full. SplitError: the folder cannot be created or written.
    """
    made = [p for p in (out, *out.parents) if not p.exists()]
    temps: dict[Path, Path] = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            tmp = out / f".{name}.{os.getpid()}.tmp"
            temps[tmp] = out / name
            with tmp.open("w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in temps.items():
            os.replace(tmp, path)
    except OSError as exc:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        remove_empty_folders(made)
        if disk_full(exc):
            raise disk_full_error(exc, "nothing was written") from None
        raise SplitError(f"--out {out} cannot be written: {exc.strerror or exc}") from None


def split_questions(
    source: str | Path, fractions: str, seed: int, out: str | Path, replace: bool = False
) -> dict[str, Any]:
    """Split question file ``source`` into ``out``/``train.json``, ``val.json``, ``test.json`` and ``split.json``.

    Args:
        source: A question file :func:`~hcqr_dspy.data.load_questions` reads (MIRAGE JSON, a JSON list, JSON Lines);
            every question must have a gold answer.
        fractions: Train, validation and test shares, ``"0.5,0.2,0.3"`` (:func:`parse_fractions`).
        seed: Seed of the draw.
        out: The split's folder (created if needed).
        replace: Write over the split files ``out`` holds (refused otherwise).

    Returns:
        The record written to ``split.json``: ``source`` (``file``, ``sha256``, ``questions``, ``content_sha256``),
        ``seed``, ``fractions`` and ``parts`` (``{part: {file, questions, ids}}``).

    Raises:
        SplitError: bad fractions (:func:`parse_fractions`), a file too small for them (:func:`draw_split`), a
            missing file, an ``--out`` :func:`check_out` refuses; nothing is written.
        DataError: the file cannot be read as questions (:func:`~hcqr_dspy.data.load_questions`).
    """
    shares = parse_fractions(fractions)
    path, folder = Path(source), Path(out)
    if not path.is_file():
        raise SplitError(f"question file {source} not found")
    examples = load_questions(path)
    check_out(folder, path, replace)
    parts = draw_split([e.qid for e in examples], shares, seed)
    rows = _raw_rows(path)
    fingerprint = question_fingerprint(examples)
    record = {
        "source": {
            "file": str(source),
            "sha256": file_sha256(path),
            "questions": len(examples),
            "content_sha256": fingerprint["content_sha256"],
        },
        "seed": seed,
        "fractions": dict(zip(PARTS, shares)),
        "parts": {p: {"file": f"{p}.json", "questions": len(ids), "ids": ids} for p, ids in parts.items()},
    }
    texts = {f"{p}.json": _json({qid: rows[qid] for qid in ids}) for p, ids in parts.items()}
    _write_all(folder, {**texts, RECORD: _json(record)})
    return record


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
