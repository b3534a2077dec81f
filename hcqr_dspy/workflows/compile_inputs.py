"""What ``hcqr compile`` is asked to do, and every input of it checked before the first LM call.

:class:`CompileSpec` is the request; :func:`check_request` checks what needs no file or LM (the recipe with the
seed asked for, the method, the LM specs, the registry names), :func:`draw_questions` the training questions a
seed draws (and their overlap with holdout files), and :func:`check_inputs` everything, building the objects
the compile runs on (:class:`CompileInputs`). :mod:`hcqr_dspy.workflows.compile` compiles one seed,
:mod:`hcqr_dspy.workflows.compile_seeds` several.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy

from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import HCQRError, ProgramFormatError, RecipeError
from hcqr_dspy.evaluation.folders import out_folder_fault
from hcqr_dspy.evaluation.records import write_probe
from hcqr_dspy.lm import build_lm, parse_lm_spec
from hcqr_dspy.optimize.catalog import entry
from hcqr_dspy.optimize.demo_counts import count_saved_program
from hcqr_dspy.optimize.recipe_compile import check_recipe_for, split_train
from hcqr_dspy.optimize.recipes import Recipe, load_recipe
from hcqr_dspy.optimize.saved import META_FILE, STATE_FILE, question_keys, read_meta, refuse_overlap
from hcqr_dspy.programs import PROGRAMS, make_program, refuse_bound
from hcqr_dspy.workflows.specs import dataset_name, open_index


@dataclass
class CompileSpec:
    """Everything ``hcqr compile`` needs (recorded with the saved program).

    Attributes:
        recipe: Recipe name or path (see :func:`~hcqr_dspy.optimize.recipes.load_recipe`).
        method: Registered method to compile (``hcqr``).
        train: MIRAGE-format file of training/validation questions.
        index: Index folder the program retrieves from while compiling.
        out: Folder of the saved program (with several seeds: the folder of their ``seed-<N>/`` folders).
        lm: ``--lm`` spec of the task LM.
        reflection_lm: GEPA's reflection LM spec (overrides the recipe's).
        reflection_api_base / reflection_api_key_env: Its endpoint and key
            variable (not inherited from the task LM: the two are often
            different services).
        train_size / val_size: Override the recipe's sizes.
        holdout: Evaluation files that must not share a question (id within
            the same dataset, or text) with the training questions.
        program_options: Method options (``budget``, ``k_per_query`` ...).
        max_tokens / n_ctx / api_base / api_key_env: LM settings, as for ``hcqr eval``.
        register / alias: Model Registry name and alias of the compiled program.
        seed: The compile's seed, instead of the recipe's ``seed`` (or ``seeds``).
        name: The program's name in the Prompt Registry and the logged model's (default: ``out``'s folder name).
        replace: Compile over a finished saved program in ``out`` (refused otherwise; one compile only).
    """

    recipe: str
    method: str
    train: str
    index: str | None
    out: str
    lm: str = "local"
    reflection_lm: str | None = None
    reflection_api_base: str | None = None
    reflection_api_key_env: str | None = None
    train_size: int | None = None
    val_size: int | None = None
    holdout: list[str] = field(default_factory=list)
    program_options: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 1024
    n_ctx: int = 8192
    api_base: str | None = None
    api_key_env: str | None = None
    register: str | None = None
    alias: str | None = None
    seed: int | None = None
    name: str | None = None
    replace: bool = False


@dataclass
class CompileInputs:
    """A checked compile request: the recipe (its ``seed`` the one compiled), the questions, the student and LMs,
    and the ``meta.json`` record of the saved program (without what the compile adds)."""

    recipe: Recipe
    lm_cfg: Any
    out: Path
    train_name: str
    trainset: list[dspy.Example]
    valset: list[dspy.Example]
    index_info: dict[str, Any] | None
    student: Any
    lm: Any
    reflection_lm: Any
    meta: dict[str, Any]


def probe_writable(folder: Path) -> None:
    """Check that ``folder`` can be created and written, leaving nothing behind that was not there.

    Raises:
        HCQRError: it cannot be created or written (a read-only or full disk, ``/proc`` ...).
    """
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        write_probe(folder)
    except OSError as exc:
        raise HCQRError(f"--out {folder} is not writable: {exc.strerror or exc}; choose another --out") from None
    finally:
        for p in missing:  # deepest first
            try:
                p.rmdir()
            except OSError:
                pass


def finished_program(folder: Path) -> dict[str, Any] | None:
    """``meta.json`` of the complete saved program in ``folder`` (:func:`~hcqr_dspy.optimize.saved.read_meta`
    accepts it and its ``program.json`` loads into its method); ``None`` when there is none, or only the part of
    one that an interrupted save left (a compile saves over that).

    Raises:
        ProgramFormatError: a ``meta.json`` malformed in itself beside a ``program.json``, which no interrupted save
            leaves (:func:`refuse_malformed_meta`): never saved over.
    """
    if not (folder / META_FILE).is_file():
        return None
    try:
        meta = read_meta(folder)
        count_saved_program(folder)
    except ProgramFormatError:
        if (folder / STATE_FILE).is_file():
            refuse_malformed_meta(folder)
        return None
    return meta


def refuse_malformed_meta(folder: Path) -> None:
    """Refuse a ``meta.json`` malformed in itself (not JSON, another format, ill-typed fields), whatever its
    ``program.json`` holds: no interrupted save leaves one (``meta.json`` is replaced atomically, after
    ``program.json``), so a compile must not save over it.

    Raises:
        ProgramFormatError: as :func:`~hcqr_dspy.optimize.saved.read_meta` for the record, with what to do.
    """
    try:
        read_meta(folder, check_state=False)
    except ProgramFormatError as exc:
        raise ProgramFormatError(
            f"{exc}; {folder / META_FILE} was not left so by an interrupted save: repair it, or remove {folder} to "
            "compile it again"
        ) from None


def check_out(out: Path, replace: bool = False) -> None:
    """Refuse an ``--out`` that one compile cannot write: a file, a folder holding anything but a saved program
    (another tool's records named: :func:`~hcqr_dspy.evaluation.folders.out_folder_fault`), or a finished saved
    program (:func:`finished_program`) unless ``replace``.

    Raises:
        ProgramFormatError: one line naming the folder, what it holds and what to do.
    """
    if out.is_dir() and (fault := out_folder_fault(out, "program")):
        raise ProgramFormatError(fault)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / META_FILE).is_file())):
        raise ProgramFormatError(f"{out} exists and is not a saved program folder; choose another --out")
    if not replace and (meta := finished_program(out)):
        recipe = meta["recipe"] or {}
        raise ProgramFormatError(
            f"--out {out} holds a finished saved program ({META_FILE}, {STATE_FILE}: {meta['method']}, recipe "
            f"{recipe.get('name')}, seed {recipe.get('seed')}, saved {meta['created']}); give --replace to compile "
            "over it, or choose another --out"
        )


def check_registry_names(register: str, alias: str | None, option: str = "--register") -> None:
    """Refuse a registered model name or alias the Model Registry would refuse, before any LM call (MLflow's own
    rules: ``mlflow.utils.validation``; a name without ``/`` or ``:``, an alias of letters, digits, ``_`` and ``-``
    that is neither ``latest`` nor ``v<number>``).

    Raises:
        HCQRError: the name or the alias, and why.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation

    checks = [(option, register, validation._validate_model_name)]
    if alias is not None:
        checks += [
            ("--alias", alias, validation._validate_model_alias_name),
            ("--alias", alias, validation._validate_model_alias_name_reserved),
        ]
    for option, value, check in checks:
        try:
            check(value)
        except MlflowException as exc:
            raise HCQRError(f"{option} {value!r}: {exc.message.splitlines()[0]}") from None


def seeded(recipe: Recipe, seed: int) -> Recipe:
    """``recipe`` compiling seed ``seed`` alone (what ``meta.json`` records as its ``recipe``)."""
    return recipe.model_copy(update={"seed": seed, "seeds": None})


def check_request(spec: CompileSpec, track: bool, reflection_lm=None) -> Recipe:
    """The checks that need no file but the recipe, nor an LM: the recipe (:func:`load_recipe`, its seed replaced
    by ``spec.seed`` when given), ``--alias`` and ``--register``, the method, the LM specs and the reflection LM
    a recipe needs (``reflection_lm``: a ready one given instead).

    Returns:
        The recipe, its ``seed`` the one to compile (``seeds`` left as the recipe gives them when ``spec.seed`` is
        ``None``).

    Raises:
        RecipeError, HCQRError: one line naming the value.
    """
    recipe = load_recipe(spec.recipe)
    if spec.seed is not None:
        recipe = seeded(recipe, spec.seed)
    if spec.alias and not spec.register:
        raise HCQRError("--alias needs --register NAME")
    if spec.register and not track:
        raise HCQRError("--register needs MLflow tracking (drop --no-mlflow)")
    if spec.register is not None:
        check_registry_names(spec.register, spec.alias)
    if spec.method not in PROGRAMS:
        raise HCQRError(f"unknown method {spec.method!r}; choose one of {', '.join(PROGRAMS)}")
    refuse_bound(spec.method, "hcqr compile")
    parse_lm_spec(spec.lm, api_base=spec.api_base, api_key_env=spec.api_key_env)
    reflection_spec = spec.reflection_lm or recipe.reflection_lm
    if entry(recipe.optimizer).reflection_lm:
        if reflection_lm is None and not reflection_spec:
            raise RecipeError(
                f"recipe {recipe.name!r} ({recipe.optimizer}) needs a reflection LM: give --reflection-lm or set "
                "reflection_lm in the recipe"
            )
        if reflection_spec:
            parse_lm_spec(
                reflection_spec,
                api_base=spec.reflection_api_base,
                api_key_env=spec.reflection_api_key_env,
                option="--reflection-lm",
            )
    return recipe


def draw_questions(spec: CompileSpec, recipe: Recipe, examples: list[dspy.Example] | None = None):
    """The training and validation questions ``recipe``'s seed draws from ``spec.train``, checked against every
    ``--holdout`` file.

    Args:
        examples: The train file's questions, when already read.

    Returns:
        ``(train_name, trainset, valset, keys)``: the dataset's name, the two samples and their
        :func:`~hcqr_dspy.optimize.saved.question_keys`.

    Raises:
        DataError, RecipeError, HCQRError: an unreadable train file, too few questions, an overlap.
    """
    train_name = dataset_name(spec.train)
    examples = load_questions(spec.train) if examples is None else examples
    trainset, valset = split_train(examples, recipe, spec.train_size, spec.val_size)
    keys = question_keys(trainset + valset, train_name)
    for file in spec.holdout:
        refuse_overlap(keys, load_questions(file), dataset_name(file), f"compile --holdout {file}")
    return train_name, trainset, valset, keys


def check_inputs(spec: CompileSpec, track: bool = True, lm=None, reflection_lm=None) -> CompileInputs:
    """Check every input of one compile before its first LM call, and build what it runs on.

    Checked: :func:`check_request`; a recipe giving several ``seeds`` with no ``spec.seed`` (that is
    :mod:`hcqr_dspy.workflows.compile_seeds`' job); ``spec.out`` (:func:`check_out`, and writable);
    :func:`draw_questions`; the index; the recipe against the program and the LM
    (:func:`~hcqr_dspy.optimize.recipe_compile.check_recipe_for`). The task LM (and GEPA's reflection LM) are built here
    unless given.

    Raises:
        RecipeError, HCQRError, ProgramFormatError: one line naming the value.
    """
    recipe = check_request(spec, track, reflection_lm)
    if recipe.seeds is not None:
        raise RecipeError(
            f"recipe {recipe.name!r} gives seeds {recipe.seeds}: compile them with --seeds (one program each), or "
            "one of them with --seed N"
        )
    lm_cfg = parse_lm_spec(spec.lm, api_base=spec.api_base, api_key_env=spec.api_key_env)
    reflection_spec = spec.reflection_lm or recipe.reflection_lm
    out = Path(spec.out)
    check_out(out, spec.replace)
    train_name, trainset, valset, keys = draw_questions(spec, recipe)
    retriever, index_info = open_index(spec.method, spec.index)
    student = make_program(spec.method, retriever, **spec.program_options)
    probe_writable(out)  # a compile can run for hours: find an unwritable --out now, not when saving
    lm = lm or build_lm(
        spec.lm, max_tokens=spec.max_tokens, n_ctx=spec.n_ctx, api_base=spec.api_base, api_key_env=spec.api_key_env
    )
    check_recipe_for(recipe, student, lm)  # before the MLflow run: a refused recipe leaves no run behind
    needs_reflection = entry(recipe.optimizer).reflection_lm
    if needs_reflection and reflection_lm is None:
        reflection_lm = build_lm(
            reflection_spec,
            temperature=1.0,
            max_tokens=2048,
            n_ctx=spec.n_ctx,
            api_base=spec.reflection_api_base,
            api_key_env=spec.reflection_api_key_env,
        )
    meta = {
        "optimizer": recipe.optimizer,
        "recipe": recipe.record(),
        "lm": lm_cfg.params(),
        "reflection_lm": reflection_spec if needs_reflection else None,
        "demo_context_tokens": recipe.demo_context_tokens,
        "index": index_info,
        # Every question the optimizer saw (training and validation): what later evaluations are checked against.
        "train": {
            **keys,
            "file": str(Path(spec.train).resolve()) if Path(spec.train).exists() else spec.train,
            "train_count": len(trainset),
            "val_count": len(valset),
        },
    }
    return CompileInputs(
        recipe, lm_cfg, out, train_name, trainset, valset, index_info, student, lm, reflection_lm, meta
    )
