"""A compiled program's prompts in the MLflow Prompt Registry: one prompt per stage, a version per change.

Each predictor (stage) of a program becomes the prompt ``<program>.<stage>`` (``hcqr-medqa.hypothesis``), a chat
template (``mlflow.genai.register_prompt`` with a list of messages): the signature's instructions as the
``system`` message, then each few-shot demo the stage's prompt shows (the adapter's own rendering,
:mod:`hcqr_dspy.optimize.demo_counts`: a demo lacking every output field of the stage is never shown) as a
``user`` message (its input fields, ``name: value`` lines) and an ``assistant`` message (its output fields).
``mlflow.genai.load_prompt("prompts:/<program>.<stage>/<version>")`` gives them back; ``template[0]["content"]``
is the instructions. A compile registers a new version of a stage only when its template differs from the stage's
latest version (else it links that version again), links every version to the compile run and the logged model,
and gives each the model's alias when it has one.

Prompt names allow letters, digits, ``-``, ``_`` and ``.`` (``mlflow.prompt.registry_utils``); a program's name
with other characters is made one by :func:`safe_name`.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from typing import Any

import dspy

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.optimize.demo_counts import bootstrapped, default_adapter, renders

NAME_RULE = re.compile(r"[^A-Za-z0-9_.-]+")


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
    """Register each stage of ``program`` as the prompt ``<name>.<stage>`` (see the module docstring).

    Args:
        program: The (compiled) program.
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
    versions = []
    for stage, predictor in program.named_predictors():
        full = prompt_name(name, stage)
        template = stage_template(predictor)
        shown = shown_demos(predictor)
        traces = sum(bootstrapped(d) for d in shown)
        latest = _latest(client, full)
        if latest is not None and latest.template == template:
            version = latest
        else:
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


def _all_versions(client, name: str) -> list[Any]:
    """Every version of prompt ``name``, oldest first (none when there is no such prompt)."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_prompt_versions(name, max_results=1000)
    except MlflowException:  # no such prompt
        return []
    return sorted(getattr(found, "prompt_versions", found) or [], key=lambda v: int(v.version))


def _latest(client, name: str):
    """The latest version of prompt ``name``, or ``None`` when it has none."""
    found = _all_versions(client, name)
    return found[-1] if found else None


def render(template: str | list[dict[str, Any]]) -> list[str]:
    """A prompt template as text lines: a text template as it is; a chat template message by message, each under
    a ``## <role>`` heading."""
    if isinstance(template, str):
        return template.splitlines()
    lines: list[str] = []
    for message in template:
        lines.append(f"## {message.get('role')}")
        lines.extend(str(message.get("content", "")).splitlines())
    return lines


def prompt_diff(name: str, old: str, new: str) -> str:
    """The unified diff (``difflib``) of two versions of prompt ``name``, versions or aliases (``3``, ``champion``).

    Raises:
        HCQRError: the prompt or a version does not exist.
    """
    import mlflow.genai
    from mlflow.exceptions import MlflowException

    def load(ref: str):
        uri = f"prompts:/{name}/{ref}" if ref.isdigit() else f"prompts:/{name}@{ref}"
        try:
            return mlflow.genai.load_prompt(uri, link_to_model=False)
        except MlflowException as exc:
            raise HCQRError(f"no prompt {uri}: {exc.message.splitlines()[0]}") from None

    a, b = load(old), load(new)
    return "\n".join(
        difflib.unified_diff(
            render(a.template),
            render(b.template),
            fromfile=f"{name} v{a.version}",
            tofile=f"{name} v{b.version}",
            lineterm="",
        )
    )


def prompt_versions(name: str) -> list[str]:
    """One line per version of prompt ``name``, oldest first: version, aliases, demos, recipe, compile run.

    Raises:
        HCQRError: no such prompt.
    """
    import mlflow

    client = mlflow.MlflowClient()
    found = _all_versions(client, name)
    if not found:
        raise HCQRError(f"no prompt {name!r} in this store; `hcqr compile` names its prompts <program>.<stage>")
    lines = []
    for v in found:
        v = client.get_prompt_version(name, v.version) or v  # search results carry no aliases
        aliases = ", ".join(getattr(v, "aliases", None) or []) or "-"
        tags = v.tags or {}
        lines.append(
            f"{name} v{v.version}  aliases: {aliases}  demos: {tags.get('demos', '?')}  "
            f"recipe: {tags.get('recipe', '-')}  run: {tags.get('run_id', '-')}"
        )
    return lines


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
