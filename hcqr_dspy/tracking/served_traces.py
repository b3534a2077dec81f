"""The questions a served model answered, from their traces (:mod:`hcqr_dspy.tracking.serve_runtime` tags each
``kind=served``): ``hcqr served`` lists them, newest first, filtered by registered model and version."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hcqr_dspy.errors import HCQRError


def served_filter(model: str | None) -> str:
    """The ``mlflow.search_traces`` filter of served questions, of ``model`` when given (``NAME`` or
    ``NAME/VERSION``).

    Raises:
        HCQRError: ``model`` is not ``NAME`` or ``NAME/VERSION``, or holds a quote.
    """
    clauses = ["tags.kind = 'served'"]
    if model:
        name, _, version = model.partition("/")
        if not name or "'" in model or (version and not version.isdigit()):
            raise HCQRError(f"--model {model!r}: give a registered model NAME or NAME/VERSION (a version number)")
        clauses.append(f"tags.model_name = '{name}'")
        if version:
            clauses.append(f"tags.model_version = '{version}'")
    return " AND ".join(clauses)


def served_questions(experiment_id: str, model: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The ``limit`` newest served questions (of ``model``, see :func:`served_filter`): ``{"time" (UTC, ISO),
    "model" ("NAME vN" or the model id), "qid", "answer", "valid", "error", "seconds", "trace_id"}``."""
    import mlflow

    traces = mlflow.search_traces(
        locations=[experiment_id],  # experiment ids (MLflow 3: `experiment_ids` is deprecated for it)
        filter_string=served_filter(model),
        max_results=limit,
        order_by=["timestamp_ms DESC"],
        return_type="list",
    )
    rows = []
    for trace in traces:
        tags, info = trace.info.tags, trace.info
        try:
            outputs = json.loads(trace.data.response or "{}")
        except (TypeError, json.JSONDecodeError):
            outputs = {}
        outputs = outputs if isinstance(outputs, dict) else {}
        name, version = tags.get("model_name"), tags.get("model_version")
        rows.append(
            {
                "time": datetime.fromtimestamp(info.request_time / 1000, UTC).isoformat(timespec="seconds"),
                "model": f"{name} v{version}" if name and version else tags.get("model_id"),
                "qid": tags.get("qid"),
                "answer": outputs.get("answer"),
                "valid": outputs.get("valid"),
                "error": outputs.get("error"),
                "seconds": round((info.execution_duration or 0) / 1000, 2),
                "trace_id": info.trace_id,
            }
        )
    return rows
