"""Where the ``hcqr`` command's notes go: the ``hcqr_dspy`` logger, printed on stderr as they read.

Every module logs its notes to ``logging.getLogger(__name__)``, under the one ``hcqr_dspy`` logger: what a command
is doing at ``INFO`` (``loaded 229 passages from ...``, ``hcqr judge: judge LM ... at ...``), cautions at
``WARNING`` (``hcqr: note: ...``, ``warning: ...``), details at ``DEBUG``. A library user gets them through
``logging`` as any library's (Python prints ``WARNING`` and above on stderr until logging is configured).

The command (:func:`cli_logging`) prints them on stderr as the message alone, so a note reads the same as it
always did, with secrets masked (:class:`~hcqr_dspy.redaction.RedactingFilter`). ``-v``/``--verbose`` shows
``DEBUG`` lines too; ``-q``/``--quiet`` only ``WARNING`` and above, and no progress lines
(:class:`~hcqr_dspy.evaluation.progress.ProgressReport`). The one-line errors (``hcqr: error: ...``, exit 2) are
printed by :func:`hcqr_dspy.cli.main.main`, never logged, and show whatever the level.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hcqr_dspy.evaluation.progress import ProgressReport
from hcqr_dspy.redaction import RedactingFilter

ROOT = "hcqr_dspy"
"""The logger every module of the package logs under (``hcqr_dspy.<module>``)."""

DEFAULT_LEVEL = logging.INFO


class StderrHandler(logging.StreamHandler):
    """A handler writing each record as its message alone to the ``sys.stderr`` of the moment it is emitted (a
    redirected or captured stderr included), secrets masked."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self.addFilter(RedactingFilter())

    @property
    def stream(self):  # noqa: D102 - read at each record, never kept
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it; the live sys.stderr is used instead
        pass


def add_verbosity_args(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """``-v/--verbose`` and ``-q/--quiet`` (one of them) on ``parser``, stored as ``log_level`` (a ``logging``
    level). On a subcommand's parser (``after_command``) they default to nothing, so that the value given before
    the subcommand stands."""
    group = parser.add_mutually_exclusive_group()
    default = argparse.SUPPRESS if after_command else DEFAULT_LEVEL
    group.add_argument(
        "-v",
        "--verbose",
        dest="log_level",
        action="store_const",
        const=logging.DEBUG,
        default=default,
        help="show debug lines too (default: notes and what the command is doing)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        dest="log_level",
        action="store_const",
        const=logging.WARNING,
        default=default,
        help="show only cautions and errors: no lines saying what the command is doing, no progress lines "
        "(default: off)",
    )


@contextmanager
def cli_logging(level: int = DEFAULT_LEVEL) -> Iterator[None]:
    """Print the ``hcqr_dspy`` logger's records of ``level`` and above on stderr while the block runs
    (:class:`StderrHandler`); progress lines only below ``WARNING``. The logger's level, its handler and the
    progress setting are restored afterwards (a command run in-process leaves nothing behind)."""
    logger = logging.getLogger(ROOT)
    handler = StderrHandler()
    before, shown = logger.level, ProgressReport.shown
    logger.addHandler(handler)
    logger.setLevel(level)
    ProgressReport.shown = level < logging.WARNING
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
        ProgressReport.shown = shown
