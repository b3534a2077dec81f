"""Compiling a program with a recipe: the train and validation samples, the optimizer, the compile itself, the
demos trimmed to what is shown, and the score the optimizer measured.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import dspy

from hcqr_dspy.data import select
from hcqr_dspy.errors import RecipeError
from hcqr_dspy.lm import count_tokens
from hcqr_dspy.optimize.feedback import PROBABILITY_METRICS, make_metric
from hcqr_dspy.optimize.recipes import Recipe, optimizers
from hcqr_dspy.programs.context import trim_context
from hcqr_dspy.programs.option_probs import NO_LOGPROBS, scores_options


def split_train(
    examples: list[dspy.Example], recipe: Recipe, train_size: int | None = None, val_size: int | None = None
) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """A seeded train sample and a disjoint validation sample.

    Raises:
        RecipeError: fewer questions than ``train_size + val_size``, or a
            train size under the recipe's ``min_train`` (the minimum is named).
    """
    n_train = recipe.train_size if train_size is None else train_size
    n_val = recipe.val_size if val_size is None else val_size
    if n_train < recipe.min_train:
        raise RecipeError(
            f"a train set of {n_train} question(s) is too small for recipe {recipe.name!r} ({recipe.optimizer}); "
            f"it needs at least {recipe.min_train}"
        )
    if len(examples) < n_train + n_val:
        raise RecipeError(
            f"the train file has {len(examples)} questions; recipe {recipe.name!r} needs {n_train} + "
            f"{n_val} (validation)"
        )
    pool = select(examples, limit=n_train + n_val, seed=recipe.seed)
    return pool[:n_train], pool[n_train:]


def build_optimizer(recipe: Recipe, metric: Callable, reflection_lm=None):
    """The recipe's optimizer object.

    Raises:
        RecipeError: GEPA without a reflection LM.
    """
    cls = optimizers()[recipe.optimizer]
    kwargs = dict(recipe.settings)
    if "seed" in inspect.signature(cls.__init__).parameters:
        kwargs.setdefault("seed", recipe.seed)
    if recipe.optimizer == "GEPA":
        if reflection_lm is None:
            raise RecipeError(
                f"recipe {recipe.name!r} (GEPA) needs a reflection LM: give --reflection-lm or set "
                "reflection_lm in the recipe"
            )
        kwargs["reflection_lm"] = reflection_lm
    return cls(metric=metric, **kwargs)


def compile_program(
    recipe: Recipe, student, trainset: list[dspy.Example], valset: list[dspy.Example] | None = None, reflection_lm=None
):
    """Run the recipe's optimizer on ``student`` (under the caller's ``dspy.context``) and return the compiled program.

    The student is not modified (DSPy optimizers compile a copy).

    Raises:
        RecipeError: see :func:`build_optimizer`; ``demo_predictors`` naming no predictor; metric
            ``feedback_gold_prob`` with an LM that gives no option probabilities (before any call), or a question
            the metric could not score (after the optimizer, which catches a metric's errors).
    """
    check_recipe_for(recipe, student, dspy.settings.lm)
    metric = make_metric(recipe.metric, getattr(student, "retriever", None))
    optimizer = build_optimizer(recipe, metric, reflection_lm)
    kwargs = dict(recipe.compile)
    if "valset" in inspect.signature(type(optimizer).compile).parameters and valset:
        kwargs["valset"] = valset
    student.demo_context_tokens = recipe.demo_context_tokens  # demos are shown trimmed while candidates are scored
    student.score_options = recipe.metric in PROBABILITY_METRICS  # no letter-distribution prefill nobody reads
    try:
        compiled = optimizer.compile(student, trainset=trainset, **kwargs)
    finally:
        del student.score_options  # back to the class's default (scored)
    compiled.score_options = True  # a compiled program scores its answers as any other
    if getattr(metric, "refusals", None):
        raise metric.refusals[0]
    keep_demos_of(compiled, recipe.demo_predictors)
    trim_demo_contexts(compiled, recipe.demo_context_tokens)
    return compiled


def check_recipe_for(recipe: Recipe, program, lm) -> None:
    """Refuse, before any LM call, a recipe that cannot compile ``program`` with ``lm``: ``demo_predictors``
    naming no predictor of the program, metric ``grounded`` for a program without retrieval (no context to
    ground in), metric ``feedback_gold_prob`` with an LM that gives no option probabilities
    (:func:`hcqr_dspy.programs.option_probs.scores_options`).

    Raises:
        RecipeError: one line naming the recipe file.
    """
    where = f"recipe {recipe.path}"
    if recipe.demo_predictors is not None:
        names = [name for name, _ in program.named_predictors()]
        unknown = [n for n in recipe.demo_predictors if n not in names]
        if unknown:
            raise RecipeError(
                f"{where}: demo_predictors {', '.join(unknown)} are not predictors of this program ({', '.join(names)})"
            )
    if recipe.metric == "grounded" and getattr(program, "retriever", None) is None:
        raise RecipeError(f"{where}: metric 'grounded' needs a retrieval method; {program.method} shows no context")
    if recipe.metric == "feedback_gold_prob" and not scores_options(lm):
        raise RecipeError(f"{where} (metric feedback_gold_prob): {NO_LOGPROBS}; use metric 'feedback'")


def keep_demos_of(program, names: list[str] | None) -> int:
    """Remove, in place, the few-shot demos of every predictor not in ``names`` (``None``: keep all).

    Returns:
        How many demos were removed.
    """
    if names is None:
        return 0
    removed = 0
    for name, predictor in program.named_predictors():
        if name not in names:
            removed += len(predictor.demos)
            predictor.demos = []
    return removed


def trim_demo_contexts(program, max_tokens: int) -> int:
    """Cut, in place, the ``context`` of every few-shot demo of ``program`` to ``max_tokens``
    (:func:`hcqr_dspy.programs.context.trim_context`, tokens counted with the LM in ``dspy.settings``),
    so that saved programs hold what is shown.

    Returns:
        How many demo contexts were cut.
    """
    lm = dspy.settings.lm
    cut = 0
    for predictor in program.predictors():
        for demo in predictor.demos:
            context = demo.get("context") if hasattr(demo, "get") else None
            if isinstance(context, str) and count_tokens(lm, context) > max_tokens:
                demo["context"] = trim_context(context, max_tokens, lm)
                cut += 1
    return cut


def optimizer_scores(compiled: Any) -> dict[str, float]:
    """The score the optimizer itself measured for the program it returned, as a fraction in [0, 1].

    ``val_score``: BootstrapFewShotWithRandomSearch's best candidate (``candidate_programs[0]["score"]``)
    and MIPROv2's best full evaluation (``program.score``), both percentages from ``dspy.Evaluate``;
    GEPA's best candidate's aggregate score on its validation set (``detailed_results``, already a
    fraction). ``candidates``: how many programs it scored. BootstrapFewShot validates nothing: ``{}``.
    """
    out: dict[str, float] = {}
    candidates = getattr(compiled, "candidate_programs", None)
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) and "score" in candidates[0]:
        out["val_score"] = float(candidates[0]["score"]) / 100
        out["candidates"] = float(len(candidates))
    elif isinstance(getattr(compiled, "score", None), (int, float)):
        out["val_score"] = float(compiled.score) / 100
    results = getattr(compiled, "detailed_results", None)
    if results is not None and getattr(results, "val_aggregate_scores", None):
        out["val_score"] = float(results.val_aggregate_scores[results.best_idx])
        out["candidates"] = float(len(results.val_aggregate_scores))
    return out
