"""Evaluations tied to the model they evaluated (MLflow 3's model-centric tracking).

Every tracked evaluation has a LoggedModel:

* a program from the Model Registry (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``, ``models:/<model id>``):
  the LoggedModel behind the version it resolved to (:func:`resolve_model_uri`, recorded in the run folder's
  ``config.json`` as ``saved_program.model``, so that moving an alias later cannot change what a run says it ran);
* a compiled program from a folder or ``runs:/`` whose compile run is in this store: the model that compile logged;
* a zero-shot program: an external LoggedModel (``mlflow.create_external_model``, no artifacts) named
  ``<method>-zero-shot``, one per method, settings and LM (the tag ``hcqr.program_key``, a SHA-256 of them), reused
  by every evaluation of that program.

The evaluation run takes the model as an input (``mlflow.log_inputs(models=...)``), the tags ``model_id`` and, for
registered versions, ``model_name`` and ``model_version`` (the runs table filters on them:
``tags.model_version = '2'``); its traces are linked through ``mlflow.set_active_model``; its headline metrics are
logged against the model and the question set (``mlflow.log_metrics(model_id=..., dataset=...)``), so that the
model's page lists its accuracy per dataset beside other versions' and the zero-shot program's.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hcqr_dspy.errors import ProgramFormatError

ZERO_SHOT_TYPE = "zero-shot"
PROGRAM_KEY_TAG = "hcqr.program_key"
# What a model's page shows of an evaluation (result.metrics keys); DUR comes from `hcqr judge`.
MODEL_METRICS = ("accuracy", "accuracy_se", "invalid_rate", "n", "hypothesis_accuracy", "gold_coverage", "dur", "dur_n")


def resolve_model_uri(uri: str) -> dict[str, Any] | None:
    """What a ``models:/`` URI resolves to now: ``{"uri", "name", "version", "alias", "model_id"}`` (name, version
    and alias ``None`` for ``models:/<model id>``); ``None`` for any other source.

    Raises:
        ProgramFormatError: no such registered model, version, alias or logged model.
    """
    if not str(uri).startswith("models:/"):
        return None
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    ref = str(uri)[len("models:/") :].rstrip("/")
    try:
        if "@" in ref:
            name, alias = ref.split("@", 1)
            version = client.get_model_version_by_alias(name, alias)
        elif "/" in ref:
            name, number = ref.split("/", 1)
            alias = None
            if number == "latest":  # MLflow's models:/NAME/latest: the highest version
                found = client.search_model_versions(f"name = '{name}'")
                if not found:
                    raise ProgramFormatError(f"cannot resolve {uri}: registered model {name!r} has no version")
                version = max(found, key=lambda v: int(v.version))
            else:
                version = client.get_model_version(name, number)
        else:
            model = mlflow.get_logged_model(ref)
            return {"uri": uri, "name": None, "version": None, "alias": None, "model_id": model.model_id}
    except MlflowException as exc:
        raise ProgramFormatError(f"cannot resolve {uri}: {exc.message.splitlines()[0]}") from None
    return {
        "uri": uri,
        "name": version.name,
        "version": str(version.version),
        "alias": alias,
        "model_id": version_model_id(version),
    }


def version_model_id(version) -> str | None:
    """The LoggedModel id of a registered ``ModelVersion``: its ``model_id``, which MLflow's own stores leave empty,
    else its source when that is a LoggedModel URI (``models:/m-...``, what MLflow 3 registers)."""
    if getattr(version, "model_id", None):
        return version.model_id
    source = str(version.source or "")
    return source[len("models:/") :] if source.startswith("models:/m-") else None


def program_key(config: dict[str, Any]) -> str:
    """SHA-256 of what makes a zero-shot program: its method, settings and LM spec (from a run's ``config.json``)."""
    lm = config.get("lm") or {}
    what = {"method": config["method"], "program": config.get("program"), "lm": lm.get("spec")}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def zero_shot_model(config: dict[str, Any], experiment_id: str) -> str:
    """The id of the external LoggedModel of a zero-shot program (made on first use; see the module docstring)."""
    import mlflow

    from hcqr_dspy.tracking.mlflow_runs import flatten

    key = program_key(config)
    found = mlflow.search_logged_models(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`{PROGRAM_KEY_TAG}` = '{key}'",
        output_format="list",
    )
    if found:
        return found[0].model_id
    lm = (config.get("lm") or {}).get("spec")
    model = mlflow.create_external_model(
        name=f"{config['method']}-zero-shot",
        tags={PROGRAM_KEY_TAG: key, "method": config["method"], "lm": str(lm), "program": ZERO_SHOT_TYPE},
        params=flatten({"program": config.get("program") or {}, "lm": lm}),
        model_type=ZERO_SHOT_TYPE,
        experiment_id=experiment_id,
    )
    return model.model_id


def compiled_model(compile_run_id: str, experiment_id: str) -> str | None:
    """The id of the model a compile run logged (not ``mlflow.dspy``'s placeholders), or ``None`` when the run is
    not in this store or logged none."""
    import mlflow

    from hcqr_dspy.tracking.mlflow_runs import never_finalized

    models = [
        m
        for m in mlflow.search_logged_models(
            experiment_ids=[experiment_id],
            filter_string=f"source_run_id = '{compile_run_id}'",
            output_format="list",
        )
        if not never_finalized(m)
    ]
    return models[0].model_id if models else None


def evaluated_model(config: dict[str, Any], experiment_id: str) -> dict[str, Any]:
    """The model a run evaluated: ``{"model_id", "name", "version"}`` (see the module docstring); ``model_id`` is
    ``None`` for a compiled program whose compile is not in this store."""
    saved = config.get("saved_program")
    if not saved:
        return {"model_id": zero_shot_model(config, experiment_id), "name": None, "version": None}
    model = saved.get("model") or {}
    if model.get("model_id"):
        return {"model_id": model["model_id"], "name": model.get("name"), "version": model.get("version")}
    compile_id = saved.get("compile_run_id")
    model_id = compiled_model(compile_id, experiment_id) if compile_id else None
    return {"model_id": model_id, "name": None, "version": None}


def link_run_to_model(run_id: str, model: dict[str, Any]) -> None:
    """Make the model an input of run ``run_id`` and tag the run with it (``model_id``, ``model_name``,
    ``model_version``)."""
    import mlflow
    from mlflow.entities import LoggedModelInput

    client = mlflow.MlflowClient()
    client.log_inputs(run_id, models=[LoggedModelInput(model["model_id"])])
    client.set_tag(run_id, "model_id", model["model_id"])
    if model.get("version"):
        client.set_tag(run_id, "model_name", model["name"])
        client.set_tag(run_id, "model_version", str(model["version"]))


def log_model_metrics(model_id: str, metrics: dict[str, Any], dataset=None, prefix: str = "") -> None:
    """Log an evaluation's headline metrics (:data:`MODEL_METRICS` present in ``metrics``) to the active run, against
    the LoggedModel ``model_id`` and the question set ``dataset`` (an ``mlflow.data`` dataset)."""
    import mlflow

    chosen = {
        f"{prefix}{k}": float(metrics[k])
        for k in MODEL_METRICS
        if isinstance(metrics.get(k), (int, float)) and not isinstance(metrics.get(k), bool)
    }
    if chosen:
        mlflow.log_metrics(chosen, model_id=model_id, dataset=dataset)


def judged_dataset(run_id: str):
    """The question set an evaluation run took as input (an ``mlflow.data`` dataset), or ``None``."""
    import mlflow

    inputs = mlflow.get_run(run_id).inputs
    for entry in getattr(inputs, "dataset_inputs", None) or []:
        return entry.dataset
    return None
