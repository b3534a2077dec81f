"""The run ``hcqr compare --mlflow-dir`` records is linked to what its runs evaluated: their question sets (the same
MLflow datasets, name and content digest) and their models are its inputs (two real tracked evaluations in a SQLite
MLflow store, read back through MLflow's client)."""

import json

import dspy
import mlflow
from dspy.utils import DummyLM

from hcqr_dspy.cli.main import main
from hcqr_dspy.retrieval import BM25Retriever
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}


def test_the_comparison_run_takes_its_runs_question_sets_and_models_as_inputs(
    tmp_path, tiny_corpus, mlflow_store, capsys
):
    index = BM25Retriever(tiny_corpus, show_progress=False).save(tmp_path / "idx")
    qs = {
        f"t{i}": {"question": f"Case {i}: yellow halos?", "options": OPTIONS, "answer": "AB"[i % 2]} for i in range(4)
    }
    (tmp_path / "qs.json").write_text(json.dumps(qs))
    arms = {}
    for method in ("simple_rag", "cot"):
        lm = DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())
        spec = EvalSpec(
            method=method,
            dataset=str(tmp_path / "qs.json"),
            index=str(index) if method != "cot" else None,
            lm="openai/dummy",
            run_dir=str(tmp_path / method),
        )
        _, _, run_id = run_evaluation(spec, mlflow_dir=mlflow_store, progress=False, lm=lm, traces="off")
        arms[method] = mlflow.get_run(run_id)
    out = tmp_path / "comparison"
    argv = ["compare", str(tmp_path / "simple_rag"), str(tmp_path / "cot"), "--reference", "simple_rag"]
    assert main([*argv, "--out", str(out), "--mlflow-dir", str(mlflow_store)]) == 0
    run_id = capsys.readouterr().err.split("MLflow run ")[1].split()[0]
    run = mlflow.get_run(run_id)
    # the question set: the dataset both evaluations logged (one content digest), an input of the comparison
    logged = {(d.dataset.name, d.dataset.digest) for arm in arms.values() for d in arm.inputs.dataset_inputs}
    assert len(logged) == 1
    assert {(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs} == logged
    [entry] = run.inputs.dataset_inputs
    assert {t.key: t.value for t in entry.tags}["mlflow.data.context"] == "comparison"
    # the models: each evaluation's (zero-shot programs: one external model per method), inputs and tags
    models = {label: arm.data.tags["model_id"] for label, arm in arms.items()}
    assert len(set(models.values())) == 2 and all(m.startswith("m-") for m in models.values())
    assert {m.model_id for m in run.inputs.model_inputs} == set(models.values())
    assert {label: run.data.tags[f"model.{label}"] for label in models} == models
