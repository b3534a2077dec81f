"""Compare evaluation runs over the same questions: same queries, same hits, same answers?

Usage:
    python bench/parity.py REFERENCE_RUN OTHER_RUN [OTHER_RUN ...] [--json OUT]

Each argument is a run folder of ``hcqr eval`` (read through
:class:`hcqr_dspy.evaluation.run_folder.RunFolder`). Per question of the reference and
each other run: whether the queries are equal, whether the passages the
answer step saw are equal (ids in order; and their fused scores within
1e-4), how many of them the two runs share whatever the order (the top-k
overlap), and whether the predictions are equal. The runs must be over the same
questions (the question fingerprints of their configs are compared).

Exit status 1 when any question whose hits agree has a different answer, a
question is missing, or the runs are over different questions (or a folder
is not a run), else 0: Milvus issue's "done when",
"gives the same answers as the faiss Flat index on the same questions when the
hits agree".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCORE_TOLERANCE = 1e-4


def compare(reference, other) -> dict:
    """Per-question comparison of two run folders' rows."""
    ref_rows = {r["qid"]: r for r in reference.rows()}
    rows = {r["qid"]: r for r in other.rows()}
    questions = []
    for qid, a in ref_rows.items():
        b = rows.get(qid)
        if b is None:
            questions.append({"qid": qid, "missing": True})
            continue
        ids_a, ids_b = [p["id"] for p in a["passages"]], [p["id"] for p in b["passages"]]
        scores_close = len(ids_a) == len(ids_b) and all(
            abs(p["score"] - q["score"]) <= SCORE_TOLERANCE for p, q in zip(a["passages"], b["passages"])
        )
        questions.append(
            {
                "qid": qid,
                "same_queries": a["queries"] == b["queries"],
                "same_hits": ids_a == ids_b,
                "overlap": len(set(ids_a) & set(ids_b)),
                "k": len(ids_a),
                "same_scores": scores_close,
                "same_answer": a["prediction"] == b["prediction"],
                "answers": [a["prediction"], b["prediction"]],
                "answer_lm_calls_cached": b.get("stages", {}).get("answer", {}).get("cached_lm_calls"),
            }
        )
    agree = [q for q in questions if q.get("same_hits")]
    return {
        "reference": str(reference.path),
        "other": str(other.path),
        "reference_index": reference.config.get("index", {}).get("path"),
        "other_index": other.config.get("index", {}).get("path"),
        "questions": len(questions),
        "missing": sum(1 for q in questions if q.get("missing")),
        "same_queries": sum(1 for q in questions if q.get("same_queries")),
        "same_hits": len(agree),
        "overlap": sum(q["overlap"] for q in questions if not q.get("missing")),
        "overlap_of": sum(q["k"] for q in questions if not q.get("missing")),
        "same_scores": sum(1 for q in questions if q.get("same_scores")),
        "same_answers": sum(1 for q in questions if q.get("same_answer")),
        "same_answers_where_hits_agree": sum(1 for q in agree if q["same_answer"]),
        "per_question": questions,
    }


def main(argv=None) -> int:
    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.evaluation.same_questions import check_same_questions

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", help="the reference run folder (e.g. faiss Flat)")
    ap.add_argument("others", nargs="+", help="run folders to compare with it")
    ap.add_argument("--json", default=None, help="write the comparison here")
    args = ap.parse_args(argv)
    try:
        folders = [RunFolder.open(p) for p in [args.reference, *args.others]]
        check_same_questions(folders, [f.rows() for f in folders])  # raises RunError naming both question sets
    except HCQRError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 1
    results = [compare(folders[0], f) for f in folders[1:]]
    ok = True
    for r in results:
        print(
            f"{r['other']} vs {r['reference']}: {r['questions']} questions, {r['missing']} missing; "
            f"same queries {r['same_queries']}, same hits {r['same_hits']} (scores within {SCORE_TOLERANCE}: "
            f"{r['same_scores']}), top-k overlap {r['overlap']} of {r['overlap_of']} passages, "
            f"same answers {r['same_answers']}; where the hits agree, same answers "
            f"{r['same_answers_where_hits_agree']} of {r['same_hits']}"
        )
        for q in r["per_question"]:
            print(
                f"   {q['qid']}: "
                + (
                    "missing"
                    if q.get("missing")
                    else f"queries {'=' if q['same_queries'] else '≠'}, hits {'=' if q['same_hits'] else '≠'} "
                    f"(overlap {q['overlap']}/{q['k']}), "
                    f"answer {q['answers'][0]} / {q['answers'][1]}, answer call cached: {q['answer_lm_calls_cached']}"
                )
            )
        ok = ok and not r["missing"] and r["same_answers_where_hits_agree"] == r["same_hits"]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
