"""Optimizer recipes: the YAML files that name a DSPy optimizer and its settings, read and validated.

A **recipe** is a YAML file (``optimizers/*.yaml``) that names a DSPy
optimizer and its settings; ``hcqr compile`` reads it, so a new recipe needs
no code. It is a pydantic model (:class:`RecipeSpec`; read by
:mod:`hcqr_dspy.config`): unknown keys are refused, types are checked
strictly and ranges as listed. Keys:

=============  ==============================================================
optimizer      ``BootstrapFewShot``, ``BootstrapFewShotWithRandomSearch``,
               ``MIPROv2``, ``GEPA`` or ``LabeledFewShot``
               (``dspy.teleprompt``; what hcqr knows of each:
               :mod:`hcqr_dspy.optimize.catalog`); required
description    free text
metric         ``accuracy`` (gold letter, invalid = wrong) or ``grounded``
               (right, from a context and a reasoning that name the gold
               option; retrieval methods only) for the bootstrapping
               optimizers and MIPROv2; for GEPA, which needs textual
               feedback, ``feedback`` (accuracy plus a diagnosis) or
               ``feedback_gold_prob`` (the mean of accuracy and the gold
               option's probability, with the diagnosis;
               :mod:`hcqr_dspy.optimize.objectives`); default: the
               optimizer's first (``accuracy``; GEPA ``feedback``);
               LabeledFewShot takes none (leave it out)
train_size     training questions drawn from the train file (seeded
               sample), an integer >= 1 and >= ``min_train`` (default 30)
val_size       validation questions drawn after them, disjoint, >= 0 (0:
               none; optimizers that need one then use the training
               questions; default 0)
min_train      the least training questions the recipe accepts, >= 1 (default 2)
seed           the compile's seed, >= 0 (default 0): it draws the
               training and validation questions and orders the training
               questions, and is the optimizer's own ``seed`` where it has
               one (the catalog says where each optimizer takes it)
seeds          a list of distinct seeds >= 0 instead of ``seed`` (giving
               both is refused): one compile per seed, each saved in
               ``<out>/seed-<N>/`` (``hcqr compile --seeds`` and ``--seed``
               override both keys)
settings       keyword arguments of the optimizer's constructor; names and
               annotated types checked against its signature
               (:func:`hcqr_dspy.config.check_arguments`; ``metric``,
               ``reflection_lm`` and ``seed`` are set here, not in
               ``settings``)
compile        keyword arguments of its ``compile()``, checked the same way
               (``student``, ``trainset``, ``valset``, ``teacher`` and
               ``seed`` are set here)
reflection_lm  GEPA only: an ``--lm`` spec of the reflection LM
               (``--reflection-lm`` overrides it; GEPA refuses to start
               without one)
demo_predictors
               the predictors that keep the demos the optimizer chose (e.g.
               ``[answer]``: only the answer step is taught by example);
               the others' demos are removed after compiling; names are
               checked against the program's (default: all keep theirs)
demo_context_tokens
               the most tokens of retrieved context a few-shot demo keeps,
               >= 0 (default 600, about three passages; whole documents are
               kept from the top). A bootstrapped answer-step demo carries
               its question's whole fused context (15 passages, 3-4k
               tokens); two of them plus the live context would not fit an
               8k window.
=============  ==============================================================

A bare recipe name (``--recipe bootstrap_fewshot``) is looked up in the
working folder's ``optimizers/``, then among the recipes shipped in the
package (:mod:`hcqr_dspy.resources`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hcqr_dspy.config import check_arguments, read_yaml, validate
from hcqr_dspy.errors import RecipeError
from hcqr_dspy.optimize.catalog import CATALOG, OptimizerName, entry, metric_problem
from hcqr_dspy.resources import find

DEMO_CONTEXT_TOKENS = 600
# Arguments hcqr sets itself: a recipe may not.
OWN_INIT_ARGS = frozenset({"self", "metric", "reflection_lm", "prompt_model", "task_model", "teacher_settings"})
OWN_COMPILE_ARGS = frozenset({"self", "student", "trainset", "valset", "teacher"})


def optimizers() -> dict[str, type]:
    """The optimizers a recipe may name (``dspy.teleprompt`` classes, from :mod:`hcqr_dspy.optimize.catalog`)."""
    return {name: e.cls for name, e in CATALOG.items()}


Count = Annotated[int, Field(ge=0)]


class RecipeSpec(BaseModel):
    """A recipe file's content (see the module note for the keys, their ranges and defaults)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    optimizer: OptimizerName
    description: str = ""
    metric: Literal["accuracy", "grounded", "feedback", "feedback_gold_prob"] | None = None
    train_size: Annotated[int, Field(ge=1)] = 30
    val_size: Count = 0
    min_train: Annotated[int, Field(ge=1)] = 2
    seed: Count = 0
    seeds: Annotated[list[Count], Field(min_length=1)] | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    compile: dict[str, Any] = Field(default_factory=dict)
    reflection_lm: Annotated[str, Field(min_length=1)] | None = None
    demo_context_tokens: Count = DEMO_CONTEXT_TOKENS
    demo_predictors: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None

    @field_validator("settings", "compile")
    @classmethod
    def _optimizer_arguments(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("optimizer")
        if name is None:  # the optimizer itself is wrong: that error is the one reported
            return value
        optimizer = optimizers()[name]
        if "seed" in value:
            raise ValueError(
                "'seed' is the recipe's own key (seed, or seeds), which hcqr passes to the optimizer; remove it "
                f"from {info.field_name!r}"
            )
        if info.field_name == "settings":
            return check_arguments((optimizer.__init__,), value, OWN_INIT_ARGS, f"{name} setting(s)")
        return check_arguments((optimizer.compile,), value, OWN_COMPILE_ARGS, f"{name}.compile argument(s)")

    @model_validator(mode="after")
    def _consistent(self) -> RecipeSpec:
        accepted = entry(self.optimizer).metrics
        if self.metric is None and accepted:
            self.metric = accepted[0]  # the default: accuracy (GEPA: feedback)
        problem = metric_problem(self.optimizer, self.metric)
        if problem:
            raise ValueError(problem)
        if self.reflection_lm is not None and not entry(self.optimizer).reflection_lm:
            needing = ", ".join(name for name, e in CATALOG.items() if e.reflection_lm)
            raise ValueError(f"'reflection_lm' is for {needing} only, not {self.optimizer}")
        if self.seeds is not None:
            if "seed" in self.model_fields_set:
                raise ValueError(f"give either 'seed' or 'seeds', not both (seed {self.seed}, seeds {self.seeds})")
            repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
            if repeated:
                raise ValueError(f"seeds: {', '.join(map(str, repeated))} given more than once")
        if self.train_size < self.min_train:
            raise ValueError(f"train_size {self.train_size} is under the recipe's own min_train {self.min_train}")
        return self


class Recipe(RecipeSpec):
    """A validated recipe with where it was read: ``name`` (the file stem) and ``path``."""

    name: str
    path: str

    def record(self) -> dict[str, Any]:
        """What runs and saved programs record about the recipe (``meta.json``'s ``recipe``)."""
        return self.model_dump()


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Read and validate a recipe before any LM call.

    Args:
        name_or_path: A recipe file (``.yaml`` may be left out), or a bare name:
            ``./optimizers/<name>.yaml``, else the shipped recipe of that name
            (:func:`hcqr_dspy.resources.find`).

    Raises:
        RecipeError: one line naming the file, the line and the field: unreadable or non-UTF-8 file,
            invalid YAML, unknown keys, optimizer, metric or settings (the allowed ones listed),
            values of the wrong type or out of range, the ``feedback`` metric or ``reflection_lm``
            with an optimizer other than GEPA; no such file or name (the folders
            searched and the recipes there are listed).
    """
    path, _ = find("recipe", name_or_path, RecipeError)
    raw, node = read_yaml(path, RecipeError, "recipe")
    spec = validate(RecipeSpec, raw, path, RecipeError, node)
    # the keys the file gave (``seed`` and ``seeds`` exclude each other), validated again with where it was read
    return Recipe.model_validate({**spec.model_dump(exclude_unset=True), "name": path.stem, "path": str(path)})
