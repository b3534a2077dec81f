"""``hcqr compare``: compare run folders on the same questions (:mod:`hcqr_dspy.reporting`) and track the
comparison as an MLflow run.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable

from hcqr_dspy.cli.common import add_mlflow_args, tracking_store, ui_hint
from hcqr_dspy.errors import HCQRError

log = logging.getLogger(__name__)


def cmd_compare(args: argparse.Namespace) -> int:
    # imported when the command runs: matplotlib, statsmodels and mlflow take seconds, `hcqr --help` none
    from hcqr_dspy.reporting import compare
    from hcqr_dspy.tracking.comparison import track_comparison
    from hcqr_dspy.tracking.store import check_existing_store, store_outages

    names = [name for name, _ in args.group or []]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise HCQRError(f"--group {twice} is given twice; name each optimizer arm once")
    if not args.no_mlflow:  # a store that is there and cannot be read is refused before the report is written
        check_existing_store(args.mlflow_dir)
    report, files = compare(
        args.runs,
        reference=args.reference,
        out_dir=args.out,
        qrels=args.qrels,
        common=args.common,
        margin=args.margin,
        margin_pgold=args.margin_pgold,
        strict_setup=args.strict_setup,
        groups=dict(args.group or []),
    )
    print(report)
    log.info(f"written: {', '.join(str(f) for f in files)}")
    if not args.no_mlflow:
        with store_outages(args.mlflow_dir, saved=lambda: f"the report is saved in {args.out}"):
            run_id = track_comparison(args.out, mlflow_dir=args.mlflow_dir)
        log.info(f"MLflow run {run_id} in {tracking_store(args)} (view with {ui_hint(args)})")
    return 0


def _bounded(text: str, low: float, high: float, what: str) -> float:
    """``text`` as a number from ``low`` to ``high``, else argparse's error naming it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what} from {low:g} to {high:g}, got {text!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise argparse.ArgumentTypeError(f"expected {what} from {low:g} to {high:g}, got {text!r}")
    return value


def _margin_points(text: str) -> float:
    from hcqr_dspy.reporting.equivalence import MIN_MARGIN_POINTS

    return _bounded(text, MIN_MARGIN_POINTS, 100, "percentage points")


def _margin_pgold(text: str) -> float:
    from hcqr_dspy.reporting.equivalence import MIN_MARGIN_PGOLD

    return _bounded(text, MIN_MARGIN_PGOLD, 1, "a probability")


def _group(text: str) -> tuple[str, list[str]]:
    """``NAME=RUN,RUN[,...]`` as ``(NAME, [RUN, ...])``, else argparse's error naming it."""
    name, sep, members = text.partition("=")
    runs = [m.strip() for m in members.split(",") if m.strip()]
    if not sep or not name.strip() or not runs:
        raise argparse.ArgumentTypeError(f"expected NAME=RUN,RUN (runs by label or folder), got {text!r}")
    return name.strip(), runs


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
    p.add_argument(
        "--margin",
        type=_margin_points,
        default=None,
        metavar="POINTS",
        help="equivalence margin for accuracy differences, in percentage points: a paired two one-sided test "
        "(TOST) of each accuracy difference the report tests, numbered and Holm-adjusted with the report's other "
        "tests",
    )
    p.add_argument(
        "--margin-pgold",
        type=_margin_pgold,
        default=None,
        metavar="P",
        help="equivalence margin for gold-option probability differences (0.0001 to 1), tested the same way",
    )
    p.add_argument(
        "--strict-setup",
        action="store_true",
        help="refuse runs whose setups differ (LM, model file, llama.cpp build and engine settings, temperature, "
        "endpoint, library versions, questions, index, retrieval settings) or a run whose rows come from several "
        "setups; default: compare them, flagged under the title and in the Setups table",
    )
    p.add_argument(
        "--group",
        type=_group,
        action="append",
        metavar="NAME=RUN,RUN",
        help="replicate compiles (runs of one method and recipe that differ in compile seed) to report as one "
        "optimizer arm: per-seed and pooled effects against the method's zero-shot run, a two-level bootstrap "
        "interval and the between-seed SD; repeatable (default: compiled runs are grouped from their records)",
    )
    add_mlflow_args(p)
    p.set_defaults(func=cmd_compare)
