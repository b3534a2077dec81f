"""The report's working-hypothesis tables (HCQR and its variants): the hypothesis against the final
answer, against CoT (exact McNemar), and how often runs agree on hypothesis, queries and passages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.evaluation.metrics import hypothesis_changes
from hcqr_dspy.reporting.family import HYPOTHESIS_VS_COT, MCNEMAR, compared, mde_text, p_text
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.stats import discordant_mde, mcnemar_exact


def hypothesis_table(runs: Sequence[Run]) -> str:
    """Markdown: for each run with working hypotheses (HCQR), the hypothesis's accuracy and how the final
    answer relates to it (counts from :func:`hcqr_dspy.evaluation.metrics.hypothesis_changes`); ``""`` if none
    has one."""
    keys = ("kept_right", "kept_wrong", "fixed", "broke", "changed_wrong_to_wrong", "invalid_answer")
    lines = []
    for run in runs:
        c = hypothesis_changes(run.rows)
        n = c["with_hypothesis"]
        if not n:
            continue
        changed = c["fixed"] + c["broke"] + c["changed_wrong_to_wrong"]
        lines.append(
            f"| {run.label} | {n} | {c['hypothesis_correct'] / n:.1%} | {changed / n:.1%} | "
            + " | ".join(str(c[k]) for k in keys)
            + " |"
        )
    if not lines:
        return ""
    head = (
        "| run | with hypothesis | hypothesis accuracy | answer changed | "
        + " | ".join(k.replace("_", " ") for k in keys)
        + " |"
    )
    return "\n".join([head, "|---|" + "---:|" * (3 + len(keys)), *lines])


def hypothesis_vs_cot(runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    """Markdown: the working hypothesis's accuracy against CoT's on the same questions, exact McNemar test
    (a hypothesis that could not be parsed counts wrong); ``("", {})`` without a CoT run and an HCQR run."""
    cots = [r for r in runs if r.config.get("method") == "cot"]
    with_h = [(r, r.hypothesis_correct) for r in runs]
    with_h = [(r, h) for r, h in with_h if h is not None]
    if not cots or not with_h:
        return "", {}
    lines = [
        "| run | CoT run | n | hypothesis accuracy | CoT accuracy | b (CoT only) | c (hypothesis only) | McNemar p |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    figures = {}
    for run, h in with_h:
        for cot in cots:  # every CoT run given, each named (runs with other LMs are other baselines)
            t = mcnemar_exact(cot.correct, h)
            n = len(h)
            acc_h = sum(h.values()) / n
            acc_c = sum(cot.correct.values()) / n
            key = run.label if len(cots) == 1 else f"{run.label} vs {cot.label}"
            figures[key] = {"n": n, "cot_run": cot.label, "hypothesis_accuracy": acc_h, "cot_accuracy": acc_c, **t}
            p = p_text(
                t["p_value"],
                section=HYPOTHESIS_VS_COT,
                label=compared(cot.label, f"{run.label}'s working hypothesis", "accuracy"),
                test=MCNEMAR,
                mde=mde_text(discordant_mde(t["b"], t["c"], n), 100, 1, unit=" points"),
            )
            lines.append(f"| {run.label} | {cot.label} | {n} | {acc_h:.1%} | {acc_c:.1%} | {t['b']} | {t['c']} | {p} |")
    return "\n".join(lines), figures


def upstream_agreement(runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    """Markdown and figures: for each pair of runs that record working hypotheses (HCQR and its variants), on
    the questions both answered with one, how often the two runs share the hypothesis letter, the retrieval
    queries (in order) and the shown passages (ids, in order; ``None`` / "–" where a run does not retrieve,
    as ``hcqr_hypothesis``); ``("", {})`` with fewer than two such runs.

    An ablation that changes only the answer step (``hcqr`` against ``hcqr_show_hypothesis``) differs from
    its base by that step alone on the questions where all three agree. They need not agree even with the
    same prompts at temperature 0: the committed study's two HCQR cells, run in different sessions on
    fresh machines, disagree on some hypotheses, so the report says how often they do.
    """
    with_h = [r for r in runs if r.hypothesis_correct is not None]
    if len(with_h) < 2:
        return "", {}

    def upstream(run: Run) -> dict[str, tuple]:
        return {
            r["qid"]: (
                r["hypothesis"].get("working_hypothesis"),
                tuple(r.get("queries") or ()),
                tuple(p.get("id") for p in r.get("passages") or ()),
            )
            for r in run.rows
            if r.get("hypothesis")
        }

    ups = [upstream(r) for r in with_h]
    # runs without retrieval (hcqr_hypothesis) have no queries to agree on
    retrieves = [any(u[1] for u in up.values()) for up in ups]
    lines = [
        "| runs | n | same hypothesis letter | same queries | same passages | all three |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    figures = {}
    for i, a in enumerate(with_h):
        for j in range(i + 1, len(with_h)):
            b, ua, ub = with_h[j], ups[i], ups[j]
            both = sorted(ua.keys() & ub.keys())
            n = len(both)
            same = [tuple(x == y for x, y in zip(ua[q], ub[q])) for q in both]
            retrieve = retrieves[i] and retrieves[j]
            counts = {
                "n": n,
                "same_hypothesis": sum(s[0] for s in same),
                "same_queries": sum(s[1] for s in same) if retrieve else None,
                "same_passages": sum(s[2] for s in same) if retrieve else None,
                "same_all": sum(all(s) for s in same) if retrieve else None,
            }
            figures[f"{a.label} vs {b.label}"] = counts
            cells = " | ".join(
                f"{counts[k]} ({counts[k] / n:.0%})" if n and counts[k] is not None else "–"
                for k in ("same_hypothesis", "same_queries", "same_passages", "same_all")
            )
            lines.append(f"| {a.label} vs {b.label} | {n} | {cells} |")
    return "\n".join(lines), figures
