"""``hcqr rescore``: add the answer step's letter distribution to finished run folders (no generation)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from hcqr_dspy.cli.common import add_dataset_move_arg, move_datasets, positive_int, report_moves
from hcqr_dspy.lm import parse_lm_spec


def cmd_rescore(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy and llama.cpp take seconds, `hcqr --help` none
    from hcqr_dspy.errors import RunError
    from hcqr_dspy.evaluation.folders import repeated_folder
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.workflows.rescore import rescore_run

    if args.lm is not None:
        parse_lm_spec(args.lm)
    seen: dict = {}
    for run_dir in args.runs:  # every folder opened before any model is loaded
        twice = repeated_folder(run_dir, seen)
        if twice:
            raise RunError(f"{twice}; rescore each run once")
        RunFolder.open(run_dir)
    report_moves(move_datasets(args.runs, args.dataset))
    for run_dir in args.runs:
        print(json.dumps(rescore_run(run_dir, lm_spec=args.lm, index=args.index, n_ctx=args.n_ctx)))
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``rescore`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command(
        "rescore",
        help="add the answer step's probability of each option (and of the gold one) to run folders, "
        "teacher-forced from the recorded reasoning: one prefill a question, nothing generated",
    )
    p.add_argument("runs", nargs="+", help="run folders (from `hcqr eval`)")
    p.add_argument("--lm", default=None, help="scoring LM, local or gguf: (default: the run's own LM)")
    p.add_argument("--index", default=None, help="index folder resolving the shown passages (default: the run's)")
    p.add_argument("--n-ctx", type=positive_int, default=None, help="context window (default: the run's)")
    add_dataset_move_arg(p)
    p.set_defaults(func=cmd_rescore)
