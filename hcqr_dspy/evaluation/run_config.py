"""What of a run folder's ``config.json`` must match for a later session to resume it.

Everything that can change a row must match: the method and its options, the LM and its settings (a ``gguf:``
file by its SHA-256 too), the prompts (``prompts_sha256``: each stage's signature and demos), the selected
questions (``questions``: their ids' and contents' SHA-256), the index (``index``: corpus fingerprint and count,
retriever, encoder, vector index, search options) and a saved program or answer step (its compile run, creation
time, recipe, training set, ``program.json``'s SHA-256 and, for a ``models:/`` URI, the version it resolved to).
Where those inputs lie on this machine does not (:data:`LOCATION_KEYS`): a clone of the repository in another
folder, the data mounted at another path, or a ``runs:/`` / ``models:/`` program fetched again (MLflow downloads
it to a new temporary folder each time) resume the same run, and the configuration then records the new places.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import RunError

# Written anew by each session whatever the folder held (the MLflow run a resumed run continues).
MUTABLE_KEYS = ("mlflow_run_id",)
# Top-level key -> its fields that say where an input lies, not what it is (``()``: the value itself).
LOCATION_KEYS: dict[str, tuple[str, ...]] = {
    "dataset": (),
    "index": ("path", "corpus_source"),
    "saved_program": ("source", "folder"),
    "answer_step": ("source", "folder"),
}


def differing_keys(old: dict[str, Any], new: dict[str, Any], unrecorded: Sequence[str] = ()) -> list[str]:
    """The top-level keys whose identity differs between a folder's recorded ``old`` configuration and this
    session's ``new`` one, sorted; :data:`MUTABLE_KEYS` and :data:`LOCATION_KEYS` left out, a key absent on
    one side and ``None`` on the other is no difference, nor an identity ``old`` does not record (``unrecorded``:
    ``prompts_sha256``, ``saved_program.program_sha256`` ...;
    :attr:`~hcqr_dspy.evaluation.folder_format.StoredConfig.unrecorded`)."""
    return sorted(
        k
        for k in set(old) | set(new)
        if k not in MUTABLE_KEYS
        and k not in unrecorded
        and _identity(k, old.get(k)) != _identity(k, _as_old(k, old.get(k), new.get(k), unrecorded))
    )


def refuse_other_config(
    folder: Path, old: dict[str, Any], new: dict[str, Any], unrecorded: Sequence[str] = (), advice: str = ""
) -> None:
    """Refuse to resume ``folder``, whose recorded configuration is ``old``, with ``new`` where they differ in what
    decides a row (:func:`differing_keys`); ``advice`` ends the message.

    Raises:
        RunError: ``run folder F holds a run with another configuration (differs in: K, ...); <advice>``.
    """
    keys = differing_keys(old, new, unrecorded)
    if keys:
        raise RunError(
            f"run folder {folder} holds a run with another configuration (differs in: {', '.join(keys)}); {advice}"
        )


def _as_old(key: str, old: Any, new: Any, unrecorded: Sequence[str]) -> Any:
    """``new`` without the fields of ``key`` that ``old`` does not record (``unrecorded``)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    return {k: v for k, v in new.items() if f"{key}.{k}" not in unrecorded}


def moved_inputs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The locations (``dataset``, ``index.path`` ...) that differ between ``old`` and ``new``, in
    :data:`LOCATION_KEYS` order."""
    moved = []
    for key, fields in LOCATION_KEYS.items():
        before, now = old.get(key), new.get(key)
        if not fields:
            if before != now:
                moved.append(key)
            continue
        before, now = before if isinstance(before, dict) else {}, now if isinstance(now, dict) else {}
        moved += [f"{key}.{f}" for f in fields if before.get(f) != now.get(f) and before and now]
    return moved


def _identity(key: str, value: Any) -> Any:
    if key in LOCATION_KEYS:
        fields = LOCATION_KEYS[key]
        if not fields:
            return None
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in fields}
    return without_nones(value)


def without_nones(value: Any) -> Any:
    """``value`` with ``None``-valued keys dropped at every depth: a setting recorded as ``None`` and one not
    recorded are the same setting."""
    if isinstance(value, dict):
        return {k: without_nones(v) for k, v in value.items() if v is not None}
    return value
