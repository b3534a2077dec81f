"""``hcqr compile --seeds``: replicate compiles of one recipe, one saved program per seed.

A compile is one draw: the seed draws the training questions and their order, and is the optimizer's own seed
where it has one (:mod:`hcqr_dspy.optimize.catalog`). ``--seeds 0,1,2`` (or a recipe's ``seeds: [...]``) compiles
each seed into ``<out>/seed-<N>/``, a saved-program folder whose ``meta.json`` records ``recipe.seed = N``; with
``--register NAME`` each is its own model version tagged ``seed=<N>`` (``--alias A`` becomes ``A-seed-<N>``), and
its stages are versions of the prompts ``NAME.<stage>`` (unregistered: ``<out name>-seed-<N>.<stage>``).

Every input of every seed is checked before the first LM call (:func:`run_compile_seeds`): nothing is written on
bad input. A seed whose compile then fails does not stop the others; the result names it. A seed whose folder
already holds its complete saved program (an interrupted run) is skipped.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hcqr_dspy.data import load_questions
from hcqr_dspy.errors import HCQRError, ProgramFormatError, RecipeError
from hcqr_dspy.evaluation.provenance import session_record
from hcqr_dspy.optimize.catalog import seed_problem
from hcqr_dspy.optimize.demo_counts import count_saved_program
from hcqr_dspy.optimize.saved import META_FILE, read_meta
from hcqr_dspy.workflows.compile import run_compile
from hcqr_dspy.workflows.compile_inputs import (
    CompileSpec,
    check_inputs,
    check_request,
    draw_questions,
    finished_program,
    seeded,
)
from hcqr_dspy.workflows.setup_guard import check_same_compile_setup

SEED_FOLDER = re.compile(r"^seed-(\d+)$")
SEED_LOCK = re.compile(r"^\.seed-\d+\.writer\.lock$")  # run_compile's lock beside a seed's folder


def parse_seeds(text: str, option: str = "--seeds") -> list[int]:
    """Seeds given as ``"0,1,2"``.

    Raises:
        HCQRError: one line naming the value: empty, an item that is not an integer, a negative one, one given
            twice.
    """
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        raise HCQRError(f"{option} {text!r} names no seed; give integers >= 0 separated by commas, e.g. 0,1,2")
    seeds = []
    for item in items:
        if not re.fullmatch(r"[+-]?\d+", item):
            raise HCQRError(f"{option} {text!r}: {item!r} is not an integer; give integers >= 0, e.g. 0,1,2")
        seeds.append(int(item))
    return check_seeds(seeds, option)


def check_seeds(seeds: list[int], option: str = "--seeds") -> list[int]:
    """Refuse an empty list, a seed that is not an integer >= 0, or one given twice (one line naming it).

    Raises:
        HCQRError: as above.
    """
    if not seeds:
        raise HCQRError(f"{option} names no seed; give integers >= 0, e.g. 0,1,2")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise HCQRError(f"{option}: seed {seed!r} is not an integer >= 0")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise HCQRError(f"{option}: seed {', '.join(map(str, repeated))} given more than once")
    return list(seeds)


def recipe_seeds(spec: CompileSpec) -> list[int] | None:
    """The ``seeds`` of ``spec``'s recipe (``None`` when it gives one ``seed``; ``spec.seed`` overrides both).

    Raises:
        RecipeError: see :func:`~hcqr_dspy.optimize.recipes.load_recipe`.
    """
    from hcqr_dspy.optimize.recipes import load_recipe

    return None if spec.seed is not None else load_recipe(spec.recipe).seeds


def seed_spec(spec: CompileSpec, seed: int) -> CompileSpec:
    """The compile of one seed: into ``<out>/seed-<N>``, alias ``<alias>-seed-<N>``, named ``<out name>-seed-<N>``."""
    root = Path(spec.out)
    return replace(
        spec,
        out=str(root / f"seed-{seed}"),
        seed=seed,
        alias=f"{spec.alias}-seed-{seed}" if spec.alias else None,
        name=f"{root.name}-seed-{seed}",
    )


def check_root(root: Path) -> None:
    """Refuse an ``--out`` for several seeds that is not a folder of ``seed-<N>/`` folders (missing or empty is fine).

    Raises:
        ProgramFormatError: a file, a saved program folder, or a folder holding anything else.
    """
    if not root.exists():
        return
    if not root.is_dir():
        raise ProgramFormatError(f"--out {root} is a file; --seeds writes a folder of seed-<N>/ folders")
    if (root / META_FILE).exists():
        raise ProgramFormatError(
            f"--out {root} holds a saved program; --seeds writes seed-<N>/ folders into a folder of their own"
        )
    other = sorted(p.name for p in root.iterdir() if not (SEED_FOLDER.match(p.name) and p.is_dir()))
    other = [name for name in other if not SEED_LOCK.match(name)]
    if other:
        shown = ", ".join(other[:5]) + (" ..." if len(other) > 5 else "")
        raise ProgramFormatError(
            f"--out {root} holds other things than seed-<N>/ folders ({shown}); choose another --out"
        )


def saved_seed(folder: Path, spec: CompileSpec, recipe, seed: int, train_ids: list[str]) -> bool:
    """Whether ``folder`` holds this seed's complete saved program (``meta.json`` and a ``program.json`` that
    :func:`~hcqr_dspy.optimize.saved.load_program` accepts): then it is skipped. ``False`` when it is missing,
    empty, or holds a ``meta.json`` whose program does not load (a save interrupted while replacing it): the seed
    is compiled again, over it.

    Raises:
        ProgramFormatError: it holds another program (method, recipe, seed or training questions differ), or
            files but no ``meta.json``.
    """
    if not folder.exists() or not any(folder.iterdir()):
        return False
    if not (folder / META_FILE).is_file():
        raise ProgramFormatError(
            f"{folder} holds files but no {META_FILE} (not a saved program, or a save interrupted before it was "
            f"written): remove it to compile seed {seed} again, or choose another --out"
        )
    meta = finished_program(folder)
    if meta is None:
        return False  # an interrupted save: meta.json of an earlier attempt; the compile saves over it
    have = (
        meta["method"],
        (meta["recipe"] or {}).get("name"),
        (meta["recipe"] or {}).get("seed"),
        (meta["train"] or {}).get("ids"),
    )
    want = (spec.method, recipe.name, seed, train_ids)
    if have != want:
        raise ProgramFormatError(
            f"{folder} holds another compile (method, recipe, seed, training questions: {have[0]}, {have[1]}, "
            f"{have[2]}, {len(have[3] or [])} questions) than seed {seed} of this one ({want[0]}, {want[1]}, "
            f"{seed}, {len(train_ids)} questions); choose another --out"
        )
    return True


def run_compile_seeds(
    spec: CompileSpec,
    seeds: list[int] | None = None,
    mlflow_dir=None,
    track: bool = True,
    lm=None,
    reflection_lm=None,
    report: Callable[[str], None] | None = None,
    strict_setup: bool = False,
) -> dict[str, Any]:
    """Compile ``spec`` once per seed, each into ``<spec.out>/seed-<N>/`` (:func:`seed_spec`,
    :func:`~hcqr_dspy.workflows.compile.run_compile`).

    Checked before the first LM call, nothing written when refused: the seeds (:func:`check_seeds`); ``spec.seed``
    and ``spec.replace`` unset; the recipe and the request
    (:func:`~hcqr_dspy.workflows.compile_inputs.check_request`, for every seed's alias too); a recipe whose
    optimizer no seed can change (:func:`~hcqr_dspy.optimize.catalog.seed_problem`);
    ``spec.out`` (:func:`check_root`); each seed's training questions and holdout overlap
    (:func:`~hcqr_dspy.workflows.compile_inputs.draw_questions`) and folder (:func:`saved_seed`); and every other
    input, with the LMs built once for all seeds (:func:`~hcqr_dspy.workflows.compile_inputs.check_inputs`).

    Args:
        seeds: The seeds (default: the recipe's ``seeds``).
        report: Called with one line as each seed is skipped, starts, or fails.
        strict_setup: With seeds left to compile, refuse (before the first LM call of a compile, nothing written)
            to compile them on another setup than every seed saved in ``spec.out`` recorded, asked for now or not
            (:func:`hcqr_dspy.workflows.setup_guard.check_same_compile_setup`): one arm's seeds on one setup.
        mlflow_dir, track, lm, reflection_lm: As for :func:`~hcqr_dspy.workflows.compile.run_compile`.

    Returns:
        ``{"out", "seeds": [{"seed", "out", "status": "compiled" | "skipped" | "failed", "result" (the compile's
        summary, or for a skipped seed ``{"predictors": demo counts, "bootstrap_shortfall"}`` from its folder),
        "error" (one line, failed seeds)}], "failed": [seeds]}``.

    Raises:
        HCQRError, RecipeError, ProgramFormatError: bad input, as above (one line naming the value).
        SetupMismatchError: with ``strict_setup``, this session's setup is not the saved seeds'.
    """
    say = report or (lambda line: None)
    if spec.seed is not None:
        raise HCQRError(f"give either --seed {spec.seed} or --seeds, not both")
    if spec.replace:
        raise HCQRError("--replace applies to one compile; --seeds skips the seeds saved already")
    recipe = check_request(spec, track, reflection_lm)
    if seeds is None and recipe.seeds is None:
        raise RecipeError(f"recipe {recipe.name!r} gives one seed, not seeds: give --seeds")
    seeds = check_seeds(list(recipe.seeds) if seeds is None else list(seeds))
    examples = load_questions(spec.train)
    problem = seed_problem(recipe.optimizer, recipe.settings, recipe.compile, len(examples))
    if problem:
        raise RecipeError(f"recipe {recipe.name!r}: {problem}; compile one seed (--seed N)")
    root = Path(spec.out)
    check_root(root)
    todo, skipped = [], {}
    for seed in seeds:
        one = seed_spec(spec, seed)
        check_request(one, track, reflection_lm)  # its alias
        keys = draw_questions(one, seeded(recipe, seed), examples)[3]
        if saved_seed(Path(one.out), spec, recipe, seed, keys["ids"]):
            skipped[seed] = one.out
        else:
            todo.append(one)
    if todo:  # every other input, once; the LMs built here serve every seed
        checked = check_inputs(todo[0], track, lm, reflection_lm)
        lm, reflection_lm = checked.lm, checked.reflection_lm
        # the seeds left, compiled now, beside every seed saved in the folder (asked for now or not): one setup
        saved = [f for f in sorted(root.glob("seed-*")) if f.is_dir() and finished_program(f)] if strict_setup else []
        if saved:
            check_same_compile_setup(session_record("compile", lm), saved)
    results = []
    for seed in seeds:
        if seed in skipped:
            say(f"seed {seed}: {skipped[seed]} holds its complete saved program; skipped")
            meta = read_meta(skipped[seed])
            counts = count_saved_program(skipped[seed])
            result = {"predictors": counts, "bootstrap_shortfall": meta.get("bootstrap_shortfall")}
            results.append({"seed": seed, "out": skipped[seed], "status": "skipped", "result": result, "error": None})
            continue
        one = next(s for s in todo if s.seed == seed)
        say(f"seed {seed}: compiling into {one.out}")
        try:
            result = run_compile(one, mlflow_dir=mlflow_dir, track=track, lm=lm, reflection_lm=reflection_lm)
        except Exception as exc:  # one seed's failure keeps the others; the result names it
            error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            if not isinstance(exc, HCQRError):  # not an outage or bad input: where it happened is said in full
                say(traceback.format_exc().rstrip())
            say(f"seed {seed} failed: {error}")
            results.append({"seed": seed, "out": one.out, "status": "failed", "result": None, "error": error})
            continue
        results.append({"seed": seed, "out": one.out, "status": "compiled", "result": result, "error": None})
    return {"out": str(root), "seeds": results, "failed": [r["seed"] for r in results if r["status"] == "failed"]}
