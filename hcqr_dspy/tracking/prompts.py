"""A compiled program's prompts in the MLflow Prompt Registry: one prompt per stage, a version per change.

Each predictor (stage) of a program becomes the prompt ``<program>.<stage>`` (``hcqr-medqa.hypothesis``), a chat
template (``mlflow.genai.register_prompt`` with a list of messages): the signature's instructions as the
``system`` message, then each few-shot demo the stage's prompt shows (the adapter's own rendering,
:mod:`hcqr_dspy.optimize.demo_counts`: a demo lacking every output field of the stage is never shown) as a
``user`` message (its input fields, ``name: value`` lines) and an ``assistant`` message (its output fields).
``mlflow.genai.load_prompt("prompts:/<program>.<stage>/<version>")`` gives them back; ``template[0]["content"]``
is the instructions. A compile registers a new version of a stage only when its template differs from the stage's
latest compiled version and from its zero-shot version (else it links that version again), links every version to
the compile run and the logged model, and gives each the model's alias when it has one.

Each prompt also holds, once, its zero-shot version (:func:`register_zero_shot_prompts`): the stage's template in
the same method built afresh with the same options (its signature's instructions, no demos), with the alias
``zero-shot`` and the version tag ``zero_shot=true``, so that ``hcqr prompts <program>.<stage> zero-shot champion``
is what the optimizer changed. It is registered before the stage's first compiled version, and again only when the
method's zero-shot template differs from it (another method registered under the same name, a signature reworded):
then the alias moves to the new version and a note on stderr says so.

Prompt names allow letters, digits, ``-``, ``_`` and ``.`` (``mlflow.prompt.registry_utils``); a program's name
with other characters is made one by :func:`safe_name`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

import dspy

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.optimize.demo_counts import bootstrapped, default_adapter, renders

log = logging.getLogger(__name__)

NAME_RULE = re.compile(r"[^A-Za-z0-9_.-]+")
ZERO_SHOT_ALIAS = "zero-shot"  # the alias of each prompt's zero-shot version
ZERO_SHOT_TAG = "zero_shot"  # the version tag (``true``) of every zero-shot version, the alias's earlier ones too


def safe_name(text: str) -> str:
    """``text`` as a prompt (or logged model) name: itself when it is one; else every run of characters such a
    name cannot hold made ``-``, and the first 6 hex digits of ``text``'s SHA-256 added, so that two names that
    differ only there (``bad name!``, ``bad name?``) stay two names."""
    clean = NAME_RULE.sub("-", text).strip("-.")
    if clean == text and text:
        return text
    return f"{clean or 'program'}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def prompt_name(program: str, stage: str) -> str:
    """``<program>.<stage>``, the program's name made a valid prompt name (:func:`safe_name`)."""
    return f"{safe_name(program)}.{stage}"


def _lines(fields: dict[str, Any], record: Any) -> str:
    return "\n".join(f"{name}: {record[name]}" for name in fields if name in record and record[name] is not None)


def shown_demos(predictor: dspy.Predict) -> list[Any]:
    """The predictor's demos its prompt shows (:func:`~hcqr_dspy.optimize.demo_counts.renders`)."""
    adapter = default_adapter()
    return [d for d in predictor.demos if renders(adapter, predictor.signature, d)]


def stage_template(predictor: dspy.Predict) -> list[dict[str, str]]:
    """The chat template of one predictor: ``system`` = its instructions; per demo its prompt shows a ``user``
    message (input fields) and an ``assistant`` message (output fields)."""
    signature = predictor.signature
    messages = [{"role": "system", "content": signature.instructions}]
    for demo in shown_demos(predictor):
        record = demo.toDict() if hasattr(demo, "toDict") else dict(demo)
        messages.append({"role": "user", "content": _lines(signature.input_fields, record)})
        messages.append({"role": "assistant", "content": _lines(signature.output_fields, record)})
    return messages


def register_program_prompts(
    program: dspy.Module,
    name: str,
    run_id: str | None = None,
    alias: str | None = None,
    recipe: str | None = None,
    seed: int | None = None,
) -> list[Any]:
    """Register each stage of ``program`` as the prompt ``<name>.<stage>`` (see the module docstring), after its
    zero-shot version (:func:`register_zero_shot_prompts`).

    Args:
        program: The (compiled) program, a registered method's (``program.method``, ``program.options()``).
        name: The program's name: its registered model name, or its folder's name.
        run_id: The compile run the versions are linked to.
        alias: Give every stage's version this alias (the model version's alias).
        recipe: The recipe's name, a tag of each new version.
        seed: The compile's seed, a tag of each new version.

    Returns:
        The ``PromptVersion`` of every stage, in the program's predictor order.
    """
    import mlflow
    import mlflow.genai

    client = mlflow.MlflowClient()
    zero_shot = register_zero_shot_prompts(program, name)
    versions = []
    for stage, predictor in program.named_predictors():
        full = prompt_name(name, stage)
        template = stage_template(predictor)
        shown = shown_demos(predictor)
        traces = sum(bootstrapped(d) for d in shown)
        version = _same_template(client, full, template, zero_shot.get(stage))
        if version is None:
            version = mlflow.genai.register_prompt(
                name=full,
                template=template,
                commit_message=f"compiled by run {run_id}" if run_id else "compiled",
                tags={
                    "stage": stage,
                    "program": name,
                    "demos": str(len(shown)),
                    "demos_bootstrapped": str(traces),
                    "demos_labelled": str(len(shown) - traces),
                    **({"recipe": recipe} if recipe else {}),
                    **({"seed": str(seed)} if seed is not None else {}),
                    **({"run_id": run_id} if run_id else {}),
                },
            )
        if run_id:
            client.link_prompt_version_to_run(run_id, version)
        if alias:
            mlflow.genai.set_prompt_alias(full, alias, version.version)
        versions.append(version)
    return versions


def all_versions(client, name: str) -> list[Any]:
    """Every version of prompt ``name``, oldest first (none when there is no such prompt)."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_prompt_versions(name, max_results=1000)
    except MlflowException:  # no such prompt
        return []
    return sorted(getattr(found, "prompt_versions", found) or [], key=lambda v: int(v.version))


def _same_template(client, name: str, template: list[dict[str, str]], zero_shot: Any = None):
    """The version of prompt ``name`` a compiled stage with ``template`` links again instead of registering a new
    one: its latest compiled version (zero-shot versions aside), else its zero-shot version ``zero_shot``, when
    that one's template is ``template``; ``None`` when neither is."""
    compiled = [v for v in all_versions(client, name) if (v.tags or {}).get(ZERO_SHOT_TAG) != "true"]
    for version in (compiled[-1] if compiled else None, zero_shot):
        if version is not None and version.template == template:
            return version
    return None


def zero_shot_program(program: dspy.Module) -> dspy.Module:
    """``program``'s method built afresh with its constructor options (``program.options()``) over its retriever,
    which is not searched: the program before any compile, whose predictors carry the signatures' own
    instructions and no demos. A reranker's cross-encoder (``cross_encoder``) is left out: it is in no prompt, and
    loading its weights would be the slowest step of registering.

    Raises:
        HCQRError: unknown method; see the method's ``options()``.
    """
    from hcqr_dspy.programs.method_registry import make_program

    options = {k: v for k, v in program.options().items() if k != "cross_encoder"}
    return make_program(program.method, program.retriever, **options)


def _zero_shot_version(client, name: str):
    """The version of prompt ``name`` with the alias ``zero-shot``, else its latest version tagged
    ``zero_shot=true``; ``None`` when it has neither."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_prompt_version_by_alias(name, ZERO_SHOT_ALIAS)
    except MlflowException:  # no such prompt, or no such alias
        tagged = [v for v in all_versions(client, name) if (v.tags or {}).get(ZERO_SHOT_TAG) == "true"]
        return tagged[-1] if tagged else None


def register_zero_shot_prompts(program: dspy.Module, name: str) -> dict[str, Any]:
    """Register each stage's zero-shot template (:func:`zero_shot_program`) as a version of ``<name>.<stage>``,
    once: a prompt whose zero-shot version holds the same template (content equality: instructions and messages)
    keeps it. A stage whose zero-shot template differs from the registered one gets a new version, the alias
    ``zero-shot`` moves to it, and one line on stderr names both versions and their methods.

    Each new version is tagged ``zero_shot=true``, ``method``, ``demos=0``, ``stage`` and ``program``.

    Returns:
        ``{stage: PromptVersion}``, the zero-shot version of every stage.

    Raises:
        HCQRError: see :func:`zero_shot_program`.
    """
    import mlflow
    import mlflow.genai

    client = mlflow.MlflowClient()
    fresh = zero_shot_program(program)
    versions = {}
    for stage, predictor in fresh.named_predictors():
        full = prompt_name(name, stage)
        template = stage_template(predictor)
        current = _zero_shot_version(client, full)
        if current is not None and current.template == template:
            versions[stage] = current
            continue
        version = mlflow.genai.register_prompt(
            name=full,
            template=template,
            commit_message=f"zero-shot: the uncompiled {fresh.method} program's {stage} step (no demos)",
            tags={"stage": stage, "program": name},  # a new prompt takes these as its own tags too
        )
        for key, value in {ZERO_SHOT_TAG: "true", "method": fresh.method, "demos": "0"}.items():
            mlflow.genai.set_prompt_version_tag(full, version.version, key, value)
        mlflow.genai.set_prompt_alias(full, ZERO_SHOT_ALIAS, version.version)
        if current is not None:
            log.warning(
                f"hcqr: note: the zero-shot prompt of {full} changed: version {current.version} holds the "
                f"{(current.tags or {}).get('method', '?')!r} program's template, this {fresh.method!r} program's "
                f"differs (another method registered under the name {name!r}, or its signature reworded); "
                f"registered it as version {version.version} and moved the alias {ZERO_SHOT_ALIAS} to it"
            )
        versions[stage] = client.get_prompt_version(full, version.version)
    return versions


def move_alias(model: str, alias: str, version: str) -> list[str]:
    """Give registered model ``model``'s version ``version`` the alias ``alias``, and the prompts linked to that
    version's LoggedModel (its ``mlflow.linkedPrompts`` tag: one version per stage) the same alias, so that prompt
    aliases keep following the model's.

    Returns:
        The prompt versions that now carry the alias (``prompts:/NAME/VERSION``).

    Raises:
        HCQRError: no such model version, or an alias the registry refuses.
    """
    import json

    import mlflow
    import mlflow.genai
    from mlflow.exceptions import MlflowException

    from hcqr_dspy.tracking.model_links import resolve_model_uri

    client = mlflow.MlflowClient()
    found = resolve_model_uri(f"models:/{model}/{version}")
    try:
        client.set_registered_model_alias(model, alias, found["version"])
    except MlflowException as exc:
        raise HCQRError(f"alias {alias!r}: {exc.message.splitlines()[0]}") from None
    linked = []
    if found["model_id"]:
        tag = mlflow.get_logged_model(found["model_id"]).tags.get("mlflow.linkedPrompts") or "[]"
        for prompt in json.loads(tag):
            mlflow.genai.set_prompt_alias(prompt["name"], alias, int(prompt["version"]))
            linked.append(f"prompts:/{prompt['name']}/{prompt['version']}")
    return linked
