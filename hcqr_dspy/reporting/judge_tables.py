"""The report's tables of its judges: the DUR judge's accuracy on each control and its agreement with hand labels,
and MLflow's retrieval judges.

For every judged run: the DUR with its 95% Wilson interval; the judge's accuracy on each control
(:mod:`hcqr_dspy.judge.controls`) with its 95% Wilson interval (``statsmodels``' ``proportion_confint``,
``method="wilson"``): positive controls called ENTAILED or USEFUL, negative and on-topic controls called
NOT_USEFUL; and, when the run folder holds ``judge_agreement.json`` from the same judge (LM, mode, reasoning),
its agreement with the hand-labelled contexts (:mod:`hcqr_dspy.judge.agreement`: accuracy with its Wilson
interval, Cohen's kappa with its 95% interval). A control a run's judgments do not hold is shown as not judged.

The warnings: :func:`hcqr_dspy.judge.controls.control_flags` (control rates outside
:data:`~hcqr_dspy.judge.controls.CONTROL_LIMITS`, a DUR the judge cannot separate from its on-topic controls,
controls never judged) and :func:`hcqr_dspy.judge.agreement.agreement_flags` (agreement no better than chance).

MLflow's retrieval judges (``hcqr judge --mlflow-scorers``, :func:`mlflow_judges_table`): for every run whose folder
holds ``mlflow_judges.json`` (:mod:`hcqr_dspy.judge.mlflow_record`), the mean retrieval relevance and retrieval
groundedness over its questions (those of the comparison: a run restricted by ``--common`` is summarised over the
questions kept) with the standard error of the mean and the number of questions judged, and the judge LM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcqr_dspy.judge.agreement import AGREEMENT_FILE, agreement_flags, agreement_summary
from hcqr_dspy.judge.controls import CONTROL_LIMITS, control_flags
from hcqr_dspy.judge.dur_metrics import CONTROLS, wilson_interval
from hcqr_dspy.judge.mlflow_record import LABELS, MLFLOW_JUDGES_FILE, SCORERS, means
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.tables import dur_cell

# What each control should be called, as the table's column says it.
EXPECTED = {"positive": "useful", "negative": "not useful", "on_topic": "not useful"}
JUDGE_KEYS = ("judge_lm", "mode", "reasoning")


def controls_note() -> str:
    """The note under the judge table, with the limits of :data:`hcqr_dspy.judge.controls.CONTROL_LIMITS`."""
    return (
        "Accuracy of the judge on each control, with its 95% Wilson interval. Positive control: a context stating "
        "the gold answer and why (right when called ENTAILED or USEFUL); negative control: another question's "
        "context; on-topic control: passages retrieved for the question with one distractor option, every "
        "passage that could carry the gold option's evidence removed (right when called NOT_USEFUL). A DUR is "
        f"flagged when its judge calls fewer than {CONTROL_LIMITS['positive_min']:.0%} of positive, more than "
        f"{CONTROL_LIMITS['negative_max']:.0%} of negative or more than {CONTROL_LIMITS['on_topic_max']:.0%} of "
        "on-topic controls useful, or when the DUR is not above the upper end of the interval of its useful-rate "
        "on on-topic controls (it cannot separate the real contexts from undeciding ones on the same topic). "
        "Hand-labelled set: the same judge on contexts labelled by hand (`hcqr judge --labelled-set`), accuracy "
        "and Cohen's kappa with 95% intervals; flagged when kappa's interval reaches down to chance."
    )


def _interval(correct: int, n: int) -> str:
    lo, hi = wilson_interval(correct, n)
    return f"{correct / n:.0%} ({correct}/{n}) [{lo:.0%}–{hi:.0%}]"


def control_accuracy(dur: dict[str, Any], side: str) -> dict[str, Any] | None:
    """The judge's accuracy on one control from a run's DUR metrics: ``correct``, ``n``, ``accuracy`` and
    ``ci`` (95% Wilson); ``None`` when the run holds no judgment of that control."""
    n = int(dur.get(f"dur_{side}_control_n") or 0)
    rate = dur.get(f"dur_{side}_control")
    if not n or rate is None:
        return None
    useful = round(rate * n)
    correct = useful if EXPECTED[side] == "useful" else n - useful
    return {"correct": correct, "n": n, "accuracy": correct / n, "ci": list(wilson_interval(correct, n))}


def run_agreement(run: Run) -> tuple[dict[str, Any] | None, bool]:
    """A run's ``judge_agreement.json`` and whether it was measured with the judge that judged the run's
    contexts (its LM, mode and reasoning); ``(None, False)`` when there is none."""
    record = run.folder.read_json(AGREEMENT_FILE)
    if not record:
        return None, False
    judge = run.judgments[0] if run.judgments else run.dur.get("judge") or {}
    same = all(judge.get(k) == (record.get("judge") or {}).get(k) for k in JUDGE_KEYS)
    return record, same


def _agreement_cell(record: dict[str, Any] | None, same: bool) -> str:
    if record is None:
        return "not measured"
    if not same:
        other = ", ".join(f"{k}={record.get('judge', {}).get(k)}" for k in JUDGE_KEYS)
        return f"measured with another judge ({other})"
    if not record.get("valid"):
        return f"no valid judgment of {record.get('n', 0)}"
    cell = _interval(record["correct"], record["valid"])
    ci = record.get("kappa_ci")
    kappa = "undefined" if record.get("kappa") is None else f"{record['kappa']:.2f}"
    cell += f", κ {kappa}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    if record.get("invalid"):
        cell += f"; {record['invalid']} invalid"
    return cell


def judge_controls_table(runs: Sequence[Run]) -> tuple[str, list[str], dict[str, Any]]:
    """Markdown: each judged run's DUR (with its interval) beside its judge's accuracy on every control and its
    hand-labelled agreement; the warnings of :func:`control_flags` and :func:`agreement_flags`; the figures for
    ``comparison.json``. ``("", [], {})`` when no run is judged."""
    judged = [r for r in runs if r.dur.get("dur_n")]
    if not judged:
        return "", [], {}
    lines = [
        "| run | DUR [95% CI] | judged | positive controls called useful | negative controls called not useful "
        "| on-topic controls called not useful | hand-labelled set: accuracy, κ | judge |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    flags: list[str] = []
    figures: dict[str, Any] = {}
    for run in judged:
        d = run.dur
        valid = int(d["dur_n"]) - int(d.get("dur_invalid") or 0)
        dur = dur_cell(run)
        if d.get("dur") is not None and valid:
            lo, hi = wilson_interval(round(d["dur"] * valid), valid)
            dur += f" [{lo:.0%}–{hi:.0%}]"
        accuracy = {side: control_accuracy(d, side) for side in CONTROLS}
        cells = [_interval(a["correct"], a["n"]) if a else "– (not judged)" for a in accuracy.values()]
        record, same = run_agreement(run)
        judge = run.judgments[0] if run.judgments else d.get("judge") or {}
        who = ", ".join(f"{k}={judge.get(k)}" for k in JUDGE_KEYS if judge.get(k) is not None)
        lines.append(
            f"| {run.label} | {dur} | {d['dur_n']} | {' | '.join(cells)} | {_agreement_cell(record, same)} "
            f"| {who or '–'} |"
        )
        run_flags = control_flags(d) + (agreement_flags(record) if record and same else [])
        flags += [f"DUR of {run.label} is not trustworthy: {f}" for f in run_flags]
        figures[run.label] = {
            "controls": accuracy,
            "judge_agreement": agreement_summary(record) if record and same else None,
            "flags": run_flags,
        }
    return "\n".join(lines), flags, figures


MLFLOW_JUDGES_NOTE = (
    "MLflow's built-in LLM judges on each question's trace (`hcqr judge --mlflow-scorers`). Retrieval relevance: "
    "the share of the passages retrieved for a question (every query's hits, before fusion) the judge called "
    "relevant to the question (RetrievalRelevance, one call per passage). Retrieval groundedness: the share of a "
    "question's retrieval steps whose passages the judge said support the recorded response (RetrievalGroundedness, "
    "one call per query; the response is the answer letter with, for HCQR, the hypothesis and queries). Mean over "
    "the questions judged ± standard error of the mean; n = questions judged. Neither uses the gold answer."
)


def _mlflow_judge_cell(figure: dict[str, Any] | None) -> str:
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
        cells = [_mlflow_judge_cell(summary.get(name)) for name in SCORERS.values()]
        lines.append(f"| {run.label} | {' | '.join(cells)} | {who or '–'} |")
        figures[run.label] = {**summary, "judges": {k: v for k, v in judges.items() if k in summary}}
    if not figures:
        return "", {}
    return "\n".join(lines), figures
