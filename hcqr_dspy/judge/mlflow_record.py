"""The record of MLflow's built-in retrieval judges in a run folder: ``mlflow_judges.json``.

``hcqr judge --mlflow-scorers`` runs ``mlflow.genai.scorers.RetrievalRelevance`` and ``RetrievalGroundedness`` on a
tracked run's question traces (:mod:`hcqr_dspy.tracking.retrieval_judges`); their assessments live on the traces, and
this file keeps what ``hcqr compare`` reads without an MLflow store, rebuilt from the traces at each judging:

* ``questions``: ``{qid: {scorer: value, "judge_lm": {scorer: spec}}}``, each value in [0, 1]: for
  ``retrieval_relevance`` the share of the question's retrieved passages (every ``RETRIEVER`` span's documents, before
  fusion) the judge called relevant to the question; for ``retrieval_groundedness`` the share of its ``RETRIEVER``
  spans whose passages the judge said support the trace's response (the root span's outputs: the answer letter and,
  for HCQR, hypothesis and queries); ``judge_lm`` the ``--judge-lm`` of the assessments each value comes from;
* ``judges``: ``{scorer: [judge LM specs]}`` over every question;
* ``model``, ``api_base``: the MLflow model URI and endpoint of the last judging;
* ``judge_model``: the last judging's local judge LM (``model_file``, ``model_sha256``, ``n_ctx``, ``build`` and
  the engine settings of the llama-cpp-python server it was served by), ``null`` for a remote one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from hcqr_dspy.errors import HCQRError

MLFLOW_JUDGES_FILE = "mlflow_judges.json"
SCORERS = {"relevance": "retrieval_relevance", "groundedness": "retrieval_groundedness"}
"""``--mlflow-scorers`` names -> the MLflow scorer's (and its assessments') name."""
LABELS = {"retrieval_relevance": "retrieval relevance", "retrieval_groundedness": "retrieval groundedness"}


def scorer_names(choice: str) -> list[str]:
    """The MLflow scorer names of a ``--mlflow-scorers`` value (comma-separated ``relevance``, ``groundedness``).

    Raises:
        HCQRError: an empty list or an unknown name (one line naming the choices).
    """
    names = [n.strip() for n in choice.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCORERS]
    if not names or unknown:
        raise HCQRError(
            f"--mlflow-scorers {choice!r}: choose from {', '.join(SCORERS)} (comma-separated; default both)"
        )
    return [SCORERS[n] for n in dict.fromkeys(names)]


def means(record: Mapping[str, Any], qids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per scorer over the record's questions (or only ``qids``): ``mean``, its standard error ``se`` (sample
    standard deviation / sqrt(n); ``None`` for one question) and ``n``; scorers no question has are left out."""
    questions = record.get("questions") or {}
    keep = set(questions) if qids is None else set(qids) & set(questions)
    out: dict[str, dict[str, Any]] = {}
    for scorer in SCORERS.values():
        values = [float(questions[q][scorer]) for q in sorted(keep) if questions[q].get(scorer) is not None]
        if not values:
            continue
        n = len(values)
        mean = sum(values) / n
        se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else None
        out[scorer] = {"mean": mean, "se": se, "n": n}
    return out
