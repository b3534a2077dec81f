"""The typed fields of an experiment file (:mod:`hcqr_dspy.workflows.experiment_file`): the sub-mappings
``questions:``, ``judge:`` and ``comparison:`` and the checks of a method name, a dataset file and a saved-program
reference, each raising the ``ValueError`` pydantic reports against its field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, ValidationInfo
from typing_extensions import TypedDict

from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import DataError, HCQRError
from hcqr_dspy.optimize.seed_folders import seed_folders
from hcqr_dspy.programs.method_registry import PROGRAMS
from hcqr_dspy.reporting.equivalence import MIN_MARGIN_PGOLD, MIN_MARGIN_POINTS

Positive = Annotated[int, Field(ge=1)]
CELL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # a folder name: the experiment's and each program cell's
RESERVED_CELLS = ("comparison",)  # folders beside the cells' in a dataset's folder
Text = Annotated[str, Field(min_length=1)]


def field_check(check, value, *args, **options):
    """``check(value, *args, **options)``, its one-line :class:`HCQRError` raised as the ``ValueError`` pydantic
    reports against the field."""
    try:
        return check(value, *args, **options)
    except HCQRError as exc:
        raise ValueError(str(exc)) from None


class QuestionSample(TypedDict, total=False):
    """``questions:``: the same sample in every cell (:func:`hcqr_dspy.data.select`)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]

    limit: Positive
    seed: Annotated[int, Field(ge=0)]
    ids: Annotated[list[Text], Field(min_length=1)]


class JudgeSpec(TypedDict, total=False):
    """``judge:``: DUR judging of each retrieval cell (``lm`` null: the experiment's LM)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]

    lm: Text | None
    mode: Literal["context", "passage"]
    reasoning: bool
    max_tokens: Positive
    limit: Positive
    seed: Annotated[int, Field(ge=0)]


class ComparisonSpec(TypedDict, total=False):
    """``comparison:``: how each dataset's cells are compared (:func:`hcqr_dspy.reporting.compare`): equivalence
    margins for accuracy (points, 0.01 to 100) and p(gold) (0.0001 to 1), each adding a paired TOST per difference,
    and ``strict_setup`` (refuse a cell, before it answers, on another setup than the cells recorded, and a report
    over cells of different setups)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]

    margin: Annotated[float, Field(ge=MIN_MARGIN_POINTS, le=100, allow_inf_nan=False)]
    margin_pgold: Annotated[float, Field(ge=MIN_MARGIN_PGOLD, le=1, allow_inf_nan=False)]
    strict_setup: bool


def method_name(name: str) -> str:
    if name not in PROGRAMS:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(PROGRAMS)}")
    return name


def dataset_file(file: str, info: ValidationInfo) -> str:
    path = resolve_path(file, info)
    if not Path(path).is_file():
        raise ValueError(f"file {path} not found")
    try:
        load_questions(path)
    except DataError as exc:
        raise ValueError(f"does not load: {exc}") from None
    return path


def program_ref(ref: str, info: ValidationInfo) -> str:
    if ref.startswith(("runs:/", "models:/")):
        return ref  # resolved against the MLflow store when the experiment runs
    path = resolve_path(ref, info)
    if not (Path(path) / "meta.json").is_file() and not seed_folders(path):
        raise ValueError(
            f"{path} is not a saved program folder (no meta.json) nor one of replicate compiles (no seed-N/ "
            "folders); make one with `hcqr compile`"
        )
    return path


def resolve_path(path: str, info: ValidationInfo) -> str:
    p = Path(path)
    base = Path((info.context or {}).get("base") or ".")
    return str(p if p.is_absolute() else (base / p).resolve())
