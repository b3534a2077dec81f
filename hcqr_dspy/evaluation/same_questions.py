"""Which runs can be compared question by question (:func:`check_same_questions`): runs made over the same
questions, holding the same question ids (or compared on those every run has answered)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.run_folder import RunFolder


def check_same_questions(
    folders: Sequence[RunFolder], rows: Sequence[list[dict[str, Any]]], common: bool = False
) -> list[str]:
    """The shared question ids (in the first run's order) of runs that must cover the same questions.

    Two runs match when they were made over the same questions: the content
    fingerprint of their question sets (ids, text, options, answer;
    :func:`~hcqr_dspy.evaluation.fingerprints.question_fingerprint`)
    is equal. Runs whose record lacks the content fingerprint (run folder
    format 1) are matched by dataset and id hash. They must also hold
    the same question ids, unless ``common`` is set: then runs still under way
    (a study resumed session by session) are compared on the questions every one
    of them has answered.

    Raises:
        RunError: another question set (datasets and fingerprints named); different
            ids without ``common``; no question answered by every run with it.
    """
    first = [r["qid"] for r in rows[0]]
    q0 = folders[0].questions_record
    shared = set(first)
    for folder, run_rows in zip(folders[1:], rows[1:]):
        ids = [r["qid"] for r in run_rows]
        if set(ids) != set(first) and not common:
            only_a = sorted(set(first) - set(ids))[:5]
            only_b = sorted(set(ids) - set(first))[:5]
            raise RunError(
                f"runs cover different questions: {folders[0].path} ({len(first)}) vs {folder.path} ({len(ids)}); "
                f"only in the first: {only_a or '-'}; only in the second: {only_b or '-'}. "
                "Compare runs made with the same dataset, --limit/--seed or --ids (finish interrupted runs first, "
                "or compare runs under way on the questions all have answered with --common)."
            )
        shared &= set(ids)
        q = folder.questions_record
        a, b = q0.get("content_sha256"), q.get("content_sha256")
        same = (
            a == b
            if a and b
            else (folders[0].dataset == folder.dataset and q0.get("ids_sha256") == q.get("ids_sha256"))
        )
        if not same:
            what = "share question ids but not questions" if set(ids) & set(first) else "were made over other questions"
            raise RunError(
                f"runs {what}: {folders[0].path} was made over {folders[0].dataset} "
                f"(questions {str(a or q0.get('ids_sha256'))[:12]}), {folder.path} over {folder.dataset} "
                f"(questions {str(b or q.get('ids_sha256'))[:12]}); a paired comparison needs the same questions"
            )
    if not shared:
        raise RunError("no question has been answered by every run: " + ", ".join(str(f.path) for f in folders))
    return [qid for qid in first if qid in shared]
