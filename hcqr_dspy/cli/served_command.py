"""``hcqr served``: the questions a served model answered (their traces), newest first.

Its command imports MLflow when it runs, so that ``hcqr --help`` loads none.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from hcqr_dspy.cli.common import positive_int


def cmd_served(args: argparse.Namespace) -> int:
    from hcqr_dspy.tracking.served_traces import served_filter, served_questions
    from hcqr_dspy.tracking.store import browse_store

    served_filter(args.model)  # a malformed --model is refused before the store is opened
    # read-only (an archived study) is fine; a locked or malformed store is refused in one line
    _, experiment_id = browse_store(args.mlflow_dir, "serve a model with MLFLOW_TRACKING_URI set to it")
    rows = served_questions(experiment_id, args.model, args.limit)
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            said = row["answer"] if row["valid"] else f"invalid ({row['error'] or 'no letter'})"
            print(f"{row['time']}  {row['model']}  {row['qid']}  {said}  {row['seconds']} s  {row['trace_id']}")
    if not rows and not args.json:
        print("no served questions" + (f" of {args.model}" if args.model else ""))
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``served`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("served", help="list the questions a served model answered (their traces), newest first")
    p.add_argument("--model", default=None, help="only this registered model: NAME or NAME/VERSION")
    p.add_argument("--limit", type=positive_int, default=20, help="how many, newest first")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.set_defaults(func=cmd_served)
