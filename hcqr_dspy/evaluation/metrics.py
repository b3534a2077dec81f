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


def accuracy_metric(example, prediction, trace=None) -> bool:
    """DSPy metric: the predicted letter equals the gold answer (invalid = wrong)."""
    return bool(getattr(prediction, "valid", False)) and prediction.answer == example.answer


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Aggregate run rows into metrics, reading ``rows`` once (:class:`MetricsAccumulator`; a generator over a
    ``predictions.jsonl`` of any length is summarized holding one row at a time).

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
        parsed) and ``answer_changed_rate`` (final answer differs from the hypothesis); ``mean_cpu_pressure`` and
        ``cpu_pressure_rows``: the CPU contention over the rows that measured it
        (:mod:`hcqr_dspy.evaluation.cpu_pressure`), as the share of their seconds in which some task waited for a
        CPU (each row's share weighted by its seconds), and how many rows measured it (both absent when none did).
    """
    acc = MetricsAccumulator()
    for r in rows:
        acc.add(r)
    return acc.metrics()


COST_FIELDS = ("lm_calls", "cached_lm_calls", "prompt_tokens", "completion_tokens", "seconds")
"""A row's cost fields, averaged per question as ``mean_<field>`` (:func:`summarize`)."""


class MetricsAccumulator:
    """The running sums behind :func:`summarize` and :func:`fallback_summary`: :meth:`add` one row at a time, in any
    order, then read :meth:`metrics` (or :meth:`fallbacks`). It holds counts and sums per metric name, never the rows,
    so its size does not grow with their number. Sums of floats (``seconds``, evidence shares) follow the rows' order:
    rows added in another order give the same figures up to float rounding (about 1e-15 relative)."""

    def __init__(self) -> None:
        self.n = self.invalid = self.labelled = self.correct = self.hypothesis_invalid = 0
        self.costs = dict.fromkeys(COST_FIELDS, 0)
        self.stages: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.invalid_causes: dict[str, int] = {}
        self.fallback_counts: dict[str, list[int]] = {}  # name -> [questions, total units]
        self.sources: dict[str, int] = {}  # query source -> queries
        self.evidence_n, self.gold_mentioned, self.distractor_share = 0, 0, 0.0
        self.changes = dict.fromkeys(("with_hypothesis", "hypothesis_correct", *HYPOTHESIS_OUTCOMES), 0)
        self.pressure_n, self.pressure_seconds, self.stalled_seconds = 0, 0.0, 0.0

    def add(self, r: dict[str, Any]) -> None:
        """Count one row (a record of ``predictions.jsonl``)."""
        self.n += 1
        self.invalid += not r["valid"]
        if r.get("gold") is not None:
            self.labelled += 1
            self.correct += bool(r["correct"])
        for field in COST_FIELDS:
            self.costs[field] += r.get(field) or 0
        if (pressure := r.get("cpu_pressure")) is not None:
            self.pressure_n += 1
            self.pressure_seconds += r.get("seconds") or 0
            self.stalled_seconds += pressure * (r.get("seconds") or 0)
        for name, st in (r.get("stages") or {}).items():
            for field, value in st.items():
                self.stages[name][field] += value or 0
        if not r["valid"]:
            key = f"invalid_{r.get('invalid_stage') or 'unknown'}_{r.get('invalid_cause') or 'unknown'}"
            self.invalid_causes[key] = self.invalid_causes.get(key, 0) + 1
        fallbacks = r.get("fallbacks") or {}
        for name, units in fallbacks.items():
            c = self.fallback_counts.setdefault(name, [0, 0])
            c[0] += int(units or 0) > 0
            c[1] += int(units or 0)
        self.hypothesis_invalid += bool(fallbacks.get("hypothesis_failed"))
        for source in r.get("query_sources") or []:
            self.sources[source] = self.sources.get(source, 0) + 1
        if e := r.get("evidence"):
            self.evidence_n += 1
            self.gold_mentioned += e["gold_mentioned"]
            self.distractor_share += e["distractors_mentioned"] / e["distractors"] if e["distractors"] else 0.0
        h = (r.get("hypothesis") or {}).get("working_hypothesis")
        outcome = hypothesis_outcome(h, r["prediction"], r["valid"], r["gold"])
        if outcome is not None:
            self.changes["with_hypothesis"] += 1
            self.changes["hypothesis_correct"] += h == r["gold"]
            self.changes[outcome] += 1

    def fallbacks(self) -> dict[str, Any]:
        """:func:`fallback_summary` of the rows added."""
        out: dict[str, Any] = {}
        if not self.n:
            return out
        for name in sorted(self.fallback_counts):
            questions, total = self.fallback_counts[name]
            out[name] = {"questions": questions, "rate": questions / self.n, "total": total}
        queries = sum(self.sources.values())
        for source in sorted(self.sources):
            out[f"query_share_{source}"] = self.sources[source] / queries
        return out

    def metrics(self) -> dict[str, float]:
        """:func:`summarize` of the rows added."""
        n = self.n
        if n == 0:
            return {"n": 0}
        out: dict[str, float] = {"n": n}
        if self.labelled:  # accuracy over the questions with a gold answer (all of them in an evaluation)
            acc = self.correct / self.labelled
            out.update(correct=self.correct, accuracy=acc, accuracy_se=math.sqrt(acc * (1 - acc) / self.labelled))
        if self.labelled < n:
            out["labelled"] = self.labelled
        out.update(invalid=self.invalid, invalid_rate=self.invalid / n)
        for field, total in self.costs.items():
            out[f"mean_{field}"] = total / n
        if self.pressure_n and self.pressure_seconds > 0:
            out.update(
                mean_cpu_pressure=self.stalled_seconds / self.pressure_seconds, cpu_pressure_rows=self.pressure_n
            )
        for name, fields in self.stages.items():
            for field, total in fields.items():
                out[f"{name}_mean_{field}"] = total / n
        out.update(self.invalid_causes)
        for name, f in self.fallbacks().items():
            if name.startswith("query_share_"):
                out[name] = f
            else:
                out.update({f"fallback_{name}_{k}": v for k, v in f.items()})
        if self.evidence_n:  # evidence_summary's figures
            gold, distractor = self.gold_mentioned / self.evidence_n, self.distractor_share / self.evidence_n
            out.update(
                evidence_n=self.evidence_n,
                gold_coverage=gold,
                distractor_coverage=distractor,
                evidence_margin=gold - distractor,
            )
        if self.hypothesis_invalid:
            out["hypothesis_invalid"] = self.hypothesis_invalid
        changes = self.changes
        if changes["with_hypothesis"]:
            n_h = changes["with_hypothesis"]
            out["hypothesis_accuracy"] = changes["hypothesis_correct"] / n_h
            out["answer_changed_rate"] = (changes["fixed"] + changes["broke"] + changes["changed_wrong_to_wrong"]) / n_h
            out.update(
                {f"hypothesis_{k}": v for k, v in changes.items() if k not in ("with_hypothesis", "hypothesis_correct")}
            )
        return out


def fallback_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Every fallback the rows' method took, added up (reading ``rows`` once: :class:`MetricsAccumulator`).

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
    acc = MetricsAccumulator()
    for r in rows:
        acc.add(r)
    return acc.fallbacks()


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
