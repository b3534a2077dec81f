"""Experiment files: methods x datasets sharing one LM, index, budget and question sample.

An experiment file (YAML) looks like::

    name: paper_main
    lm: local:qwen2.5-coder-0.5b          # any --lm spec
    index: indexes/medrag-all-bm25         # one shared index (every retrieval method)
    search_options: {nprobe: 32}           # optional: dense indexes' search-time options (nprobe, efSearch, k_factor)
    encoder_backend: onnx-int8             # optional: what embeds the queries (torch, onnx, onnx-int8, openvino,
                                           # openvino-bf16)
    budget: 15                             # passages shown to the answer step, every method
    questions: {limit: 20, seed: 0}        # the same sample in every cell (or ids: [...])
    datasets:
      medqa: data/medqa.json
      mmlu: data/mmlu.json
    methods: [cot, simple_rag, hcqr]
    programs:                              # optional: saved (compiled) programs as cells beside the methods,
      hcqr_bfs: ../programs/hcqr-bfs       # by cell name: a folder from `hcqr compile`, runs:/ or models:/ URI;
      sr_bfs: ../programs/sr-bfs-seeds     # a folder of `hcqr compile --seeds` (seed-N/ inside): one cell a seed,
                                           # sr_bfs-seed-0, sr_bfs-seed-1, ... (compare groups them as one arm)
    method_options:                        # optional, per method
      hcqr: {k_per_query: 5, fusion: score_sum}
    reference: simple_rag                  # optional: the comparison's reference method
    judge: {lm: null, mode: context}       # optional: DUR judging with controls (lm null = the run's LM;
                                           # reasoning: true, max_tokens: 512; limit: N, seed: 0 judges
                                           # the same seeded N questions of every cell)
    comparison:                            # optional: how the cells are compared (as `hcqr compare`)
      margin: 5                            # TOST margin, accuracy points (0.01 to 100)
      margin_pgold: 0.05                   # TOST margin, p(gold) (0.0001 to 1)
      strict_setup: true                   # refuse cells answered on different setups

The file is a pydantic model (:class:`Experiment`, read by
:mod:`hcqr_dspy.config`): unknown keys (at any level) are refused, types are
checked strictly and ranges as follows: ``name`` is a folder name (letters,
digits, ``.``, ``_``, ``-``); ``budget``, ``questions.limit``,
``max_tokens``, ``n_ctx`` and ``threads`` are integers >= 1 and
``questions.seed`` >= 0; ``methods`` are registered methods, each once;
``method_options`` name methods of the grid and are checked against each
method's constructor (names and annotated types); ``programs`` are cell names
(as ``name``, none a method of the grid) each naming a saved program folder
(with ``meta.json``), a folder of replicate compiles (``hcqr compile --seeds``:
one cell per ``seed-N/``, named ``<cell>-seed-N``) or a ``runs:/`` /
``models:/`` URI, whose method, options
and budget come with it (resolved, and their budget checked against the file's,
before the first cell runs: :mod:`hcqr_dspy.workflows.experiment`);
``reference`` is a method or program cell; ``judge.mode`` is
``context`` or ``passage``; ``comparison.margin`` is from 0.01 to 100 points and
``comparison.margin_pgold`` from 0.0001 to 1
(:class:`~hcqr_dspy.workflows.experiment_fields.ComparisonSpec`). Every dataset must load with the question loader
(:func:`hcqr_dspy.data.load_questions`), and retrieval methods need an index
folder. An error is one line naming the file, the line, the field and what
is allowed. All of it is checked before any LM call (``hcqr experiment FILE
--check`` stops there).

Relative paths are resolved against the file's folder. ``hcqr experiment
NAME`` finds ``./experiments/NAME.yaml``, else the experiment of that name
shipped in the package (:mod:`hcqr_dspy.resources`); a shipped file's
relative paths are resolved as if it stood in ``./experiments/`` of the
working folder, so the shipped ``paper_main`` reads its index and datasets
relative to wherever it is run. Running one is
:mod:`hcqr_dspy.workflows.experiment`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hcqr_dspy.config import describe, line_of, problem_line, read_yaml, validate
from hcqr_dspy.errors import ExperimentError
from hcqr_dspy.lm import parse_lm_spec
from hcqr_dspy.optimize.seed_folders import expand_replicates
from hcqr_dspy.programs.method_registry import PROGRAMS, check_option_values, check_options
from hcqr_dspy.resources import find
from hcqr_dspy.retrieval.index_kinds import check_index_options
from hcqr_dspy.retrieval.query_runtime import check_runtime
from hcqr_dspy.retrieval.vector_index import check_search_options
from hcqr_dspy.workflows.experiment_fields import (
    CELL_NAME,
    RESERVED_CELLS,
    ComparisonSpec,
    JudgeSpec,
    Positive,
    QuestionSample,
    Text,
    dataset_file,
    field_check,
    method_name,
    program_ref,
    resolve_path,
)


class Experiment(BaseModel):
    """A validated experiment file (paths resolved; see the module note for the keys and their ranges).

    Validate with ``Experiment.model_validate(data, context={"base": folder})``: relative paths are
    resolved against ``folder``. Fields are validated in the order declared (``api_base`` and
    ``api_key_env`` before ``lm``, ``methods`` before what refers to them).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(pattern=CELL_NAME)]
    description: str = ""
    api_base: Text | None = None
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    lm: Text
    datasets: Annotated[dict[Text, Annotated[Text, AfterValidator(dataset_file)]], Field(min_length=1)]
    methods: Annotated[list[Annotated[str, AfterValidator(method_name)]], Field(min_length=1)]
    programs: dict[Annotated[str, Field(pattern=CELL_NAME)], Annotated[Text, AfterValidator(program_ref)]] = Field(
        default_factory=dict
    )
    index: Text | None = None
    budget: Positive = 15
    questions: QuestionSample = Field(default_factory=dict)
    method_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    reference: str | None = None
    judge: JudgeSpec | None = None
    comparison: ComparisonSpec = Field(default_factory=dict)
    max_tokens: Positive = 1024
    n_ctx: Positive = 8192
    threads: Positive = 1
    search_options: dict[str, int] = Field(default_factory=dict)
    encoder_backend: str | None = None

    @field_validator("encoder_backend")
    @classmethod
    def _encoder_backend(cls, name: str | None) -> str | None:
        return None if name is None else field_check(check_runtime, name)

    @field_validator("search_options")
    @classmethod
    def _search_options(cls, options: dict[str, int]) -> dict[str, int]:
        return field_check(check_search_options, options)

    @field_validator("lm")
    @classmethod
    def _lm_spec(cls, lm: str, info: ValidationInfo) -> str:
        field_check(parse_lm_spec, lm, api_base=info.data.get("api_base"), api_key_env=info.data.get("api_key_env"))
        return lm

    @field_validator("methods")
    @classmethod
    def _each_once(cls, methods: list[str]) -> list[str]:
        repeated = sorted({m for m in methods if methods.count(m) > 1})
        if repeated:
            raise ValueError(f"method(s) {', '.join(repeated)} listed twice (each cell is one run folder)")
        return methods

    @field_validator("programs")
    @classmethod
    def _programs_apart(cls, programs: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        programs = expand_replicates(programs)
        clash = sorted(set(programs) & ({*(info.data.get("methods") or []), *RESERVED_CELLS}))
        if clash:
            raise ValueError(
                f"program cell(s) {', '.join(clash)} share a method's name or {', '.join(RESERVED_CELLS)} "
                "(each cell is one run folder beside the comparison's)"
            )
        return programs

    @field_validator("index")
    @classmethod
    def _index_folder(cls, index: str | None, info: ValidationInfo) -> str | None:
        if index is None:
            return None
        index = resolve_path(index, info)
        if not (Path(index) / "manifest.json").is_file():
            raise ValueError(f"{index} is not an hcqr index folder (no manifest.json); build one with `hcqr index`")
        return index

    @field_validator("method_options")
    @classmethod
    def _accepted_options(
        cls, method_options: dict[str, dict[str, Any]], info: ValidationInfo
    ) -> dict[str, dict[str, Any]]:
        if "methods" not in info.data:  # the methods are wrong: that error is the one reported
            return method_options
        methods = info.data["methods"]
        for method, options in method_options.items():
            if method not in methods:
                raise ValueError(f"{method!r} is not one of the methods ({', '.join(methods)})")
            try:
                check_options(method, options)
                if "budget" in info.data:  # values and ranges as the constructor checks them, with the file's budget
                    check_option_values(method, options, info.data["budget"])
            except ValueError as exc:
                raise ValueError(f"{method}: {exc}") from None
        return method_options

    @field_validator("reference")
    @classmethod
    def _reference_method(cls, reference: str | None, info: ValidationInfo) -> str | None:
        if "methods" not in info.data or "programs" not in info.data:  # their own errors are the ones reported
            return reference
        cells = [*info.data["methods"], *info.data["programs"]]
        if reference is not None and reference not in cells:
            raise ValueError(f"{reference!r} is not one of the cells ({', '.join(cells)})")
        return reference

    @model_validator(mode="after")
    def _index_for_retrieval(self) -> Experiment:
        if not self.index and any(PROGRAMS[m].uses_retrieval for m in self.methods):
            raise ValueError("retrieval methods need 'index' (build one with `hcqr index`)")
        if self.search_options and not self.index:
            raise ValueError("'search_options' need an 'index'")
        if self.encoder_backend not in (None, "torch") and not self.index:
            raise ValueError("'encoder_backend' needs an 'index'")
        if self.index and (self.search_options or self.encoder_backend):
            # what the run would refuse when it loads the index, found before any LM call
            field_check(check_index_options, self.index, self.search_options, self.encoder_backend)
        for method in self.methods:  # a method left at its defaults must fit the budget too (rerank_rag's pool_k)
            if method not in self.method_options:
                try:
                    check_option_values(method, {}, self.budget)
                except ValueError as exc:
                    raise ValueError(f"budget {self.budget} does not fit method {method!r}: {exc}") from None
        return self


def load_experiment(
    path: str | Path,
    limit: int | None = None,
    lm: str | None = None,
    only_datasets: list[str] | None = None,
    encoder_backend: str | None = None,
) -> Experiment:
    """Read and validate an experiment file (no LM call, no index load).

    Args:
        path: The YAML file (``.yaml`` may be left out), or a bare name: ``./experiments/<name>.yaml``,
            else the shipped experiment of that name (:func:`hcqr_dspy.resources.find`).
        limit: Override ``questions.limit`` (e.g. a quick run).
        lm: Override ``lm``.
        only_datasets: Run only these of the file's datasets (names as in
            the file), e.g. one dataset on a slow machine.
        encoder_backend: Override ``encoder_backend`` (what embeds the queries).

    Raises:
        ExperimentError: one line naming the file, the line and the field (its ``problems``: every
            problem found, one line each): an unreadable or non-UTF-8 file, invalid YAML, unknown keys
            (the allowed ones listed), values of the wrong type or out of range, unknown methods,
            options or LM spec, dataset files that are missing or do not load, a missing index;
            unknown ``only_datasets``; no such file or name (the folders searched and the
            experiments there are listed).
    """
    file, shipped = find("experiment", path, ExperimentError)
    raw, node = read_yaml(file, ExperimentError, "experiment file")
    if isinstance(raw, dict):
        overrides: dict[str, Any] = {"lm": lm} if lm else {}
        if encoder_backend is not None:
            overrides["encoder_backend"] = encoder_backend
        if limit is not None and isinstance(raw.get("questions", {}), dict):
            overrides["questions"] = {**raw.get("questions", {}), "limit": limit}
        raw = {**raw, **overrides}
    base = Path("experiments").resolve() if shipped else file.parent
    if not isinstance(raw, dict):
        validate(Experiment, raw, file, ExperimentError, node)  # raises: the file is not a mapping of keys
    named = raw.get("datasets") if isinstance(raw.get("datasets"), dict) else {}
    bad = [d for d in only_datasets or [] if d not in named]
    unknown = (
        f"{file}: unknown dataset(s) {', '.join(bad) or '(none given)'}; the file has {', '.join(named)}"
        if only_datasets is not None and (bad or not only_datasets)
        else None
    )
    try:
        exp = Experiment.model_validate(raw, context={"base": base})
    except ValidationError as exc:
        problems = problem_lines(exc, file, node) + later_problems(exc, raw, base, file, node)
        problems += [unknown] if unknown else []
        raise ExperimentError(describe(exc, file, Experiment, node), problems=problems) from None
    if unknown:
        raise ExperimentError(unknown)
    if only_datasets is not None:
        exp.datasets = {d: exp.datasets[d] for d in only_datasets}
    return exp


# Keys the file-wide checks (Experiment._index_for_retrieval) read: they run only when every field is valid.
FILE_WIDE_KEYS = frozenset({"index", "methods", "search_options", "encoder_backend", "budget", "method_options"})
CHECK_PASSES = 5
# Keys checked against others: their errors while one of those was left out are not problems of their own.
DEPENDS_ON = {"reference": {"methods", "programs"}, "method_options": {"methods"}}


def later_problems(exc: ValidationError, raw: dict[str, Any], base: Path, file: str | Path, node: Any) -> list[str]:
    """The problems a first validation could not reach: checks that need other fields valid (options of the
    methods listed, the reference method, the file-wide checks) run again with the failed keys left out (a
    repeated method listed once instead), up to :data:`CHECK_PASSES` times; a key found missing only because
    it was left out is not a problem, and file-wide checks count only while none of their keys is left out."""
    found: list[str] = []
    failed = {e["loc"][0] for e in exc.errors() if e["loc"]}
    trial = dict(raw)
    for _ in range(CHECK_PASSES):
        for key in failed:
            value = trial.pop(key, None)
            if key == "methods" and isinstance(value, list) and all(isinstance(m, str) for m in value):
                trial["methods"] = list(dict.fromkeys(value))  # the repeat is reported; check the rest as listed once
        try:
            Experiment.model_validate(trial, context={"base": base})
            return found
        except ValidationError as again:
            errors = [
                e
                for e in again.errors()
                if e["type"] != "missing"
                and (e["loc"] or not (FILE_WIDE_KEYS & set(raw) - set(trial)))
                and (not e["loc"] or e["loc"][0] not in failed)
                and not (e["loc"] and DEPENDS_ON.get(e["loc"][0], set()) & (set(raw) - set(trial)))
            ]
            if not errors:
                return found
            lines = error_lines(errors, file, node)
            found += [line for line in lines if line not in found]
            failed |= {e["loc"][0] for e in errors if e["loc"]}
            if not any(e["loc"] for e in errors):
                return found
    return found


def problem_lines(exc: ValidationError, file: str | Path, node: Any = None) -> list[str]:
    """Every problem of a pydantic ``ValidationError`` over an experiment file, one line each, as
    :func:`hcqr_dspy.config.describe` words its first: ``<file>:<line>: <field>: <what is wrong and allowed>``."""
    return error_lines(exc.errors(include_url=False), file, node)


def error_lines(errors: list[Any], file: str | Path, node: Any = None) -> list[str]:
    """Pydantic error records as :func:`problem_lines` words them."""
    lines = []
    for error in errors:
        loc = tuple(error["loc"])
        line = line_of(node, loc) if node is not None else None
        lines.append(f"{f'{file}:{line}' if line else file}: {problem_line(error, Experiment, loc)}")
    return lines
