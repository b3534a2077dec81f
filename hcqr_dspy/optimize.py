"""Prompt optimization: recipes, metrics (with feedback for GEPA) and compiling a program.

A **recipe** is a YAML file (``optimizers/*.yaml``) that names a DSPy
optimizer and its settings; ``hcqr compile`` reads it, so a new recipe needs
no code. It is a pydantic model (:class:`RecipeSpec`; read by
:mod:`hcqr_dspy.config`): unknown keys are refused, types are checked
strictly and ranges as listed. Keys:

=============  ==============================================================
optimizer      ``BootstrapFewShot``, ``BootstrapFewShotWithRandomSearch``,
               ``MIPROv2`` or ``GEPA`` (``dspy.teleprompt``); required
description    free text
metric         ``accuracy`` (gold letter, invalid = wrong) or ``feedback``
               (the same score plus a textual diagnosis; GEPA only)
train_size     training questions drawn from the train file (seeded
               sample), an integer >= 1 and >= ``min_train`` (default 30)
val_size       validation questions drawn after them, disjoint, >= 0 (0:
               none; optimizers that need one then use the training
               questions; default 0)
min_train      the least training questions the recipe accepts, >= 1 (default 2)
seed           sampling seed (and the optimizer's ``seed`` where it has
               one), >= 0 (default 0)
settings       keyword arguments of the optimizer's constructor; names and
               annotated types checked against its signature
               (:func:`hcqr_dspy.config.check_arguments`; ``metric`` and
               ``reflection_lm`` are set here, not in the recipe)
compile        keyword arguments of its ``compile()``, checked the same way
               (``student``, ``trainset``, ``valset`` and ``teacher`` are
               set here)
reflection_lm  GEPA only: an ``--lm`` spec of the reflection LM
               (``--reflection-lm`` overrides it; GEPA refuses to start
               without one)
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

import contextlib
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import dspy
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.metrics import accuracy_metric

DEMO_CONTEXT_TOKENS = 600
METRICS = ("accuracy", "feedback")
# Arguments hcqr sets itself: a recipe may not.
OWN_INIT_ARGS = frozenset({"self", "metric", "reflection_lm", "prompt_model", "task_model", "teacher_settings"})
OWN_COMPILE_ARGS = frozenset({"self", "student", "trainset", "valset", "teacher"})


class RecipeError(HCQRError):
    """A recipe that cannot run: unreadable, unknown keys, optimizer or settings, a train set too small."""


def optimizers() -> dict[str, type]:
    """The optimizers a recipe may name (``dspy.teleprompt`` classes)."""
    from dspy.teleprompt import GEPA, BootstrapFewShot, BootstrapFewShotWithRandomSearch, MIPROv2

    return {c.__name__: c for c in (BootstrapFewShot, BootstrapFewShotWithRandomSearch, MIPROv2, GEPA)}


Count = Annotated[int, Field(ge=0)]


class RecipeSpec(BaseModel):
    """A recipe file's content (see the module note for the keys, their ranges and defaults)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    optimizer: Literal["BootstrapFewShot", "BootstrapFewShotWithRandomSearch", "MIPROv2", "GEPA"]
    description: str = ""
    metric: Literal["accuracy", "feedback"] = "accuracy"
    train_size: Annotated[int, Field(ge=1)] = 30
    val_size: Count = 0
    min_train: Annotated[int, Field(ge=1)] = 2
    seed: Count = 0
    settings: dict[str, Any] = Field(default_factory=dict)
    compile: dict[str, Any] = Field(default_factory=dict)
    reflection_lm: Annotated[str, Field(min_length=1)] | None = None
    demo_context_tokens: Count = DEMO_CONTEXT_TOKENS

    @field_validator("settings", "compile")
    @classmethod
    def _optimizer_arguments(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from hcqr_dspy.config import check_arguments

        name = info.data.get("optimizer")
        if name is None:  # the optimizer itself is wrong: that error is the one reported
            return value
        optimizer = optimizers()[name]
        if info.field_name == "settings":
            return check_arguments((optimizer.__init__,), value, OWN_INIT_ARGS, f"{name} setting(s)")
        return check_arguments((optimizer.compile,), value, OWN_COMPILE_ARGS, f"{name}.compile argument(s)")

    @model_validator(mode="after")
    def _consistent(self) -> "RecipeSpec":
        if self.metric == "feedback" and self.optimizer != "GEPA":
            raise ValueError(f"metric 'feedback' is for GEPA; {self.optimizer} needs metric 'accuracy'")
        if self.reflection_lm is not None and self.optimizer != "GEPA":
            raise ValueError(f"'reflection_lm' is for GEPA only, not {self.optimizer}")
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
    from hcqr_dspy.config import read_yaml, validate
    from hcqr_dspy.resources import find

    path, _ = find("recipe", name_or_path, RecipeError)
    raw, node = read_yaml(path, RecipeError, "recipe")
    spec = validate(RecipeSpec, raw, path, RecipeError, node)
    return Recipe.model_validate({**spec.model_dump(), "name": path.stem, "path": str(path)})


# -- metrics ------------------------------------------------------------------------------------
_WORD = re.compile(r"[a-z0-9]+")
_STOP = {"with", "from", "that", "this", "which", "their", "there", "into", "than", "other", "none", "above", "only"}


def content_words(text: str) -> list[str]:
    """Lower-case words of 4+ characters, minus a few function words: what must appear for a mention."""
    return [w for w in _WORD.findall(str(text).lower()) if len(w) >= 4 and w not in _STOP]


def mentions(option_text: str, passages: list[str]) -> bool:
    """Whether one passage holds every content word of an option (an option of short words: the whole text).

    A cheap, transparent proxy for "the context contained evidence naming the
    correct option"; it is used only to word the feedback, never the score.
    """
    words = content_words(option_text) or [str(option_text).lower().strip()]
    return any(all(w in p.lower() for w in words) for p in passages)


def diagnose(example: dspy.Example, pred: Any, passages: list[str] | None = None) -> tuple[float, str, str]:
    """Score (1 correct, 0 otherwise) and what went wrong in a prediction.

    Args:
        example: The question with its gold ``answer`` and ``options``.
        pred: The program's prediction (``answer``, ``valid``, ``error``, and
            for HCQR ``hypothesis``).
        passages: Texts of the passages the answer step saw, to tell whether
            the correct option was named in the context.

    Returns:
        ``(score, case, feedback)``; ``case`` is one of ``correct``,
        ``invalid_answer``, ``wrong_hypothesis_no_evidence``,
        ``wrong_hypothesis_evidence_ignored``, ``right_hypothesis_flipped``,
        ``wrong_hypothesis_corrected`` (correct, listed apart), ``wrong``.
    """
    gold = example.answer
    gold_text = example.options.get(gold, "")
    letters = ", ".join(example.options)
    h = pred.get("hypothesis") if hasattr(pred, "get") else None
    y0 = (h or {}).get("working_hypothesis")
    if not getattr(pred, "valid", False):
        error = getattr(pred, "error", None) or "no letter"
        return 0.0, "invalid_answer", (
            f"Invalid answer format: the reply was not one of the option letters ({letters}) [{str(error)[:200]}]. "
            "The answer must be exactly one option letter."
        )
    answer = pred.answer
    if answer == gold:
        if y0 and y0 != gold:
            return 1.0, "wrong_hypothesis_corrected", (
                f"Correct ({gold}. {gold_text}), although the working hypothesis was {y0} "
                f"({example.options.get(y0, '?')}); the retrieved evidence corrected it."
            )
        return 1.0, "correct", f"Correct: {gold}. {gold_text}."
    chosen = f"{answer} ({example.options.get(answer, '?')})"
    if y0 is None:
        return 0.0, "wrong", f"Wrong: answered {chosen}; the correct answer is {gold}. {gold_text}."
    if y0 == gold:
        return 0.0, "right_hypothesis_flipped", (
            f"The working hypothesis {gold} ({gold_text}) was right, but the final answer flipped away to {chosen}. "
            "The answer step should keep the option that the question's findings and the context support."
        )
    evidence = mentions(gold_text, passages or [])
    if not evidence:
        return 0.0, "wrong_hypothesis_no_evidence", (
            f"Wrong hypothesis {y0} ({example.options.get(y0, '?')}); the correct answer is {gold} ({gold_text}), and no "
            f"retrieved passage names it: the context did not contain distinguishing evidence. The hypothesis should "
            f"weigh the findings that separate the options, and the distinction query should contrast {y0} with the "
            "alternatives by the features that tell them apart."
        )
    return 0.0, "wrong_hypothesis_evidence_ignored", (
        f"Wrong hypothesis {y0} ({example.options.get(y0, '?')}); the context did name the correct answer {gold} "
        f"({gold_text}) but the final answer was {chosen}. The answer step should weigh the passages over the first guess."
    )


# Which diagnoses concern which HCQR predictor (GEPA asks per predictor via pred_name).
_BLAME = {
    "hypothesis": {"wrong_hypothesis_no_evidence", "wrong_hypothesis_evidence_ignored", "wrong_hypothesis_corrected"},
    "rewrite": {"wrong_hypothesis_no_evidence"},
    "answer": {"invalid_answer", "right_hypothesis_flipped", "wrong_hypothesis_evidence_ignored", "wrong"},
}


def make_metric(kind: str, retriever=None) -> Callable:
    """The DSPy metric named by a recipe.

    Args:
        kind: ``accuracy`` -> ``metric(example, pred, trace=None) -> bool``
            (:func:`hcqr_dspy.metrics.accuracy_metric`); ``feedback`` -> GEPA's
            ``metric(gold, pred, trace, pred_name, pred_trace) ->
            dspy.Prediction(score, feedback)`` built on :func:`diagnose`.
        retriever: Used by ``feedback`` to read the passages the answer step saw.

    Raises:
        RecipeError: an unknown kind.
    """
    if kind == "accuracy":
        return accuracy_metric
    if kind != "feedback":
        raise RecipeError(f"unknown metric {kind!r}; valid metrics: {', '.join(METRICS)}")

    def feedback_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        texts = []
        if retriever is not None:
            texts = [retriever.get(p["id"]).text for p in (pred.get("passages") or [])]
        score, case, text = diagnose(gold, pred, texts)
        if pred_name in _BLAME and case not in ("correct",) and case not in _BLAME[pred_name]:
            text += f" (This outcome is not mainly due to the {pred_name} step.)"
        return dspy.Prediction(score=score, feedback=text)

    return feedback_metric


# -- compiling ----------------------------------------------------------------------------------
def split_train(examples: list[dspy.Example], recipe: Recipe, train_size: int | None = None,
                val_size: int | None = None) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """A seeded train sample and a disjoint validation sample.

    Raises:
        RecipeError: fewer questions than ``train_size + val_size``, or a
            train size under the recipe's ``min_train`` (the minimum is named).
    """
    from hcqr_dspy.data import select

    n_train = recipe.train_size if train_size is None else train_size
    n_val = recipe.val_size if val_size is None else val_size
    if n_train < recipe.min_train:
        raise RecipeError(
            f"a train set of {n_train} question(s) is too small for recipe {recipe.name!r} ({recipe.optimizer}); "
            f"it needs at least {recipe.min_train}"
        )
    if len(examples) < n_train + n_val:
        raise RecipeError(f"the train file has {len(examples)} questions; recipe {recipe.name!r} needs {n_train} + {n_val} (validation)")
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
            raise RecipeError(f"recipe {recipe.name!r} (GEPA) needs a reflection LM: give --reflection-lm or set reflection_lm in the recipe")
        kwargs["reflection_lm"] = reflection_lm
    return cls(metric=metric, **kwargs)


def compile_program(recipe: Recipe, student, trainset: list[dspy.Example], valset: list[dspy.Example] | None = None,
                    reflection_lm=None):
    """Run the recipe's optimizer on ``student`` (under the caller's ``dspy.context``) and return the compiled program.

    The student is not modified (DSPy optimizers compile a copy).

    Raises:
        RecipeError: see :func:`build_optimizer`.
    """
    metric = make_metric(recipe.metric, getattr(student, "retriever", None))
    optimizer = build_optimizer(recipe, metric, reflection_lm)
    kwargs = dict(recipe.compile)
    if "valset" in inspect.signature(type(optimizer).compile).parameters and valset:
        kwargs["valset"] = valset
    student.demo_context_tokens = recipe.demo_context_tokens  # demos are shown trimmed while candidates are scored
    compiled = optimizer.compile(student, trainset=trainset, **kwargs)
    trim_demo_contexts(compiled, recipe.demo_context_tokens)
    return compiled


def trim_demo_contexts(program, max_tokens: int) -> int:
    """Cut, in place, the ``context`` of every few-shot demo of ``program`` to ``max_tokens``
    (:func:`hcqr_dspy.programs.base.trim_context`, tokens counted with the LM in ``dspy.settings``),
    so that saved programs hold what is shown.

    Returns:
        How many demo contexts were cut.
    """
    from hcqr_dspy.lm import count_tokens
    from hcqr_dspy.programs.base import trim_context

    lm = dspy.settings.lm
    cut = 0
    for predictor in program.predictors():
        for demo in predictor.demos:
            context = demo.get("context") if hasattr(demo, "get") else None
            if isinstance(context, str) and count_tokens(lm, context) > max_tokens:
                demo["context"] = trim_context(context, max_tokens, lm)
                cut += 1
    return cut


@dataclass
class CompileSpec:
    """Everything ``hcqr compile`` needs (recorded with the saved program).

    Attributes:
        recipe: Recipe name or path (see :func:`load_recipe`).
        method: Registered method to compile (``hcqr``).
        train: MIRAGE-format file of training/validation questions.
        index: Index folder the program retrieves from while compiling.
        out: Folder of the saved program.
        lm: ``--lm`` spec of the task LM.
        reflection_lm: GEPA's reflection LM spec (overrides the recipe's).
        reflection_api_base / reflection_api_key_env: Its endpoint and key
            variable (not inherited from the task LM: the two are often
            different services).
        train_size / val_size: Override the recipe's sizes.
        holdout: Evaluation files that must not share a question (id within
            the same dataset, or text) with the training questions.
        program_options: Method options (``budget``, ``k_per_query`` ...).
        max_tokens / n_ctx / api_base / api_key_env: LM settings, as for ``hcqr eval``.
    """

    recipe: str
    method: str
    train: str
    index: str | None
    out: str
    lm: str = "local"
    reflection_lm: str | None = None
    reflection_api_base: str | None = None
    reflection_api_key_env: str | None = None
    train_size: int | None = None
    val_size: int | None = None
    holdout: list[str] = field(default_factory=list)
    program_options: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 1024
    n_ctx: int = 8192
    api_base: str | None = None
    api_key_env: str | None = None
    register: str | None = None
    alias: str | None = None


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


def probe_writable(folder: Path) -> None:
    """Check that ``folder`` can be created and written, leaving nothing behind that was not there.

    Raises:
        HCQRError: it cannot be created or written (a read-only or full disk, ``/proc`` ...).
    """
    from hcqr_dspy.evaluate import write_probe

    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        write_probe(folder)
    except OSError as exc:
        raise HCQRError(f"--out {folder} is not writable: {exc.strerror or exc}; choose another --out") from None
    finally:
        for p in missing:  # deepest first
            try:
                p.rmdir()
            except OSError:
                pass


def run_compile(spec: CompileSpec, mlflow_dir=None, track: bool = True, lm=None, reflection_lm=None) -> dict[str, Any]:
    """:func:`compile_and_save` as the one writer of ``spec.out``: a second compile into the same folder is
    refused at once, naming the process that writes it (:class:`~hcqr_dspy.run_folder.WriterLock`, on
    ``.<out>.writer.lock`` beside the folder, removed at the end). Folders made for the lock are removed again
    when the compile fails.

    Raises:
        RunError: another process compiles into ``spec.out``. See :func:`compile_and_save`.
    """
    from hcqr_dspy.run_folder import WriterLock

    out = Path(spec.out)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HCQRError(f"--out {out} is not writable: {exc.strerror or exc}; choose another --out") from None
    ok = False
    try:
        with WriterLock(out, "compile", lock_file=out.parent / f".{out.name}.writer.lock"):
            result = compile_and_save(spec, mlflow_dir, track, lm, reflection_lm)
        ok = True
        return result
    finally:
        if not ok:
            for folder in made:  # deepest first; only the empty ones
                with contextlib.suppress(OSError):
                    folder.rmdir()


def compile_and_save(spec: CompileSpec, mlflow_dir=None, track: bool = True, lm=None,
                     reflection_lm=None) -> dict[str, Any]:
    """Compile a program with a recipe, save it, and track the compile in MLflow (call :func:`run_compile`).

    Every input is checked before the first LM call: the recipe, the method,
    the LM specs (GEPA's reflection LM included), the train file and its size,
    the overlap with ``holdout`` files, the index and the output folder.

    Args:
        spec: What to compile.
        mlflow_dir: MLflow store folder.
        track: Log to MLflow: params, the optimizer's trials
            (``mlflow.dspy.autolog(log_compiles=True)``), the saved program
            folder as ``program`` artifacts, the recipe, metrics (the optimizer's own
            validation score ``val_score`` where it has one, :func:`optimizer_scores`; the
            training and validation sizes; demos per predictor and whether its
            instructions changed), and the program as an MLflow pyfunc model logged
            from code (:func:`hcqr_dspy.serving.log_program_model`: no pickle; the model
            config names the index and the LM), registered as ``spec.register`` (with
            ``spec.alias``) when given.
        lm / reflection_lm: Ready ``dspy.LM`` objects instead of building the specs (tests).

    Returns:
        ``{"out", "mlflow_run_id", "model_uri", "registered", "scores", "train", "val", "predictors": {name:
        {"demos", "instructions_changed"}}}`` (``mlflow_run_id``, ``model_uri`` and ``registered`` are
        None untracked or unregistered).

    Raises:
        RecipeError, HCQRError: bad input as listed above, or an unwritable ``out``
            (checked before any LM call).
        LMUnavailableError: the LM stopped answering during the compile (nothing is saved; a
            rerun gets the calls already answered from DSPy's cache).
    """
    import json

    from hcqr_dspy.data import load_questions
    from hcqr_dspy.lm import build_lm, parse_lm_spec
    from hcqr_dspy.program_io import META_FILE, ProgramFormatError, question_keys, refuse_overlap, save_program
    from hcqr_dspy.programs import PROGRAMS, make_program
    from hcqr_dspy.run import dataset_name, open_index

    recipe = load_recipe(spec.recipe)
    if spec.alias and not spec.register:
        raise HCQRError("--alias needs --register NAME")
    if spec.register and not track:
        raise HCQRError("--register needs MLflow tracking (drop --no-mlflow)")
    if spec.method not in PROGRAMS:
        raise HCQRError(f"unknown method {spec.method!r}; choose one of {', '.join(PROGRAMS)}")
    lm_cfg = parse_lm_spec(spec.lm, api_base=spec.api_base, api_key_env=spec.api_key_env)
    reflection_spec = spec.reflection_lm or recipe.reflection_lm
    if recipe.optimizer == "GEPA":
        if reflection_lm is None and not reflection_spec:
            raise RecipeError(f"recipe {recipe.name!r} (GEPA) needs a reflection LM: give --reflection-lm or set reflection_lm in the recipe")
        if reflection_spec:
            parse_lm_spec(reflection_spec, api_base=spec.reflection_api_base, api_key_env=spec.reflection_api_key_env,
                          option="--reflection-lm")
    out = Path(spec.out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / META_FILE).is_file())):
        raise ProgramFormatError(f"{out} exists and is not a saved program folder; choose another --out")
    train_name = dataset_name(spec.train)
    trainset, valset = split_train(load_questions(spec.train), recipe, spec.train_size, spec.val_size)
    keys = question_keys(trainset + valset, train_name)
    for file in spec.holdout:
        refuse_overlap(keys, load_questions(file), dataset_name(file), f"compile --holdout {file}")
    retriever, index_info = open_index(spec.method, spec.index)
    student = make_program(spec.method, retriever, **spec.program_options)
    probe_writable(out)  # a compile can run for hours: find an unwritable --out now, not when saving
    lm = lm or build_lm(spec.lm, max_tokens=spec.max_tokens, n_ctx=spec.n_ctx, api_base=spec.api_base,
                        api_key_env=spec.api_key_env)
    if recipe.optimizer == "GEPA" and reflection_lm is None:
        reflection_lm = build_lm(reflection_spec, temperature=1.0, max_tokens=2048, n_ctx=spec.n_ctx,
                                 api_base=spec.reflection_api_base, api_key_env=spec.reflection_api_key_env)
    meta = {
        "optimizer": recipe.optimizer,
        "recipe": recipe.record(),
        "lm": lm_cfg.params(),
        "reflection_lm": reflection_spec if recipe.optimizer == "GEPA" else None,
        "demo_context_tokens": recipe.demo_context_tokens,
        "index": index_info,
        # Every question the optimizer saw (training and validation): what later evaluations are checked against.
        "train": {**keys, "file": str(Path(spec.train).resolve()) if Path(spec.train).exists() else spec.train,
                  "train_count": len(trainset), "val_count": len(valset)},
    }

    def _compile():
        from dspy.utils.callback import BaseCallback

        from hcqr_dspy.evaluate import LM_UNAVAILABLE, LMUnavailableError, lm_failure

        failures: list[BaseException] = []

        class LMFailures(BaseCallback):
            # Optimizers count a failed example as an error and go on (BootstrapFewShot up to max_errors), so an
            # LM that went down could silently yield a program with fewer demos; every such failure is recorded.
            def on_lm_end(self, call_id, outputs, exception=None):
                if isinstance(exception, LM_UNAVAILABLE):
                    failures.append(exception)

        def unavailable(exc: BaseException) -> LMUnavailableError:
            return LMUnavailableError(
                f"the LM stopped answering or cannot be used during the compile ({lm_failure(exc)}); "
                f"nothing was saved to {out}; run the same command again (LM calls already answered come from DSPy's cache)"
            )

        callbacks = [*dspy.settings.get("callbacks", []), LMFailures()]
        try:
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter(), callbacks=callbacks):
                compiled = compile_program(recipe, student, trainset, valset, reflection_lm=reflection_lm)
        except LM_UNAVAILABLE as exc:
            raise unavailable(exc) from None
        if failures:
            raise unavailable(failures[0])
        return compiled

    run_id = model_uri = registered = None
    scores: dict[str, float] = {}
    if track:
        import mlflow
        import mlflow.dspy

        from hcqr_dspy import tracking

        params = {"recipe": recipe.record(), "method": spec.method, "program": student.settings(), "lm": lm_cfg.params(),
                  "train": {"file": meta["train"]["file"], "count": len(trainset), "val_count": len(valset)},
                  "index": index_info}
        with tracking.mlflow_run(f"compile · {spec.method} · {recipe.name} · {spec.lm}", params,
                                 tags={"kind": "compile", "method": spec.method, "optimizer": recipe.optimizer,
                                       "recipe": recipe.name, "lm": spec.lm, "dataset": train_name},
                                 store=mlflow_dir, traces=False) as run:
            run_id = run.info.run_id
            mlflow.dspy.autolog(log_compiles=True, log_traces=False, log_traces_from_compile=False, silent=True)
            try:
                compiled = _compile()
            finally:
                mlflow.dspy.autolog(disable=True, silent=True)
            save_program(compiled, out, mlflow_run_id=run_id, **meta)
            mlflow.log_artifacts(str(out), artifact_path="program")
            mlflow.log_artifact(recipe.path, artifact_path="recipe")
            scores = optimizer_scores(compiled)
            mlflow.log_metrics({**scores, "train_size": len(trainset), "val_size": len(valset),
                                **{f"demos.{name}": len(p.demos) for name, p in compiled.named_predictors()},
                                **{f"instructions_changed.{name}": float(p.signature.instructions != q.signature.instructions)
                                   for (name, p), (_, q) in zip(compiled.named_predictors(), student.named_predictors())}})
            if not scores:
                mlflow.set_tag("val_score", f"none: {recipe.optimizer} does not score candidates on a validation set")
            from hcqr_dspy.serving import log_program_model

            logged = log_program_model(out, lm=spec.lm, index=spec.index, register=spec.register, alias=spec.alias,
                                       max_tokens=spec.max_tokens, n_ctx=spec.n_ctx, api_base=spec.api_base,
                                       api_key_env=spec.api_key_env, name=spec.method)
            model_uri, registered = logged["model_uri"], logged["registered"]
            if registered:
                mlflow.MlflowClient().set_model_version_tag(spec.register, str(logged["version"]), "recipe", recipe.name)
    else:
        compiled = _compile()
        save_program(compiled, out, mlflow_run_id=None, **meta)

    before = student.dump_state()
    after = json.loads((out / "program.json").read_text(encoding="utf-8"))
    predictors = {
        name: {
            "demos": len(after[name].get("demos") or []),
            "instructions_changed": after[name]["signature"]["instructions"] != before[name]["signature"]["instructions"],
        }
        for name in before
    }
    return {"out": str(out), "mlflow_run_id": run_id, "model_uri": model_uri, "registered": registered, "scores": scores,
            "train": len(trainset), "val": len(valset), "predictors": predictors}
