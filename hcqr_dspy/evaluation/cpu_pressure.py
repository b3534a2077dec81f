"""CPU contention while a question is answered, from Linux pressure stall information (PSI).

``/proc/pressure/cpu`` holds, in its ``some`` line, ``total``: the microseconds, since boot, during which at least one
runnable task on the machine (or the cgroup, in a container) waited for a CPU (kernel documentation
``Documentation/accounting/psi.rst``). Its increase over a question's wall time, as a share, is how contended the
machine was while the question ran: about 0 when the run's own threads had the cores to themselves, near 1 when
something else (another run, a test suite, a compile) competed for them the whole time. A question's ``seconds``
read under contention are not the method's cost: a report compares seconds only between runs measured alike
(:func:`hcqr_dspy.reporting.tables.contention_note`).

Where the kernel has no PSI (not Linux, or PSI off), nothing is measured: the share is ``None``, never a guess.
"""

from __future__ import annotations

import time
from pathlib import Path

PSI_CPU = Path("/proc/pressure/cpu")
# A span of work during which some task waited for a CPU this share of the time or more had its seconds inflated by
# other work: they are not the work's own cost.
CONTENDED = 0.10


def cpu_stall_us(path: Path = PSI_CPU) -> int | None:
    """The ``some`` line's ``total`` of a PSI file (microseconds some task waited for a CPU); ``None`` where the file
    is absent, unreadable or holds no such line."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for field in fields[1:]:
                name, _, value = field.partition("=")
                if name == "total" and value.isdigit():
                    return int(value)
    return None


class PressureWindow:
    """The CPU pressure over a span of wall time: made at its start, read at its end (:meth:`share`)."""

    def __init__(self, path: Path = PSI_CPU) -> None:
        self.path = path
        self.stall = cpu_stall_us(path)
        self.start = time.monotonic()

    def share(self) -> float | None:
        """The share of the wall time since the window opened in which some task waited for a CPU, from 0 to 1
        (rounded to 3 digits); ``None`` without PSI, or over a span too short to read (under a millisecond)."""
        stall, elapsed = cpu_stall_us(self.path), time.monotonic() - self.start
        if self.stall is None or stall is None or stall < self.stall or elapsed < 1e-3:
            return None
        return round(min(1.0, (stall - self.stall) / 1e6 / elapsed), 3)
