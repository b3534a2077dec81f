"""DUR and its shares from a run's judgments: label shares, invalid judgments, control rates, query roles; the
Wilson interval the reports put on them."""

from __future__ import annotations

from typing import Any

from hcqr_dspy.judge.labels import LABELS, USEFUL_LABELS

# The controls judged with every question (:mod:`hcqr_dspy.judge.controls`): ``<name>_label`` in a judgment.
CONTROLS = ("positive", "negative", "on_topic")


def wilson_interval(count: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``count / n`` (``statsmodels``' ``proportion_confint``,
    ``method="wilson"``), 95% by default; ``(0.0, 1.0)`` when ``n`` is 0."""
    if not n:
        return 0.0, 1.0
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(count, n, alpha=alpha, method="wilson")
    return float(lo), float(hi)


def dur_metrics(judgments: list[dict[str, Any]]) -> dict[str, Any]:
    """DUR and label shares over valid judgments; invalid judgments counted apart; control rates.

    Returns:
        ``dur_n`` (judged), ``dur_invalid``, ``dur`` (share ENTAILED or
        USEFUL among valid), ``dur_entailed`` / ``dur_useful`` /
        ``dur_not_useful`` shares; ``dur_positive_control``,
        ``dur_negative_control`` and ``dur_on_topic_control`` (the judge's
        ENTAILED-or-USEFUL rate on each control, over its valid control
        judgments, counted in ``dur_<control>_control_n``; absent for a control
        the judgments do not hold, as judgments recorded with ``controls: true`` hold no on-topic control);
        ``dur_on_topic_control_unbuilt`` (questions no on-topic control could be
        built for, when any); and for
        multi-query runs ``dur_role_q<i>``: among decision-useful contexts, the
        share holding a passage found by query i (in passage mode: a passage
        found by query i and itself labelled ENTAILED or USEFUL).
    """
    valid = [j for j in judgments if j["valid"]]
    out: dict[str, Any] = {"dur_n": len(judgments), "dur_invalid": len(judgments) - len(valid)}
    for side in CONTROLS:
        labels = [j.get(f"{side}_label") for j in judgments if j.get(f"{side}_label") in LABELS]
        if labels:
            out[f"dur_{side}_control_n"] = len(labels)
            out[f"dur_{side}_control"] = sum(lab in USEFUL_LABELS for lab in labels) / len(labels)
    unbuilt = sum(bool(j.get("on_topic_error")) for j in judgments)
    if unbuilt:
        out["dur_on_topic_control_unbuilt"] = unbuilt
    if not valid:
        return out
    n = len(valid)
    for label in LABELS:
        out[f"dur_{label.lower()}"] = sum(j["label"] == label for j in valid) / n
    out["dur"] = out["dur_entailed"] + out["dur_useful"]
    useful = [j for j in valid if j["label"] in USEFUL_LABELS]
    n_queries = max((q for j in valid for qs in j["passage_queries"] for q in qs), default=-1) + 1
    if useful and n_queries > 1:
        for qi in range(n_queries):
            hits = 0
            for j in useful:
                if j.get("passage_labels"):
                    hits += any(
                        qi in qs and lab in USEFUL_LABELS for qs, lab in zip(j["passage_queries"], j["passage_labels"])
                    )
                else:
                    hits += any(qi in qs for qs in j["passage_queries"])
            out[f"dur_role_q{qi + 1}"] = hits / len(useful)
    return out
