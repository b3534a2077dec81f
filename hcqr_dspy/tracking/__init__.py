"""MLflow tracking: the store, one MLflow run per evaluation, what a reviewer sees first, and serving.

The store is an SQLite database ``<dir>/mlflow.db`` with artifacts under ``<dir>/artifacts`` (MLflow 3's file
store is in maintenance mode), where ``<dir>`` is ``--mlflow-dir`` or ``$HCQR_MLFLOW_DIR`` or ``./mlruns``; an
explicit ``$MLFLOW_TRACKING_URI`` wins (:mod:`~hcqr_dspy.tracking.store`). Each run logs the full configuration
as params, the metrics of the evaluation, the run folder's ``config.json``, ``predictions.jsonl`` and
``metrics.json`` as artifacts, and one trace per question (built by :mod:`~hcqr_dspy.tracking.question_traces`, its
LM calls recorded by :mod:`~hcqr_dspy.tracking.lm_spans`, scored by :mod:`~hcqr_dspy.tracking.scorers`).
A resumed evaluation continues its MLflow run (its id is kept in ``config.json``).

Modules: :mod:`~hcqr_dspy.tracking.evaluation_run` (an evaluation's MLflow run, opened or resumed and recorded),
:mod:`~hcqr_dspy.tracking.question_traces` (a question's trace, and the observer that makes each question one),
:mod:`~hcqr_dspy.tracking.stage_spans` (the spans of its stages, searches and fusions),
:mod:`~hcqr_dspy.tracking.store` (where the store is, opening it, its locks and outages),
:mod:`~hcqr_dspy.tracking.store_faults` (a store locked by another process, full or malformed: the wait, the one-line
errors, MLflow's background failures kept off stderr), :mod:`~hcqr_dspy.tracking.trace_repair` (question traces a
stopped process or a failed store left out, rebuilt from the rows),
:mod:`~hcqr_dspy.tracking.experiment_page` (the experiment's description and key-metrics view),
:mod:`~hcqr_dspy.tracking.mlflow_runs` (runs, their params, metrics, artifacts and descriptions),
:mod:`~hcqr_dspy.tracking.lm_spans` (one span per LM call in a question's trace),
:mod:`~hcqr_dspy.tracking.datasets` (the question set as an MLflow evaluation dataset),
:mod:`~hcqr_dspy.tracking.compile_run` (a compile's questions, bootstrapping attempts and candidates' scores),
:mod:`~hcqr_dspy.tracking.scorers` (scoring a run's traces), :mod:`~hcqr_dspy.tracking.prompt_links` (question
traces linked to the prompt versions their stages used), :mod:`~hcqr_dspy.tracking.comparison` (a
comparison as a run), :mod:`~hcqr_dspy.tracking.ui` (``hcqr ui``), :mod:`~hcqr_dspy.tracking.serving` (a saved
program as a pyfunc model) and :mod:`~hcqr_dspy.tracking.served_model` (that model's code).

Importing this package imports neither MLflow nor any of these modules: import the module that defines a name.
"""
