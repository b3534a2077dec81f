"""Benchmarks -> ``dspy.Example``.

A question is ``dspy.Example(qid, question, options, answer)`` with inputs
``question, options``; ``options`` maps option letters (``"A"``, ``"B"``, ...,
consecutive from ``A``, two or more) to option texts.

Sources: MIRAGE-format JSON files ``{qid: {question, options, answer}}``
(Xiong et al. 2024, the MIRAGE benchmark: MedQA-US, MMLU-Med, MedMCQA,
PubMedQA*, BioASQ-Y/N), JSON Lines files with one ``{id, question, options,
answer}`` object per line (``qid`` or ``id``; the line number when neither),
a Hugging Face dataset saved to disk (``FOLDER`` or ``FOLDER:SPLIT``) or an MLflow evaluation dataset
(``mlflow:NAME``, ``mlflow:ID``, ``mlflow:REF@STORE``) with the same fields (:mod:`hcqr_dspy.data_sources`), or a
hub dataset name through :func:`datasets.load_dataset` with the same fields (needs network access). Every source's
rows pass the same checks (:func:`check_question`, unique ids). Questions without gold answers (``hcqr predict``)
are read with ``labelled=False``: their ``answer`` is ``None``.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterable, Sequence
from pathlib import Path

import dspy

from hcqr_dspy import data_sources
from hcqr_dspy.config import read_text
from hcqr_dspy.errors import DataError

LETTERS = string.ascii_uppercase


def check_question(qid: str, row: object, where: str, labelled: bool = True) -> dspy.Example:
    """Validate one MIRAGE row and build its Example.

    Args:
        qid: The question's id.
        row: ``{question, options, answer}``.
        where: The file (or flag) it came from, for messages.
        labelled: The row must have a gold ``answer``. With ``False`` (unlabelled questions, ``hcqr
            predict``) a row without ``answer`` (or with ``null``) gets ``answer=None``; an answer that
            is given must still be one of the options.

    Raises:
        DataError: not an object, missing/empty question, fewer than two
            options, option labels that are not consecutive letters from
            ``A``, an empty option text, or an answer not among the options
            (a missing one too, unless ``labelled`` is false).
    """
    if not isinstance(row, dict):
        raise DataError(f"{where}: question {qid!r} is not a JSON object")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: question {qid!r} has no 'question' text")
    options = row.get("options")
    if isinstance(options, list):  # a list of option texts is labelled A, B, C ...
        options = {LETTERS[i]: o for i, o in enumerate(options)} if len(options) <= 26 else None
    if not isinstance(options, dict):
        raise DataError(f"{where}: question {qid!r} has no 'options' object")
    if len(options) < 2:
        raise DataError(f"{where}: question {qid!r} has {len(options)} option(s); at least two are needed")
    labels = [str(k).strip().upper() for k in options]
    if sorted(labels) != list(LETTERS[: len(labels)]):
        raise DataError(
            f"{where}: question {qid!r} has options labelled {list(options)}; labels must be the letters "
            f"{', '.join(LETTERS[: len(labels)])}"
        )
    opts = {}
    for key, text in sorted(zip(labels, options.values())):
        if not isinstance(text, str):
            raise DataError(f"{where}: question {qid!r} option {key} is not text ({type(text).__name__})")
        if not text.strip():
            raise DataError(f"{where}: question {qid!r} option {key} is empty")
        opts[key] = text.strip()
    answer = row.get("answer")
    answer = answer.strip().upper() if isinstance(answer, str) else answer
    if answer is None and not labelled:
        pass
    elif answer not in opts:
        raise DataError(
            f"{where}: question {qid!r} has answer {row.get('answer')!r}, not one of its options {list(opts)}"
        )
    return dspy.Example(qid=str(qid), question=question.strip(), options=opts, answer=answer).with_inputs(
        "question", "options"
    )


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DataError(
                f"key {key!r} appears twice in one JSON object; question ids and option letters must be unique"
            )
        out[key] = value
    return out


def _from_mapping(data: object, where: str, labelled: bool = True) -> list[dspy.Example]:
    if isinstance(data, dict):
        items: Iterable = data.items()
    elif isinstance(data, list):
        items = ((row.get("qid", row.get("id", i)) if isinstance(row, dict) else i, row) for i, row in enumerate(data))
    else:
        raise DataError(f"{where}: expected a JSON object {{qid: question}} or a list of questions")
    examples = []
    seen: set[str] = set()
    for qid, row in items:
        if str(qid) in seen:
            raise DataError(f"{where}: question id {str(qid)!r} appears twice; ids must be unique")
        seen.add(str(qid))
        examples.append(check_question(str(qid), row, where, labelled=labelled))
    if not examples:
        raise DataError(f"{where}: holds no questions")
    return examples


def load_questions(source: str | Path, split: str = "test", labelled: bool = True) -> list[dspy.Example]:
    """Load a benchmark as Examples, in file order.

    Args:
        source: A MIRAGE-format ``.json`` file, a ``.jsonl`` file (one question
            object per line), a saved Hugging Face dataset's folder (``FOLDER`` or
            ``FOLDER:SPLIT``), an MLflow evaluation dataset (``mlflow:REF@STORE``; a
            ``mlflow:REF`` without store is refused here, the commands fill in theirs),
            or a hub dataset name (with fields ``question``, ``options``, ``answer``
            and optionally ``id``); see :mod:`hcqr_dspy.data_sources`.
        split: Split of a hub dataset.
        labelled: Every question must have a gold answer (evaluations). ``False``
            accepts questions without one (``answer=None``; see :func:`check_question`).

    Raises:
        DataError: unreadable or malformed file (see :func:`check_question`; a
            JSON Lines file names the line), a saved dataset or MLflow dataset that
            cannot be read or lacks the fields (:mod:`hcqr_dspy.data_sources`), or a
            hub dataset that cannot be reached.
    """
    if data_sources.is_mlflow(source):
        where = data_sources.MLFLOW + data_sources.mlflow_parts(str(source))[0]  # the store is long: named apart
        return _from_mapping(data_sources.read_mlflow_dataset(str(source)), where, labelled)
    folder = data_sources.hf_folder(source)
    if folder is not None:
        rows = data_sources.read_saved_dataset(folder[0], folder[1], labelled)
        return _from_mapping(rows, str(source), labelled)
    path = Path(source)
    if path.is_file() and path.suffix == ".jsonl":
        return _from_mapping(_read_jsonl(path), str(path), labelled)
    if path.is_file():
        text = read_text(path, DataError, "question file")  # not UTF-8: the line and column are named
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        except DataError as exc:
            raise DataError(f"{path}: {exc}") from None
        return _from_mapping(data, str(path), labelled)
    text = str(source)
    if text.count("/") == 1 and not path.suffix and not text.startswith((".", "/", "~")):
        try:
            import datasets

            ds = datasets.load_dataset(text, split=split)
        except Exception as exc:
            raise DataError(
                f"could not load hub dataset {text!r} (split {split!r}): {type(exc).__name__}; it needs network "
                "access to the Hugging Face hub, or pass a MIRAGE-format .json file"
            ) from None
        return _from_mapping(data_sources.dataset_rows(ds, text, labelled), text, labelled)
    raise DataError(
        f"benchmark {text!r} not found: give a MIRAGE-format .json file, a saved dataset's folder, "
        "mlflow:NAME or a hub dataset name"
    )


def _read_jsonl(path: Path) -> list[dict]:
    """The question objects of a JSON Lines file, each given its ``qid`` (``qid``, ``id`` or the line number).

    Raises:
        DataError: unreadable, not UTF-8, or a line that is not a JSON object (file and line named).
    """
    rows = []
    lines = read_text(path, DataError, "question file").splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: not a question object")
        rows.append({**row, "qid": str(row.get("qid", row.get("id", lineno)))})
    return rows


def select(
    examples: Sequence[dspy.Example], limit: int | None = None, seed: int = 0, ids: Sequence[str] | None = None
) -> list[dspy.Example]:
    """Deterministic subset of questions, kept in their original order.

    Args:
        examples: All questions.
        limit: Keep a random sample of this many (seeded); ``None`` keeps all.
        seed: Seed of the sample (same seed, same questions).
        ids: Keep exactly these question ids (applied before ``limit``).

    Raises:
        DataError: unknown ids, or ``limit < 1``.
    """
    chosen = list(examples)
    if ids:
        known = {e.qid: e for e in chosen}
        missing = [i for i in ids if i not in known]
        if missing:
            raise DataError(f"unknown question ids: {', '.join(missing[:10])}")
        wanted = set(ids)
        chosen = [e for e in chosen if e.qid in wanted]
    if limit is not None:
        if limit < 1:
            raise DataError(f"limit must be >= 1, got {limit}")
        if limit < len(chosen):
            keep = set(random.Random(seed).sample(range(len(chosen)), limit))
            chosen = [e for i, e in enumerate(chosen) if i in keep]
    return chosen


def format_options(options: dict[str, str]) -> str:
    """Options as ``"A. text"`` lines, the form every signature receives."""
    return "\n".join(f"{k}. {v}" for k, v in options.items())
