"""Prompt optimization: recipes, metrics (with feedback for GEPA), compiling a program, and the saved-program format.

Modules: :mod:`~hcqr_dspy.optimize.catalog` (what hcqr knows of each DSPy optimizer: where its seed goes, the
scale of its scores, a reflection LM, the metrics it takes), :mod:`~hcqr_dspy.optimize.recipes` (the recipe files
that name a DSPy optimizer and its settings), :mod:`~hcqr_dspy.optimize.feedback` (the metrics a recipe names, with
GEPA's textual diagnosis), :mod:`~hcqr_dspy.optimize.recipe_compile` (train and validation samples, the optimizer, the
compile, the optimizer's own score), :mod:`~hcqr_dspy.optimize.attempts` (each bootstrapping attempt seen as it
runs), :mod:`~hcqr_dspy.optimize.trials` (each candidate's or trial's score),
:mod:`~hcqr_dspy.optimize.demo_counts` (demos counted as the adapter renders them into each prompt, and the demos a
compile keeps) and :mod:`~hcqr_dspy.optimize.saved` (a saved program: two
JSON files, loadable against any index).
``hcqr compile`` (inputs checked, the compile tracked in MLflow) is :mod:`hcqr_dspy.workflows.compile` (several
seeds: :mod:`hcqr_dspy.workflows.compile_seeds`); loading a
saved program from an MLflow run or model is :mod:`hcqr_dspy.workflows.programs`. Nothing here imports MLflow.
"""
