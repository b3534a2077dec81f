"""Outages a run stops on, as one line: a full disk (:func:`disk_full`, :func:`disk_full_error`) and an LM that
stopped answering (:func:`lm_failure` names what it raised).

Neither is a bug: finished records are saved and the same command resumes once the disk has room or the LM
answers again.
"""

from __future__ import annotations

import errno

from hcqr_dspy.errors import DiskFullError

# errno values of a write that failed for lack of space: ENOSPC (device full), EDQUOT (quota), EFBIG (a file-size
# limit, RLIMIT_FSIZE). SQLite reports the same as "database or disk is full" (sqlite3 result code SQLITE_FULL).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full(exc: BaseException | None) -> BaseException | None:
    """The exception in ``exc``'s chain (itself, its ``__cause__``/``__context__``, an ``orig`` that SQLAlchemy
    wraps) that says the disk is full, or ``None``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return exc
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        if "database or disk is full" in str(exc) or "No space left on device" in str(exc):
            return exc
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return None


def disk_full_error(exc: BaseException, saved: str = "") -> DiskFullError:
    """The one-line stop of a run whose disk filled: what failed, what is saved, what to do."""
    cause = disk_full(exc) or exc
    if isinstance(cause, OSError) and cause.strerror:
        what = f"{cause.strerror}: {cause.filename}" if cause.filename else cause.strerror
    else:
        what = (str(cause).splitlines() or ["disk full"])[0][:200]
    return DiskFullError(
        f"the disk is full ({what}); {saved + '; ' if saved else ''}free space and run the same command again to resume"
    )


def lm_failure(exc: BaseException) -> str:
    """``"<error type>: <first line of the message>"`` (at most 300 characters) for one-line stop messages."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
