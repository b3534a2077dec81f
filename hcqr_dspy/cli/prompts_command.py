"""``hcqr prompts``: a compiled program's prompts in the MLflow Prompt Registry: their versions, one version, or
the diff of two versions of one stage (``zero-shot``: the uncompiled program's).

Its command imports MLflow when it runs, so that ``hcqr --help`` loads none.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hcqr_dspy.errors import HCQRError


def cmd_prompts(args: argparse.Namespace) -> int:
    from hcqr_dspy.tracking.prompt_views import prompt_diff, prompt_text, prompt_versions
    from hcqr_dspy.tracking.prompts import move_alias
    from hcqr_dspy.tracking.store import browse_store, open_store

    # read-only (an archived study) unless an alias is moved; a locked or malformed store is refused in one line
    browse_store(args.mlflow_dir, "run `hcqr compile` or `hcqr register`")
    if args.alias is not None:
        if args.old is None or args.new is not None:
            raise HCQRError("--alias ALIAS takes the model version: hcqr prompts MODEL VERSION --alias ALIAS")
        open_store(args.mlflow_dir)
        for uri in move_alias(args.name, args.alias, args.old):
            print(f"{uri} @{args.alias}")
        print(f"models:/{args.name}/{args.old} @{args.alias}")
        return 0
    if args.old is None:
        for line in prompt_versions(args.name):
            print(line)
        return 0
    if args.new is None:
        print(prompt_text(args.name, args.old))
        return 0
    diff = prompt_diff(args.name, args.old, args.new)
    print(diff or f"{args.name}: versions {args.old} and {args.new} are the same")
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``prompts`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command(
        "prompts",
        help="list the versions of a compiled stage's prompt (NAME: <program>.<stage>, e.g. hcqr-medqa.answer), "
        "print one, show the diff of two of them (zero-shot: the uncompiled program's), or move a registered "
        "model's alias with its prompts' "
        "(hcqr prompts MODEL VERSION --alias ALIAS)",
    )
    p.add_argument("name", help="prompt name, <program>.<stage> (`hcqr compile` prints them)")
    p.add_argument(
        "old",
        nargs="?",
        default=None,
        help="a version number or alias (zero-shot: the uncompiled program's); alone, that version is printed",
    )
    p.add_argument("new", nargs="?", default=None, help="a version number or alias, diffed against OLD")
    p.add_argument(
        "--alias",
        default=None,
        help="give registered model NAME's version OLD this alias, and the same alias to the prompt versions "
        "compiled with it (default: none)",
    )
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.set_defaults(func=cmd_prompts)
