"""``hcqr ui``: the MLflow UI for the tracking store (127.0.0.1 by default).

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` and a refused flag load no
DSPy, MLflow or torch.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from hcqr_dspy.cli.common import positive_int
from hcqr_dspy.tracking.experiment_page import evaluation_runs_url, key_metrics_url
from hcqr_dspy.tracking.store import browse_store, existing_store
from hcqr_dspy.tracking.ui import check_port, serve_ui

log = logging.getLogger(__name__)


def cmd_ui(args: argparse.Namespace) -> int:
    folder = existing_store(args.mlflow_dir, "run `hcqr eval` or `make demo`")
    check_port(args.host, args.port)  # a taken port fails here, before a link to another program is printed
    # a read-only store (an archived study) is served as it is; a locked or malformed one is refused in one line
    _, experiment_id = browse_store(args.mlflow_dir, "run `hcqr eval` or `make demo`")
    log.info(
        f"MLflow UI on http://{args.host}:{args.port} for {folder} (Ctrl-C stops it)\n"
        f"  evaluation runs: {evaluation_runs_url(experiment_id, args.host, args.port)}\n"
        f"  every run with the key metrics: {key_metrics_url(experiment_id, args.host, args.port)}"
    )
    return serve_ui(args.mlflow_dir, host=args.host, port=args.port, workers=args.workers)


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``ui`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command("ui", help="start the MLflow UI for the tracking store (127.0.0.1 by default)")
    p.add_argument("--mlflow-dir", default=None, help="MLflow store folder (default: $HCQR_MLFLOW_DIR or ./mlruns)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=positive_int, default=5000, help="port to serve on")
    p.add_argument("--workers", type=positive_int, default=1, help="MLflow server worker processes")
    p.set_defaults(func=cmd_ui)
