"""The report's judge-free retrieval tables: evidence coverage in the shown context (with paired tests
against the reference) and recall / nDCG against relevance judgments (qrels)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.evidence import load_qrels, paired_evidence_tests, qrels_metrics
from hcqr_dspy.reporting.family import EVIDENCE, MCNEMAR, WILCOXON, compared, mde_text, p_text
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import discordant_mde, minimum_detectable_effect


def evidence_table(runs: Sequence[Run], reference: Run) -> str:
    """Markdown: judge-free evidence metrics of each retrieval run (gold / distractor coverage, margin),
    with paired tests against the reference (:func:`hcqr_dspy.evaluation.evidence.paired_evidence_tests`)."""
    with_ev = [r for r in runs if r.metrics.get("evidence_n")]
    if not with_ev:
        return ""
    ref_ev = {row["qid"]: row.get("evidence") for row in reference.rows}
    lines = [
        "| run | n | gold coverage | distractor coverage | margin | vs ref gold b/c | McNemar p | "
        "Δ margin | Wilcoxon p |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in with_ev:
        m = run.metrics
        cells = [
            f"{m['evidence_n']}",
            f"{m['gold_coverage']:.1%}",
            f"{m['distractor_coverage']:.1%}",
            f"{m['evidence_margin']:+.3f}",
        ]
        t = None
        if run is not reference and reference.metrics.get("evidence_n"):
            t = paired_evidence_tests(ref_ev, {row["qid"]: row.get("evidence") for row in run.rows})
        if t:
            gold_mde = mde_text(discordant_mde(t["gold_b"], t["gold_c"], t["n"]), 100, 1, unit=" points")
            margin_sd = t.get("margin_sd")
            margin_mde = mde_text(minimum_detectable_effect(t["n"], margin_sd) if margin_sd else None, limit=2)
            cells += [
                f"{t['gold_b']}/{t['gold_c']}",
                p_text(
                    t["gold_p"],
                    section=EVIDENCE,
                    label=compared(reference.label, run.label, "gold option mentioned"),
                    test=MCNEMAR,
                    mde=gold_mde,
                ),
                f"{t['margin_mean_diff']:+.3f}",
                p_text(
                    t["margin_p"],
                    section=EVIDENCE,
                    label=compared(reference.label, run.label, "evidence margin"),
                    test=WILCOXON,
                    mde=margin_mde,
                ),
            ]
        else:
            cells += ["reference" if run is reference else "–", "", "", ""]
        lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def qrels_table(runs: Sequence[Run], qrels_path: Path | None, explicit: bool = False) -> tuple[str, dict[str, Any]]:
    """Markdown: recall@k and nDCG@10 of each retrieval run's fused contexts against relevance judgments
    (ir-measures; :func:`hcqr_dspy.evaluation.evidence.qrels_metrics`); ``("", {})`` without qrels.

    Raises:
        HCQRError: ``explicit`` (the user named the file) and it judges none of the compared questions.
    """
    if qrels_path is None:
        return "", {}
    qrels = load_qrels(qrels_path)
    no_relevant = 0
    if explicit:
        asked = {r["qid"] for run in runs for r in run.rows}
        if not any(q in asked and any(v > 0 for v in rel.values()) for q, rel in qrels.items()):
            raise HCQRError(
                f"qrels {qrels_path} mark a relevant passage for none of the {len(asked)} compared "
                f"questions (e.g. {sorted(asked)[0]}); are they for another dataset?"
            )
    lines, figures = [], {}
    for run in runs:
        if not any(r.get("passages") for r in run.rows):
            continue
        k = int((run.config.get("program") or {}).get("budget") or 15)
        m = qrels_metrics(run.rows, qrels, k=k)
        if not m:
            continue
        figures[run.label] = {key: v for key, v in m.items() if key != "per_query"}
        lines.append(f"| {run.label} | {m['qrels_n']} | {k} | {m[f'recall_at_{k}']:.3f} | {m['ndcg_at_10']:.3f} |")
        no_relevant = max(no_relevant, m["qrels_no_relevant"])
    if not lines:
        return "", {}
    source = f"Relevance judgments: `{qrels_path}` (ir-measures)." + (
        f" {no_relevant} question(s) listed there with no relevant passage are left out (trec_eval's convention)."
        if no_relevant
        else ""
    )
    head = ["| run | judged questions | k | recall@k | nDCG@10 |", "|---|---:|---:|---:|---:|"]
    return "\n".join([source, "", *head, *lines]), figures
