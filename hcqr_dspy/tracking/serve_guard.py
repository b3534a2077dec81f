"""What MLflow's scoring server (``mlflow models serve``) refuses of a request to a served program before MLflow
reads it, and what its error responses leave out.

MLflow 3's scoring server (``mlflow.pyfunc.scoring_server``) reads a request's whole body and parses it (``json``;
pandas for CSV and Parquet) before the model sees anything, and answers an ``MlflowException`` with
``MlflowException.serialize_as_json()``, which carries the exception's ``stack_trace`` (file paths of the server)
when it has one: a CSV or Parquet body pandas cannot read, any error of a model that is not an ``MlflowException``.
Neither MLflow nor uvicorn has a setting for the size of a request, the nesting of its JSON or leaving the trace
out, and the model is loaded before MLflow builds its FastAPI app, so no model code can wrap that app. The one place
left is the function MLflow builds its ``/invocations`` endpoint with, ``_async_catch_mlflow_exception`` (its error
handler), looked up when the app is built just after the model is loaded: :func:`guard_scoring_server`, called by
the model's ``load_context``, wraps it with :func:`guarded`, in MLflow's scoring server only (a model loaded with
``mlflow.pyfunc.load_model`` is left as it is).

Each refusal is a 4xx whose JSON body is ``{"error_code", "message"}``, the message one line, never a stack trace:

* HTTP 413, ``REQUEST_TOO_LARGE``: a body over :data:`MAX_REQUEST_BYTES` (16 MiB; ``HCQR_SERVE_MAX_REQUEST_BYTES``
  sets another number of bytes), by its ``Content-Length`` or as it arrives;
* HTTP 415, ``UNSUPPORTED_MEDIA_TYPE``: no ``Content-Type``, or ``text/csv`` (a record's options are an object,
  which CSV cannot carry); ``application/json`` and Parquet go on to MLflow;
* HTTP 400, ``BAD_REQUEST``: a JSON body that is not JSON, or nested more than :data:`MAX_JSON_DEPTH` levels (a
  request needs 5: ``{"dataframe_split": {"data": [[..., {"A": ...}]]}}``).

MLflow's own error answers (a schema it refuses, a Parquet body it cannot read) pass on without ``stack_trace``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from hcqr_dspy.errors import HCQRError

MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_REQUEST_BYTES_VAR = "HCQR_SERVE_MAX_REQUEST_BYTES"
MAX_JSON_DEPTH = 32
SCORING_APP = "mlflow.pyfunc.scoring_server.app"
ERROR_HANDLER = "_async_catch_mlflow_exception"
JSON_TYPES = ("application/json",)
CSV_TYPE = "text/csv"


def max_request_bytes() -> int:
    """The largest body a request may have: ``HCQR_SERVE_MAX_REQUEST_BYTES``, else :data:`MAX_REQUEST_BYTES`.

    Raises:
        HCQRError: the variable is not a whole number of bytes above 0.
    """
    given = os.environ.get(MAX_REQUEST_BYTES_VAR, "").strip()
    if not given:
        return MAX_REQUEST_BYTES
    if not given.isdigit() or int(given) <= 0:
        raise HCQRError(f"{MAX_REQUEST_BYTES_VAR} must be a number of bytes above 0, got {given!r}")
    return int(given)


def json_depth(value: Any, limit: int) -> int:
    """Levels of objects and lists in a parsed JSON value (a scalar 0, ``[]`` 1, ``{"a": [1]}`` 2), counted
    level by level (no recursion) and no further than ``limit + 1``."""
    depth, level = 0, [value]
    while depth <= limit:
        level = [v for v in level if isinstance(v, (dict, list))]
        if not level:
            break
        depth += 1
        level = [child for v in level for child in (v.values() if isinstance(v, dict) else v)]
    return depth


def json_fault(body: bytes) -> str | None:
    """Why a JSON body is refused (not JSON, nested too deep), in one line; ``None`` when MLflow may read it."""
    too_deep = f"the JSON body is nested deeper than the {MAX_JSON_DEPTH} levels a request may have"
    try:
        value = json.loads(body)
    except RecursionError:  # deeper than the parser's recursion limit (about 1,000 levels)
        return too_deep
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"the body is not valid JSON: {str(exc).splitlines()[0]}"
    return too_deep if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH else None


def refusal(status: int, code: str, message: str):
    """A JSON error response ``{"error_code", "message"}``."""
    from starlette.responses import Response

    body = json.dumps({"error_code": code, "message": message})
    return Response(content=body, status_code=status, media_type="application/json")


def too_large(limit: int, size: int | None):
    """The 413 of a body of ``size`` bytes (``None``: more than ``limit`` arrived, its size unsaid)."""
    said = f"has {size} bytes, over" if size is not None else "is over"
    return refusal(
        413,
        "REQUEST_TOO_LARGE",
        f"the request body {said} the {limit} bytes a request may have ({MAX_REQUEST_BYTES_VAR} where the program "
        "is served); send its records in several requests",
    )


def without_stack_trace(response):
    """``response`` itself, or, when it is an error whose JSON body has ``stack_trace``, one without it."""
    from starlette.responses import Response

    if response.status_code < 400 or not (response.media_type or "").startswith("application/json"):
        return response
    try:
        body = json.loads(response.body)
    except ValueError:
        return response
    if not isinstance(body, dict) or "stack_trace" not in body:
        return response
    body.pop("stack_trace")
    return Response(content=json.dumps(body), status_code=response.status_code, media_type="application/json")


async def read_body(request, limit: int) -> bytes | None:
    """The request's body, or ``None`` once more than ``limit`` bytes arrived (the rest is left unread)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def guarded(catch: Callable, limit: int) -> Callable:
    """MLflow's error handler ``catch`` (a decorator of the ``/invocations`` endpoint), wrapped: the endpoint it
    decorates first refuses the requests of the module docstring's table, then runs as MLflow built it over the
    body already read, and its error answers lose ``stack_trace``."""
    from starlette.requests import Request

    def decorate(endpoint: Callable) -> Callable:
        caught = catch(endpoint)

        @functools.wraps(endpoint)
        async def checked(request: Request):
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                return too_large(limit, int(declared))
            kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
            if not kind:
                return refusal(
                    415,
                    "UNSUPPORTED_MEDIA_TYPE",
                    "the request has no Content-Type; send application/json (or application/vnd.apache.parquet)",
                )
            if kind == CSV_TYPE:
                return refusal(
                    415,
                    "UNSUPPORTED_MEDIA_TYPE",
                    "Content-Type text/csv cannot carry a record's options (an object of letter -> text); send "
                    'application/json: {"dataframe_records": [{"question": "...", "options": {"A": "...", "B": '
                    '"..."}}]}',
                )
            body = await read_body(request, limit)
            if body is None:
                return too_large(limit, None)
            if kind in JSON_TYPES and (fault := await asyncio.to_thread(json_fault, body)):
                return refusal(400, "BAD_REQUEST", fault)
            sent = False

            async def replay() -> dict[str, Any]:
                nonlocal sent
                if sent:
                    return await request.receive()  # the client's disconnect
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            return without_stack_trace(await caught(Request(request.scope, replay)))

        return checked

    decorate.hcqr_guarded = True
    return decorate


def guard_scoring_server() -> bool:
    """Wrap MLflow's ``/invocations`` error handler with :func:`guarded` when this process is MLflow's scoring
    server building its app (``mlflow models serve``: its module ``mlflow.pyfunc.scoring_server.app`` is being
    run); nothing otherwise. Returns whether the server is guarded.

    Raises:
        HCQRError: ``HCQR_SERVE_MAX_REQUEST_BYTES`` is not a number of bytes, or this MLflow's scoring server has
            no error handler to wrap (the program is not served unguarded).
    """
    app_module = sys.modules.get(SCORING_APP)
    if app_module is None or hasattr(app_module, "app"):
        return False
    limit = max_request_bytes()
    from mlflow.pyfunc import scoring_server
    from mlflow.version import VERSION

    catch = getattr(scoring_server, ERROR_HANDLER, None)
    if catch is None:
        raise HCQRError(
            f"MLflow {VERSION}'s scoring server has no {ERROR_HANDLER}, which hcqr-dspy wraps to refuse oversized "
            "or malformed requests; serve with an MLflow 3 release that has it (3.17 does)"
        )
    if not getattr(catch, "hcqr_guarded", False):
        setattr(scoring_server, ERROR_HANDLER, guarded(catch, limit))
    return True
