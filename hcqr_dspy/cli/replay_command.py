"""``hcqr replay``: search run folders' recorded queries again with another index, no LM call
(:mod:`hcqr_dspy.workflows.replay`), and report recorded against replayed contexts.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy or torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from hcqr_dspy.cli.common import add_dataset_move_arg, move_datasets, positive_int, report_moves, undo_moves
from hcqr_dspy.errors import HCQRError

NEAR_DUPLICATE_JACCARD = 0.6  # the default of hcqr_dspy.reporting.query_diversity, without importing it here


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def cmd_replay(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy and the retrievers take seconds, `hcqr --help` none
    from hcqr_dspy.workflows.replay import replay, replay_faults

    moves = move_datasets(args.runs, args.dataset)
    try:
        faults = replay_faults(args.runs, args.index, args.out)
    except HCQRError:
        undo_moves(moves)
        raise
    if faults:  # every fault, one line each, before anything is loaded; a refused command moves no dataset
        undo_moves(moves)
        for fault in faults:
            print(f"hcqr: error: {fault}", file=sys.stderr)
        return 2
    report_moves(moves)
    report, _, files = replay(
        args.runs, args.index, out_dir=args.out, budget=args.budget, threshold=args.near_duplicate
    )
    if files:
        print(f"written: {', '.join(str(f) for f in files)}")
    else:
        print(report, end="")
    return 0


HELP = "search runs' recorded queries again with another index (no LM call) and compare the contexts"
DESCRIPTION = (
    "Search each run folder's recorded queries again with another index of the same corpus "
    "(BM25, dense, hybrid, any backend), with the run's fusion and budget and no LM call, and report, per "
    "run, gold-option coverage and distinct passages of the recorded and the replayed contexts side by "
    "side, near-duplicate query pairs per question and words per query."
)


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``replay`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("replay", help=HELP, description=DESCRIPTION)
    p.add_argument("runs", nargs="+", help="run folders of query-planning methods (from `hcqr eval`)")
    p.add_argument(
        "--near-duplicate",
        type=_share,
        default=NEAR_DUPLICATE_JACCARD,
        metavar="JACCARD",
        help="two queries of a question are near-duplicates when their stemmed content-word sets have at least "
        "this Jaccard coefficient",
    )
    p.add_argument("--index", required=True, help="index folder to search, over the runs' corpus")
    p.add_argument("--out", default=None, help="folder for replay.md and replay.json (default: print the report)")
    p.add_argument("--budget", type=positive_int, default=None, help="passages per context (default: each run's)")
    add_dataset_move_arg(p)
    p.set_defaults(func=cmd_replay)
