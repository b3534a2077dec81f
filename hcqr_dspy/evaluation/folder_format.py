"""The run folder's format, and the one place a folder of any format is read as the current one.

``config.json`` carries the folder's format number under ``format`` (:data:`FORMAT`); a ``config.json`` without
one is format 1. The number belongs to the file, not to the configuration: :func:`read_config` leaves it out of
the configuration it returns, and a folder keeps the format it was created with when a later session rewrites its
``config.json`` (:func:`stored_config`), so reading or resuming a folder never renumbers it.

Format 2 (written into every new folder):
    * ``config.json`` records every identity :mod:`~hcqr_dspy.evaluation.run_config` compares that applies:
      ``prompts_sha256``, a saved program's or answer step's ``program_sha256`` and ``seed``, a ``gguf:``
      file's ``lm.sha256``; one missing is a difference.
    * the inputs' places (:data:`PLACES`) are kept as :func:`~hcqr_dspy.evaluation.places.portable` writes them.

Format 1 (``config.json`` without ``format``):
    * any identity of :data:`UNRECORDED_IN_1` may be absent: :func:`read_config` lists the absent ones
      (:attr:`StoredConfig.unrecorded`), which a resume does not compare and then records.
    * places are absolute paths, read like format 2's (:func:`~hcqr_dspy.evaluation.places.resolve`).
    * ``questions`` may lack ``content_sha256``: its runs are matched by dataset and ``ids_sha256``
      (:func:`~hcqr_dspy.evaluation.same_questions.check_same_questions`) and its sample by the ids alone.
    * ``sessions.jsonl`` may be absent, or start after the first rows (``predictions_before``): those rows' setup
      is unknown (:mod:`hcqr_dspy.reporting.setups` reports it unverified).
    * rows may lack ``option_probs``, ``gold_prob`` and ``cached_lm_calls`` (``hcqr rescore`` adds the first two
      in ``option_probs.jsonl``: :mod:`~hcqr_dspy.evaluation.option_probs`).
    * a judgment may hold ``controls: true`` (:data:`TWO_CONTROLS`: judged against the positive and the negative
      control only); :func:`lacks_on_topic_control` finds them and :mod:`hcqr_dspy.judge.control_upgrade` adds
      the on-topic control.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.places import index_matches, portable, resolve
from hcqr_dspy.files import file_sha256

FORMAT = 2
FORMAT_KEY = "format"
# Identities format 1 may lack: top-level key -> its fields (``()``: the key itself).
UNRECORDED_IN_1: dict[str, tuple[str, ...]] = {
    "prompts_sha256": (),
    "saved_program": ("program_sha256", "seed"),
    "answer_step": ("program_sha256", "seed"),
    "lm": ("sha256",),  # a gguf: file's bytes
}
# The inputs' places a configuration records: top-level key -> its fields (``()``: the value itself).
PLACES: dict[str, tuple[str, ...]] = {
    "dataset": (),
    "index": ("path", "corpus_source"),
    "saved_program": ("folder",),  # its "source" is kept as given (a path as typed, a runs:/ or models:/ URI)
    "answer_step": ("folder",),
}
# A judgment's ``controls`` when it was judged against the positive and the negative control only.
TWO_CONTROLS = True


@dataclass(frozen=True)
class StoredConfig:
    """A ``config.json`` as read: the configuration (no format number; places resolved on this machine), the
    folder's format, the file's own record (``recorded``, as on disk) and the identities it lacks (format 1:
    ``prompts_sha256``, ``saved_program.program_sha256`` ...)."""

    config: dict[str, Any]
    format: int
    recorded: dict[str, Any]
    unrecorded: tuple[str, ...] = ()


def read_config(recorded: dict[str, Any], folder: Path, file: Path) -> StoredConfig:
    """``config.json``'s object ``recorded`` (of run folder ``folder``, read from ``file``) as the current format.

    Raises:
        RunError: its ``format`` is not a format number, or one newer than :data:`FORMAT` (one line naming the file).
    """
    number = recorded.get(FORMAT_KEY, 1)
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise RunError(f"{file}: format {number!r} is not a run folder format number; repair or restore that file")
    if number > FORMAT:
        raise RunError(
            f"{file} is run folder format {number}, newer than this hcqr-dspy reads ({FORMAT}); upgrade hcqr-dspy"
        )
    config = {k: v for k, v in recorded.items() if k != FORMAT_KEY}
    unrecorded = _lacking(config) if number == 1 else ()
    return StoredConfig(_resolved(config, folder), number, recorded, unrecorded)


def stored_config(config: dict[str, Any], folder: Path, previous: StoredConfig | None) -> dict[str, Any]:
    """What ``config.json`` of ``folder`` holds for ``config`` (places absolute on this machine): each place in
    :func:`~hcqr_dspy.evaluation.places.portable` form, or as ``previous`` recorded it where it resolves to the same
    place; the format number of ``previous`` (none for format 1), :data:`FORMAT` for a new folder."""
    out = {k: v for k, v in config.items() if k != FORMAT_KEY}
    before = previous.recorded if previous is not None else {}
    now = previous.config if previous is not None else {}
    for key, fields in PLACES.items():
        if not fields:
            if isinstance(out.get(key), str):
                out[key] = before[key] if now.get(key) == out[key] and key in before else portable(out[key], folder)
            continue
        if not isinstance(out.get(key), dict):
            continue
        kept = before.get(key) if isinstance(before.get(key), dict) and isinstance(now.get(key), dict) else {}
        out[key] = dict(out[key])
        for f in fields:
            if isinstance(out[key].get(f), str):
                same = f in kept and now[key].get(f) == out[key][f]
                out[key][f] = kept[f] if same else portable(out[key][f], folder)
    number = previous.format if previous is not None else FORMAT
    return out if number == 1 else {FORMAT_KEY: number, **out}


def first_recorded(unrecorded: tuple[str, ...], new: dict[str, Any]) -> list[str]:
    """The identities of ``unrecorded`` (a format 1 folder's) that ``new`` records: the rows the folder holds were
    not checked against them."""
    out = []
    for name in unrecorded:
        key, _, field = name.partition(".")
        value = new.get(key)
        if (not field and key in new) or (field and isinstance(value, dict) and field in value):
            out.append(name)
    return out


def lacks_on_topic_control(judgment: dict[str, Any], settings: dict[str, Any]) -> bool:
    """Whether ``judgment`` was made with ``settings`` except that its controls were the positive and the negative
    one only (:data:`TWO_CONTROLS`), so that adding the on-topic control makes it a judgment with ``settings``."""
    return judgment.get("controls") is TWO_CONTROLS and all(
        judgment.get(k) == v for k, v in settings.items() if k != "controls"
    )


def _lacking(config: dict[str, Any]) -> tuple[str, ...]:
    """The :data:`UNRECORDED_IN_1` identities a format 1 ``config`` lacks."""
    out = []
    for key, fields in UNRECORDED_IN_1.items():
        if not fields:
            if key not in config:
                out.append(key)
        elif isinstance(config.get(key), dict):
            out += [f"{key}.{f}" for f in fields if f not in config[key]]
    return tuple(out)


def _resolved(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``config`` with its :data:`PLACES` resolved on this machine: a dataset by its place (the questions' content
    fingerprint is checked when they are read), an index by its corpus fingerprint, a program folder by its
    ``program.json``'s SHA-256 (copies)."""
    out = dict(config)
    if isinstance(out.get("dataset"), str):
        out["dataset"] = resolve(out["dataset"], folder, names=True)
    index = out.get("index")
    if isinstance(index, dict):
        fingerprint = index.get("corpus_fingerprint")
        out["index"] = {
            **index,
            **{
                f: resolve(index[f], folder, index_matches(fingerprint) if f == "path" else None)
                for f in ("path", "corpus_source")
                if isinstance(index.get(f), str)
            },
        }
    for key in ("saved_program", "answer_step"):
        record = out.get(key)
        if isinstance(record, dict) and isinstance(record.get("folder"), str):
            out[key] = {**record, "folder": resolve(record["folder"], folder, _program_matches(record))}
    return out


def _program_matches(record: dict[str, Any]):
    """Whether a folder is the saved program ``record`` names (its ``program.json``'s recorded SHA-256; any saved
    program where none is recorded)."""

    def check(candidate: Path) -> bool:
        state = candidate / "program.json"
        if not state.is_file() or not (candidate / "meta.json").is_file():
            return False
        return not record.get("program_sha256") or file_sha256(state) == record["program_sha256"]

    return check
