"""Compiling a program with a recipe: the train and validation samples, the optimizer, the compile itself, the
demos trimmed to what is shown, and the score the optimizer measured. What differs between DSPy optimizers (where
the seed goes, the scale of their scores, a reflection LM, the metrics) is read from
:mod:`hcqr_dspy.optimize.catalog`.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from typing import Any

import dspy

from hcqr_dspy.data import select
from hcqr_dspy.errors import RecipeError
from hcqr_dspy.lm import count_tokens
from hcqr_dspy.optimize.catalog import entry
from hcqr_dspy.optimize.demo_counts import keep_rendered_demos
from hcqr_dspy.optimize.feedback import PROBABILITY_METRICS, make_metric
from hcqr_dspy.optimize.recipes import Recipe
from hcqr_dspy.programs.answer_slot_probs import NO_LOGPROBS, scores_options
from hcqr_dspy.programs.context import trim_context


def split_train(
    examples: list[dspy.Example], recipe: Recipe, train_size: int | None = None, val_size: int | None = None
) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """A seeded train sample and a disjoint validation sample, in an order the seed draws.

    The recipe's ``seed`` draws ``train_size + val_size`` questions (:func:`hcqr_dspy.data.select`), shuffles them
    (``random.Random(seed)``) and splits them: which questions train, which validate, and the order the training
    questions reach the optimizer all follow the seed (optimizers without a seed of their own depend on that
    order: :mod:`hcqr_dspy.optimize.catalog`).

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
    random.Random(recipe.seed).shuffle(pool)
    return pool[:n_train], pool[n_train:]


def build_optimizer(recipe: Recipe, metric: Callable | None, reflection_lm=None):
    """The recipe's optimizer object: its settings, the recipe's ``seed`` where the optimizer takes one, the metric
    where it takes one, the reflection LM where it needs one (:mod:`hcqr_dspy.optimize.catalog`). GEPA gets
    ``track_stats=True`` unless the recipe sets it: only then does it attach its candidates' scores
    (``detailed_results``) to the program it returns; the search is the same.

    Raises:
        RecipeError: an optimizer that needs a reflection LM (GEPA) without one.
    """
    e = entry(recipe.optimizer)
    kwargs = dict(recipe.settings)
    if e.seed == "argument":
        kwargs["seed"] = recipe.seed
    if e.reflection_lm:
        if reflection_lm is None:
            raise RecipeError(
                f"recipe {recipe.name!r} ({recipe.optimizer}) needs a reflection LM: give --reflection-lm or set "
                "reflection_lm in the recipe"
            )
        kwargs["reflection_lm"] = reflection_lm
    if e.metrics:
        kwargs["metric"] = metric
    if e.scores == "gepa_results":
        kwargs.setdefault("track_stats", True)
    return e.cls(**kwargs)


def compile_program(
    recipe: Recipe, student, trainset: list[dspy.Example], valset: list[dspy.Example] | None = None, reflection_lm=None
):
    """Run the recipe's optimizer on ``student`` (under the caller's ``dspy.context``) and return the compiled program.

    The student is not modified (DSPy optimizers compile a copy). The compiled program keeps the demos its
    prompts show, only on the recipe's ``demo_predictors``
    (:func:`~hcqr_dspy.optimize.demo_counts.keep_rendered_demos`, with the adapter of the caller's context), their
    contexts trimmed to ``demo_context_tokens``.

    Raises:
        RecipeError: see :func:`build_optimizer`; ``demo_predictors`` naming no predictor; a mini-batch larger than
            the training questions (SIMBA's ``bsize``); metric
            ``feedback_gold_prob`` with an LM that gives no option probabilities (before any call), or a question
            the metric could not score (after the optimizer, which catches a metric's errors).
    """
    check_recipe_for(recipe, student, dspy.settings.lm)
    e = entry(recipe.optimizer)
    batch = e.setting(e.batch_setting, recipe.settings) if e.batch_setting else None
    if batch is not None and batch > len(trainset):
        raise RecipeError(
            f"recipe {recipe.path}: {recipe.optimizer} {e.batch_setting} {batch} is more than the {len(trainset)} "
            f"training questions; lower {e.batch_setting} or train on more questions"
        )
    metric = (
        make_metric(recipe.metric, getattr(student, "retriever", None)) if entry(recipe.optimizer).metrics else None
    )
    optimizer = build_optimizer(recipe, metric, reflection_lm)
    kwargs = dict(recipe.compile)
    if entry(recipe.optimizer).seed == "compile":  # SIMBA: compile(seed=...) draws its batches and strategies
        kwargs["seed"] = recipe.seed
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
    keep_rendered_demos(compiled, recipe.demo_predictors)
    trim_demo_contexts(compiled, recipe.demo_context_tokens)
    return compiled


def check_recipe_for(recipe: Recipe, program, lm) -> None:
    """Refuse, before any LM call, a recipe that cannot compile ``program`` with ``lm``: ``demo_predictors``
    naming no predictor of the program, metric ``grounded`` for a program without retrieval (no context to
    ground in), metric ``feedback_gold_prob`` with an LM that gives no option probabilities
    (:func:`hcqr_dspy.programs.answer_slot_probs.scores_options`).

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


def optimizer_scores(compiled: Any, optimizer: str) -> dict[str, float]:
    """The score ``optimizer`` itself measured for the program it returned, as a fraction in [0, 1], read where the
    catalog says (:mod:`hcqr_dspy.optimize.catalog`) and divided by its scale.

    ``val_score``: BootstrapFewShotWithRandomSearch's best candidate (``candidate_programs[0]["score"]``), MIPROv2's
    best full evaluation (``program.score``), both percentages from ``dspy.Evaluate``; GEPA's best candidate's
    aggregate score on its validation set (``detailed_results``, with ``track_stats``; a fraction).
    ``train_score`` instead, for an optimizer that scores on the training questions (SIMBA: its best candidate's
    mean metric, a fraction). ``candidates``: how many programs it scored. An optimizer that scores no candidate
    (BootstrapFewShot, LabeledFewShot): ``{}``.
    """
    e = entry(optimizer)
    out: dict[str, float] = {}
    if e.scores == "candidate_programs":
        candidates = getattr(compiled, "candidate_programs", None)
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) and "score" in candidates[0]:
            out[e.score_key] = float(candidates[0]["score"]) / e.score_scale
            out["candidates"] = float(len(candidates))
    elif e.scores == "program_score":
        if isinstance(getattr(compiled, "score", None), (int, float)):
            out["val_score"] = float(compiled.score) / e.score_scale
    elif e.scores == "gepa_results":
        results = getattr(compiled, "detailed_results", None)
        if results is not None and getattr(results, "val_aggregate_scores", None):
            out["val_score"] = float(results.val_aggregate_scores[results.best_idx]) / e.score_scale
            out["candidates"] = float(len(results.val_aggregate_scores))
    return out
