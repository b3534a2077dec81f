"""Error types raised for bad input.

Every error a user can cause (a malformed file, a mismatched index, a bad
flag) is an :class:`HCQRError` subclass with a message that names the file,
line or value at fault. The CLI prints the message alone and exits with
code 2; library callers can catch :class:`HCQRError`.
"""

import functools
import json
from pathlib import Path


class HCQRError(Exception):
    """Base class of every user-facing error in hcqr-dspy."""


class DataError(HCQRError):
    """A benchmark file or question row is malformed."""


class CorpusError(HCQRError):
    """A corpus source is missing, empty or malformed."""


class RetrievalIndexError(HCQRError):
    """An index folder is missing, incomplete, corrupted or built for another corpus/encoder."""


class EncoderError(HCQRError):
    """An encoder spec is malformed or its weights cannot be loaded."""


class QueryRuntimeError(HCQRError):
    """A query runtime is unknown, its library is missing, or the export failed."""


class QueryError(HCQRError):
    """A search request is malformed (empty query, ``k <= 0``)."""


class LMCapabilityError(HCQRError):
    """The LM lacks something a method requires (e.g. token log-probabilities); the run stops, nothing is marked
    wrong."""


class OutageError(HCQRError):
    """A service or resource a run depends on failed mid-run through no fault of the code: an LM endpoint or
    retrieval backend that stayed unreachable (or kept answering outside its API's format) after retries with
    back-off, or a full disk. Finished questions are saved and the same command resumes; never a bug."""


class DiskFullError(OutageError):
    """A write failed because the disk (or the user's quota) is full (``ENOSPC``, ``EDQUOT``, ``EFBIG``, or
    SQLite's "database or disk is full"); every file that was whole before is still whole."""


class StoreLockedError(OutageError):
    """The MLflow store (its SQLite file) stayed locked by another process for the whole wait
    (``$HCQR_MLFLOW_LOCK_SECONDS``): finished questions are saved and the same command resumes once it is free."""


class BackendUnavailableError(OutageError):
    """The retrieval backend (a Milvus server, ...) stopped answering mid-run and stayed unreachable after
    retries with back-off."""


class RunError(HCQRError):
    """A run folder cannot be used: another configuration, not writable, unreadable or foreign records."""


class SetupMismatchError(HCQRError):
    """A strict-setup run would answer on another setup than its run folders recorded (nothing was written)."""


class ResponseCacheError(HCQRError):
    """DSPy's response cache folder (``$DSPY_CACHEDIR``) cannot take the run's memory bounds: it is not writable, or
    another process held it locked past diskcache's 60 s retry. Nothing has run yet."""


class LMUnavailableError(OutageError):
    """The LM stopped answering (or cannot be used) mid-run; finished questions are saved."""


class ProgramError(HCQRError):
    """A program raised an error that is not a bad LM reply (a bug): the run stopped at that question.

    Attributes:
        qid: The question.
        traceback_file: Where its traceback was written.
    """

    def __init__(self, message: str, qid: str, traceback_file: Path | None):
        super().__init__(message)
        self.qid = qid
        self.traceback_file = traceback_file


class LMSpecError(HCQRError):
    """An ``--lm`` spec cannot be resolved (unknown name, missing package, bad checksum)."""


class TruncatedReplyError(HCQRError):
    """An LM reply was cut at ``max_tokens`` (finish reason ``length``): the step that asked is a bad reply of
    cause ``truncated`` (:func:`hcqr_dspy.programs.invalid_replies.bad_reply`), never parsed as if it were whole
    (:class:`hcqr_dspy.lm.adapter.HCQRAdapter` raises it)."""


class LMReplyFormatError(Exception):
    """The LM endpoint kept replying with a body that is not its API's format (HTML, truncated JSON) after
    retries with back-off. Not an :class:`~hcqr_dspy.errors.HCQRError`: it is raised inside a run, where
    :data:`hcqr_dspy.evaluation.answering.LM_UNAVAILABLE` stops the run with it as an LM outage."""


class MilvusUnavailableError(RetrievalIndexError):
    """A Milvus server or Milvus Lite database cannot be reached or opened."""


class MilvusCapabilityError(RetrievalIndexError):
    """The Milvus engine lacks what was asked (an index type, the BM25 function)."""


class MilvusOutageError(MilvusUnavailableError, BackendUnavailableError):
    """A search failed on Milvus's side mid-run: the server stayed unreachable, hung or not ready through
    :func:`~hcqr_dspy.retrieval.milvus.retries.retry_settings`' window of retries, or refused the request. An
    outage: a run stops with one line and the same command resumes."""


@functools.cache
def request_rejected_class() -> type:
    """The class ``RequestRejected(MlflowException, HCQRError)``: a serving request none of whose records can be
    answered (:func:`hcqr_dspy.tracking.served_requests.request_rejected`), which MLflow's scoring server answers with
    HTTP 400. Built on first use, because its base ``MlflowException`` needs MLflow, which this module does not
    import."""
    from mlflow.exceptions import MlflowException  # heavy: imported only where a model is served
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    class RequestRejected(MlflowException, HCQRError):
        """A request none of whose records can be answered: HTTP 400 on MLflow's scoring server."""

        def __init__(self, message: str, rejected: list[dict]):
            super().__init__(message, error_code=INVALID_PARAMETER_VALUE, rejected=rejected)
            self.reason = message

        def serialize_as_json(self) -> str:
            # The scoring server prefixes .message with a dump of the request's DataFrame; the body keeps ours.
            body = json.loads(super().serialize_as_json())
            return json.dumps({**body, "message": self.reason})

    return RequestRejected


class ExperimentError(HCQRError):
    """An experiment file is malformed (unknown key, method or dataset ...).

    Args:
        message: One line: the first problem, and how many more there are.
        problems: Every problem found, one line each (``hcqr experiment --check`` prints them all);
            default: ``[message]``.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems else [message]


class RecipeError(HCQRError):
    """A recipe that cannot run: unreadable, unknown keys, optimizer or settings, a train set too small."""


class ProgramFormatError(HCQRError):
    """A saved program that cannot be used: missing files, another format, a newer version, an unknown method."""


class SplitError(HCQRError):
    """A question file cannot be split as asked (``hcqr split``): fractions that are not three numbers from 0 to 1
    summing to 1, a file too small for them, or an output folder that holds other records or an earlier split."""
