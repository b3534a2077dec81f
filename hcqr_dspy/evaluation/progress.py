"""What a resumable loop shows while it runs: records done of all, the running accuracy where records have one, the
seconds a record takes and the time left.

It goes to stdout, as DSPy's own bar did (stderr keeps the one-line errors and notes). On a terminal it is a
``tqdm`` bar with those figures after it; anywhere else (a log file, a CI job, a pipe) it is a plain line every
:data:`LINE_EVERY_ROWS`-th of the work or :data:`LINE_EVERY_SECONDS` seconds, and at the end, so a log holds whole
lines, never a bar redrawn with carriage returns.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, TextIO

LINE_EVERY_ROWS = 20
"""A log line at each twentieth of the records to make (the first and last included)."""

LINE_EVERY_SECONDS = 60.0
"""A log line at least this often, in seconds, while records keep coming."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressReport:
    """Progress of ``total`` records, ``before`` of them made in an earlier session (``rows_before``).

    Args:
        total: Records the loop is to hold when done.
        rows_before: The records made before (their ``correct`` fields count in the accuracy).
        what: What a record is (``question``, ``judgment``), for the text.
        stream: Where to write (default ``sys.stdout``); a bar where it is a terminal.
    """

    shown: bool = True
    """Whether loops show their progress at all (``hcqr -q`` turns it off: :mod:`hcqr_dspy.cli.logs`)."""

    def __init__(self, total: int, rows_before: Iterable[dict[str, Any]], what: str, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.total, self.what = total, what
        self.before = self.right = self.scored = 0
        for r in rows_before:  # read once: a generator over a file of any length
            self.before += 1
            self.right += r.get("correct") is True
            self.scored += "correct" in r
        self.done = self.before
        self.start = self.last_line = time.monotonic()
        self.lock = threading.Lock()
        self.step = max(1, (total - self.before) // LINE_EVERY_ROWS)
        isatty = getattr(self.stream, "isatty", None)
        self.bar = None
        if callable(isatty) and isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=self.before, file=self.stream, unit=what, dynamic_ncols=True)

    def figures(self) -> str:
        """``accuracy 41.7% (5/12), 108 s a question, about 29 min left`` (the parts that are known)."""
        parts = []
        if self.scored:
            parts.append(f"accuracy {self.right / self.scored:.1%} ({self.right}/{self.scored})")
        made = self.done - self.before
        if made:
            per = (time.monotonic() - self.start) / made
            parts.append(f"{per:.1f} s a {self.what}")
            if self.done < self.total:
                parts.append(f"about {_duration(per * (self.total - self.done))} left")
        return ", ".join(parts)

    def row(self, row: dict[str, Any]) -> None:
        """Count one new record (thread-safe) and show the progress."""
        with self.lock:
            self.done += 1
            if "correct" in row:
                self.scored += 1
                self.right += row.get("correct") is True
            if self.bar is not None:
                self.bar.set_postfix_str(self.figures(), refresh=False)
                self.bar.update(1)
                return
            now = time.monotonic()
            made = self.done - self.before
            if (
                made == 1
                or made % self.step == 0
                or self.done == self.total
                or now - self.last_line >= LINE_EVERY_SECONDS
            ):
                self.last_line = now
                print(f"{self.done}/{self.total} {self.what}s: {self.figures()}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
