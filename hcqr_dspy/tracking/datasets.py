"""A question set as an MLflow evaluation dataset (``mlflow.genai.datasets``): the input of an evaluation's
MLflow run."""

from __future__ import annotations

import json

from hcqr_dspy.data_sources import POSITION_TAG
from hcqr_dspy.tracking.store import store_lock


def questions_dataset(questions, name: str, experiment_id: str):
    """The MLflow evaluation dataset of a question set (``mlflow.genai.datasets``), created on first use.

    One record per question (:func:`question_records`): inputs ``question`` and ``options``, the expectation
    ``answer`` (the gold letter, when the question has one) and the tags ``qid`` and ``position`` (its place in
    ``questions``, 0, 1, ...: MLflow returns records in no set order). The same question set reuses its dataset;
    ``hcqr eval --dataset mlflow:NAME`` reads it back as the same questions in the same order
    (:mod:`hcqr_dspy.data_sources`).

    Args:
        questions: The questions (``dspy.Example`` with ``qid``, ``question``, ``options``, ``answer``).
        name: The dataset's name: the benchmark's name and the question set's content fingerprint
            (``medqa-1a2b3c4d5e6f``), so that another sample is another dataset.
        experiment_id: The experiment it belongs to.

    Returns:
        The ``mlflow.genai.datasets.EvaluationDataset``.
    """
    from mlflow.genai import datasets

    def find():
        found = datasets.search_datasets(
            experiment_ids=[experiment_id], filter_string=f"name = '{name}'", max_results=1
        )
        return found[0] if found else None

    dataset = find()
    if dataset is not None and dataset.has_records():
        return dataset
    with store_lock(".datasets.lock"):  # two processes filling one new dataset break its unique records
        dataset = find()
        if dataset is not None and dataset.has_records():
            return dataset
        return _fill_dataset(dataset, questions, name, experiment_id, find)


def _fill_dataset(dataset, questions, name: str, experiment_id: str, find):
    from mlflow.genai import datasets

    if dataset is None:
        try:
            dataset = datasets.create_dataset(name=name, experiment_id=experiment_id, tags={"source": "hcqr-dspy"})
        except Exception:  # another process created it first (unique name): use that one
            dataset = find()
            if dataset is None:
                raise
    dataset.merge_records(question_records(questions))
    return dataset


def question_records(questions) -> list[dict]:
    """The records of :func:`questions_dataset`, one per question in order.

    MLflow keeps one record per distinct inputs (a record whose inputs equal an earlier one's replaces it), so a
    question whose text and options repeat an earlier question's (MMLU-Med holds 78 such pairs under other ids)
    also gets its ``qid`` among its inputs: every question keeps a record of its own.
    """
    seen: set[str] = set()
    records = []
    for position, q in enumerate(questions):
        inputs = {"question": q.question, "options": dict(q.options)}
        key = json.dumps(inputs, sort_keys=True)
        if key in seen:
            inputs["qid"] = str(q.qid)
        seen.add(key)
        records.append(
            {
                "inputs": inputs,
                **({"expectations": {"answer": q.answer}} if q.answer is not None else {}),
                "tags": {"qid": str(q.qid), POSITION_TAG: str(position)},
            }
        )
    return records


def question_set_entity(dataset, digest: str):
    """``dataset`` (an MLflow evaluation dataset) as the ``mlflow.entities.Dataset`` a run logs, under ``digest``, a
    digest of its questions' content.

    MLflow's own digest of an evaluation dataset is the time of its last change (``SqlAlchemyStore``'s
    ``_compute_dataset_digest``) and changes as evaluations use it, so runs of one question set would show as many
    digests as runs; this one names the content.
    """
    from mlflow.entities import Dataset

    return Dataset(
        name=dataset.name,
        digest=digest,
        source_type=dataset.source_type,
        source=dataset.source.to_json(),
        schema=dataset.schema,
        profile=dataset.profile,
    )


def log_question_set(dataset, digest: str, context: str) -> None:
    """Log :func:`question_set_entity` as an input of the active run with the input context ``context``
    (``evaluation`` or ``prediction``). Pass the same digest to :func:`hcqr_dspy.tracking.scorers.score_rows`."""
    import mlflow
    from mlflow.entities import DatasetInput, InputTag

    run_id = mlflow.active_run().info.run_id
    tags = [InputTag(key="mlflow.data.context", value=context)]
    entity = question_set_entity(dataset, digest)
    mlflow.MlflowClient().log_inputs(run_id, datasets=[DatasetInput(dataset=entity, tags=tags)])
