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
