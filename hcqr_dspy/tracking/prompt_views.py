"""Reading a compiled program's prompts from the MLflow Prompt Registry (``hcqr prompts``): the versions of one
stage's prompt, one version as text, or the diff of two.

A version is named by its number (``3``) or an alias (``champion``; ``zero-shot``, the uncompiled program's
template, :mod:`hcqr_dspy.tracking.prompts`). A chat template reads as text message by message, each under a
``## <role>`` heading (:func:`render`). Nothing here writes to the store: an archived, read-only one is read as
it is.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.tracking.prompts import all_versions

# a version number or an alias MLflow could hold (letters, digits, ``_``, ``-``)
REF_RULE = re.compile(r"[A-Za-z0-9_-]+")


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


def _existing(client, name: str) -> list[Any]:
    """Every version of prompt ``name``, oldest first, with its aliases.

    Raises:
        HCQRError: no such prompt in the store.
    """
    found = all_versions(client, name)
    if not found:
        raise HCQRError(f"no prompt {name!r} in this store; `hcqr compile` names its prompts <program>.<stage>")
    return [client.get_prompt_version(name, v.version) or v for v in found]  # search results carry no aliases


def _known(name: str, versions: list[Any]) -> str:
    """``NAME has versions 1, 2 and aliases champion (v2), zero-shot (v1)``: what a reference may name."""
    aliases = sorted((a, v.version) for v in versions for a in getattr(v, "aliases", None) or [])
    named = ", ".join(f"{a} (v{n})" for a, n in aliases)
    return f"{name} has versions {', '.join(str(v.version) for v in versions)} and " + (
        f"aliases {named}" if named else "no aliases"
    )


def load_version(name: str, ref: str):
    """Version ``ref`` (a number or an alias) of prompt ``name``, as ``mlflow.genai.load_prompt`` gives it.

    Raises:
        HCQRError: no such prompt; no such version or alias (one line naming the versions and aliases there are).
    """
    import mlflow
    import mlflow.genai
    from mlflow.exceptions import MlflowException

    versions = _existing(mlflow.MlflowClient(), name)
    uri = f"prompts:/{name}/{ref}" if ref.isdigit() else f"prompts:/{name}@{ref}"
    if REF_RULE.fullmatch(ref):
        try:
            return mlflow.genai.load_prompt(uri, link_to_model=False)
        except MlflowException:
            pass
    raise HCQRError(f"no prompt {uri}: {_known(name, versions)}")


def _line(name: str, version: Any) -> str:
    """One version's summary: version, aliases, demos, recipe, compile run."""
    aliases = ", ".join(getattr(version, "aliases", None) or []) or "-"
    tags = version.tags or {}
    return (
        f"{name} v{version.version}  aliases: {aliases}  demos: {tags.get('demos', '?')}  "
        f"recipe: {tags.get('recipe', '-')}  run: {tags.get('run_id', '-')}"
    )


def prompt_versions(name: str) -> list[str]:
    """One line per version of prompt ``name``, oldest first: version, aliases, demos, recipe, compile run.

    Raises:
        HCQRError: no such prompt.
    """
    import mlflow

    return [_line(name, v) for v in _existing(mlflow.MlflowClient(), name)]


def prompt_text(name: str, ref: str) -> str:
    """Version ``ref`` of prompt ``name`` as text: its summary line (:func:`prompt_versions`'s), then its template
    (:func:`render`).

    Raises:
        HCQRError: see :func:`load_version`.
    """
    import mlflow

    loaded = load_version(name, ref)
    version = mlflow.MlflowClient().get_prompt_version(name, loaded.version) or loaded
    return "\n".join([_line(name, version), *render(loaded.template)])


def prompt_diff(name: str, old: str, new: str) -> str:
    """The unified diff (``difflib``) of two versions of prompt ``name``, versions or aliases (``3``, ``champion``,
    ``zero-shot``); empty when they are the same.

    Raises:
        HCQRError: see :func:`load_version`.
    """
    a, b = load_version(name, old), load_version(name, new)
    return "\n".join(
        difflib.unified_diff(
            render(a.template),
            render(b.template),
            fromfile=f"{name} v{a.version}",
            tofile=f"{name} v{b.version}",
            lineterm="",
        )
    )
