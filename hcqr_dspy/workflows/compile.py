"""``hcqr compile``: compile a program with a recipe, save it, and track the compile in MLflow.

Every input is checked before the first LM call (:func:`compile_and_save`); one process at a time compiles into
an output folder (:func:`run_compile`). The recipe, its metric and the optimizer are :mod:`hcqr_dspy.optimize`;
the saved folder is :mod:`hcqr_dspy.optimize.saved`, logged as an MLflow pyfunc model by
:mod:`hcqr_dspy.tracking.serving`.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import ContextWindowExceededError

from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import HCQRError, LMUnavailableError, ProgramFormatError, RecipeError
from hcqr_dspy.evaluation.evaluate import LM_UNAVAILABLE
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.outages import lm_failure
from hcqr_dspy.evaluation.records import write_probe
from hcqr_dspy.lm import build_lm, parse_lm_spec
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.optimize.compile import check_recipe_for, compile_program, optimizer_scores, split_train
from hcqr_dspy.optimize.recipes import load_recipe
from hcqr_dspy.optimize.saved import META_FILE, question_keys, refuse_overlap, save_program
from hcqr_dspy.programs import PROGRAMS, make_program, refuse_bound
from hcqr_dspy.programs.costs import lm_costs
from hcqr_dspy.tracking.mlflow_runs import describe_compile_run, drop_autolog_placeholders, mlflow_run
from hcqr_dspy.tracking.prompts import register_program_prompts, safe_name
from hcqr_dspy.tracking.serving import log_program_model
from hcqr_dspy.workflows.specs import dataset_name, open_index


@dataclass
class CompileSpec:
    """Everything ``hcqr compile`` needs (recorded with the saved program).

    Attributes:
        recipe: Recipe name or path (see :func:`~hcqr_dspy.optimize.recipes.load_recipe`).
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


def probe_writable(folder: Path) -> None:
    """Check that ``folder`` can be created and written, leaving nothing behind that was not there.

    Raises:
        HCQRError: it cannot be created or written (a read-only or full disk, ``/proc`` ...).
    """
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


def check_registry_names(register: str, alias: str | None, option: str = "--register") -> None:
    """Refuse a registered model name or alias the Model Registry would refuse, before any LM call (MLflow's own
    rules: ``mlflow.utils.validation``; a name without ``/`` or ``:``, an alias of letters, digits, ``_`` and ``-``
    that is neither ``latest`` nor ``v<number>``).

    Raises:
        HCQRError: the name or the alias, and why.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation

    checks = [(option, register, validation._validate_model_name)]
    if alias is not None:
        checks += [
            ("--alias", alias, validation._validate_model_alias_name),
            ("--alias", alias, validation._validate_model_alias_name_reserved),
        ]
    for option, value, check in checks:
        try:
            check(value)
        except MlflowException as exc:
            raise HCQRError(f"{option} {value!r}: {exc.message.splitlines()[0]}") from None


def run_compile(spec: CompileSpec, mlflow_dir=None, track: bool = True, lm=None, reflection_lm=None) -> dict[str, Any]:
    """:func:`compile_and_save` as the one writer of ``spec.out``: a second compile into the same folder is
    refused at once, naming the process that writes it (:class:`~hcqr_dspy.evaluation.lock.WriterLock`, on
    ``.<out>.writer.lock`` beside the folder, removed at the end). Folders made for the lock are removed again
    when the compile fails.

    Raises:
        RunError: another process compiles into ``spec.out``. See :func:`compile_and_save`.
    """
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


def compile_and_save(
    spec: CompileSpec, mlflow_dir=None, track: bool = True, lm=None, reflection_lm=None
) -> dict[str, Any]:
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
            validation score ``val_score`` where it has one, :func:`~hcqr_dspy.optimize.compile.optimizer_scores`; the
            training and validation sizes; demos per predictor and whether its
            instructions changed), and the program as an MLflow pyfunc model logged
            from code (:func:`hcqr_dspy.tracking.serving.log_program_model`: no pickle; the model
            config names the index and the LM), registered as ``spec.register`` (with
            ``spec.alias``) when given; each stage's instructions and demos as a versioned prompt
            ``<register or out folder name>.<stage>``, linked to the run and the model
            (:mod:`hcqr_dspy.tracking.prompts`); a run description. The placeholder models that
            ``mlflow.dspy.autolog`` logs for each optimizer ``compile`` call are deleted.
        lm / reflection_lm: Ready ``dspy.LM`` objects instead of building the specs (tests).

    Returns:
        ``{"out", "mlflow_run_id", "model_uri", "registered", "scores", "train", "val", "predictors": {name:
        {"demos", "instructions_changed"}}, "prompts": ["prompts:/NAME/VERSION", ...]}`` (``mlflow_run_id``,
        ``model_uri`` and ``registered`` are None untracked or unregistered; ``prompts`` is empty untracked).

    Raises:
        RecipeError, HCQRError: bad input as listed above, or an unwritable ``out``
            (checked before any LM call).
        LMUnavailableError: the LM stopped answering during the compile (nothing is saved; a
            rerun gets the calls already answered from DSPy's cache).
    """
    recipe = load_recipe(spec.recipe)
    if spec.alias and not spec.register:
        raise HCQRError("--alias needs --register NAME")
    if spec.register and not track:
        raise HCQRError("--register needs MLflow tracking (drop --no-mlflow)")
    if spec.register is not None:
        check_registry_names(spec.register, spec.alias)
    if spec.method not in PROGRAMS:
        raise HCQRError(f"unknown method {spec.method!r}; choose one of {', '.join(PROGRAMS)}")
    refuse_bound(spec.method, "hcqr compile")
    lm_cfg = parse_lm_spec(spec.lm, api_base=spec.api_base, api_key_env=spec.api_key_env)
    reflection_spec = spec.reflection_lm or recipe.reflection_lm
    if recipe.optimizer == "GEPA":
        if reflection_lm is None and not reflection_spec:
            raise RecipeError(
                f"recipe {recipe.name!r} (GEPA) needs a reflection LM: give --reflection-lm or set "
                "reflection_lm in the recipe"
            )
        if reflection_spec:
            parse_lm_spec(
                reflection_spec,
                api_base=spec.reflection_api_base,
                api_key_env=spec.reflection_api_key_env,
                option="--reflection-lm",
            )
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
    lm = lm or build_lm(
        spec.lm, max_tokens=spec.max_tokens, n_ctx=spec.n_ctx, api_base=spec.api_base, api_key_env=spec.api_key_env
    )
    check_recipe_for(recipe, student, lm)  # before the MLflow run: a refused recipe leaves no run behind
    if recipe.optimizer == "GEPA" and reflection_lm is None:
        reflection_lm = build_lm(
            reflection_spec,
            temperature=1.0,
            max_tokens=2048,
            n_ctx=spec.n_ctx,
            api_base=spec.reflection_api_base,
            api_key_env=spec.reflection_api_key_env,
        )
    meta = {
        "optimizer": recipe.optimizer,
        "recipe": recipe.record(),
        "lm": lm_cfg.params(),
        "reflection_lm": reflection_spec if recipe.optimizer == "GEPA" else None,
        "demo_context_tokens": recipe.demo_context_tokens,
        "index": index_info,
        # Every question the optimizer saw (training and validation): what later evaluations are checked against.
        "train": {
            **keys,
            "file": str(Path(spec.train).resolve()) if Path(spec.train).exists() else spec.train,
            "train_count": len(trainset),
            "val_count": len(valset),
        },
    }

    cost: dict[str, Any] = {}  # the compile's LM calls, tokens and wall seconds (programs/costs.py)

    def _compile():
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
                f"nothing was saved to {out}; run the same command again (LM calls already answered come from "
                "DSPy's cache)"
            )

        callbacks = [*dspy.settings.get("callbacks", []), LMFailures()]
        try:
            with dspy.context(lm=lm, adapter=HCQRAdapter(), callbacks=callbacks), lm_costs(cost, time.perf_counter()):
                compiled = compile_program(recipe, student, trainset, valset, reflection_lm=reflection_lm)
        except LM_UNAVAILABLE as exc:
            raise unavailable(exc) from None
        except ContextWindowExceededError as exc:  # the optimizer's own prompt (a program's is a bad reply)
            raise RecipeError(
                f"recipe {recipe.name!r}: a prompt of the {recipe.optimizer} optimizer itself does not fit the LM's "
                f"window ({str(exc).splitlines()[0]}); nothing was saved to {out}; give a larger --n-ctx if the "
                "model allows it, or change the recipe so that its prompts are shorter"
            ) from None
        if failures:
            raise unavailable(failures[0])
        return compiled

    run_id = model_uri = registered = None
    scores: dict[str, float] = {}
    prompt_uris: list[str] = []
    if track:
        import mlflow
        import mlflow.dspy

        params = {
            "recipe": recipe.record(),
            "method": spec.method,
            "program": student.settings(),
            "lm": lm_cfg.params(),
            "train": {"file": meta["train"]["file"], "count": len(trainset), "val_count": len(valset)},
            "index": index_info,
        }
        with mlflow_run(
            f"compile · {spec.method} · {recipe.name} · {spec.lm}",
            params,
            tags={
                "kind": "compile",
                "method": spec.method,
                "optimizer": recipe.optimizer,
                "recipe": recipe.name,
                "lm": spec.lm,
                "dataset": train_name,
            },
            store=mlflow_dir,
            traces=False,
        ) as run:
            run_id = run.info.run_id
            mlflow.dspy.autolog(log_compiles=True, log_traces=False, log_traces_from_compile=False, silent=True)
            try:
                compiled = _compile()
            finally:
                mlflow.dspy.autolog(disable=True, silent=True)
            save_program(compiled, out, mlflow_run_id=run_id, compile_cost=cost, **meta)
            mlflow.log_artifacts(str(out), artifact_path="program")
            mlflow.log_artifact(recipe.path, artifact_path="recipe")
            scores = optimizer_scores(compiled)
            mlflow.log_metrics(
                {
                    **scores,
                    "train_size": len(trainset),
                    "val_size": len(valset),
                    **{f"compile.{k}": float(v) for k, v in cost.items()},
                    **{f"demos.{name}": len(p.demos) for name, p in compiled.named_predictors()},
                    **{
                        f"instructions_changed.{name}": float(p.signature.instructions != q.signature.instructions)
                        for (name, p), (_, q) in zip(compiled.named_predictors(), student.named_predictors())
                    },
                }
            )
            if not scores:
                mlflow.set_tag("val_score", f"none: {recipe.optimizer} does not score candidates on a validation set")
            drop_autolog_placeholders(run_id)
            prompts = register_program_prompts(
                compiled, spec.register or out.name, run_id, alias=spec.alias, recipe=recipe.name
            )
            prompt_uris = [f"prompts:/{v.name}/{v.version}" for v in prompts]
            logged = log_program_model(
                out,
                prompts=prompts,
                lm=spec.lm,
                index=spec.index,
                register=spec.register,
                alias=spec.alias,
                max_tokens=spec.max_tokens,
                n_ctx=spec.n_ctx,
                api_base=spec.api_base,
                api_key_env=spec.api_key_env,
                # the logged model's name tells compiles apart in the UI's model list: the folder's name
                name=safe_name(out.name),
            )
            model_uri, registered = logged["model_uri"], logged["registered"]
            describe_compile_run(
                run_id, spec.method, recipe, len(trainset), len(valset), train_name, scores, prompt_uris, registered
            )
    else:
        compiled = _compile()
        save_program(compiled, out, mlflow_run_id=None, compile_cost=cost, **meta)

    before = student.dump_state()
    after = json.loads((out / "program.json").read_text(encoding="utf-8"))
    predictors = {
        name: {
            "demos": len(after[name].get("demos") or []),
            "instructions_changed": (
                after[name]["signature"]["instructions"] != before[name]["signature"]["instructions"]
            ),
        }
        for name in before
    }
    return {
        "out": str(out),
        "mlflow_run_id": run_id,
        "model_uri": model_uri,
        "registered": registered,
        "scores": scores,
        "train": len(trainset),
        "val": len(valset),
        "predictors": predictors,
        "prompts": prompt_uris,
        "compile_cost": cost,
    }
