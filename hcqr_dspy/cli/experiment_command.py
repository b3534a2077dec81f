"""``hcqr experiment``: check or run an experiment grid (methods x datasets) from a YAML file
(:mod:`hcqr_dspy.workflows.experiment`).

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from hcqr_dspy.cli.common import add_encoder_backend_arg, positive_int, tracking_store, ui_hint
from hcqr_dspy.errors import ExperimentError


def cmd_experiment(args: argparse.Namespace) -> int:
    # imported when the command runs: dspy, pydantic and mlflow take seconds, `hcqr --help` none
    from hcqr_dspy.reporting import metrics_table
    from hcqr_dspy.workflows.experiment import run_experiment
    from hcqr_dspy.workflows.experiment_file import load_experiment

    only = [d.strip() for d in args.datasets.split(",") if d.strip()] if args.datasets is not None else None
    try:
        exp = load_experiment(
            args.file, limit=args.limit, lm=args.lm, only_datasets=only, encoder_backend=args.encoder_backend
        )
    except ExperimentError as exc:
        if not args.check:
            raise  # a run stops on one line: the first problem and how many more
        for problem in exc.problems:  # --check: every problem, one line each
            print(f"hcqr: error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        from hcqr_dspy.workflows.experiment import resolve_programs

        try:
            resolve_programs(exp, args.mlflow_dir)  # the saved programs read, and their budgets checked
        except ExperimentError as exc:
            for problem in exc.problems:
                print(f"hcqr: error: {problem}", file=sys.stderr)
            return 2
        programs = f" + {len(exp.programs)} program(s)" if exp.programs else ""
        print(
            f"{args.file}: valid ({len(exp.datasets)} dataset(s) x {len(exp.methods)} method(s){programs}, lm {exp.lm})"
        )
        return 0
    out = run_experiment(exp, runs_root=args.runs, mlflow_dir=args.mlflow_dir)
    for dname, cells in out["cells"].items():
        print(f"\n## {dname}\n")
        print(metrics_table(list(cells.items())))
        if dname in out["reports"]:
            print(f"\nreport: {out['reports'][dname]}")
    print(f"\nMLflow parent run {out['parent_run_id']} in {tracking_store(args)} (view with {ui_hint(args)})")
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``experiment`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("experiment", help="run an experiment grid (methods x datasets) from a YAML file")
    p.add_argument(
        "file", help="experiment YAML file, or the name of one in ./experiments/ or shipped (paper_main, ablations)"
    )
    p.add_argument(
        "--limit", type=positive_int, default=None, help="override the question sample size (default: the file's)"
    )
    p.add_argument("--lm", default=None, help="override the experiment's LM spec (default: the file's)")
    p.add_argument("--datasets", default=None, help="comma-separated subset of the file's datasets (default: all)")
    p.add_argument("--runs", default="runs/experiments", help="root of the experiment's run folders")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the file and stop (no LM call); every problem is printed, one line each",
    )
    add_encoder_backend_arg(p)
    p.set_defaults(func=cmd_experiment)
