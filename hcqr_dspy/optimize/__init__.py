"""Prompt optimization: recipes, metrics (with feedback for GEPA), compiling a program, and the saved-program format.

Modules: :mod:`~hcqr_dspy.optimize.recipes` (the recipe files that name a DSPy optimizer and its settings),
:mod:`~hcqr_dspy.optimize.feedback` (the metrics a recipe names, with GEPA's textual diagnosis),
:mod:`~hcqr_dspy.optimize.compile` (train and validation samples, the optimizer, the compile, the optimizer's own
score) and :mod:`~hcqr_dspy.optimize.saved` (a saved program: two JSON files, loadable against any index).
``hcqr compile`` (inputs checked, the compile tracked in MLflow) is :mod:`hcqr_dspy.workflows.compile`; loading a
saved program from an MLflow run or model is :mod:`hcqr_dspy.workflows.programs`. Nothing here imports MLflow.
"""
