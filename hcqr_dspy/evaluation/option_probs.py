"""A run's answer-step letter distributions: the rows' own, or those ``hcqr rescore`` added.

A row written by an evaluation holds ``option_probs`` (the answer step's probability of each option letter,
:mod:`hcqr_dspy.programs.option_probs`), ``gold_prob`` and, where they could not be had,
``option_probs_absent``. Rows written before that existed, or by an LM without log-probabilities, gain
them from ``option_probs.jsonl`` (one record per question: ``qid``, ``option_probs``, ``gold_prob``,
``option_probs_absent``, ``scored_by``), which ``hcqr rescore`` fills by teacher forcing.
"""

from __future__ import annotations

from typing import Any

from hcqr_dspy.errors import RunError


def with_option_probs(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each row's ``option_probs``, ``gold_prob`` and ``option_probs_absent`` taken from its
    rescoring record where the row has no distribution of its own (copies; rows are not changed).

    Raises:
        RunError: a record names a question the rows do not hold (a file copied from another run).
    """
    by_qid = {r["qid"]: r for r in records}
    foreign = sorted(set(by_qid) - {r["qid"] for r in rows})
    if foreign:
        raise RunError(
            f"option_probs.jsonl scores {len(foreign)} question(s) the run does not hold ({', '.join(foreign[:5])})"
        )
    out = []
    for row in rows:
        record = by_qid.get(row["qid"])
        if row.get("option_probs") is None and record is not None:
            row = {**row, **{k: record.get(k) for k in ("option_probs", "gold_prob", "option_probs_absent")}}
        out.append(row)
    return out


def folder_rows_with_option_probs(folder: Any) -> list[dict[str, Any]]:
    """A :class:`~hcqr_dspy.evaluation.run_folder.RunFolder`'s rows merged with its rescoring records."""
    return with_option_probs(folder.rows(), folder.option_probs_table.read())
