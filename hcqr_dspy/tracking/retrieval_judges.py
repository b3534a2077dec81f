"""MLflow's built-in retrieval judges on a question's trace: ``RetrievalRelevance`` and ``RetrievalGroundedness``.

Both read the trace itself (``mlflow.genai.utils.trace_utils``): the request is the root span's inputs (question and
options), the response its outputs (:func:`~hcqr_dspy.tracking.question_traces.root_outputs`), and the retrieved
context every top-level ``RETRIEVER`` span's documents (one span per query: HCQR's three, Simple RAG's one; the fused
context is a ``RERANKER`` span and is not read). ``RetrievalRelevance`` asks the judge LM once per document, "is it
relevant to the question?", and gives a ``yes``/``no`` feedback per document plus ``retrieval_relevance/precision``
per span; ``RetrievalGroundedness`` asks once per span whether its documents support the response. Each call is one
chat completion whose reply is JSON ``{"rationale", "result": "yes"|"no"}``; MLflow retries a failed call 10 times
with doubling waits (about 3 minutes in all) before it raises.

MLflow names a judge model by URI and calls it through its own provider code, not LiteLLM's or DSPy's:
:func:`judge_endpoint` turns a ``--judge-lm`` spec into ``openai:/<model>`` at the spec's ``--api-base`` (any
OpenAI-compatible server: vLLM, llama-cpp-python's, a gateway) or at OpenAI's own endpoint for ``openai/<model>``
without one; MLflow reads that endpoint and its key from ``OPENAI_API_BASE`` and ``OPENAI_API_KEY``, which
:func:`endpoint_env` sets for the judging only. A local model (``local``, ``gguf:``) runs inside this process and
has no URI MLflow can call: :func:`hcqr_dspy.tracking.judge_server.served_endpoint` serves it over HTTP for the
judging and gives its endpoint, with the model file's name, SHA-256 and engine settings (:attr:`JudgeEndpoint.model`).
MLflow fetches its model catalog (token prices, context windows) from GitHub unless ``MLFLOW_MODEL_CATALOG_URI`` is
set; :func:`endpoint_env` sets it empty (the bundled catalog) when unset, so no other address is called.

Each feedback is logged on the trace with metadata ``source`` (:data:`FEEDBACK_SOURCE`), ``judge_lm`` (the spec)
and, for a local judge LM, ``judge_model_sha256`` (its model file's SHA-256); :func:`judge_trace` skips a trace that
holds a valid assessment of the scorer by the same judge LM (same spec and model file), and replaces (deletes,
judges again) ours of another judge LM or of a failed call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hcqr_dspy.errors import LMSpecError
from hcqr_dspy.lm.spec import LMConfig
from hcqr_dspy.redaction import redact, register_secret

FEEDBACK_SOURCE = "hcqr judge --mlflow-scorers"
"""The ``source`` metadata of the assessments :func:`judge_trace` logs."""
NO_KEY = "no-key"
"""``OPENAI_API_KEY`` for an endpoint given without ``--api-key-env`` (MLflow refuses an unset key; a server that
checks keys refuses this one): never a key of the environment's, which belongs to another endpoint."""
PROBE = (
    'Is this sentence written in English? Answer using only the following json format: {"rationale": "Reason for '
    'the assessment", "result": "yes|no"}'
)
"""The one question :func:`probe` asks, in the judges' reply format."""
OUTAGE_WORDS = ("Failed to connect to", "timed out after")
"""Words of MLflow's error once a call found no endpoint through all its retries (``send_chat_request``)."""


@dataclass(frozen=True)
class JudgeEndpoint:
    """A judge LM as MLflow calls it.

    Attributes:
        spec: The ``--judge-lm`` spec (recorded as the assessments' ``judge_lm``).
        model_uri: MLflow's model URI (``openai:/<model>``).
        api_base: The endpoint (``None``: OpenAI's own).
        api_key_env: The variable holding its key (``None``: :data:`NO_KEY`, or ``OPENAI_API_KEY`` for OpenAI's own).
        model: A local judge LM's model file and engine (``model_file``, ``model_sha256``, ``n_ctx``, ``build`` and
            :class:`~hcqr_dspy.lm.engine_settings.EngineSettings`' fields), served for the judging; ``None`` for
            a remote one.
    """

    spec: str
    model_uri: str
    api_base: str | None
    api_key_env: str | None
    model: dict[str, Any] | None = None

    def where(self) -> str:
        """Where calls go, for messages (never the key)."""
        if self.model is not None:
            return f"{self.api_base} (llama-cpp-python's server for {self.model['model_file']}, started to judge)"
        key = f" (key from ${self.api_key_env})" if self.api_key_env else " (no key variable)"
        return (self.api_base or "OpenAI's default endpoint") + key

    def identity(self) -> dict[str, str]:
        """The metadata that names this judge LM on its assessments: ``judge_lm`` and, for a local one,
        ``judge_model_sha256``."""
        if self.model is None:
            return {"judge_lm": self.spec}
        return {"judge_lm": self.spec, "judge_model_sha256": self.model["model_sha256"]}


def judge_endpoint(cfg: LMConfig) -> JudgeEndpoint:
    """MLflow's model URI and endpoint for a parsed ``--judge-lm`` (:func:`hcqr_dspy.lm.parse_lm_spec`).

    Raises:
        LMSpecError: a local model (in-process: :func:`hcqr_dspy.tracking.judge_server.served_endpoint` serves it);
            a provider other than ``openai`` without ``--api-base``; a key variable that is not set. One line each,
            saying what to give instead.
    """
    if cfg.kind != "litellm":
        raise LMSpecError(
            f"--judge-lm {cfg.spec}: a local model runs inside hcqr and has no URI MLflow's judges can call; "
            "serve it for the judging with hcqr_dspy.tracking.judge_server.served_endpoint"
        )
    provider, _, model = cfg.model.partition("/")
    if not cfg.api_base and provider != "openai":
        raise LMSpecError(
            f"--judge-lm {cfg.spec}: MLflow's judges are run here against an OpenAI-compatible endpoint: give "
            "its --api-base (vLLM, llama.cpp, a gateway), or use openai/<model> for OpenAI's own"
        )
    key_env = cfg.api_key_env or (None if cfg.api_base else "OPENAI_API_KEY")
    if key_env and not os.environ.get(key_env):
        raise LMSpecError(f"environment variable {key_env} (the API key for {cfg.model}) is not set")
    return JudgeEndpoint(cfg.spec, f"openai:/{model}", cfg.api_base, key_env)


@contextmanager
def endpoint_env(endpoint: JudgeEndpoint) -> Iterator[None]:
    """Within the block, MLflow's ``openai`` provider calls ``endpoint`` (``OPENAI_API_BASE``, ``OPENAI_API_KEY``;
    ``OPENAI_BASE_URL`` unset) and reads no model catalog from the network (``MLFLOW_MODEL_CATALOG_URI`` empty
    unless set); the variables are restored after it."""
    names = ("OPENAI_API_BASE", "OPENAI_BASE_URL", "OPENAI_API_KEY", "MLFLOW_MODEL_CATALOG_URI")
    saved = {n: os.environ.get(n) for n in names}
    key = os.environ[endpoint.api_key_env] if endpoint.api_key_env else NO_KEY
    if endpoint.api_key_env:
        register_secret(key)  # masked wherever an error would print it
    os.environ.pop("OPENAI_BASE_URL", None)
    os.environ.pop("OPENAI_API_BASE", None)
    if endpoint.api_base:
        os.environ["OPENAI_API_BASE"] = endpoint.api_base
    os.environ["OPENAI_API_KEY"] = key
    os.environ.setdefault("MLFLOW_MODEL_CATALOG_URI", "")
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def first_line(exc: BaseException) -> str:
    """An error's type and first line, redacted and cut to 300 characters."""
    return f"{type(exc).__name__}: {(redact(str(exc)).splitlines() or [''])[0][:300]}"


def probe(endpoint: JudgeEndpoint) -> None:
    """Ask the judge LM one question through MLflow's own judge call, without retries, inside :func:`endpoint_env`.

    Raises:
        LMSpecError: the call failed (nothing listening, a refused key, an unknown model, a reply not in the judges'
            JSON format): one line naming the spec, the endpoint and MLflow's error.
    """
    from mlflow.genai.judges.utils import invoke_judge_model

    try:
        invoke_judge_model(endpoint.model_uri, PROBE, assessment_name="probe", num_retries=0)
    except Exception as exc:  # MlflowException (connection, HTTP status, JSON), a KeyError for a reply without result
        raise LMSpecError(
            f"the judge LM {endpoint.spec} at {endpoint.where()} cannot be used by MLflow's judges: "
            f"{first_line(exc)}; nothing was judged"
        ) from None


def scorer(name: str, endpoint: JudgeEndpoint) -> Any:
    """MLflow's scorer ``name`` (``retrieval_relevance``, ``retrieval_groundedness``) with the judge model."""
    from mlflow.genai.scorers import RetrievalGroundedness, RetrievalRelevance

    kind = {"retrieval_relevance": RetrievalRelevance, "retrieval_groundedness": RetrievalGroundedness}[name]
    return kind(model=endpoint.model_uri)


def ours(assessment: Any, name: str) -> bool:
    """Whether ``assessment`` was logged by :func:`judge_trace` for the scorer ``name`` (its span feedbacks too)."""
    return (assessment.name == name or assessment.name.startswith(name + "/")) and (assessment.metadata or {}).get(
        "source"
    ) == FEEDBACK_SOURCE


def has_passages(trace: Any) -> bool:
    """Whether the trace has a ``RETRIEVER`` span with passage text (a ``light`` trace keeps none)."""
    from mlflow.genai.utils.trace_utils import extract_retrieval_context_from_trace

    spans = extract_retrieval_context_from_trace(trace)
    return any(str(chunk.get("content") or "").strip() for chunks in spans.values() for chunk in chunks)


def judge_trace(trace: Any, names: Sequence[str], endpoint: JudgeEndpoint) -> dict[str, str]:
    """Run the scorers ``names`` on one trace and log their feedback on it (inside :func:`endpoint_env`).

    Returns:
        Per scorer: ``judged``, ``already`` (a valid assessment by this judge LM is there), ``no_passages`` (no
        ``RETRIEVER`` span with passage text: a rebuilt or ``light`` trace) or ``failed: <error line>`` (an error
        feedback ``JUDGE_FAILED`` is logged in its place and the next judging retries it).

    Raises:
        LMUnavailableError: a call found no endpoint through MLflow's retries (:data:`OUTAGE_WORDS`).
    """
    import mlflow
    from mlflow.entities import AssessmentError, AssessmentSource, Feedback

    from hcqr_dspy.errors import LMUnavailableError

    who = endpoint.identity()
    meta = {"source": FEEDBACK_SOURCE, **who}
    outcome: dict[str, str] = {}
    for name in names:
        mine = [a for a in trace.info.assessments if ours(a, name)]
        if any(
            a.name == name and a.error is None and all((a.metadata or {}).get(k) == v for k, v in who.items())
            for a in mine
        ):
            if not any(a.error is not None for a in mine):
                outcome[name] = "already"
                continue
        if not has_passages(trace):
            outcome[name] = "no_passages"
            continue
        try:
            feedbacks = scorer(name, endpoint)(trace=trace)
        except Exception as exc:  # MlflowException from the call or its reply
            line = first_line(exc)
            if any(w in line for w in OUTAGE_WORDS):
                raise LMUnavailableError(
                    f"the judge LM {endpoint.spec} at {endpoint.where()} stopped answering ({line})"
                ) from None
            source = AssessmentSource(source_type="LLM_JUDGE", source_id=endpoint.model_uri)
            error = AssessmentError(error_code="JUDGE_FAILED", error_message=line)
            feedbacks = [Feedback(name=name, source=source, error=error)]
            outcome[name] = f"failed: {line}"
        for old in mine:  # another judge's, or a failed call's: replaced
            mlflow.delete_assessment(trace_id=trace.info.trace_id, assessment_id=old.assessment_id)
        for feedback in feedbacks if isinstance(feedbacks, list) else [feedbacks]:
            feedback.metadata = {**(feedback.metadata or {}), **meta}
            mlflow.log_assessment(trace_id=trace.info.trace_id, assessment=feedback)
        outcome.setdefault(name, "judged")
    return outcome


def question_values(trace: Any) -> dict[str, Any]:
    """The trace's values of :data:`hcqr_dspy.judge.mlflow_record.SCORERS` from the valid assessments of
    :func:`judge_trace`: the share of ``yes`` among the per-document (relevance) or per-span (groundedness)
    feedbacks, and under ``judge_lm`` each scorer's judge LM spec; ``{}`` when the trace holds none."""
    from hcqr_dspy.judge.mlflow_record import SCORERS

    values: dict[str, Any] = {}
    for name in SCORERS.values():
        found = [a for a in trace.info.assessments if a.name == name and ours(a, name) and a.error is None]
        if found:
            values[name] = sum(str(a.value).lower() == "yes" for a in found) / len(found)
            values.setdefault("judge_lm", {})[name] = (found[0].metadata or {}).get("judge_lm")
    return values
