"""A saved program as an MLflow pyfunc model: the Model Registry and ``mlflow models serve``.

The model is logged *from code* (``mlflow.pyfunc.log_model(python_model=<file>)``): its code is the
file :mod:`hcqr_dspy.served_model`, which builds :class:`ProgramModel`; nothing is pickled. Its
artifacts are the saved-program folder (``program.json`` and ``meta.json``, :mod:`hcqr_dspy.program_io`,
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

Each answer is ``{qid, answer, answer_text, valid, error, hypothesis, queries, passages}`` (passages:
id, title, score and the queries that found them: :func:`hcqr_dspy.evaluate.answer_record`), as
``hcqr predict`` writes them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError

# An index folder up to this size travels with the model as an artifact; a larger one is named by path.
BUNDLE_INDEX_MAX_BYTES = 64 * 1024 * 1024
MODEL_CODE = Path(__file__).with_name("served_model.py")
# Seconds a request may take on `mlflow models serve` (its -t/--timeout), as the hints and README give it:
# MLflow's default (60 s, MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT) is shorter than one HCQR question with a
# local model on a CPU (three LM calls; 2 to 30 minutes measured on 2 shared cores), which it answers with
# "Request processing time exceeded limit" (HTTP 504).
SERVE_TIMEOUT_S = 1800
ENV_OVERRIDES = {"lm": "HCQR_SERVE_LM", "index": "HCQR_SERVE_INDEX", "api_base": "HCQR_SERVE_API_BASE",
                 "api_key_env": "HCQR_SERVE_API_KEY_ENV"}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


class ProgramModel:
    """The pyfunc model of a saved program (an ``mlflow.pyfunc.PythonModel``, built by
    :func:`python_model`; see the module docstring for its config)."""

    def load_context(self, context) -> None:
        """Load the program against its index and build its LM (once per serving process).

        Raises:
            HCQRError: the index or program cannot be loaded, or the LM spec is unusable.
        """
        from hcqr_dspy.lm import build_lm
        from hcqr_dspy.program_io import load_program, read_meta
        from hcqr_dspy.programs import PROGRAMS
        from hcqr_dspy.retrieval import load_index

        config = {**(context.model_config or {})}
        for key, var in ENV_OVERRIDES.items():
            if os.environ.get(var):
                config[key] = os.environ[var]
        folder = Path(context.artifacts["program"])
        meta = read_meta(folder)
        index = config.get("index")
        if index == "bundled":
            index = context.artifacts["index"]
        retriever = None
        if PROGRAMS[meta["method"]].uses_retrieval:
            if not index:
                raise HCQRError(f"the {meta['method']} program needs an index: set {ENV_OVERRIDES['index']}")
            retriever = load_index(index)
        self.program, self.meta = load_program(folder, retriever)
        self.lm = build_lm(config["lm"], max_tokens=int(config.get("max_tokens") or 1024),
                           n_ctx=int(config.get("n_ctx") or 8192), api_base=config.get("api_base"),
                           api_key_env=config.get("api_key_env"))

    def predict(self, context, model_input, params=None) -> list[dict[str, Any]]:
        """Answer questions: ``model_input`` is a DataFrame (``dataframe_records``) or a list of
        ``{question, options[, qid]}``; one answer record per question (:func:`answer_record`).

        Raises:
            HCQRError: a malformed question (one line naming it).
        """
        import dspy

        from hcqr_dspy.data import check_question
        from hcqr_dspy.evaluate import answer_record

        records = model_input.to_dict(orient="records") if hasattr(model_input, "to_dict") else list(model_input)
        out = []
        for i, record in enumerate(records):
            qid = str(record.get("qid") or i)
            ex = check_question(qid, {k: v for k, v in record.items() if k != "answer"}, "request", labelled=False)
            with dspy.context(lm=self.lm, adapter=dspy.JSONAdapter()):
                pred = self.program(question=ex.question, options=ex.options)
            out.append(answer_record(qid, ex.options, pred.get("answer"), bool(pred.get("valid")), pred.get("error"),
                                     pred.get("hypothesis"), pred.get("queries"), pred.get("passages")))
        return out


def python_model():
    """A :class:`ProgramModel` that is an ``mlflow.pyfunc.PythonModel`` (MLflow is imported only here)."""
    import mlflow.pyfunc

    class PyfuncProgramModel(ProgramModel, mlflow.pyfunc.PythonModel):
        pass

    return PyfuncProgramModel()


def log_program_model(folder: str | Path, lm: str, index: str | None = None, register: str | None = None,
                      alias: str | None = None, max_tokens: int = 1024, n_ctx: int = 8192, api_base: str | None = None,
                      api_key_env: str | None = None, name: str = "program") -> dict[str, Any]:
    """Log a saved program as a pyfunc model of the active MLflow run, and register it if asked.

    Args:
        folder: The saved-program folder.
        lm, api_base, api_key_env, max_tokens, n_ctx: The LM it answers with (the model config).
        index: Its index folder (bundled as an artifact when at most :data:`BUNDLE_INDEX_MAX_BYTES`).
        register: Register it in the Model Registry under this name (a new version).
        alias: Give that version this alias (``models:/NAME@ALIAS``); needs ``register``.
        name: The logged model's name.

    Returns:
        ``{"model_uri", "registered": "models:/NAME/VERSION" or None, "version", "index": "bundled"|path|None}``.

    Raises:
        HCQRError: ``alias`` without ``register``.
    """
    import mlflow
    import mlflow.pyfunc

    from hcqr_dspy import __version__
    from hcqr_dspy.program_io import read_meta

    if alias and not register:
        raise HCQRError("an alias needs a registered model name (--register NAME)")
    meta = read_meta(folder)
    artifacts = {"program": str(Path(folder).resolve())}
    index_ref = None
    if index:
        if folder_bytes(Path(index)) <= BUNDLE_INDEX_MAX_BYTES:
            artifacts["index"], index_ref = str(Path(index).resolve()), "bundled"
        else:
            index_ref = str(Path(index).resolve())
    config = {"method": meta["method"], "index": index_ref, "lm": lm, "api_base": api_base, "api_key_env": api_key_env,
              "max_tokens": max_tokens, "n_ctx": n_ctx}
    info = mlflow.pyfunc.log_model(
        name=name, python_model=str(MODEL_CODE), artifacts=artifacts, model_config=config,
        pip_requirements=[f"hcqr-dspy=={__version__}"], registered_model_name=register,
        metadata={"hcqr_dspy_program": {"method": meta["method"], "optimizer": meta.get("optimizer"),
                                        "recipe": (meta.get("recipe") or {}).get("name")}},
    )
    version = getattr(info, "registered_model_version", None)
    if register and alias:
        mlflow.MlflowClient().set_registered_model_alias(register, alias, str(version))
    return {"model_uri": info.model_uri, "registered": f"models:/{register}/{version}" if register else None,
            "version": version, "index": index_ref}


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
        raise HCQRError(f"the MLflow model at {model_dir} holds no hcqr-dspy program (no 'program' artifact); "
                        "log programs with `hcqr compile --register NAME`")
    return model_dir / program["path"]
