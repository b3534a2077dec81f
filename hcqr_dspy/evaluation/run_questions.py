"""A run's questions reloaded from its dataset (:meth:`~hcqr_dspy.evaluation.run_folder.RunFolder.load_questions`
and :meth:`~hcqr_dspy.evaluation.run_folder.RunFolder.question_sample`), checked against what the run recorded.

``folder`` is a :class:`~hcqr_dspy.evaluation.run_folder.RunFolder` (its ``path``, ``dataset``,
``questions_record`` and ``rows()`` are read); this module does not import it.
"""

from __future__ import annotations

from typing import Any

from hcqr_dspy.errors import HCQRError, RunError
from hcqr_dspy.evaluation.fingerprints import question_fingerprint


def reload_questions(folder: Any) -> dict[str, Any]:
    """The run's questions (from its dataset), by id; see :meth:`RunFolder.load_questions
    <hcqr_dspy.evaluation.run_folder.RunFolder.load_questions>`.

    Raises:
        RunError: the dataset cannot be read any more, or lacks a question the run answered.
    """
    from hcqr_dspy.data import load_questions  # imports dspy: only a run's questions reloaded pay for it

    try:
        questions = load_questions(folder.dataset, labelled=folder.questions_record.get("labelled", True))
    except HCQRError as exc:
        raise RunError(f"run {folder.path}: its dataset cannot be read ({exc})") from None
    by_id = {q.qid: q for q in questions}
    rows = folder.rows()
    missing = [r["qid"] for r in rows if r["qid"] not in by_id]
    if missing:
        raise RunError(f"run {folder.path}: question(s) {', '.join(missing[:5])} are not in {folder.dataset} any more")
    return by_id


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
            f"{record.get('limit')} and seed {record.get('seed')} (made with an explicit id list?); "
            "name the questions with --ids"
        )
    return [str(e.qid) for e in sample]
