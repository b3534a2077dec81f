"""``hcqr compile``: optimize a program's prompts with a DSPy optimizer recipe, save it and optionally register it.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Callable

from hcqr_dspy.cli.common import (
    FUSION_STRATEGIES,
    add_endpoint_args,
    add_lm_args,
    add_mlflow_args,
    non_negative_int,
    parsed_program_options,
    positive_int,
    tracking_store,
    ui_hint,
)
from hcqr_dspy.cli.method_names import method_names

log = logging.getLogger(__name__)


def cmd_compile(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy and the optimizers take seconds, `hcqr --help` none
    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.programs.method_registry import PROGRAMS
    from hcqr_dspy.workflows.compile import CompileSpec, run_compile
    from hcqr_dspy.workflows.compile_seeds import parse_seeds, recipe_seeds, run_compile_seeds
    from hcqr_dspy.workflows.specs import check_program_options

    if args.seeds is not None and args.seed is not None:
        raise HCQRError(f"give either --seed {args.seed} or --seeds {args.seeds}, not both")
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    if args.strict_setup and args.seeds is None:
        raise HCQRError("--strict-setup applies to --seeds: it checks the seeds left against the seeds saved")
    options = parsed_program_options(args)
    if args.program in PROGRAMS:
        check_program_options(args.program, options)
    spec = CompileSpec(
        recipe=args.recipe,
        method=args.program,
        train=args.train,
        index=args.index,
        out=args.out,
        lm=args.lm,
        reflection_lm=args.reflection_lm,
        reflection_api_base=args.reflection_api_base,
        reflection_api_key_env=args.reflection_api_key_env,
        train_size=args.train_size,
        val_size=args.val_size,
        holdout=list(args.holdout or []),
        program_options=options,
        max_tokens=args.max_tokens,
        n_ctx=args.n_ctx,
        api_base=args.api_base,
        api_key_env=args.api_key_env,
        register=args.register,
        alias=args.alias,
        seed=args.seed,
        replace=args.replace,
    )
    if seeds is None and recipe_seeds(spec) is None:
        out = run_compile(spec, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow)
        print_compile(args, out)
        return 0
    done = run_compile_seeds(
        spec, seeds, mlflow_dir=args.mlflow_dir, track=not args.no_mlflow, report=print, strict_setup=args.strict_setup
    )
    for item in done["seeds"]:
        if item["status"] == "compiled":
            print_compile(args, item["result"], alias=f"{args.alias}-seed-{item['seed']}" if args.alias else None)
    print(f"compile summary of {len(done['seeds'])} seed(s) in {done['out']}:")
    for item in done["seeds"]:
        result = item["result"] or {}
        counts = ", ".join(f"{name} {demo_counts(c)}" for name, c in (result.get("predictors") or {}).items())
        short = result.get("bootstrap_shortfall")
        short = f" (bootstrapped {short['bootstrapped']} of {short['asked']} traces asked)" if short else ""
        print(f"  seed {item['seed']}: {item['status']}, {item['out']}" + (f": {counts}" if counts else "") + short)
    if done["failed"]:
        failed = ", ".join(str(s) for s in done["failed"])
        errors = "; ".join(f"seed {i['seed']}: {i['error']}" for i in done["seeds"] if i["status"] == "failed")
        print(
            f"hcqr: error: seed(s) {failed} failed ({errors}); the other seeds are saved: run the same command "
            "again to compile the failed ones (saved seeds are skipped)",
            file=sys.stderr,
        )
        return 1
    return 0


def demo_counts(c: dict) -> str:
    """A stage's demos as its prompt shows them: ``2 demos (1 bootstrapped, 1 labelled)``."""
    text = f"{c['rendered']} demos ({c['bootstrapped']} bootstrapped, {c['labelled']} labelled)"
    return text + (f", {c['saved'] - c['rendered']} saved but never shown" if c["saved"] > c["rendered"] else "")


def print_compile(args: argparse.Namespace, out: dict, alias: str | None = None) -> None:
    """The lines that report one compile: its folder, demos as shown, cost, score, MLflow run, prompts and model
    version; a warning line on stderr when it bootstrapped fewer traces than asked."""
    from hcqr_dspy.optimize.demo_counts import shortfall_warning
    from hcqr_dspy.tracking.serving import SERVE_TIMEOUT_S

    alias = args.alias if alias is None else alias
    print(
        f"saved compiled {args.program} (seed {out['seed']}) to {out['out']} ({out['train']} training + "
        f"{out['val']} validation questions)"
    )
    for name, info in out["predictors"].items():
        changed = "changed" if info["instructions_changed"] else "unchanged"
        print(f"  {name}: {demo_counts(info)} in its prompt, instructions {changed}")
    if out["bootstrap_shortfall"]:
        log.warning(shortfall_warning(out["bootstrap_shortfall"], out["optimizer"], out["seed"]))
    c = out["compile_cost"]
    print(
        f"  compile cost: {c['lm_calls']} LM calls (+{c['cached_lm_calls']} from the cache), "
        f"{c['prompt_tokens']} prompt + {c['completion_tokens']} completion tokens, {c['seconds']:.0f} s"
        + (f" (some task waited for a CPU {c['cpu_pressure']:.0%} of that time)" if "cpu_pressure" in c else "")
    )
    if out["scores"].get("val_score") is not None:
        print(f"  the optimizer's validation score: {out['scores']['val_score']:.1%}")
    if out["scores"].get("train_score") is not None:
        print(f"  the optimizer's score on its training questions: {out['scores']['train_score']:.1%}")
    if out["mlflow_run_id"]:
        print(
            f"MLflow run {out['mlflow_run_id']} in {tracking_store(args)} (view with {ui_hint(args)}); run it with "
            f"`hcqr eval --program {shlex.quote(out['out'])}` or --program runs:/{out['mlflow_run_id']}"
        )
    if out["prompts"]:
        print(
            "prompts in MLflow's Prompt Registry: " + ", ".join(out["prompts"]) + " (`hcqr prompts NAME` lists "
            "a stage's versions, `hcqr prompts NAME OLD NEW` shows what changed)"
        )
    if out["registered"]:
        uri = shlex.quote(f"models:/{args.register}@{alias}" if alias else out["registered"])
        print(
            f"registered as {out['registered']}"
            + (f" (alias {alias})" if alias else "")
            + f": `hcqr eval --program {uri}`, `hcqr predict --program {uri}`, or serve it with\n"
            f"  MLFLOW_TRACKING_URI={shlex.quote(tracking_store(args))} mlflow models serve -m {uri} "
            f"--env-manager local -h 127.0.0.1 -p 5001 -t {SERVE_TIMEOUT_S}\n"
            "  (-t: seconds a request may take; MLflow's default, 60, is shorter than one question "
            "with a local model on a CPU)"
        )


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``compile`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("compile", help="optimize a program's prompts with a DSPy optimizer recipe and save it")
    p.add_argument(
        "--recipe",
        required=True,
        help="recipe file, or the name of one in ./optimizers/ or shipped (bootstrap_fewshot, mipro_light ...)",
    )
    p.add_argument(
        "--program",
        default="hcqr",
        metavar="METHOD",
        help=f"method to compile, one of: {', '.join(method_names())} (default: hcqr)",
    )
    p.add_argument("--train", required=True, help="MIRAGE-format file of training questions (e.g. medmcqa.json)")
    p.add_argument("--train-size", type=positive_int, default=None, help="training questions (default: the recipe's)")
    p.add_argument(
        "--val-size", type=non_negative_int, default=None, help="validation questions (default: the recipe's)"
    )
    p.add_argument(
        "--holdout",
        action="append",
        default=None,
        help="an evaluation file that must not share questions with the training set, repeated (default: none)",
    )
    p.add_argument("--index", default=None, help="index folder (default: none, needed by retrieval methods)")
    p.add_argument("--budget", type=positive_int, default=None, help="passages shown (default: the method's, 15)")
    p.add_argument(
        "--k-per-query",
        type=positive_int,
        default=None,
        help="passages per query, HCQR and its ablations (default: ceil(budget / queries))",
    )
    p.add_argument("--fusion", choices=FUSION_STRATEGIES, default=None, help="multi-query fusion (default: score_sum)")
    p.add_argument(
        "--out",
        required=True,
        help="folder of the saved program (e.g. programs/hcqr-bfs); with --seeds, the folder of its seed-N/ folders",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="compile over the finished saved program in --out (refused without it; not with --seeds, which skips "
        "the seeds saved already)",
    )
    p.add_argument(
        "--register",
        default=None,
        metavar="NAME",
        help="register the compiled program in the MLflow Model Registry as NAME (a new version; with --seeds one "
        "version per seed, tagged seed=N; then --program models:/NAME/VERSION; default: not registered)",
    )
    p.add_argument(
        "--alias",
        default=None,
        help="alias of the registered version, e.g. champion (--program models:/NAME@ALIAS; with --seeds each "
        "seed's version gets ALIAS-seed-N; default: none)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=None,
        help="the compile's seed: it draws and orders the training questions and seeds the optimizer where it has "
        "a seed (default: the recipe's seed)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="N,N,...",
        help="replicate compiles: one per seed (e.g. 0,1,2,3), each saved in OUT/seed-N/, registered (--register) "
        "as its own version tagged seed=N; seeds already saved there are skipped, a failed seed does not stop the "
        "others (default: the recipe's seeds, else one compile)",
    )
    p.add_argument(
        "--strict-setup",
        action="store_true",
        help="with --seeds: refuse (before any LM call of a compile, nothing written) to compile the seeds left on "
        "another setup than the seeds saved in OUT recorded (meta.json's compile_setup: model file, llama.cpp build "
        "and CPU features, engine settings, library versions), so one arm's seeds share one setup",
    )
    p.add_argument("--reflection-lm", default=None, help="GEPA's reflection LM spec (default: the recipe's)")
    add_endpoint_args(p, prefix="reflection-", who="the reflection LM")
    add_mlflow_args(p)
    add_lm_args(p)
    p.set_defaults(func=cmd_compile)
