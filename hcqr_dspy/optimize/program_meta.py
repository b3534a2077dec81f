"""The saved-program format's ``meta.json`` (:class:`ProgramMeta`) and the names of a saved program's two files
(:mod:`hcqr_dspy.optimize.saved` reads and writes the folder).

``meta.json`` says what the program is: format and version, the method and its constructor options, the
optimizer and recipe that made it, the LM, the index it was compiled against, the training questions (dataset,
ids and a SHA-256 of each question text, for the overlap check), the SHA-256 of ``program.json`` as saved (a hand
edit after the compile is refused when it is read), each stage's demos as its prompt shows them (bootstrapped,
labelled, rendered, saved) and, when the compile kept fewer bootstrapped traces than its recipe asked, how many
(``bootstrap_shortfall``); checked when written and when read.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hcqr_dspy.optimize.recipes import Recipe
from hcqr_dspy.programs.method_registry import PROGRAMS, check_options

FORMAT = "hcqr-dspy-program"
FORMAT_VERSION = 5  # 2: compile_cost; 3: program_sha256; 4: demos, bootstrap_shortfall; 5: compile_setup
STATE_FILE, META_FILE = "program.json", "meta.json"


class TrainingSet(BaseModel):
    """``meta.json``'s ``train``: every question the optimizer saw (training and validation), for the overlap check.

    ``ids`` and ``text_sha256`` (:func:`text_sha256` of each question) are parallel lists, made by
    :func:`question_keys`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    dataset: str
    ids: list[str]
    text_sha256: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]]
    file: str | None = None
    train_count: Annotated[int, Field(ge=0)] | None = None
    val_count: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _parallel(self) -> TrainingSet:
        if len(self.ids) != len(self.text_sha256):
            raise ValueError(f"{len(self.ids)} ids but {len(self.text_sha256)} text hashes")
        if self.train_count is not None and self.train_count + (self.val_count or 0) != len(self.ids):
            raise ValueError(f"train_count {self.train_count} + val_count {self.val_count or 0} != {len(self.ids)} ids")
        return self


class ProgramMeta(BaseModel):
    """``meta.json`` of a saved program.

    The format and its version are checked first (a newer version is refused before its keys are,
    since it may have other ones); then the method (a registered one), its constructor options
    (:func:`hcqr_dspy.programs.check_options`), the recipe that compiled it
    (:class:`hcqr_dspy.optimize.recipes.Recipe`) and its training set (:class:`TrainingSet`). Unknown keys are
    refused. The rest is recorded as :func:`hcqr_dspy.optimize.saved.save_program`'s callers give it.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal["hcqr-dspy-program"]
    format_version: Annotated[int, Field(ge=1)]
    method: str
    options: dict[str, Any] = Field(default_factory=dict)
    created: str
    hcqr_dspy_version: str
    dspy_version: str
    optimizer: str | None = None
    recipe: Recipe | None = None
    lm: dict[str, str] | None = None
    reflection_lm: str | None = None
    demo_context_tokens: Annotated[int, Field(ge=0)] | None = None
    index: dict[str, Any] | None = None
    train: TrainingSet | None = None
    mlflow_run_id: str | None = None
    compile_cost: dict[str, float] | None = None
    program_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    demos: dict[str, dict[str, Annotated[int, Field(ge=0)]]] | None = None
    bootstrap_shortfall: dict[str, Annotated[int, Field(ge=0)]] | None = None
    compile_setup: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _readable_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("format") == FORMAT:
            version = data.get("format_version")
            if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
                raise ValueError(
                    f"saved in program format version {version}, newer than this hcqr-dspy reads "
                    f"({FORMAT_VERSION}); upgrade hcqr-dspy"
                )
        return data

    @field_validator("method")
    @classmethod
    def _registered(cls, method: str) -> str:
        if method not in PROGRAMS:
            raise ValueError(f"holds method {method!r}, not one of {', '.join(PROGRAMS)}")
        return method

    @model_validator(mode="after")
    def _options_fit(self) -> ProgramMeta:
        try:
            check_options(self.method, self.options)
        except ValueError as exc:
            raise ValueError(f"options: {exc}") from None
        return self
