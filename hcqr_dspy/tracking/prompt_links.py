"""Each question's trace linked to the Prompt Registry versions its program's stages used (MLflow's
prompt-to-trace linking): which questions each prompt version answered.

The versions come from the evaluated LoggedModel (:func:`hcqr_dspy.tracking.model_links.evaluated_model`): its
``mlflow.linkedPrompts`` tag, which a tracked compile and ``hcqr register`` set to one ``<program>.<stage>`` version
per stage (:mod:`hcqr_dspy.tracking.prompts`). A registered version (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``)
and a compiled folder whose compile run is in the store have them; a zero-shot program's model has none, so its
traces are linked to nothing.

Each question's trace carries them twice: while it is recorded, the trace tag ``mlflow.linkedPrompts`` (JSON
``[{"name", "version"}]``, what ``trace.info.tags`` shows and the UI lists) and, on each stage span named after a
stage, the attributes ``prompt`` (``prompts:/NAME/VERSION``) and ``mlflow.linkedPrompts``
(:func:`~hcqr_dspy.tracking.stage_spans.span`); once the traces are in the store, the store's trace-to-prompt link
(``MlflowClient.link_prompt_versions_to_trace``: what ``mlflow.search_traces(filter_string='prompt =
"NAME/VERSION"')`` reads), by :func:`link_traces`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hcqr_dspy.tracking.stage_spans import LINKED_PROMPTS

log = logging.getLogger(__name__)


def model_prompts(model_id: str | None) -> dict[str, Any]:
    """The prompt versions of LoggedModel ``model_id``, by stage: ``{stage: PromptVersion}`` in its
    ``mlflow.linkedPrompts`` order. A version's stage is its ``stage`` tag, else its name after the last ``.``.

    A listed version the registry does not hold is left out, with one note on stderr naming it. ``{}`` for no
    model, or a model with no linked prompts (a zero-shot program's).
    """
    if not model_id:
        return {}
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    listed = json.loads(mlflow.get_logged_model(model_id).tags.get(LINKED_PROMPTS) or "[]")
    found = {}
    for entry in listed:
        try:
            version = client.get_prompt_version(entry["name"], entry["version"])
        except MlflowException:  # deleted from the registry since the model was logged
            log.warning(
                f"hcqr: note: prompt prompts:/{entry['name']}/{entry['version']}, linked to model {model_id}, is not "
                "in the registry; the traces are not linked to it"
            )
            continue
        found[(version.tags or {}).get("stage") or entry["name"].rsplit(".", 1)[-1]] = version
    return found


def link_traces(trace_ids: Iterable[str], prompts: Mapping[str, Any]) -> int:
    """Link every trace of ``trace_ids`` to every version of ``prompts`` (``{stage: PromptVersion}``) in the store
    (see the module docstring). Linking again what is linked adds nothing. Call it once the traces are written
    (``mlflow.flush_trace_async_logging``).

    Returns:
        How many traces were linked (0 when ``prompts`` is empty).

    Raises:
        MlflowException: no such trace; the store failed.
    """
    versions = list(prompts.values())
    if not versions:
        return 0
    import mlflow

    client = mlflow.MlflowClient()
    done = 0
    for trace_id in dict.fromkeys(trace_ids):
        client.link_prompt_versions_to_trace(versions, trace_id)
        done += 1
    return done
