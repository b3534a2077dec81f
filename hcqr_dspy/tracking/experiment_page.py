"""The MLflow experiment's page: its name, its description and the saved view of its runs table with the key
metrics, which :func:`hcqr_dspy.tracking.store.configure` sets on the experiment."""

from __future__ import annotations

import json
from typing import Any

EXPERIMENT = "hcqr-dspy"
# The experiment's description (MLflow shows the ``mlflow.note.content`` tag as Markdown on the experiment page).
EXPERIMENT_DESCRIPTION = """Hypothesis-Conditioned Query Rewriting (HCQR) for retrieval-augmented multiple-choice QA, \
run by hcqr-dspy as DSPy programs.

* **Runs** — one per evaluation (`hcqr eval`, `hcqr predict`, experiment cells), named
  `method · dataset · LM · zero-shot|compiled:<recipe>`; [the runs table with the key metrics](\
#/experiments/{experiment_id}/runs?viewStateShareKey={view})
  (`accuracy`, `accuracy_se`, `invalid_rate`, `dur`, `mean_lm_calls`); compile runs (`kind=compile`) and
  comparisons (`kind=comparison`, their runs linked by run id).
* **Traces** — one per question: named stage spans (hypothesis, rewrite, one RETRIEVER span per query, fusion,
  answer), tags `qid`, `method`, `dataset`, `run_folder`, `lm`, `program`; the gold answer as the expectation
  `answer`, and feedback `correct`, `valid`, `hypothesis` (kept/fixed/broke), `dur` (DUR judge). Filter e.g.
  `tags.method = 'hcqr'` and `feedback.correct = 'false'`.
* **Evaluation runs / Datasets** — each run's questions as an MLflow evaluation dataset, scored with
  `mlflow.genai.evaluate`; *Evaluation runs* lists evaluations and comparisons, *Training runs* every run.
* **Agent versions** — the model each evaluation ran (zero-shot and compiled side by side, with accuracy per
  dataset); compiled programs registered with `hcqr compile --register NAME` are served with
  `mlflow models serve`.
"""
# The metrics a reader looks at first: logged by every evaluation run (and shown first by `hcqr` tables).
KEY_METRICS = ("accuracy", "accuracy_se", "invalid_rate", "dur", "mean_lm_calls")
# A saved view of the experiment's runs table with those metrics as its columns. MLflow's UI keeps "shared
# views" as experiment tags `mlflow.sharedViewState.<key>` (a JSON of the table's state; column keys are
# `metrics.`name`` / `tags.`name`` / `attributes.`name``) and opens one with `?viewStateShareKey=<key>`.
KEY_VIEW = "hcqr-key-metrics"
KEY_VIEW_STATE = {
    "selectedColumns": [*(f"metrics.`{m}`" for m in KEY_METRICS), "tags.`program`", "attributes.`Dataset`"],
    "orderByKey": "attributes.start_time",
    "orderByAsc": False,
}


def set_experiment_page(client: Any, experiment_id: str) -> None:
    """Give the experiment its description (:data:`EXPERIMENT_DESCRIPTION`, unless it has one: a description a
    user wrote is kept) and the saved view :data:`KEY_VIEW` of its runs table (rewritten when it differs).

    Args:
        client: An ``mlflow.MlflowClient`` of the store.
        experiment_id: The experiment.
    """
    tags = client.get_experiment(experiment_id).tags
    if "mlflow.note.content" not in tags:  # a description a user wrote is kept
        client.set_experiment_tag(
            experiment_id,
            "mlflow.note.content",
            EXPERIMENT_DESCRIPTION.format(experiment_id=experiment_id, view=KEY_VIEW),
        )
    view = json.dumps(KEY_VIEW_STATE)
    if tags.get(f"mlflow.sharedViewState.{KEY_VIEW}") != view:
        client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{KEY_VIEW}", view)


def key_metrics_url(experiment_id: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """The address of the runs table with :data:`KEY_METRICS` as its columns (MLflow 3.17's *Training runs* page,
    which lists every run of the experiment), on a UI at ``host:port``."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs?viewStateShareKey={KEY_VIEW}"


def evaluation_runs_url(experiment_id: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """The address of MLflow 3.17's *Evaluation runs* page of the experiment (evaluations and comparisons, not
    compiles), on a UI at ``host:port``."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/evaluation-runs"
