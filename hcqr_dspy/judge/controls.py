"""The DUR judge's controls, and when they say a run's DUR cannot be trusted.

With every question's judgment the judge also labels

* a *positive control*: a one-document context built to decide the question,
  stating the gold option and why, written from the question's own key terms,
  gold answer and option texts (:func:`positive_control_document`);
* a *negative control*: the context another question of the same run retrieved
  (a seeded derangement of the judged questions, preferring one whose context
  does not mention this question's gold option; :func:`negative_control_pairs`).

A DUR means little if the judge calls everything useful: ``hcqr compare`` flags a DUR whose judge calls more
than 20% of negative controls useful or fewer than 80% of positive controls (:data:`CONTROL_LIMITS`,
:func:`control_flags`).
"""

from __future__ import annotations

import random
from typing import Any

from hcqr_dspy.programs.context import format_document
from hcqr_dspy.programs.queries import key_terms

# compare flags a DUR whose judge labels more than 20% of negative controls useful or fewer than 80% of
# positive controls (a judge outside them cannot tell decision-useful contexts apart).
CONTROL_LIMITS = {"negative_max": 0.20, "positive_min": 0.80}
CONTROL_SEED = 0


def positive_control_document(question: str, options: dict[str, str], answer: str) -> str:
    """A one-document context that decides the question: it states the gold option and why.

    Written from the question's own key terms (:func:`~hcqr_dspy.programs.queries.key_terms`),
    its gold answer and its option texts; no knowledge is added, so a judge that
    reads it and still says NOT_USEFUL is not reading the context.
    """
    gold = options[answer]
    others = "; ".join(f"{k}. {v}" for k, v in options.items() if k != answer)
    text = (
        f"In the case described ({key_terms(question, max_words=24)}), the correct answer is {answer}. {gold}. "
        f"The findings described are explained by {gold}, which is therefore the answer; the other options "
        f"({others}) do not explain them and are wrong."
    )
    return format_document(1, gold, text)


def negative_control_pairs(
    rows: list[dict[str, Any]], mentions_gold, seed: int = CONTROL_SEED
) -> dict[str, str | None]:
    """For each judged question, the question of the same run whose context serves as its negative control.

    A seeded derangement (no question gets its own context): questions are
    shuffled with ``seed`` and each takes the context of the next one in that
    order, or, when that context mentions its gold option (``mentions_gold(qid,
    row)`` is true), the first later one that does not (wrapping around; the
    next one if all do).

    Returns:
        ``{qid: donor qid}``; ``None`` for a run with one judged question.
    """
    qids = [r["qid"] for r in rows]
    if len(qids) < 2:
        return {q: None for q in qids}
    order = qids[:]
    random.Random(seed).shuffle(order)
    by_qid = {r["qid"]: r for r in rows}
    out: dict[str, str | None] = {}
    for i, qid in enumerate(order):
        candidates = [order[(i + j) % len(order)] for j in range(1, len(order))]
        out[qid] = next((c for c in candidates if not mentions_gold(qid, by_qid[c])), candidates[0])
    return out


def control_flags(dur: dict[str, Any]) -> list[str]:
    """Why a run's DUR cannot be trusted, from its control rates (:data:`CONTROL_LIMITS`); ``[]`` if none.

    A judged run without control judgments (judged before controls existed) is flagged too.
    """
    if not dur.get("dur_n"):
        return []
    flags = []
    neg, pos = dur.get("dur_negative_control"), dur.get("dur_positive_control")
    if pos is None and neg is None:
        return ["no control judgments (judged without controls): the judge is unchecked"]
    if neg is not None and neg > CONTROL_LIMITS["negative_max"]:
        flags.append(
            f"the judge calls {neg:.0%} of negative controls (another question's context) useful "
            f"(> {CONTROL_LIMITS['negative_max']:.0%})"
        )
    if pos is not None and pos < CONTROL_LIMITS["positive_min"]:
        flags.append(
            f"the judge calls only {pos:.0%} of positive controls (a context stating the answer) useful "
            f"(< {CONTROL_LIMITS['positive_min']:.0%})"
        )
    return flags
