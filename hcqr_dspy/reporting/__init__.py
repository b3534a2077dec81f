"""The reporting layer: paired comparison of runs on the same questions (tables, exact McNemar tests, plots).

Every run is a run folder written by ``hcqr eval`` (``config.json``, ``predictions.jsonl``, ``metrics.json``,
and ``dur.json`` / ``judgments.jsonl`` once judged by ``hcqr judge``). Runs are compared only on identical
question sets; accuracy differences against a reference run are tested with the exact McNemar test on the
discordant pairs (``statsmodels.stats.contingency_tables.mcnemar(..., exact=True)``: a two-sided binomial
test of b vs c; McNemar 1947).

Modules: :mod:`~hcqr_dspy.reporting.runs` (loading runs), :mod:`~hcqr_dspy.reporting.stats` (McNemar,
Wilson intervals, paired TOST), :mod:`~hcqr_dspy.reporting.family` (every printed p-value numbered and
Holm-adjusted as one family), :mod:`~hcqr_dspy.reporting.equivalence` (TOST against a margin),
:mod:`~hcqr_dspy.reporting.tables`, :mod:`~hcqr_dspy.reporting.diagnostics`,
:mod:`~hcqr_dspy.reporting.evidence_tables`, :mod:`~hcqr_dspy.reporting.hypotheses`,
:mod:`~hcqr_dspy.reporting.program_diff` (the report's sections), :mod:`~hcqr_dspy.reporting.plots`,
and :mod:`~hcqr_dspy.reporting.report` (:func:`compare`).
"""

from hcqr_dspy.reporting.plots import (
    PLOTS,
    accuracy_vs_cost_figure,
    compiled_figure,
    dur_figure,
    hypothesis_changes_figure,
    plot_accuracy,
    plot_accuracy_vs_cost,
    plot_dur,
    plot_hypothesis_changes,
)
from hcqr_dspy.reporting.report import compare
from hcqr_dspy.reporting.runs import (
    Run,
    judged_ids,
    load_run,
    provenance_line,
    restrict,
    run_label,
    session_summary,
    unique_labels,
)
from hcqr_dspy.reporting.stats import mcnemar_exact, wilson_interval
from hcqr_dspy.reporting.tables import comparison_table, metrics_table

__all__ = [
    "PLOTS",
    "Run",
    "accuracy_vs_cost_figure",
    "compare",
    "comparison_table",
    "compiled_figure",
    "dur_figure",
    "hypothesis_changes_figure",
    "judged_ids",
    "load_run",
    "mcnemar_exact",
    "metrics_table",
    "plot_accuracy",
    "plot_accuracy_vs_cost",
    "plot_dur",
    "plot_hypothesis_changes",
    "provenance_line",
    "restrict",
    "run_label",
    "session_summary",
    "unique_labels",
    "wilson_interval",
]
