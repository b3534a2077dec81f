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


class LMSpecError(HCQRError):
    """An ``--lm`` spec cannot be resolved (unknown name, missing package, bad checksum)."""


class LMReplyFormatError(Exception):
    """The LM endpoint kept replying with a body that is not its API's format (HTML, truncated JSON) after
    retries with back-off. Not an :class:`~hcqr_dspy.errors.HCQRError`: it is raised inside a run, where
    :data:`hcqr_dspy.evaluate.LM_UNAVAILABLE` stops the run with it as an LM outage."""


class MilvusUnavailableError(RetrievalIndexError):
    """A Milvus server or Milvus Lite database cannot be reached or opened."""


class MilvusCapabilityError(RetrievalIndexError):
    """The Milvus engine lacks what was asked (an index type, the BM25 function)."""


class MilvusOutageError(MilvusUnavailableError, BackendUnavailableError):
    """A search failed on Milvus's side mid-run: the server stayed unreachable, hung or not ready through
    :func:`~hcqr_dspy.retrieval.milvus.retries.retry_settings`' window of retries, or refused the request. An
    outage: a run stops with one line and the same command resumes."""
