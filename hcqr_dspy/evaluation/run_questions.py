"""A run's questions reloaded from its dataset (:meth:`~hcqr_dspy.evaluation.run_folder.RunFolder.load_questions`
and :meth:`~hcqr_dspy.evaluation.run_folder.RunFolder.question_sample`), checked against what the run recorded.

``folder`` is a :class:`~hcqr_dspy.evaluation.run_folder.RunFolder` (its ``path``, ``dataset``,
``questions_record`` and ``rows()`` are read); this module does not import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError, RunError
from hcqr_dspy.evaluation.fingerprints import question_fingerprint


def reload_questions(folder: Any, dataset: str | None = None) -> dict[str, Any]:
    """The run's questions (from its dataset, or from ``dataset`` where it lies now), by id; see
    :meth:`RunFolder.load_questions <hcqr_dspy.evaluation.run_folder.RunFolder.load_questions>`.

    The questions are checked against the run's record: every answered question must be there, and the run's
    sample, rebuilt (:func:`recorded_sample`), must hash to the recorded ``content_sha256`` (a file edited since
    the run, same ids, is refused). A finished run's sample can always be rebuilt unless the file's questions
    were reordered (then it is refused); an unfinished run over an explicit id list cannot be, so only its ids
    are checked when it is read where it ran, and it is refused when ``dataset`` moves it.

    Raises:
        RunError: the dataset cannot be read any more, lacks a question the run answered, or its questions'
            content is not the recorded one or cannot be checked as above.
    """
    from hcqr_dspy.data import load_questions  # imports dspy: only a run's questions reloaded pay for it

    source = dataset or folder.dataset
    try:
        questions = load_questions(source, labelled=folder.questions_record.get("labelled", True))
    except HCQRError as exc:
        raise RunError(f"run {folder.path}: its dataset cannot be read ({exc})") from None
    by_id = {q.qid: q for q in questions}
    rows = folder.rows()
    missing = [r["qid"] for r in rows if r["qid"] not in by_id]
    if missing:
        raise RunError(f"run {folder.path}: question(s) {', '.join(missing[:5])} are not in {source}")
    recorded = folder.questions_record.get("content_sha256")
    sample = recorded_sample(folder, questions, rows)
    if recorded and sample is None and (dataset is not None or len(rows) == folder.questions_record.get("count")):
        raise RunError(
            f"run {folder.path}: its question sample cannot be rebuilt from {source} to check its content "
            "(the file's questions reordered, or an unfinished run over an explicit id list)"
        )
    if recorded and sample is not None and question_fingerprint(sample)["content_sha256"] != recorded:
        raise RunError(
            f"run {folder.path}: the questions in {source} are not the ones the run was made with "
            "(same ids, other text, options or answers: content fingerprint differs)"
        )
    return by_id


def move_dataset(folder: Any, dataset: str, check: bool = True) -> str | None:
    """Read the run's questions from ``dataset`` from now on (its dataset moved), once they pass
    :func:`reload_questions`'s checks (``check=False``: put back a place recorded before); ``config.json``
    records the new place under the writer lock, as a resumed ``hcqr eval`` would. Returns the place recorded
    before, ``None`` if unchanged (nothing written).

    Raises:
        RunError: the questions there are not the run's, or the folder cannot be written (locked, read-only).
    """
    place = str(Path(dataset).resolve()) if Path(dataset).exists() else dataset
    before = folder.dataset
    if place == before:
        return None
    if check:
        reload_questions(folder, place)
    try:
        folder.set_dataset(place)
    except (RunError, OSError) as exc:
        raise RunError(f"the new place of the dataset is recorded in {folder.path / 'config.json'}: {exc}") from None
    return before


def recorded_sample(folder: Any, questions: list[Any], rows: list[dict[str, Any]]) -> list[Any] | None:
    """The run's question sample rebuilt from ``questions`` (the dataset's, in file order) so that its ids hash
    to the recorded ``ids_sha256``: drawn again with the recorded ``limit`` and ``seed``
    (:func:`hcqr_dspy.data.select`), or, once every question has a row, the answered ones in file order (a run
    over an explicit id list, or a file with questions added) or in the rows' order (a run with one question
    in flight answers in sample order). ``None`` when none gives the recorded ids."""
    from hcqr_dspy.data import select

    record = folder.questions_record
    drawn = select(questions, limit=record.get("limit"), seed=record.get("seed") or 0)
    candidates = [drawn]
    if len(rows) == record.get("count"):
        answered = {r["qid"] for r in rows}
        by_id = {q.qid: q for q in questions}
        candidates.append([q for q in questions if q.qid in answered])
        candidates.append([by_id[r["qid"]] for r in rows if r["qid"] in by_id])
    for sample in candidates:
        if question_fingerprint(sample)["ids_sha256"] == record.get("ids_sha256"):
            return sample
    return None


def rebuild_question_sample(folder: Any) -> list[str]:
    """Ids of every question the run was asked to answer, in run order; see :meth:`RunFolder.question_sample
    <hcqr_dspy.evaluation.run_folder.RunFolder.question_sample>`.

    Raises:
        RunError: the dataset cannot be read, or the rebuilt sample is not the recorded one.
    """
    from hcqr_dspy.data import select  # imports dspy: only a run's questions reloaded pay for it

    record = folder.questions_record
    by_id = folder.load_questions()
    sample = select(list(by_id.values()), limit=record.get("limit"), seed=record.get("seed") or 0)
    if question_fingerprint(sample)["ids_sha256"] != record.get("ids_sha256"):
        raise RunError(
            f"run {folder.path}: its question sample cannot be rebuilt from {folder.dataset} with limit "
            f"{record.get('limit')} and seed {record.get('seed')} (made with an explicit id list, or the file's "
            "questions added, removed or reordered since the run?); name the questions with --ids"
        )
    return [str(e.qid) for e in sample]
