"""A saved program as an MLflow pyfunc model: the Model Registry and ``mlflow models serve``.

The model is logged *from code* (``mlflow.pyfunc.log_model(python_model=<file>)``): its code is the
file :mod:`hcqr_dspy.tracking.served_model`, which builds :class:`ProgramModel`; nothing is pickled. Its
artifacts are the saved-program folder (``program.json`` and ``meta.json``, :mod:`hcqr_dspy.optimize.saved`,
the only format of a program) and, when the index is small (at most :data:`BUNDLE_INDEX_MAX_BYTES`),
the index folder itself. Its ``model_config`` says what the program needs to run:

=============  ===================================================================================
method         the saved program's method (informative; the program folder decides)
index          the index folder (an absolute path), or ``"bundled"`` when it is an artifact; ``None``
               for methods without retrieval
lm             the LM spec to answer with (:func:`hcqr_dspy.lm.build_lm`)
api_base       its API base (LiteLLM models), or ``None``
api_key_env    the *name* of the variable holding its API key (never the key), or ``None``
max_tokens     output tokens per LM call
n_ctx          context window of local models
=============  ===================================================================================

Environment variables override the config where the model is served: ``HCQR_SERVE_LM``,
``HCQR_SERVE_INDEX``, ``HCQR_SERVE_API_BASE``, ``HCQR_SERVE_API_KEY_ENV``.

Serving (MLflow's scoring server; ``--env-manager local`` uses the environment hcqr-dspy is installed in)::

    export MLFLOW_TRACKING_URI=sqlite:///$PWD/mlruns/mlflow.db
    mlflow models serve -m models:/hcqr-medqa/1 --env-manager local -h 127.0.0.1 -p 5001 -t 1800
    curl -s 127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
      -d '{"dataframe_records": [{"question": "A 70-year-old ...", "options": {"A": "...", "B": "..."}}]}'

A request is a batch of records ``{question, options[, qid]}`` (``dataframe_records``; in process,
``pyfunc.predict`` also takes a DataFrame, a list of such dicts or one dict). ``options`` is an object of
letter -> text (``{"A": "...", "B": "..."}``, at least two, labelled A, B, C ...); a list of texts is refused.
A record without a ``qid`` (missing, null, empty) gets its row number, from 0. Every record is checked before
the LM is asked anything, and each is answered or rejected on its own; ``predictions`` holds one record per
request record, in request order:

* answered: ``{qid, answer, answer_text, valid, error, hypothesis, queries, passages, rejected: null}``
  (passages: id, title, score and the queries that found them: :func:`hcqr_dspy.evaluation.rows.answer_record`), as
  ``hcqr predict`` writes them; ``valid``/``error`` are about the LM's reply;
* rejected (malformed, the LM not asked): ``{qid, answer: null, answer_text: null, valid: false, error: null,
  hypothesis: null, queries: [], passages: [], rejected: "<field>: <reason>"}``, where the field is
  ``record``, ``question``, ``options`` or ``options.<letter>``.

When no record of a request can be answered (a single malformed record, all of them, none at all), the whole
request is refused with HTTP 400 and the JSON body ``{"error_code": "INVALID_PARAMETER_VALUE", "message":
"no record of the request can be answered: record <row> (qid '<qid>'): <field>: <reason>; ...", "rejected":
[{"row", "qid", "field", "reason"}, ...]}`` (plus MLflow's ``sqlstate`` and ``error_class``): no stack trace,
no server path (:func:`request_rejected`). In process, ``pyfunc.predict`` raises that exception.

Before MLflow's scoring server reads a request, a body over 16 MiB is refused with HTTP 413, ``text/csv`` or no
``Content-Type`` with 415, JSON that is not JSON or nested more than 32 levels with 400, and MLflow's own error
answers lose their ``stack_trace`` (:mod:`hcqr_dspy.tracking.serve_guard`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from hcqr_dspy import __version__
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.lm import build_lm, parse_lm_spec
from hcqr_dspy.optimize.saved import SavedProgram, read_saved_program
from hcqr_dspy.programs.method_registry import PROGRAMS
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.tracking.model_signature import input_example, program_signature
from hcqr_dspy.tracking.serve_guard import guard_scoring_server
from hcqr_dspy.tracking.serve_runtime import (
    answer_all,
    request_deadline,
    serve_threads,
    served_model_tags,
    start_tracing,
    tracing_wanted,
)
from hcqr_dspy.tracking.served_requests import check_record, request_records, request_rejected

# An index folder up to this size travels with the model as an artifact; a larger one is named by path.
BUNDLE_INDEX_MAX_BYTES = 64 * 1024 * 1024
MODEL_CODE = Path(__file__).with_name("served_model.py")
# Seconds a request may take on `mlflow models serve` (its -t/--timeout), as the hints and README give it:
# MLflow's default (60 s, MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT) is shorter than one HCQR question with a
# local model on a CPU (three LM calls, minutes each), which it answers with "Request processing time exceeded
# limit" (HTTP 504).
SERVE_TIMEOUT_S = 1800
ENV_OVERRIDES = {
    "lm": "HCQR_SERVE_LM",
    "index": "HCQR_SERVE_INDEX",
    "api_base": "HCQR_SERVE_API_BASE",
    "api_key_env": "HCQR_SERVE_API_KEY_ENV",
}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


class ProgramModel:
    """The pyfunc model of a saved program (an ``mlflow.pyfunc.PythonModel``, built by
    :func:`python_model`; see the module docstring for its config)."""

    def load_context(self, context) -> None:
        """Load the program against its index and build its LM (once per serving process).

        In MLflow's scoring server it first guards the server's ``/invocations`` endpoint
        (:func:`hcqr_dspy.tracking.serve_guard.guard_scoring_server`: oversized, CSV and deeply nested requests
        refused with a 4xx, no stack trace in an error answer).

        Raises:
            HCQRError: the index or program cannot be loaded, the LM spec is unusable, or the scoring server cannot
                be guarded.
        """
        guard_scoring_server()
        config = {**(context.model_config or {})}
        for key, var in ENV_OVERRIDES.items():
            if os.environ.get(var):
                config[key] = os.environ[var]
        saved = read_saved_program(Path(context.artifacts["program"]))  # read once: meta.json and program.json
        meta = saved.meta
        index = config.get("index")
        if index == "bundled":
            index = context.artifacts["index"]
        retriever = None
        if PROGRAMS[meta["method"]].uses_retrieval:
            if not index:
                raise HCQRError(f"the {meta['method']} program needs an index: set {ENV_OVERRIDES['index']}")
            retriever = load_index(index)
        self.program, self.meta = saved.build(retriever), saved.described()
        self.config = config
        self.threads = serve_threads(config, parse_lm_spec(config["lm"]).kind)
        self.trace_tags = None
        if tracing_wanted():
            start_tracing()
            model_dir = Path(context.artifacts["program"]).parent.parent
            self.trace_tags = {
                "kind": "served",
                "method": self.meta["method"],
                "lm": config["lm"],
                **served_model_tags(str(model_dir) if (model_dir / "MLmodel").exists() else None),
            }
        self.lm = build_lm(
            config["lm"],
            max_tokens=int(config.get("max_tokens") or 1024),
            n_ctx=int(config.get("n_ctx") or 8192),
            api_base=config.get("api_base"),
            api_key_env=config.get("api_key_env"),
        )

    def predict(self, context, model_input, params=None) -> list[dict[str, Any]]:
        """Answer a batch of questions: ``model_input`` is a DataFrame (``dataframe_records``), a list of
        ``{question, options[, qid]}`` or one such dict; one record per question, answered or rejected (the
        module docstring gives both shapes). Every record is checked before the LM is asked anything; the
        questions then run in parallel under the request's deadline, each traced
        (:mod:`hcqr_dspy.tracking.serve_runtime`; ``params``: ``{"deadline_s": seconds}``).

        Raises:
            MlflowException: (HTTP 400, :func:`request_rejected`) no record of the request can be answered.
        """
        deadline = request_deadline(self.config, params)
        if not math.isfinite(deadline) or deadline <= 0:
            raise request_rejected([(None, None, "params.deadline_s", f"must be seconds above 0, got {deadline:g}")])
        checked = [check_record(row, record) for row, record in enumerate(request_records(model_input))]
        if not any(ex is not None for _, ex, _ in checked):
            faults = [(row, qid, *fault) for row, (qid, _, fault) in enumerate(checked)]
            raise request_rejected(faults or [(None, None, "request", "holds no records")])
        return answer_all(self.program, self.lm, self.meta["method"], checked, self.threads, deadline, self.trace_tags)


def python_model():
    """A :class:`ProgramModel` that is an ``mlflow.pyfunc.PythonModel`` (MLflow is imported only here)."""
    import mlflow.pyfunc

    class PyfuncProgramModel(ProgramModel, mlflow.pyfunc.PythonModel):
        pass

    return PyfuncProgramModel()


class _PyfuncFlavor:
    """``mlflow.pyfunc`` as ``Model.log``'s flavor: ``Model.log`` reads ``validate_serving_input`` from the keyword
    arguments it passes on to the flavor's ``save_model``, which ``mlflow.pyfunc.save_model`` refuses."""

    @staticmethod
    def save_model(validate_serving_input: bool = True, **kwargs):
        import mlflow.pyfunc

        return mlflow.pyfunc.save_model(**kwargs)


def log_program_model(
    folder: str | Path,
    lm: str,
    index: str | None = None,
    register: str | None = None,
    alias: str | None = None,
    max_tokens: int = 1024,
    n_ctx: int = 8192,
    api_base: str | None = None,
    api_key_env: str | None = None,
    name: str = "program",
    prompts: list[Any] | None = None,
    saved: SavedProgram | None = None,
) -> dict[str, Any]:
    """Log a saved program as a pyfunc model of the active MLflow run, with its signature and input example
    (:mod:`hcqr_dspy.tracking.model_signature`), and register it if asked.

    Args:
        folder: The saved-program folder.
        lm, api_base, api_key_env, max_tokens, n_ctx: The LM it answers with (the model config).
        index: Its index folder (bundled as an artifact when at most :data:`BUNDLE_INDEX_MAX_BYTES`).
        register: Register it in the Model Registry under this name (a new version, tagged with the program's
            ``recipe`` (``none`` for a zero-shot one), ``method`` and, where ``meta.json`` has them,
            ``compile_run_id`` and the compile's ``seed``).
        alias: Give that version this alias (``models:/NAME@ALIAS``); needs ``register``.
        name: The logged model's name.
        prompts: Prompt Registry versions (``prompts:/NAME/VERSION`` or ``PromptVersion``) to link to the model.
        saved: The program in ``folder`` as the caller read it (:class:`~hcqr_dspy.optimize.saved.SavedProgram`);
            ``None``: read here.

    Returns:
        ``{"model_uri", "model_id" (the LoggedModel's id), "registered": "models:/NAME/VERSION" or None, "version",
        "index": "bundled"|path|None}``.

    Raises:
        HCQRError: ``alias`` without ``register``.
    """
    import mlflow
    import mlflow.pyfunc
    from mlflow.models import Model

    if alias and not register:
        raise HCQRError("an alias needs a registered model name (--register NAME)")
    meta = (saved or read_saved_program(folder)).meta
    artifacts = {"program": str(Path(folder).resolve())}
    index_ref = None
    if index:
        if folder_bytes(Path(index)) <= BUNDLE_INDEX_MAX_BYTES:
            artifacts["index"], index_ref = str(Path(index).resolve()), "bundled"
        else:
            index_ref = str(Path(index).resolve())
    config = {
        "method": meta["method"],
        "index": index_ref,
        "lm": lm,
        "api_base": api_base,
        "api_key_env": api_key_env,
        "max_tokens": max_tokens,
        "n_ctx": n_ctx,
    }
    # Model.log rather than pyfunc.log_model: only it can skip MLflow's check of the input example, which loads the
    # model and answers the example with the LM (minutes of a local model, a paid call of a remote one).
    info = Model.log(
        artifact_path=None,
        flavor=_PyfuncFlavor,
        flavor_name="mlflow.pyfunc",
        validate_serving_input=False,
        signature=program_signature(),
        input_example=input_example(),
        prompts=prompts or None,
        name=name,
        python_model=str(MODEL_CODE),
        artifacts=artifacts,
        model_config=config,
        pip_requirements=[f"hcqr-dspy=={__version__}"],
        registered_model_name=register,
        metadata={
            "hcqr_dspy_program": {
                "method": meta["method"],
                "optimizer": meta.get("optimizer"),
                "recipe": (meta.get("recipe") or {}).get("name"),
            }
        },
    )
    version = getattr(info, "registered_model_version", None)
    if register:
        client = mlflow.MlflowClient()
        # what the version holds, for the registry's filters (`tags.recipe = 'mipro_light'`) and the method check
        # of `hcqr register`; the compile that made it, where meta.json records one
        recipe = (meta.get("recipe") or {}).get("name") or "none"
        seed = (meta.get("recipe") or {}).get("seed")
        tags = [("recipe", recipe), ("method", meta["method"]), ("compile_run_id", meta["mlflow_run_id"])]
        for key, value in [*tags, ("seed", None if seed is None else str(seed))]:
            if value:
                client.set_model_version_tag(register, str(version), key, value)
        if alias:
            client.set_registered_model_alias(register, alias, str(version))
    return {
        "model_uri": info.model_uri,
        "model_id": info.model_id,
        "registered": f"models:/{register}/{version}" if register else None,
        "version": version,
        "index": index_ref,
    }


def program_folder_of_model(model_dir: str | Path) -> Path:
    """The saved-program folder inside a downloaded pyfunc model of :func:`log_program_model`.

    Raises:
        HCQRError: the model is not one (no ``program`` artifact).
    """
    from mlflow.models import Model

    model_dir = Path(model_dir)
    try:
        flavor = Model.load(str(model_dir)).flavors.get("python_function") or {}
    except Exception as exc:  # MlflowException, OSError: not a model folder
        raise HCQRError(f"{model_dir} is not an MLflow model ({exc})") from None
    program = (flavor.get("artifacts") or {}).get("program")
    if not program:
        raise HCQRError(
            f"the MLflow model at {model_dir} holds no hcqr-dspy program (no 'program' artifact); "
            "log programs with `hcqr compile --register NAME`"
        )
    return model_dir / program["path"]
