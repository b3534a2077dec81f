"""Judge-free evidence metrics: does the context a method retrieved mention the answer, and the distractors?

No LM judges here; only the question's labels and the passages' text.

* **Option mentions.** An option is *mentioned* by a context when every content
  word of its text (lower-cased word tokens, without one-letter tokens and
  without bm25s' extended English stopword list ``STOPWORDS_EN_PLUS``,
  Snowball-stemmed with PyStemmer's English stemmer, as BM25 indexing stems,
  :mod:`hcqr_dspy.retrieval.bm25`) occurs in one passage. Per
  question: whether the gold option is mentioned, and how many distractors
  are. Options without content words (``yes``/``no``/``maybe``, letter lists)
  cannot be mentioned; such questions are left out (``evidence`` is ``None``).
  Per run: *gold coverage* (share of questions whose context mentions the
  gold option), *distractor coverage* (mean share of a question's distractors
  mentioned) and their difference; ``hcqr compare`` tests them between methods
  on the same questions (exact McNemar on gold mentions; Wilcoxon signed-rank
  on the per-question difference).
* **Relevance judgments.** Where a question set ships qrels (BEIR-style
  ``{qid: {passage_id: relevance}}``, or ``{qid: [passage_id, ...]}`` meaning
  relevance 1; e.g. ``data/demo/qrels.json`` beside the demo questions),
  recall@k (k = the method's budget, 15 by default) and nDCG@10 of each
  question's fused context (every fused passage, ranked by fusion), computed
  by ir-measures (MacAvaney et al. 2022; trec_eval's definitions through
  pytrec_eval), never by code written here.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from hcqr_dspy.config import read_json
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.signed_rank import signed_rank_p

QRELS_FILE = "qrels.json"


@lru_cache(maxsize=1)
def _analyzer():
    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return Stemmer.Stemmer("english"), frozenset(STOPWORDS_EN_PLUS)


def content_stems(text: str) -> frozenset[str]:
    """The stemmed content words of ``text`` (see the module docstring)."""
    stemmer, stop = _analyzer()
    words = [w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 1 and w not in stop]
    return frozenset(stemmer.stemWords(words))


def option_stems(text: str) -> frozenset[str]:
    """The stemmed content words of an option; empty for a content-free option
    (:func:`~hcqr_dspy.programs.queries.is_content_free`: yes/no/maybe, letter lists)."""
    from hcqr_dspy.programs.queries import is_content_free  # imports dspy: only measuring evidence pays for it

    return frozenset() if is_content_free(text) else content_stems(text)


def mentions(option_text: str, passages: Iterable[str]) -> bool:
    """Whether one of ``passages`` holds every content word of ``option_text`` (False when it has none)."""
    need = option_stems(option_text)
    if not need:
        return False
    return any(need <= content_stems(p) for p in passages)


def question_evidence(options: dict[str, str], answer: str, passages: Sequence[str]) -> dict[str, Any] | None:
    """One question's option mentions in its context.

    Args:
        options: ``{letter: text}``.
        answer: The gold letter.
        passages: The texts the answer step saw.

    Returns:
        ``{"gold_mentioned": bool, "distractors_mentioned": int, "distractors": int}`` over the
        options that have content words, or ``None`` when the gold option has none.
    """
    if not option_stems(options[answer]):
        return None
    stems = [content_stems(p) for p in passages]

    def hit(text: str) -> bool:
        need = option_stems(text)
        return bool(need) and any(need <= s for s in stems)

    distractors = [t for k, t in options.items() if k != answer and option_stems(t)]
    return {
        "gold_mentioned": hit(options[answer]),
        "distractors_mentioned": sum(hit(t) for t in distractors),
        "distractors": len(distractors),
    }


def evidence_summary(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per-run evidence metrics from rows' ``evidence`` (retrieval methods only).

    Returns:
        ``evidence_n`` (questions with a measurable gold option), ``gold_coverage``,
        ``distractor_coverage`` (mean over questions of distractors mentioned /
        distractors, questions without distractor content words counting 0) and
        ``evidence_margin`` = gold − distractor coverage; ``{}`` when no row has evidence.
    """
    ev = [r["evidence"] for r in rows if r.get("evidence")]
    if not ev:
        return {}
    n = len(ev)
    gold = sum(e["gold_mentioned"] for e in ev) / n
    distractor = sum(e["distractors_mentioned"] / e["distractors"] if e["distractors"] else 0.0 for e in ev) / n
    return {
        "evidence_n": n,
        "gold_coverage": gold,
        "distractor_coverage": distractor,
        "evidence_margin": gold - distractor,
    }


def question_margin(e: dict[str, Any]) -> float:
    """One question's gold mention (0/1) minus its share of distractors mentioned."""
    return float(e["gold_mentioned"]) - (e["distractors_mentioned"] / e["distractors"] if e["distractors"] else 0.0)


def paired_evidence_tests(reference: dict[str, dict | None], other: dict[str, dict | None]) -> dict[str, Any] | None:
    """Paired tests of two runs' evidence on the questions both measured.

    Gold mentions: exact McNemar (``statsmodels``). Per-question margins
    (:func:`question_margin`): Wilcoxon signed-rank (``scipy.stats.wilcoxon``'s p-value,
    :func:`~hcqr_dspy.evaluation.signed_rank.signed_rank_p`; zero differences dropped, two-sided; ``p = 1``
    when every difference is 0).

    Returns:
        ``n``, ``gold_b`` / ``gold_c`` (reference mentions the gold option and the other not / the
        reverse), ``gold_p``, ``margin_mean_diff`` (other − reference), ``margin_sd`` (the standard deviation of
        the per-question margin differences, ``ddof=1``; ``None`` for one question) and ``margin_p``; ``None``
        when no question has evidence in both.
    """
    from statsmodels.stats.contingency_tables import mcnemar

    qids = [q for q in reference if reference.get(q) and other.get(q)]
    if not qids:
        return None
    a = [reference[q]["gold_mentioned"] for q in qids]
    b = [other[q]["gold_mentioned"] for q in qids]
    table = [
        [sum(x and y for x, y in zip(a, b)), sum(x and not y for x, y in zip(a, b))],
        [sum(y and not x for x, y in zip(a, b)), sum(not x and not y for x, y in zip(a, b))],
    ]
    gold_b, gold_c = table[0][1], table[1][0]
    gold_p = 1.0 if gold_b + gold_c == 0 else float(mcnemar(table, exact=True).pvalue)
    diffs = [question_margin(other[q]) - question_margin(reference[q]) for q in qids]
    margin_p = 1.0 if not any(diffs) else signed_rank_p(diffs)
    return {
        "n": len(qids),
        "gold_b": gold_b,
        "gold_c": gold_c,
        "gold_p": gold_p,
        "margin_mean_diff": sum(diffs) / len(diffs),
        "margin_sd": statistics.stdev(diffs) if len(diffs) > 1 else None,
        "margin_p": margin_p,
    }


def load_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Relevance judgments as ir-measures takes them: ``{qid: {passage_id: relevance}}``.

    Accepts BEIR's ``{qid: {passage_id: relevance}}`` or ``{qid: [passage_id, ...]}`` (relevance 1).

    Raises:
        HCQRError: unreadable, not JSON, or of another shape (one line naming the file).
    """
    path = Path(path)
    raw = read_json(path, HCQRError, "qrels")
    if not isinstance(raw, dict):
        raise HCQRError(f"qrels {path}: expected {{qid: {{passage_id: relevance}}}} or {{qid: [passage_id, ...]}}")
    out: dict[str, dict[str, int]] = {}
    for qid, rel in raw.items():
        if isinstance(rel, list) and all(isinstance(p, str) for p in rel):
            out[str(qid)] = {p: 1 for p in rel}
        elif isinstance(rel, dict):
            bad = next(((p, v) for p, v in rel.items() if not isinstance(v, int) or isinstance(v, bool)), None)
            if bad is not None:
                raise HCQRError(
                    f"qrels {path}: question {qid!r}, passage {bad[0]!r} has relevance {bad[1]!r}; "
                    "relevance must be a whole number (0 = not relevant)"
                )
            out[str(qid)] = {str(p): int(v) for p, v in rel.items()}
        else:
            raise HCQRError(
                f"qrels {path}: question {qid!r} has {type(rel).__name__}; expected a list of passage "
                "ids or a {passage_id: relevance} object"
            )
    return out


def qrels_beside(dataset: str | Path) -> Path | None:
    """The qrels file shipped beside a question file (``qrels.json`` in its folder), if any."""
    p = Path(dataset)
    candidate = p.parent / QRELS_FILE if p.suffix else None
    return candidate if candidate is not None and candidate.is_file() else None


def fused_ranking(row: dict[str, Any]) -> dict[str, float]:
    """A row's fused passages (shown, then dropped by the budget) as ``{passage_id: score}`` by rank
    (``n - position``), so evaluation ranks them in fusion order whatever the fusion's own scores."""
    fused = list(row.get("passages") or []) + list(row.get("dropped_passages") or [])
    n = len(fused)
    return {p["id"]: float(n - i) for i, p in enumerate(fused)}


def qrels_metrics(rows: Iterable[dict[str, Any]], qrels: dict[str, dict[str, int]], k: int = 15) -> dict[str, Any]:
    """Recall@k and nDCG@10 of the rows' fused contexts against ``qrels``, by ir-measures.

    Questions absent from ``qrels``, or with no passage of relevance > 0 there,
    are left out (trec_eval's convention: recall is undefined for them) and
    the latter counted; a judged question that retrieved nothing scores 0.

    Returns:
        ``qrels_n``, ``recall_at_{k}``, ``ndcg_at_10`` (means over judged questions),
        ``qrels_no_relevant`` (questions left out for having no relevant passage) and
        ``per_query``: ``{qid: {"recall": r, "ndcg": n}}``; ``{}`` when no row is judged.
    """
    import ir_measures
    from ir_measures import R, nDCG

    listed = [r for r in rows if r["qid"] in qrels]
    rows = [r for r in listed if any(v > 0 for v in qrels[r["qid"]].values())]
    if not rows:
        return {}
    run = {r["qid"]: fused_ranking(r) or {"__none__": 0.0} for r in rows}
    judged = {r["qid"]: qrels[r["qid"]] for r in rows}
    measures = [R @ k, nDCG @ 10]
    per: dict[str, dict[str, float]] = {q: {"recall": 0.0, "ndcg": 0.0} for q in judged}
    for m in ir_measures.iter_calc(measures, judged, run):
        per[m.query_id]["recall" if m.measure == R @ k else "ndcg"] = float(m.value)
    n = len(per)
    return {
        "qrels_n": n,
        f"recall_at_{k}": sum(v["recall"] for v in per.values()) / n,
        "ndcg_at_10": sum(v["ndcg"] for v in per.values()) / n,
        "qrels_no_relevant": len(listed) - n,
        "per_query": per,
    }
