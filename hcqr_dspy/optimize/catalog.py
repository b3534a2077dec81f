"""The DSPy optimizers a recipe may name, and what hcqr needs to know of each: one entry per optimizer class.

Each :class:`Optimizer` entry says

* **where the seed goes** (``seed``): ``"compile"``, ``compile(seed=...)`` (SIMBA: ``random.Random(seed)`` and
  ``numpy.random.default_rng(seed)`` shuffle the training questions into its mini-batches, pick the programs it
  samples trajectories from, the demos it drops and the strategy it applies: append a demo or a rule), or
  ``"argument"``, the constructor's ``seed`` (MIPROv2: its ``rng`` draws the
  demo candidate sets, the proposer's tips and data batches, its minibatches, and seeds optuna's TPE sampler;
  ``compile(seed=...)`` is read as ``seed or self.seed``, so a compile seed of 0 is silently the constructor's,
  and hcqr sets the constructor's only. GEPA: ``random.Random(self.seed)`` picks its minibatches and candidates),
  or ``"train_order"``, the optimizer has no seed of its own and draws with fixed seeds, so only the training
  questions and their order can change what it returns (BootstrapFewShot: it bootstraps the training questions
  in order and keeps the first ``max_bootstrapped_demos`` traces that pass the metric; its labelled demos are
  ``random.Random(0).sample`` of the rest, shuffled with ``random.Random(0)``. BootstrapFewShotWithRandomSearch:
  its candidate ``c`` shuffles the training questions with ``random.Random(c)``, ``c`` in
  ``range(-3, num_candidate_programs)`` whatever the seed. LabeledFewShot: ``random.Random(0).sample`` of the
  training questions for each predictor). Sources: ``dspy/teleprompt/bootstrap.py``, ``random_search.py``,
  ``vanilla.py``, ``mipro_optimizer_v2.py``, ``gepa/gepa.py``, ``simba.py`` (DSPy 3.4).
  :func:`hcqr_dspy.optimize.recipe_compile.split_train` draws and orders the training questions with the recipe's seed,
  so the seed reaches every optimizer.
* **its candidate scores** (``scores``, ``score_scale``): where the score of the program it returned is read
  (``candidate_programs``: BootstrapFewShotWithRandomSearch's candidates, best first, ``"score"`` each;
  ``program_score``: MIPROv2's best full evaluation ``program.score``; ``gepa_results``: GEPA's
  ``detailed_results.val_aggregate_scores[best_idx]``, with ``track_stats``) and its scale (``dspy.Evaluate``
  scores are percentages, 100; GEPA's are fractions, 1; SIMBA's ``candidate_programs``, best first, hold the mean
  metric over the training questions, fractions) and the questions they were measured on (``scored_on``:
  ``"valset"``, reported as ``val_score``; ``"trainset"``, SIMBA, which keeps no validation set, as
  ``train_score``). ``None``: it scores no candidate.
* **whether it needs a reflection LM** (GEPA).
* **the metrics it accepts** (:mod:`hcqr_dspy.optimize.feedback`); ``()``: it takes no metric (LabeledFewShot
  copies training questions without running the program).
* **its mini-batch size** (``batch_setting``: SIMBA's ``bsize``, which it asserts is at most the training
  questions), checked before it runs.
* **the settings that bound its demos** (``demo_settings``) and the one that asks for bootstrapped traces
  (``bootstrap_setting``), with the constructor's defaults where a recipe leaves them out.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Literal, get_args

from dspy.teleprompt import (
    GEPA,
    SIMBA,
    BootstrapFewShot,
    BootstrapFewShotWithRandomSearch,
    LabeledFewShot,
    MIPROv2,
)

OptimizerName = Literal[
    "BootstrapFewShot", "BootstrapFewShotWithRandomSearch", "MIPROv2", "GEPA", "LabeledFewShot", "SIMBA"
]
ACCURACY_METRICS = ("accuracy", "grounded")
FEEDBACK_METRICS = ("feedback", "feedback_gold_prob")


@dataclass(frozen=True)
class Optimizer:
    """What hcqr knows of one DSPy optimizer class (see the module note)."""

    cls: type
    seed: Literal["argument", "compile", "train_order"]
    scores: Literal["candidate_programs", "program_score", "gepa_results"] | None
    score_scale: float | None
    reflection_lm: bool
    metrics: tuple[str, ...]
    demo_settings: tuple[str, ...] = ()
    bootstrap_setting: str | None = None
    scored_on: Literal["valset", "trainset"] = "valset"
    batch_setting: str | None = None  # a mini-batch size: the training questions must be at least this many

    @property
    def score_key(self) -> str:
        """The name its candidate score is reported under: ``val_score`` or ``train_score``."""
        return "val_score" if self.scored_on == "valset" else "train_score"

    @property
    def name(self) -> str:
        return self.cls.__name__

    def setting(self, name: str, settings: dict[str, Any], compile_args: dict[str, Any] | None = None) -> Any:
        """A setting's value as the optimizer will use it: ``compile()``'s argument (MIPROv2 takes demo counts
        there too), else the recipe's constructor setting, else the constructor's default (``None`` if none)."""
        if compile_args and compile_args.get(name) is not None:
            return compile_args[name]
        if name in settings:
            return settings[name]
        parameter = inspect.signature(self.cls.__init__).parameters.get(name)
        return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


CATALOG: dict[str, Optimizer] = {
    e.name: e
    for e in (
        Optimizer(
            BootstrapFewShot,
            seed="train_order",
            scores=None,
            score_scale=None,
            reflection_lm=False,
            metrics=ACCURACY_METRICS,
            demo_settings=("max_bootstrapped_demos", "max_labeled_demos"),
            bootstrap_setting="max_bootstrapped_demos",
        ),
        Optimizer(
            BootstrapFewShotWithRandomSearch,
            seed="train_order",
            scores="candidate_programs",
            score_scale=100.0,
            reflection_lm=False,
            metrics=ACCURACY_METRICS,
            demo_settings=("max_bootstrapped_demos", "max_labeled_demos"),
            bootstrap_setting="max_bootstrapped_demos",
        ),
        Optimizer(
            MIPROv2,
            seed="argument",
            scores="program_score",
            score_scale=100.0,
            reflection_lm=False,
            metrics=ACCURACY_METRICS,
            demo_settings=("max_bootstrapped_demos", "max_labeled_demos"),
            bootstrap_setting="max_bootstrapped_demos",
        ),
        Optimizer(
            GEPA, seed="argument", scores="gepa_results", score_scale=1.0, reflection_lm=True, metrics=FEEDBACK_METRICS
        ),
        Optimizer(
            LabeledFewShot,
            seed="train_order",
            scores=None,
            score_scale=None,
            reflection_lm=False,
            metrics=(),
            demo_settings=("k",),
        ),
        Optimizer(
            SIMBA,
            seed="compile",
            scores="candidate_programs",
            score_scale=1.0,
            reflection_lm=False,
            metrics=ACCURACY_METRICS,
            demo_settings=("max_demos",),
            scored_on="trainset",
            batch_setting="bsize",
        ),
    )
}
if set(CATALOG) != set(get_args(OptimizerName)):  # pragma: no cover - a catalog edited without its name list
    raise RuntimeError(f"optimizer catalog {sorted(CATALOG)} and OptimizerName {get_args(OptimizerName)} differ")


def entry(name: str) -> Optimizer:
    """The catalog entry of optimizer ``name`` (a name :data:`OptimizerName` allows)."""
    return CATALOG[name]


def accepting(metric: str) -> list[str]:
    """The optimizers that accept ``metric``, in catalog order."""
    return [name for name, e in CATALOG.items() if metric in e.metrics]


def metric_problem(optimizer: str, metric: str | None) -> str | None:
    """Why ``optimizer`` cannot use ``metric`` (``None``: none given) in one line, or ``None``."""
    e = entry(optimizer)
    if not e.metrics:
        return None if metric is None else f"{optimizer} takes no metric (it runs no program); leave 'metric' out"
    if metric in e.metrics:
        return None
    wanted = " or ".join(repr(m) for m in e.metrics)
    if e.metrics == FEEDBACK_METRICS:
        return f"{optimizer} needs metric {wanted} (a score with textual feedback), not {metric!r}"
    return f"metric {metric!r} is for {', '.join(accepting(metric))}; {optimizer} needs metric {wanted}"


def bootstraps_asked(optimizer: str, settings: dict[str, Any], compile_args: dict[str, Any]) -> int:
    """How many bootstrapped traces per predictor the recipe asks ``optimizer`` for (0 where it bootstraps none)."""
    e = entry(optimizer)
    if e.bootstrap_setting is None:
        return 0
    return int(e.setting(e.bootstrap_setting, settings, compile_args) or 0)


def demos_asked(optimizer: str, settings: dict[str, Any], compile_args: dict[str, Any]) -> int | None:
    """The most demos per predictor the recipe asks ``optimizer`` for (``None``: it makes no demos, GEPA)."""
    e = entry(optimizer)
    if not e.demo_settings:
        return None
    return sum(int(e.setting(s, settings, compile_args) or 0) for s in e.demo_settings)


def seed_problem(
    optimizer: str, settings: dict[str, Any], compile_args: dict[str, Any], file_questions: int | None = None
) -> str | None:
    """Why no seed can change what ``optimizer`` compiles under these settings (one line), or ``None``.

    An optimizer with a seed argument always depends on it. One without (``train_order``) depends on the seed
    only through the training questions drawn and their order, and those change only the demos it makes from
    them: asked for no demos, or given a train file of one question (``file_questions``: how many the file holds),
    every seed compiles the same program.
    """
    e = entry(optimizer)
    if e.seed in ("argument", "compile"):
        return None
    why = f"{optimizer} takes no seed of its own (the seed only draws and orders the training questions) and"
    if demos_asked(optimizer, settings, compile_args) == 0:
        shown = ", ".join(f"{s}: {e.setting(s, settings, compile_args)}" for s in e.demo_settings)
        return f"{why} this recipe asks it for no demos ({shown}): every seed compiles the same program"
    if file_questions == 1:
        return f"{why} the train file holds one question: every seed draws it, and compiles the same program"
    return None
