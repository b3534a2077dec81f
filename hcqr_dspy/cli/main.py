"""The ``hcqr`` command line: the parser of every subcommand, and :func:`main`.

Every subcommand prints a one-line ``hcqr: error: ...`` message and exits with
code 2 on bad input (:class:`hcqr_dspy.errors.HCQRError`), never a traceback.
Each subcommand is one module of :mod:`hcqr_dspy.cli` (its parser and ``cmd_<name>``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from hcqr_dspy import __version__
from hcqr_dspy.cli import (
    ask_command,
    compare_command,
    compile_command,
    demo_command,
    evaluate_command,
    experiment_command,
    index_command,
    judge_command,
    prompts_command,
    register_command,
    replay_command,
    rescore_command,
    served_command,
    split_command,
    ui_command,
)
from hcqr_dspy.cli.common import HelpFormatter
from hcqr_dspy.cli.logs import add_verbosity_args, cli_logging
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.redaction import redact, redact_exception

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# MLflow draws a "Downloading artifacts" bar for each artifact it reads back (a compile reads its logged model's
# files); the commands print what they did themselves. MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=true shows them.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

log = logging.getLogger(__name__)


def _versions() -> str:
    """``hcqr-dspy X (dspy Y, mlflow Z, python W)``, read from installed package metadata (no import)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "missing"

    return (
        f"hcqr-dspy {__version__} (dspy {version('dspy')}, mlflow {version('mlflow')}, python {sys.version.split()[0]})"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``hcqr`` parser: every subcommand, in the order ``hcqr --help`` lists them."""
    parser = argparse.ArgumentParser(
        prog="hcqr",
        description="Hypothesis-Conditioned Query Rewriting (HCQR) for retrieval-augmented MCQA.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_versions())
    add_verbosity_args(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        p = sub.add_parser(name, formatter_class=HelpFormatter, **kwargs)
        add_verbosity_args(p, after_command=True)  # `hcqr eval -q ...` as well as `hcqr -q eval ...`
        return p

    # in the order `hcqr --help` lists them
    modules = (split_command, index_command, evaluate_command, ask_command, demo_command, judge_command)
    modules += (rescore_command, compare_command, replay_command, experiment_command, compile_command)
    modules += (register_command, prompts_command, served_command, ui_command)
    for module in modules:
        module.add_parsers(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``hcqr`` command; its exit code (2 and one ``hcqr: error:`` line on bad input, 130 on Ctrl-C).

    Its notes are printed on stderr at the level ``-v``/``-q`` chose (:func:`~hcqr_dspy.cli.logs.cli_logging`);
    the error line is printed whatever the level."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with cli_logging(args.log_level):
            if log.isEnabledFor(logging.DEBUG):
                log.debug("hcqr %s: %s", args.command, _versions())
            return args.func(args)
    except HCQRError as exc:
        print(f"hcqr: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hcqr: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: its traceback is printed, cleaned of secrets first
        redact_exception(exc)
        raise
