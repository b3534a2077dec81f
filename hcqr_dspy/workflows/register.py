"""``hcqr register``: put a saved program (a folder ``hcqr compile`` wrote, e.g. one committed with a study) in
this MLflow store's Model Registry, as ``hcqr compile --register`` does after a compile, without compiling again.

The compile run that made the folder lives in the store of the machine that compiled it; a clone of the
repository has the folder but not that store. Registering it here gives the same things a tracked compile gives:
an MLflow run (tag ``kind=register``) holding the folder's ``program.json`` and ``meta.json`` as artifacts, each
stage's instructions and demos as a version of the prompt ``<name>.<stage>`` (:mod:`hcqr_dspy.tracking.prompts`;
once per prompt, the method's zero-shot template too, alias ``zero-shot``),
the pyfunc model (:mod:`hcqr_dspy.tracking.serving`) registered as a new version of ``name`` with the tags
``recipe`` and ``method``, and the alias on both when one is given. The original compile run's id
(``meta.json``'s ``mlflow_run_id``) is kept as the tag ``compile_run_id``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlflow

from hcqr_dspy.errors import HCQRError, ProgramFormatError
from hcqr_dspy.lm import parse_lm_spec
from hcqr_dspy.lm.spec import check_route
from hcqr_dspy.optimize.saved import META_FILE, STATE_FILE, NoRetriever, read_saved_program
from hcqr_dspy.retrieval import read_manifest
from hcqr_dspy.tracking.mlflow_runs import mlflow_run
from hcqr_dspy.tracking.prompts import register_program_prompts, safe_name
from hcqr_dspy.tracking.serving import log_program_model
from hcqr_dspy.tracking.store import configure
from hcqr_dspy.workflows.compile_inputs import check_registry_names


def serving_index(meta: dict[str, Any], index: str | None, no_index: bool) -> tuple[str | None, str | None]:
    """The index the registered model serves with, and a note when it is not the one the program was compiled on.

    ``index`` given: that folder; else the folder ``meta.json`` records, which must still exist; ``no_index``:
    none (the model then needs ``--index`` wherever it runs).

    Raises:
        HCQRError: an empty ``index``; both ``index`` and ``no_index``; the recorded folder is gone and no
            ``index`` is given; the folder is not a complete index (every file's size and checksum,
            :func:`~hcqr_dspy.retrieval.read_manifest`).
        ProgramFormatError: ``meta.json``'s index record holds a non-string path, source or fingerprint.
    """
    if index is not None and not index.strip():
        raise HCQRError("--index is empty: give an index folder, or --no-index")
    if index and no_index:
        raise HCQRError("give either --index FOLDER or --no-index, not both")
    if no_index:
        return None, None
    recorded = meta.get("index") or {}
    for key in ("path", "corpus_fingerprint", "corpus_source"):
        if recorded.get(key) is not None and not isinstance(recorded[key], str):
            raise ProgramFormatError(f"meta.json: index.{key} is {recorded[key]!r}, not a string")
    if not index:
        index = recorded.get("path")
        if not index:
            return None, None
        if not Path(index).is_dir():
            raise HCQRError(
                f"the index the program was compiled with, {index}, is not a folder on this machine; give "
                "--index FOLDER (an index of the same corpus: `hcqr index`) or --no-index"
            )
    manifest = read_manifest(index, verify_files=True)  # bundled or served as it is: every file checked
    want, have = recorded.get("corpus_fingerprint"), manifest["corpus"]["fingerprint"]
    note = None
    if want and want != have:
        note = (
            f"note: {index} indexes another corpus ({manifest['corpus']['source']}, fingerprint {have[:12]}) than "
            f"the program was compiled on ({recorded.get('corpus_source')}, {want[:12]})"
        )
    return index, note


def refuse_other_method(name: str, method: str) -> None:
    """Refuse to add a ``method`` program to registered model ``name`` when its versions hold another method:
    its stages' prompts (``<name>.<stage>``) would then mix two programs' templates.

    The method of an existing version is its run's ``method`` tag (set by ``hcqr compile`` and ``hcqr register``).

    Raises:
        HCQRError: a version of ``name`` holds another method.
    """
    client = mlflow.MlflowClient()
    for version in client.search_model_versions(f"name = '{name}'"):
        other = client.get_run(version.run_id).data.tags.get("method") if version.run_id else None
        if other and other != method:
            raise HCQRError(
                f"registered model {name!r} holds {other!r} programs (version {version.version}); register this "
                f"{method!r} program under another --name"
            )


def register_saved_program(
    folder: str | Path,
    name: str,
    alias: str | None = None,
    index: str | None = None,
    no_index: bool = False,
    lm: str | None = None,
    max_tokens: int = 1024,
    n_ctx: int = 8192,
    api_base: str | None = None,
    api_key_env: str | None = None,
    mlflow_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Register the saved program in ``folder`` as a new version of ``name`` (see the module docstring).

    Args:
        folder: A saved-program folder (``program.json`` + ``meta.json``).
        name: Registered model name; its stages' prompts are ``<name>.<stage>``.
        alias: Alias of the new model version and of its prompt versions.
        index, no_index: The index it serves with (:func:`serving_index`).
        lm: LM spec of the served model (default: the one it was compiled with, ``meta.json``'s ``lm.spec``).
        max_tokens, n_ctx, api_base, api_key_env: The served model's LM settings, as for ``hcqr compile``.
        mlflow_dir: The tracking store (default: ``$HCQR_MLFLOW_DIR`` or ``./mlruns``).

    Returns:
        ``{"run_id", "registered": "models:/NAME/VERSION", "version", "prompts": [prompts:/...], "index" (its
        folder or ``None``), "bundled" (the index travels inside the model), "note", "meta"}``.

    Raises:
        HCQRError: a name or alias the registry refuses; an LM spec no command could run
            (:func:`~hcqr_dspy.lm.parse_lm_spec`, LiteLLM's routing); ``name`` holds another method
            (:func:`refuse_other_method`); see :func:`serving_index`.
        ProgramFormatError: ``folder`` is not a saved program that loads.
    """
    check_registry_names(name, alias, option="--name")
    saved = read_saved_program(folder)  # read once: what is registered and logged is what was checked
    program, meta = saved.build(NoRetriever()), saved.described()  # its prompts only: never searched here
    index, note = serving_index(meta, index, no_index)
    recipe = (meta.get("recipe") or {}).get("name")
    if lm is None:
        lm = (meta.get("lm") or {}).get("spec") or "local"
    cfg = parse_lm_spec(lm, api_base=api_base, api_key_env=api_key_env)
    if cfg.kind == "litellm":
        check_route(cfg.model)
    configure(mlflow_dir)
    refuse_other_method(name, meta["method"])

    params = {
        "folder": str(Path(folder).resolve()),
        "method": meta["method"],
        "recipe": recipe,
        "optimizer": meta.get("optimizer"),
    }  # the LM and the index: the logged model's config, which MLflow logs as params too
    tags = {"kind": "register", "method": meta["method"], "lm": lm, **({"recipe": recipe} if recipe else {})}
    if meta.get("mlflow_run_id"):
        tags["compile_run_id"] = meta["mlflow_run_id"]
    label = recipe or "zero-shot"
    # only the format's two files are logged, not whatever else the folder holds (links, data)
    with tempfile.TemporaryDirectory(prefix="hcqr-register-") as tmp:
        staged = Path(tmp) / Path(folder).resolve().name
        staged.mkdir()
        (staged / STATE_FILE).write_bytes(saved.state_bytes)  # the bytes checked against meta.json's SHA-256
        shutil.copyfile(Path(folder) / META_FILE, staged / META_FILE)
        with mlflow_run(
            f"register · {meta['method']} · {label} · {name}", params, tags=tags, store=mlflow_dir, traces=False
        ) as run:
            run_id = run.info.run_id
            mlflow.log_artifacts(str(staged), artifact_path="program")
            seed = (meta.get("recipe") or {}).get("seed")
            prompts = register_program_prompts(program, name, run_id, alias=alias, recipe=recipe, seed=seed)
            logged = log_program_model(
                staged,
                prompts=prompts,
                lm=lm,
                index=index,
                register=name,
                alias=alias,
                max_tokens=max_tokens,
                n_ctx=n_ctx,
                api_base=api_base,
                api_key_env=api_key_env,
                name=safe_name(Path(folder).resolve().name),
                saved=saved,
            )
            client = mlflow.MlflowClient()
            version = str(logged["version"])
            prompt_uris = [f"prompts:/{v.name}/{v.version}" for v in prompts]
            client.set_tag(
                run_id,
                "mlflow.note.content",
                f"**Registered** the saved `{meta['method']}` program `{folder}` (recipe `{label}`) as "
                f"`{logged['registered']}`"
                + (f" (alias `{alias}`)" if alias else "")
                + ". Prompts: "
                + ", ".join(f"`{uri}`" for uri in prompt_uris)
                + (
                    f". Compiled by MLflow run `{meta['mlflow_run_id']}` (its `meta.json`)."
                    if meta.get("mlflow_run_id")
                    else "."
                ),
            )
    return {
        "run_id": run_id,
        "registered": logged["registered"],
        "version": version,
        "prompts": prompt_uris,
        "index": index,
        "bundled": logged["index"] == "bundled",
        "note": note,
        "meta": meta,
    }
