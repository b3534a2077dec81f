"""The report's table of MLflow's retrieval judges (``hcqr judge --mlflow-scorers``): for every run whose folder
holds ``mlflow_judges.json`` (:mod:`hcqr_dspy.judge.mlflow_record`), the mean retrieval relevance and retrieval
groundedness over its questions (those of the comparison: a run restricted by ``--common`` is summarised over the
questions kept) with the standard error of the mean and the number of questions judged, and the judge LM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.judge.mlflow_record import LABELS, MLFLOW_JUDGES_FILE, SCORERS, means
from hcqr_dspy.reporting.runs import Run

MLFLOW_JUDGES_NOTE = (
    "MLflow's built-in LLM judges on each question's trace (`hcqr judge --mlflow-scorers`). Retrieval relevance: "
    "the share of the passages retrieved for a question (every query's hits, before fusion) the judge called "
    "relevant to the question (RetrievalRelevance, one call per passage). Retrieval groundedness: the share of a "
    "question's retrieval steps whose passages the judge said support the recorded response (RetrievalGroundedness, "
    "one call per query; the response is the answer letter with, for HCQR, the hypothesis and queries). Mean over "
    "the questions judged ± standard error of the mean; n = questions judged. Neither uses the gold answer."
)


def _cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "– (not judged)"
    se = f" ± {figure['se']:.1%}" if figure["se"] is not None else ""
    return f"{figure['mean']:.1%}{se} (n {figure['n']})"


def mlflow_judges_table(runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    """Markdown: one row per run judged by MLflow's retrieval judges, and the figures for ``comparison.json``
    (``{run label: {scorer: {"mean", "se", "n"}, "judges": {scorer: [judge LM specs]}}}``); ``("", {})`` when no
    run was judged so."""
    lines = [
        "| run | retrieval relevance | retrieval groundedness | judge |",
        "|---|---:|---:|---|",
    ]
    figures: dict[str, Any] = {}
    for run in runs:
        record = run.folder.read_json(MLFLOW_JUDGES_FILE)
        if not record:
            continue
        summary = means(record, [r["qid"] for r in run.rows])
        if not summary:
            continue
        judges = record.get("judges") or {}
        who = "; ".join(f"{LABELS[k]}: {', '.join(v)}" for k, v in judges.items() if k in summary)
        cells = [_cell(summary.get(name)) for name in SCORERS.values()]
        lines.append(f"| {run.label} | {' | '.join(cells)} | {who or '–'} |")
        figures[run.label] = {**summary, "judges": {k: v for k, v in judges.items() if k in summary}}
    if not figures:
        return "", {}
    return "\n".join(lines), figures
