"""Error types raised for bad input.

Every error a user can cause (a malformed file, a mismatched index, a bad
flag) is an :class:`HCQRError` subclass with a message that names the file,
line or value at fault. The CLI prints the message alone and exits with
code 2; library callers can catch :class:`HCQRError`.
"""


class HCQRError(Exception):
    """Base class of every user-facing error in hcqr-dspy."""


class CorpusError(HCQRError):
    """A corpus source is missing, empty or malformed."""


class RetrievalIndexError(HCQRError):
    """An index folder is missing, incomplete, corrupted or built for another corpus/encoder."""


class QueryError(HCQRError):
    """A search request is malformed (empty query, ``k <= 0``)."""


class LMCapabilityError(HCQRError):
    """The LM lacks something a method requires (e.g. token log-probabilities); the run stops, nothing is marked wrong."""


class OutageError(HCQRError):
    """A service or resource a run depends on failed mid-run through no fault of the code: an LM endpoint or
    retrieval backend that stayed unreachable (or kept answering outside its API's format) after retries with
    back-off, or a full disk. Finished questions are saved and the same command resumes; never a bug."""


class DiskFullError(OutageError):
    """A write failed because the disk (or the user's quota) is full (``ENOSPC``, ``EDQUOT``, ``EFBIG``, or
    SQLite's "database or disk is full"); every file that was whole before is still whole."""


class BackendUnavailableError(OutageError):
    """The retrieval backend (a Milvus server, ...) stopped answering mid-run and stayed unreachable after
    retries with back-off."""
