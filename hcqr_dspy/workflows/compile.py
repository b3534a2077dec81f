"""``hcqr compile``: compile a program with a recipe, save it, and track the compile in MLflow.

Every input is checked before the first LM call (:func:`~hcqr_dspy.workflows.compile_inputs.check_inputs`); one
process at a time compiles into an output folder (:func:`run_compile`). The recipe, its metric and the optimizer
are :mod:`hcqr_dspy.optimize`; the saved folder is :mod:`hcqr_dspy.optimize.saved`, logged as an MLflow pyfunc
model by :mod:`hcqr_dspy.tracking.serving`. Several seeds of one recipe: :mod:`hcqr_dspy.workflows.compile_seeds`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import ContextWindowExceededError

from hcqr_dspy.errors import HCQRError, LMUnavailableError, RecipeError
from hcqr_dspy.evaluation.answering import LM_UNAVAILABLE
from hcqr_dspy.evaluation.cpu_pressure import PressureWindow
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.outages import lm_failure
from hcqr_dspy.evaluation.provenance import session_record
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.lm.reply_setup import cached_reply_setups
from hcqr_dspy.optimize.attempts import watch_bootstrapping
from hcqr_dspy.optimize.catalog import bootstraps_asked
from hcqr_dspy.optimize.demo_counts import bootstrap_shortfall, stage_demos
from hcqr_dspy.optimize.recipe_compile import compile_program, optimizer_scores
from hcqr_dspy.optimize.saved import save_program
from hcqr_dspy.optimize.trials import trial_scores
from hcqr_dspy.programs.costs import lm_costs
from hcqr_dspy.tracking.compile_run import (
    attempt_traces,
    log_attempt_counts,
    log_compile_questions,
    log_trial_scores,
)
from hcqr_dspy.tracking.mlflow_runs import (
    COMPILE_OUT_TAG,
    close_stale_compile_runs,
    describe_compile_run,
    drop_autolog_placeholders,
    mlflow_run,
)
from hcqr_dspy.tracking.prompts import register_program_prompts, safe_name
from hcqr_dspy.tracking.serving import log_program_model
from hcqr_dspy.workflows.compile_inputs import CompileInputs, CompileSpec, check_inputs

log = logging.getLogger(__name__)

__all__ = ["CompileSpec", "compile_and_save", "run_compile"]


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

    Every input is checked before the first LM call (:func:`~hcqr_dspy.workflows.compile_inputs.check_inputs`):
    the recipe, the method, the LM specs (GEPA's reflection LM included), the train file and its size, the
    overlap with ``holdout`` files, the index and the output folder.

    Args:
        spec: What to compile (``spec.seed``: the seed, instead of the recipe's).
        mlflow_dir: MLflow store folder.
        track: Log to MLflow: params, ``mlflow.dspy.autolog(log_compiles=True)``'s artifacts,
            the training and validation questions as datasets (input contexts ``training``, ``validation``), one
            trace per bootstrapping attempt, the optimizer's score of each candidate or trial as a metric with
            steps and the counts ``bootstrap.attempts``, ``bootstrap.passed``, ``bootstrap.errors``
            (:mod:`hcqr_dspy.tracking.compile_run`), the saved program folder as ``program`` artifacts, the
            recipe, metrics (the optimizer's own validation score ``val_score`` where it has one,
            :func:`~hcqr_dspy.optimize.recipe_compile.optimizer_scores`; the
            training and validation sizes; per predictor the demos its prompt shows, ``demos.<stage>``, of them
            ``demos.<stage>.bootstrapped`` and ``demos.<stage>.labelled``, and whether its instructions changed),
            the tags ``seed``, ``hcqr.out`` (the folder: the next compile into it closes as ``FAILED`` a run that a
            killed compile left ``RUNNING``) and, when it kept fewer bootstrapped traces than asked,
            ``bootstrap_shortfall``, and
            the program as an MLflow pyfunc model logged
            from code (:func:`hcqr_dspy.tracking.serving.log_program_model`: no pickle; the model
            config names the index and the LM), registered as ``spec.register`` (with
            ``spec.alias``) when given; each stage's instructions and demos as a versioned prompt
            ``<register, else spec.name or the out folder's name>.<stage>``, linked to the run and the model
            (:mod:`hcqr_dspy.tracking.prompts`); a run description. The placeholder models that
            ``mlflow.dspy.autolog`` logs for each optimizer ``compile`` call are deleted.
        lm / reflection_lm: Ready ``dspy.LM`` objects instead of building the specs (tests).

    Returns:
        ``{"out", "seed", "optimizer", "mlflow_run_id", "model_uri", "registered", "scores", "train", "val",
        "predictors": {name: {"demos", "bootstrapped", "labelled", "rendered", "saved", "instructions_changed"}},
        "bootstrap_shortfall", "prompts": ["prompts:/NAME/VERSION", ...], "compile_cost"}``. ``demos`` is
        ``rendered``, the demos the stage's prompt shows (:func:`~hcqr_dspy.optimize.demo_counts.stage_demos`).
        ``bootstrap_shortfall`` is ``{"asked", "bootstrapped"}`` when the program kept fewer bootstrapped traces
        than the recipe's ``max_bootstrapped_demos``, else ``None`` (both also in ``meta.json``).
        ``mlflow_run_id``, ``model_uri`` and ``registered`` are None untracked or unregistered; ``prompts`` is
        empty untracked.

    Raises:
        RecipeError, HCQRError: bad input as listed above, or an unwritable ``out``
            (checked before any LM call).
        LMUnavailableError: the LM stopped answering during the compile (nothing is saved; a
            rerun gets the calls already answered from DSPy's cache).
    """
    checked = check_inputs(spec, track, lm, reflection_lm)
    recipe, out, student = checked.recipe, checked.out, checked.student
    cost: dict[str, Any] = {}  # the compile's LM calls, tokens and wall seconds (programs/costs.py)
    run_id = model_uri = registered = None
    scores: dict[str, float] = {}
    prompt_uris: list[str] = []
    name = spec.register or spec.name or out.name
    if not track:
        compiled, counts, shortfall = _compile(checked, cost)
        save_program(compiled, out, mlflow_run_id=None, compile_cost=cost, **checked.meta)
    else:
        import mlflow
        import mlflow.dspy

        params = {
            "recipe": recipe.record(),
            "method": spec.method,
            "program": student.settings(),
            "lm": checked.lm_cfg.params(),
            "train": {
                "file": checked.meta["train"]["file"],
                "count": len(checked.trainset),
                "val_count": len(checked.valset),
            },
            "index": checked.index_info,
        }
        tags = {"kind": "compile", "method": spec.method, "optimizer": recipe.optimizer, "recipe": recipe.name}
        tags.update({"lm": spec.lm, "dataset": checked.train_name, "seed": str(recipe.seed)})
        tags[COMPILE_OUT_TAG] = str(out.resolve())
        for stale in close_stale_compile_runs(out, mlflow_dir):
            log.info(
                f"hcqr: note: MLflow run {stale} of an earlier compile into {out} was left running (the process was "
                "stopped); closed as FAILED"
            )
        with mlflow_run(
            f"compile · {spec.method} · {recipe.name} · {spec.lm}", params, tags=tags, store=mlflow_dir, traces=False
        ) as run:
            run_id = run.info.run_id
            log_compile_questions(checked.trainset, checked.valset, checked.train_name, run.info.experiment_id)
            # tracing stays on inside compile() for the attempts' own traces; DSPy's module and LM calls are not
            # traced (log_traces), nor are Evaluate's (whose metric patch would log onto the last attempt's trace)
            mlflow.dspy.autolog(
                log_compiles=True,
                log_traces=False,
                log_traces_from_compile=True,
                log_traces_from_eval=False,
                silent=True,
            )
            trace_tags = {"method": spec.method, "recipe": recipe.name, "optimizer": recipe.optimizer}
            try:
                with watch_bootstrapping(attempt_traces({**trace_tags, "mlflow_run_id": run_id})) as attempts:
                    compiled, counts, shortfall = _compile(checked, cost)
            finally:
                mlflow.dspy.autolog(disable=True, silent=True)
            log_attempt_counts(attempts)
            log_trial_scores(trial_scores(compiled, recipe.optimizer))
            save_program(compiled, out, mlflow_run_id=run_id, compile_cost=cost, **checked.meta)
            mlflow.log_artifacts(str(out), artifact_path="program")
            mlflow.log_artifact(recipe.path, artifact_path="recipe")
            scores = optimizer_scores(compiled, recipe.optimizer)
            mlflow.log_metrics(
                {
                    **scores,
                    "train_size": len(checked.trainset),
                    "val_size": len(checked.valset),
                    **{f"compile.{k}": float(v) for k, v in cost.items()},
                    **{f"demos.{stage}": c["rendered"] for stage, c in counts.items()},
                    **{f"demos.{stage}.{k}": c[k] for stage, c in counts.items() for k in ("bootstrapped", "labelled")},
                    **{
                        f"instructions_changed.{n}": float(p.signature.instructions != q.signature.instructions)
                        for (n, p), (_, q) in zip(compiled.named_predictors(), student.named_predictors())
                    },
                }
            )
            if "val_score" not in scores:
                also = "; it scores them on its training questions (train_score)" if "train_score" in scores else ""
                mlflow.set_tag(
                    "val_score", f"none: {recipe.optimizer} does not score candidates on a validation set{also}"
                )
            if shortfall:
                mlflow.set_tag("bootstrap_shortfall", f"{shortfall['bootstrapped']} of {shortfall['asked']} asked")
            drop_autolog_placeholders(run_id)
            prompts = register_program_prompts(
                compiled, name, run_id, alias=spec.alias, recipe=recipe.name, seed=recipe.seed
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
                # the logged model's name tells compiles apart in the UI's model list: the program's name
                name=safe_name(spec.name or out.name),
            )
            model_uri, registered = logged["model_uri"], logged["registered"]
            describe_compile_run(
                run_id,
                spec.method,
                recipe,
                len(checked.trainset),
                len(checked.valset),
                checked.train_name,
                scores,
                prompt_uris,
                registered,
            )
    zero_shot = dict(student.named_predictors())
    predictors = {
        stage: {
            "demos": c["rendered"],
            **c,
            "instructions_changed": p.signature.instructions != zero_shot[stage].signature.instructions,
        }
        for (stage, p), c in zip(compiled.named_predictors(), counts.values())
    }
    return {
        "out": str(out),
        "seed": recipe.seed,
        "optimizer": recipe.optimizer,
        "mlflow_run_id": run_id,
        "model_uri": model_uri,
        "registered": registered,
        "scores": scores,
        "train": len(checked.trainset),
        "val": len(checked.valset),
        "predictors": predictors,
        "bootstrap_shortfall": shortfall,
        "prompts": prompt_uris,
        "compile_cost": cost,
    }


def _compile(checked: CompileInputs, cost: dict[str, Any]):
    """Run the recipe's optimizer on the checked inputs under the task LM and :class:`HCQRAdapter`, and count the
    compiled program's demos as its prompts show them; ``meta`` gains ``demos``, ``bootstrap_shortfall`` and
    ``compile_setup``: ``{"session": <the compile's session record, machine, packages, engine, LM settings and
    reply-setup fingerprint (:func:`~hcqr_dspy.evaluation.provenance.session_record`)>, "cached_setups": <under
    which setups the replies DSPy's cache served the compile were made (:func:`~hcqr_dspy.lm.reply_setup.
    cached_reply_setups`)>}``.

    Returns:
        ``(compiled, counts, shortfall)`` (:func:`~hcqr_dspy.optimize.demo_counts.stage_demos`,
        :func:`~hcqr_dspy.optimize.demo_counts.bootstrap_shortfall`).

    Raises:
        LMUnavailableError: the LM stopped answering (an optimizer would have counted it an error and gone on).
        RecipeError: a prompt of the optimizer itself over the LM's window.
    """
    recipe, out = checked.recipe, checked.out
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

    adapter = HCQRAdapter()
    callbacks = [*dspy.settings.get("callbacks", []), LMFailures()]
    window = PressureWindow()  # how contended the machine was: are the compile's seconds its own?
    try:
        with (
            dspy.context(lm=checked.lm, adapter=adapter, callbacks=callbacks),
            lm_costs(cost, time.perf_counter()),
            cached_reply_setups() as cached,
        ):
            compiled = compile_program(
                recipe, checked.student, checked.trainset, checked.valset, reflection_lm=checked.reflection_lm
            )
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
    if (pressure := window.share()) is not None:  # without PSI nothing is measured, and nothing recorded
        cost["cpu_pressure"] = pressure
    counts = stage_demos(compiled, adapter)
    shortfall = bootstrap_shortfall(bootstraps_asked(recipe.optimizer, recipe.settings, recipe.compile), counts)
    setup = {"session": session_record("compile", checked.lm), "cached_setups": cached.summary()}
    checked.meta.update(demos=counts, bootstrap_shortfall=shortfall, compile_setup=setup)
    return compiled, counts, shortfall
