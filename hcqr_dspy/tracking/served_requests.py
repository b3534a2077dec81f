"""Checking the records of a served request before the LM is asked anything (the shapes and errors are in
:mod:`hcqr_dspy.tracking.serving`'s docstring): each record answered or rejected on its own, and a request none of
whose records can be answered refused with HTTP 400."""

from __future__ import annotations

import math
import numbers
from typing import Any

from hcqr_dspy.data import LETTERS, check_question
from hcqr_dspy.errors import DataError, request_rejected_class

OPTIONS_SHAPE = 'an object of letter -> text such as {"A": "...", "B": "..."}'
# Characters a served question and each option may have: far above any benchmark's (MedQA-US questions run to about
# 2,000), and a bound on what one record puts in the LM's prompt and, through every traced step, in the store.
MAX_QUESTION_CHARS = 20_000
MAX_OPTION_CHARS = 5_000
# Faults listed in a 400's message (all of them are in its "rejected" list).
MESSAGE_FAULTS = 10


def _absent(value: Any) -> bool:
    """None, NaN (pandas' missing value in ``dataframe_records`` beside records that have the field) or pd.NA."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "true/false"
    if isinstance(value, numbers.Number):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return "a list"
    return "text" if isinstance(value, str) else type(value).__name__


def request_records(model_input: Any) -> list[Any]:
    """The records of a request: the rows of a DataFrame, the items of a list (or array), or one dict.

    Raises:
        MlflowException: (HTTP 400) anything else.
    """
    if hasattr(model_input, "to_dict") and hasattr(model_input, "columns"):
        return model_input.to_dict(orient="records")
    if isinstance(model_input, dict):
        return [model_input]
    if hasattr(model_input, "tolist"):
        model_input = model_input.tolist()
    if isinstance(model_input, (list, tuple)):
        return list(model_input)
    raise request_rejected(
        [(None, None, "request", f"must be records {{question, options[, qid]}}, not {_kind(model_input)}")]
    )


def record_qid(row: int, record: Any) -> str:
    """A record's ``qid`` as text; its row number (from 0) when it has none (missing, null, NaN, empty)."""
    qid = record.get("qid") if isinstance(record, dict) else None
    if _absent(qid) or not str(qid).strip():
        return str(row)
    if isinstance(qid, float) and qid.is_integer():  # pandas makes integer ids floats beside a record without one
        qid = int(qid)
    return str(qid).strip()


def record_fault(record: Any) -> tuple[str, str] | None:
    """Why a record cannot be answered, as ``(field, reason)``, or ``None`` when it can. The field is ``record``,
    ``question``, ``options`` or ``options.<letter>``."""
    if not isinstance(record, dict):
        return "record", f"must be an object {{question, options[, qid]}}, not {_kind(record)}"
    question, options = record.get("question"), record.get("options")
    if _absent(question):
        return "question", "missing"
    if not isinstance(question, str) or not question.strip():
        return "question", "empty" if isinstance(question, str) else f"must be text, not {_kind(question)}"
    if len(question) > MAX_QUESTION_CHARS:
        return "question", f"{len(question)} characters, more than the {MAX_QUESTION_CHARS} a served question may have"
    if _absent(options):
        return "options", f"missing; give {OPTIONS_SHAPE}"
    if not isinstance(options, dict):
        return "options", f"must be {OPTIONS_SHAPE}, not {_kind(options)}"
    if len(options) < 2:
        return "options", f"at least two are needed, got {len(options)}"
    if len(options) > len(LETTERS):
        return "options", f"at most {len(LETTERS)} are allowed (A to Z), got {len(options)}"
    labels = sorted(str(k).strip().upper() for k in options)
    if labels != list(LETTERS[: len(labels)]):
        return "options", (
            f"labels must be the letters {', '.join(LETTERS[: len(labels)])}, got {', '.join(map(str, options))}"
        )
    for key, text in options.items():
        if not isinstance(text, str):
            return f"options.{key}", f"must be text, not {_kind(text)}"
        if not text.strip():
            return f"options.{key}", "empty"
        if len(text) > MAX_OPTION_CHARS:
            return f"options.{key}", f"{len(text)} characters, more than the {MAX_OPTION_CHARS} an option may have"
    return None


def check_record(row: int, record: Any):
    """``(qid, example, None)`` for a record that can be answered (the example from
    :func:`hcqr_dspy.data.check_question`, as ``hcqr predict`` builds it), else ``(qid, None, (field, reason))``."""
    qid, fault = record_qid(row, record), record_fault(record)
    if fault:
        return qid, None, fault
    try:
        ex = check_question(
            qid, {"question": record["question"], "options": record["options"]}, f"record {row}", labelled=False
        )
    except DataError as exc:  # a rule of check_question that record_fault does not know
        return qid, None, ("record", str(exc))
    return qid, ex, None


def request_rejected(faults: list[tuple[int | None, str | None, str, str]]) -> Exception:
    """The error of a request none of whose records can be answered, from its ``(row, qid, field, reason)`` faults
    (row and qid ``None`` for the request as a whole): an ``MlflowException`` (and :class:`HCQRError`) with
    error code ``INVALID_PARAMETER_VALUE``, which MLflow's scoring server answers with HTTP 400 and the body
    ``{error_code, message, rejected: [{row, qid, field, reason}], sqlstate, error_class}``."""
    said = [
        f"{field}: {reason}" if row is None else f"record {row} (qid {qid!r}): {field}: {reason}"
        for row, qid, field, reason in faults
    ]
    more = f"; and {len(said) - MESSAGE_FAULTS} more (see 'rejected')" if len(said) > MESSAGE_FAULTS else ""
    message = "no record of the request can be answered: " + "; ".join(said[:MESSAGE_FAULTS]) + more
    rejected = [{"row": row, "qid": qid, "field": field, "reason": reason} for row, qid, field, reason in faults]
    return request_rejected_class()(message, rejected)
