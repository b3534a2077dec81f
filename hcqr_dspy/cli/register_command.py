"""``hcqr register``: register a saved program folder (e.g. one committed with a study) in this MLflow store's
Model Registry, with its stages' prompts, without compiling it again.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` loads no DSPy or MLflow.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

from hcqr_dspy.cli.common import add_endpoint_args, positive_int, tracking_store, ui_hint


def cmd_register(args: argparse.Namespace) -> int:
    from hcqr_dspy.workflows.register import register_saved_program

    out = register_saved_program(
        args.folder,
        args.name,
        alias=args.alias,
        index=args.index,
        no_index=args.no_index,
        lm=args.lm,
        max_tokens=args.max_tokens,
        n_ctx=args.n_ctx,
        api_base=args.api_base,
        api_key_env=args.api_key_env,
        mlflow_dir=args.mlflow_dir,
    )
    if out["note"]:
        print(out["note"])
    meta = out["meta"]
    recipe = (meta.get("recipe") or {}).get("name") or "none"
    uri = f"models:/{args.name}@{args.alias}" if args.alias else out["registered"]
    print(
        f"registered {args.folder} ({meta['method']}, recipe {recipe}) as {out['registered']}"
        + (f" (alias {args.alias})" if args.alias else "")
        + f", serving with index {out['index'] or 'none (give --index where it runs)'}"
        + (" (bundled in the model)" if out["bundled"] else "")
    )
    print("prompts in MLflow's Prompt Registry: " + ", ".join(out["prompts"]))
    last, version = out["prompts"][-1].removeprefix("prompts:/").rsplit("/", 1)
    store = f" --mlflow-dir {shlex.quote(args.mlflow_dir)}" if args.mlflow_dir else ""
    print(f"what compiling changed in a stage: hcqr prompts {last} zero-shot {args.alias or version}{store}")
    print(
        f"MLflow run {out['run_id']} in {tracking_store(args)} (view with {ui_hint(args)}); run it with "
        f"`hcqr eval --program {shlex.quote(uri)}`"
    )
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``register`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command(
        "register",
        help="register a saved program folder (from `hcqr compile`) in the MLflow Model Registry, with its prompts",
    )
    p.add_argument("folder", help="saved-program folder (program.json + meta.json), e.g. experiments/programs/hcqr-bfs")
    p.add_argument("--name", required=True, help="registered model name; the stages' prompts are <name>.<stage>")
    p.add_argument(
        "--alias", default=None, help="alias of the new version and its prompts, e.g. champion (default: none)"
    )
    p.add_argument(
        "--index",
        default=None,
        help="index folder the model serves with (default: the one recorded in meta.json, which must exist)",
    )
    p.add_argument("--no-index", action="store_true", help="register without an index (give --index where it runs)")
    p.add_argument("--lm", default=None, help="LM spec the model answers with (default: the one it was compiled with)")
    add_endpoint_args(p)
    p.add_argument("--max-tokens", type=positive_int, default=1024, help="output tokens per LM call")
    p.add_argument(
        "--n-ctx",
        type=positive_int,
        default=8192,
        help="context window of local models (at most the one the model was trained with)",
    )
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.set_defaults(func=cmd_register)
