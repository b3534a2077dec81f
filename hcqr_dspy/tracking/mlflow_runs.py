"""MLflow runs: one per evaluation (started, or resumed by id), its params, metrics and run-folder artifacts,
the LM calls of its traces (:func:`dspy_tracing`), and its description."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.tracking.experiment_page import EXPERIMENT
from hcqr_dspy.tracking.store import configure


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> MLflow params (``a.b`` keys, values as strings, 6000 chars max)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = str(value)[:6000]
    return out


@contextmanager
def mlflow_run(
    run_name: str,
    params: dict[str, Any],
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
    store: str | Path | None = None,
    experiment: str = EXPERIMENT,
    traces: bool = True,
) -> Iterator[Any]:
    """Start (or resume, given ``run_id``) an MLflow run with params and tags.

    Started while another MLflow run is active (an experiment's parent run), it
    is a nested child run.

    Args:
        run_name: Display name.
        params: Configuration, flattened into params (logged once; a resumed
            run keeps its params).
        tags: Extra tags (method, dataset ...).
        run_id: Resume this MLflow run instead of starting a new one.
        store: Tracking folder (see :func:`store_dir`).
        experiment: MLflow experiment name.
        traces: Record the LM calls of traces opened in the run (:func:`dspy_tracing`).

    Yields:
        The active ``mlflow.ActiveRun``.
    """
    import mlflow

    experiment_id = configure(store, experiment)
    nested = mlflow.active_run() is not None  # a cell of an experiment: child of its parent run
    with dspy_tracing(traces):
        if run_id:
            run = mlflow.start_run(run_id=run_id, nested=nested)
        else:
            run = mlflow.start_run(run_name=run_name, experiment_id=experiment_id, tags=tags or {}, nested=nested)
            mlflow.log_params(flatten(params))
        with run:
            yield run


@contextmanager
def dspy_tracing(enabled: bool = True) -> Iterator[None]:
    """Record each DSPy LM call made under an active trace as one MLflow span, its messages, reply and token usage
    (:mod:`hcqr_dspy.tracking.lm_spans`), inside the block; DSPy's modules and adapters get no spans of their own.
    At its end the recording stops and the traces, exported in the background, are written."""
    if not enabled:
        yield
        return
    import mlflow

    from hcqr_dspy.tracking.lm_spans import recording

    try:
        with recording():
            yield
    finally:
        mlflow.flush_trace_async_logging()


def log_metrics(metrics: dict[str, float]) -> None:
    """Log numeric metrics to the active run."""
    import mlflow

    mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})


def log_run_folder(folder) -> None:
    """Log a run folder's record files (:meth:`hcqr_dspy.evaluation.run_folder.RunFolder.files`) as artifacts
    of the active run (under ``run/``).

    Args:
        folder: A :class:`~hcqr_dspy.evaluation.run_folder.RunFolder` or its path.
    """
    import mlflow

    folder = folder if isinstance(folder, RunFolder) else RunFolder(folder)
    for f in folder.files():
        mlflow.log_artifact(str(f), artifact_path="run")


def mlflow_run_link(run_id: str) -> str | None:
    """A Markdown link to a run of this store for MLflow's UI (``#/experiments/<id>/runs/<id>``); ``None`` if absent."""
    import mlflow

    try:
        run = mlflow.get_run(run_id)
    except Exception:  # MlflowException: not in this store
        return None
    return f"[{run.info.run_name or run_id}](#/experiments/{run.info.experiment_id}/runs/{run_id})"


def describe_mlflow_run(run_id: str, config: dict[str, Any], kind: str = "evaluation") -> None:
    """Set an evaluation's MLflow run description (MLflow's ``mlflow.note.content``, Markdown) and, for a saved
    (compiled) program, the tag ``compile_run_id`` linking the MLflow run of the compile that made it.

    Args:
        run_id: The run.
        config: The run folder's configuration (its ``config.json``).
        kind: ``evaluation`` (gold answers) or ``prediction`` (unlabelled questions).
    """
    import mlflow

    client = mlflow.MlflowClient()
    q = config.get("questions") or {}
    lines = [
        f"**{config['method']}** on {q.get('count')} questions of `{config['dataset']}` "
        f"({'scored against gold answers' if kind == 'evaluation' else 'no gold answers: predictions only'}), "
        f"LM `{(config.get('lm') or {}).get('spec')}`."
    ]
    saved = config.get("saved_program")
    if saved:
        compile_id = saved.get("compile_run_id")
        link = mlflow_run_link(compile_id) if compile_id else None
        lines.append(
            f"Program: compiled with recipe `{saved.get('recipe')}` ({saved.get('optimizer')}) on "
            f"{saved.get('train_count')} {saved.get('train_dataset')} questions, "
            f"from `{saved.get('source')}`; "
            + (
                f"compile run {link}."
                if link
                else f"compile run `{compile_id}` (not in this store)."
                if compile_id
                else "no compile run recorded."
            )
        )
        if compile_id:
            client.set_tag(run_id, "compile_run_id", compile_id)
    elif config.get("answer_step"):
        answer = config["answer_step"]
        lines.append(
            f"Program: the method's own retrieval, answering with the answer step (instructions and demos) of "
            f"`{answer.get('source')}`, compiled with recipe `{answer.get('recipe')}` on "
            f"{answer.get('train_count')} {answer.get('train_dataset')} questions."
        )
    else:
        lines.append("Program: zero-shot (the method's own instructions, no demos).")
    client.set_tag(run_id, "mlflow.note.content", "\n\n".join(lines))


def never_finalized(model: Any) -> bool:
    """Whether a LoggedModel is still ``PENDING``: what ``mlflow.dspy.autolog``'s placeholders stay."""
    return str(model.status).upper().endswith("PENDING")


def drop_autolog_placeholders(run_id: str) -> int:
    """Delete the placeholder logged models ``mlflow.dspy.autolog(log_compiles=True)`` leaves in run ``run_id``:
    one named ``dspy``, never finalized (status ``PENDING``), per optimizer ``compile`` call
    (``mlflow.dspy.util.log_dummy_model_outputs``, logged so that MLflow's UI shows a Run tab). The run's
    real model is logged beside them.

    Returns:
        How many were deleted.
    """
    import mlflow

    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    placeholders = [
        model
        for model in mlflow.search_logged_models(
            experiment_ids=[run.info.experiment_id],
            filter_string=f"source_run_id = '{run_id}' AND name = 'dspy'",
            output_format="list",
        )
        if never_finalized(model)
    ]
    for model in placeholders:
        client.delete_logged_model(model.model_id)
    return len(placeholders)


COMPILE_OUT_TAG = "hcqr.out"  # a compile run's saved-program folder (resolved path)


def close_stale_compile_runs(out: Path, store: str | Path | None = None) -> list[str]:
    """Close as ``FAILED`` the MLflow runs of earlier compiles into ``out`` (tag :data:`COMPILE_OUT_TAG`) that are
    still ``RUNNING``: their process was killed or lost its machine before it could end them. Call it holding
    ``out``'s writer lock (:func:`hcqr_dspy.workflows.compile.run_compile`), so that no live compile's run is
    among them.

    Returns:
        The ids of the runs closed.
    """
    import mlflow

    experiment_id = configure(store, EXPERIMENT)
    folder = str(Path(out).resolve())
    running = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string="tags.kind = 'compile' AND attributes.status = 'RUNNING'",
        output_format="list",
    )
    client = mlflow.MlflowClient()
    stale = [run.info.run_id for run in running if run.data.tags.get(COMPILE_OUT_TAG) == folder]
    for run_id in stale:
        client.set_terminated(run_id, "FAILED")
    return stale


def describe_compile_run(
    run_id: str,
    method: str,
    recipe: Any,
    train: int,
    val: int,
    dataset: str,
    scores: dict[str, float],
    prompts: list[str],
    registered: str | None,
) -> None:
    """Set a compile's MLflow run description (``mlflow.note.content``, Markdown): what was compiled with which
    recipe on which questions, the optimizer's own score, the prompts and the registered version."""
    import mlflow

    score = scores.get("val_score")
    if score is not None:
        scored = f"The optimizer's validation score: {score:.1%}."
    elif scores.get("train_score") is not None:
        scored = f"The optimizer's score on its training questions: {scores['train_score']:.1%}."
    else:
        scored = f"{recipe.optimizer} scores no candidate on a validation set."
    lines = [
        f"**Compile** of `{method}` with recipe `{recipe.name}` ({recipe.optimizer}) on {train} training + {val} "
        f"validation questions of `{dataset}`.",
        scored,
    ]
    if prompts:
        lines.append("Prompts: " + ", ".join(f"`{uri}`" for uri in prompts) + ".")
    lines.append(f"Registered as `{registered}`." if registered else "Not registered (no `--register`).")
    mlflow.MlflowClient().set_tag(run_id, "mlflow.note.content", "\n\n".join(lines))
