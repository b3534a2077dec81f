"""A run's answer-step letter distributions: the rows' own, or those ``hcqr rescore`` added.

A row written by an evaluation holds ``option_probs`` (the answer step's probability of each option letter,
:mod:`hcqr_dspy.programs.answer_slot_probs`), ``gold_prob`` and, where they could not be had,
``option_probs_absent``. Rows without them (run folder format 1: :mod:`~hcqr_dspy.evaluation.folder_format`),
or written by an LM without log-probabilities, gain them from ``option_probs.jsonl`` (one record per question:
``qid``, ``option_probs``, ``gold_prob``, ``option_probs_absent``, ``scored_by``), which ``hcqr rescore`` fills by
teacher forcing.
"""

from __future__ import annotations

from typing import Any

from hcqr_dspy.errors import RunError


def with_option_probs(
    rows: list[dict[str, Any]], records: list[dict[str, Any]], source: str = "option_probs.jsonl"
) -> list[dict[str, Any]]:
    """``rows`` with each row's ``option_probs``, ``gold_prob`` and ``option_probs_absent`` taken from its
    rescoring record where the row has no distribution of its own (copies; rows are not changed).

    Raises:
        RunError: a record names a question the rows do not hold (a file copied from another run), or its
            distribution is not one (:func:`check_distribution`).
    """
    by_qid = {r["qid"]: r for r in records}
    foreign = sorted(set(by_qid) - {r["qid"] for r in rows})
    if foreign:
        raise RunError(
            f"{source} scores {len(foreign)} question(s) the run does not hold ({', '.join(foreign[:5])}); "
            "was it copied from another run?"
        )
    for record in records:
        check_distribution(record.get("option_probs"), f"{source}: question {record['qid']!r}")
    out = []
    for row in rows:
        record = by_qid.get(row["qid"])
        if row.get("option_probs") is None and record is not None:
            row = {**row, **{k: record.get(k) for k in ("option_probs", "gold_prob", "option_probs_absent")}}
        out.append(row)
    return out


def folder_rows_with_option_probs(folder: Any) -> list[dict[str, Any]]:
    """A :class:`~hcqr_dspy.evaluation.run_folder.RunFolder`'s rows merged with its rescoring records."""
    return with_option_probs(folder.rows(), folder.option_probs_table.read(), str(folder.option_probs_table.path))


def check_distribution(probs: Any, where: str) -> None:
    """Refuse what is not a letter distribution: a mapping of capital letters to probabilities in [0, 1]
    summing to 1 (within 1e-3, the records' rounding). ``None`` (absent) passes.

    Raises:
        RunError: naming ``where``.
    """
    if probs is None:
        return
    ok = (
        isinstance(probs, dict)
        and probs
        and all(isinstance(k, str) and len(k) == 1 and k.isupper() for k in probs)
        and all(isinstance(v, int | float) and 0 <= v <= 1 for v in probs.values())
        and abs(sum(probs.values()) - 1) <= 1e-3
    )
    if not ok:
        raise RunError(f"{where}: option_probs is not a distribution over option letters; repair or delete that line")
