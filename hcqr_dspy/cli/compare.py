"""``hcqr compare``: compare run folders on the same questions (:mod:`hcqr_dspy.reporting`) and track the
comparison as an MLflow run.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from hcqr_dspy.cli.common import _add_mlflow_args, _store, _ui_hint


def cmd_compare(args: argparse.Namespace) -> int:
    # imported when the command runs: matplotlib, statsmodels and mlflow take seconds, `hcqr --help` none
    from hcqr_dspy.reporting import compare
    from hcqr_dspy.tracking.comparison import track_comparison

    report, files = compare(args.runs, reference=args.reference, out_dir=args.out, qrels=args.qrels, common=args.common)
    print(report)
    print(f"written: {', '.join(str(f) for f in files)}", file=sys.stderr)
    if not args.no_mlflow:
        run_id = track_comparison(args.out, mlflow_dir=args.mlflow_dir)
        print(f"MLflow run {run_id} in {_store(args)} (view with {_ui_hint(args)})", file=sys.stderr)
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``compare`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("compare", help="compare runs on the same questions: table, McNemar tests, plots")
    p.add_argument("runs", nargs="+", help="two or more run folders")
    p.add_argument("--reference", default=None, help="reference run (method label or folder; default: the first)")
    p.add_argument("--out", default="comparison", help="folder for comparison.md/json and PNG plots")
    p.add_argument(
        "--qrels",
        default=None,
        help="relevance judgments for recall@k / nDCG@10 (default: qrels.json beside the dataset, if any)",
    )
    p.add_argument(
        "--common",
        action="store_true",
        help="runs still under way over the same question set: compare them on the questions every run "
        "has answered, saying how many (default: off, the runs must hold the same questions)",
    )
    _add_mlflow_args(p)
    p.set_defaults(func=cmd_compare)
