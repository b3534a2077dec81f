"""The MLflow model signature and input example of a logged program
(:func:`hcqr_dspy.tracking.serving.log_program_model`).

Inputs are the records of a request (MLflow's column-based signature, ``mlflow.types.schema``):

=========  ===============================================================================================
question   string, required
options    an object of option letter -> text; ``A`` and ``B`` required, ``C`` ... ``Z`` optional (the
           labels :data:`hcqr_dspy.data.LETTERS` allows). An ``Object`` rather than a ``Map`` type: with an
           ``Object`` column MLflow's schema enforcement reads one dict as one record
           (``mlflow.models.utils._enforce_schema``), so ``pyfunc.predict({"question": ..., "options": ...})``
           works; with a ``Map`` it would read the dict as columns.
qid        optional, any type (text or a number, returned as text; a record without one gets its row number)
=========  ===============================================================================================

MLflow enforces the types and required fields before the model sees a request (a request that breaks them is
answered with HTTP 400, ``error_class: SCHEMA_ENFORCEMENT_FAILED``); the model then checks what a schema cannot say
(labels that skip a letter, empty texts) record by record (:func:`hcqr_dspy.tracking.served_requests.record_fault`).

Params: ``deadline_s``, the seconds a request may take (:mod:`hcqr_dspy.tracking.serve_runtime`), sent as
``{"params": {"deadline_s": 120}}`` beside the records.

Outputs are one record per request record, as :func:`hcqr_dspy.evaluation.rows.answer_record` writes it plus
``rejected``. MLflow does not enforce output schemas of pyfunc models; this one documents the shape.
"""

from __future__ import annotations

from typing import Any

from hcqr_dspy.data import LETTERS

REQUIRED_LETTERS = 2
HYPOTHESIS_FIELDS = ("working_hypothesis", "discriminating_features", "confirming_evidence", "reasoning")
INPUT_EXAMPLE = [
    {
        "qid": "example-1",
        "question": "Which organ stores urine until it is released?",
        "options": {"A": "Bladder", "B": "Kidney", "C": "Ureter", "D": "Urethra"},
    }
]


def program_signature():
    """The ``mlflow.models.ModelSignature`` of a logged program (see the module docstring)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, Array, ColSpec, DataType, Object, ParamSchema, ParamSpec, Property, Schema

    from hcqr_dspy.tracking.serve_runtime import DEFAULT_DEADLINE_S

    options = Object(
        [Property(letter, DataType.string, required=i < REQUIRED_LETTERS) for i, letter in enumerate(LETTERS)]
    )
    hypothesis = Object([Property(name, DataType.string, required=False) for name in HYPOTHESIS_FIELDS])
    passage = Object(
        [
            Property("id", DataType.string),
            Property("title", DataType.string),
            Property("score", DataType.double, required=False),
            Property("found_by", Array(DataType.string), required=False),
        ]
    )
    inputs = Schema(
        [
            ColSpec(DataType.string, "question"),
            ColSpec(options, "options"),
            ColSpec(AnyType(), "qid", required=False),
        ]
    )
    outputs = Schema(
        [
            ColSpec(DataType.string, "qid"),
            ColSpec(DataType.string, "answer", required=False),
            ColSpec(DataType.string, "answer_text", required=False),
            ColSpec(DataType.boolean, "valid"),
            ColSpec(DataType.string, "error", required=False),
            ColSpec(hypothesis, "hypothesis", required=False),
            ColSpec(Array(DataType.string), "queries", required=False),
            ColSpec(Array(passage), "passages", required=False),
            ColSpec(DataType.string, "rejected", required=False),
        ]
    )
    params = ParamSchema([ParamSpec("deadline_s", DataType.double, DEFAULT_DEADLINE_S)])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def input_example() -> list[dict[str, Any]]:
    """A request of one record, as the model's ``input_example`` (shown in the UI and by ``mlflow models``)."""
    return [dict(record, options=dict(record["options"])) for record in INPUT_EXAMPLE]
