"""Metrics over run records: accuracy, invalid-answer rate, cost per question and stage.

Accuracy counts an invalid answer (a reply that is not one of the option
letters) as wrong; invalid answers are also reported on their own and never
mapped to a default letter. Standard error of accuracy is the binomial
``sqrt(p (1 - p) / n)``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from hcqr_dspy.evaluation.evidence import evidence_summary


def accuracy_metric(example, prediction, trace=None) -> bool:
    """DSPy metric: the predicted letter equals the gold answer (invalid = wrong)."""
    return bool(getattr(prediction, "valid", False)) and prediction.answer == example.answer


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Aggregate run rows into metrics.

    Args:
        rows: Records written by :func:`hcqr_dspy.evaluation.answering.evaluate`.

    Returns:
        ``n``, ``accuracy``, ``accuracy_se`` (over the rows with a gold answer; absent when
        none has one, and ``labelled`` counts them when some lack one), ``invalid_rate``, ``invalid``,
        means per question of ``lm_calls`` (served by the model),
        ``cached_lm_calls`` (served by DSPy's cache), ``prompt_tokens``,
        ``completion_tokens``, ``seconds``, and the same per stage as
        ``<stage>_<field>``; ``invalid_<stage>_<cause>`` counts of invalid
        questions by the stage and cause of the bad reply; the fallbacks of
        :func:`fallback_summary` (``fallback_<name>_questions`` / ``_rate`` /
        ``_total`` and ``query_share_<source>``); the judge-free evidence metrics
        of :func:`hcqr_dspy.evaluation.evidence.evidence_summary` (``gold_coverage``,
        ``distractor_coverage``, ``evidence_margin``); for HCQR rows also
        ``hypothesis_accuracy`` (over questions with a parsed hypothesis),
        ``hypothesis_invalid`` (questions whose hypothesis reply could not be
        parsed) and ``answer_changed_rate`` (final answer differs from the hypothesis).
    """
    rows = list(rows)
    n = len(rows)
    if n == 0:
        return {"n": 0}
    invalid = sum(not r["valid"] for r in rows)
    out: dict[str, float] = {"n": n}
    labelled = [r for r in rows if r.get("gold") is not None]
    if labelled:  # accuracy over the questions with a gold answer (all of them in an evaluation)
        correct = sum(bool(r["correct"]) for r in labelled)
        acc = correct / len(labelled)
        out.update(correct=correct, accuracy=acc, accuracy_se=math.sqrt(acc * (1 - acc) / len(labelled)))
    if len(labelled) < n:
        out["labelled"] = len(labelled)
    out.update(invalid=invalid, invalid_rate=invalid / n)
    for field in ("lm_calls", "cached_lm_calls", "prompt_tokens", "completion_tokens", "seconds"):
        out[f"mean_{field}"] = sum(r.get(field) or 0 for r in rows) / n
    per_stage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        for name, st in (r.get("stages") or {}).items():
            for field, value in st.items():
                per_stage[name][field] += value or 0
    for name, fields in per_stage.items():
        for field, total in fields.items():
            out[f"{name}_mean_{field}"] = total / n
    for r in rows:
        if not r["valid"]:
            key = f"invalid_{r.get('invalid_stage') or 'unknown'}_{r.get('invalid_cause') or 'unknown'}"
            out[key] = out.get(key, 0) + 1
    for name, f in fallback_summary(rows).items():
        if name.startswith("query_share_"):
            out[name] = f
        else:
            out.update({f"fallback_{name}_{k}": v for k, v in f.items()})
    out.update(evidence_summary(rows))
    invalid_h = sum(1 for r in rows if (r.get("fallbacks") or {}).get("hypothesis_failed"))
    if invalid_h:
        out["hypothesis_invalid"] = invalid_h
    changes = hypothesis_changes(rows)
    if changes["with_hypothesis"]:
        n_h = changes["with_hypothesis"]
        out["hypothesis_accuracy"] = changes["hypothesis_correct"] / n_h
        out["answer_changed_rate"] = (changes["fixed"] + changes["broke"] + changes["changed_wrong_to_wrong"]) / n_h
        out.update(
            {f"hypothesis_{k}": v for k, v in changes.items() if k not in ("with_hypothesis", "hypothesis_correct")}
        )
    return out


def fallback_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Every fallback the rows' method took, added up.

    Each row's ``fallbacks`` maps a fallback to how many units it affected in
    that question (queries, passages, or 1): ``hypothesis_failed`` and
    ``queries_from_question`` (HCQR, HyDE), ``rewrite_failed`` and
    ``queries_from_hypothesis`` (HCQR), ``queries_collapsed`` (HCQR: queries
    that repeated another, so the distinct ones were searched deeper to top
    the context up) and ``budget_unfilled`` (HCQR: passages the top-up still
    fell short of, the index having too few matches), ``passage_failed`` (HyDE),
    ``rerank_parse_failures`` (Rerank-RAG), ``judge_vote_scored`` and
    ``judge_failures`` (MAIN-RAG), ``context_cut`` and ``passages_dropped``
    (any method whose context the token budget cut).

    Returns:
        ``{name: {"questions": n, "rate": n / rows, "total": units}}`` for every
        fallback seen, and ``query_share_<source>``: the share of all queries
        sent to the retriever that came from each source (``rewrite``,
        ``hypothesis``, ``question``, ``passage``).
    """
    rows = list(rows)
    n = len(rows)
    out: dict[str, Any] = {}
    if not n:
        return out
    names = sorted({k for r in rows for k in (r.get("fallbacks") or {})})
    for name in names:
        counts = [int((r.get("fallbacks") or {}).get(name) or 0) for r in rows]
        questions = sum(c > 0 for c in counts)
        out[name] = {"questions": questions, "rate": questions / n, "total": sum(counts)}
    sources = [s for r in rows for s in (r.get("query_sources") or [])]
    for source in sorted(set(sources)):
        out[f"query_share_{source}"] = sources.count(source) / len(sources)
    return out


HYPOTHESIS_OUTCOMES = ("kept_right", "kept_wrong", "fixed", "broke", "changed_wrong_to_wrong", "invalid_answer")


def is_correct(prediction: str | None, valid: bool, gold: str | None) -> bool | None:
    """A valid answer equal to the gold letter (an invalid answer is wrong); ``None`` without a gold answer."""
    if gold is None:
        return None
    return bool(valid) and prediction == gold


def hypothesis_outcome(hypothesis: str | None, prediction: str | None, valid: bool, gold: str | None) -> str | None:
    """How one final answer relates to HCQR's working hypothesis: one of :data:`HYPOTHESIS_OUTCOMES`
    (``kept_right`` / ``kept_wrong``: answer = hypothesis; ``fixed``: wrong hypothesis, right answer;
    ``broke``: right hypothesis, wrong answer; ``changed_wrong_to_wrong``; ``invalid_answer``: no valid
    final answer); ``None`` without a hypothesis or a gold answer."""
    if not hypothesis or gold is None:
        return None
    h_right = hypothesis == gold
    if not valid:
        return "invalid_answer"
    if prediction == hypothesis:
        return "kept_right" if h_right else "kept_wrong"
    if prediction == gold:
        return "fixed"
    return "broke" if h_right else "changed_wrong_to_wrong"


def hypothesis_changes(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How the final answer relates to HCQR's working hypothesis, counted over rows
    (:func:`hypothesis_outcome` of each).

    Counts over rows that have a hypothesis (HCQR runs): ``with_hypothesis``,
    ``hypothesis_correct`` and each of :data:`HYPOTHESIS_OUTCOMES`.
    """
    c = dict.fromkeys(("with_hypothesis", "hypothesis_correct", *HYPOTHESIS_OUTCOMES), 0)
    for r in rows:
        h = (r.get("hypothesis") or {}).get("working_hypothesis")
        outcome = hypothesis_outcome(h, r["prediction"], r["valid"], r["gold"])
        if outcome is None:
            continue
        c["with_hypothesis"] += 1
        c["hypothesis_correct"] += h == r["gold"]
        c[outcome] += 1
    return c
