"""Experiment files: validation before any LM call, a grid with parent/child MLflow runs, resume, comparison."""

import json

import dspy
import mlflow
import pytest
from dspy.utils import DummyLM

from helpers import TINY_ROWS, snippet, write_jsonl
from hcqr_dspy.experiment import ExperimentError, load_experiment, run_experiment
from hcqr_dspy.retrieval import BM25Retriever, load_corpus


@pytest.fixture
def setup(tmp_path):
    corpus = load_corpus(write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    BM25Retriever(corpus, show_progress=False).save(tmp_path / "idx")
    for name in ("d1", "d2"):
        rows = {f"{name}-{i}": {"question": f"Digoxin yellow vision case {name} {i}?",
                                "options": {"A": "Digoxin toxicity", "B": "Graves"}, "answer": "A"} for i in range(3)}
        (tmp_path / f"{name}.json").write_text(json.dumps(rows))
    return tmp_path


def write_exp(folder, **overrides):
    spec = {
        "name": "grid", "lm": "openai/test-model", "index": "idx", "budget": 3,
        "questions": {"limit": 2, "seed": 1}, "datasets": {"d1": "d1.json", "d2": "d2.json"},
        "methods": ["cot", "simple_rag", "hcqr"], "reference": "simple_rag",
        "method_options": {"hcqr": {"k_per_query": 2}},
    }
    spec.update(overrides)
    import yaml

    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"metods": ["cot"]}, r"unknown key\(s\) metods; valid keys: .*methods"),
        ({"methods": ["cot", "magic"]}, r"unknown method\(s\) magic; valid methods: cot, simple_rag, hcqr"),
        ({"datasets": {"d1": "nope.json"}}, r"dataset 'd1' file .*nope.json not found"),
        ({"index": "missing"}, "is not an hcqr index folder"),
        ({"lm": "gpt4"}, "unknown --lm spec"),
        ({"method_options": {"hcqr": {"k_per_qurey": 2}}}, r"unknown option\(s\) k_per_qurey for method 'hcqr'"),
        ({"questions": {"limt": 3}}, r"unknown questions key\(s\) limt"),
        ({"reference": "hyde"}, "reference 'hyde' is not one of the methods"),
    ],
)
def test_bad_experiment_files_fail_before_any_lm_call(setup, overrides, message):
    with pytest.raises(ExperimentError, match=message):
        load_experiment(write_exp(setup, **overrides))


def routed_lm():
    return DummyLM(
        {
            "`support_query`": {"support_query": "digoxin toxicity", "distinction_query": "digoxin versus graves",
                                "key_feature_query": "yellow vision"},
            "`discriminating_features`": {"discriminating_features": "yellow vision", "reasoning": "r",
                                          "working_hypothesis": "A", "confirming_evidence": "glycoside"},
            "`answer`": {"reasoning": "r", "answer": "A"},
        },
        adapter=dspy.JSONAdapter(),
    )


def test_grid_runs_cells_as_child_runs_resumes_and_compares(setup, mlflow_store):
    exp = load_experiment(write_exp(setup))
    lm = routed_lm()
    out = run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=lm)
    assert set(out["cells"]) == {"d1", "d2"} and set(out["cells"]["d1"]) == {"cot", "simple_rag", "hcqr"}
    assert all(m["n"] == 2 and m["accuracy"] == 1.0 for cells in out["cells"].values() for m in cells.values())
    report = (setup / "runs" / "grid" / "d1" / "comparison" / "comparison.md").read_text()
    assert "reference: simple_rag" in report
    client = mlflow.MlflowClient()
    children = client.search_runs(
        [mlflow.get_experiment_by_name("hcqr-dspy").experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'",
    )
    assert len(children) == 6
    assert {c.data.params["program.budget"] for c in children} == {"3"}
    calls = len(lm.history)
    again = run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=lm)
    assert again["parent_run_id"] == out["parent_run_id"] and len(lm.history) == calls  # all resumed


def test_a_subset_of_the_datasets_can_be_run(setup):
    exp = load_experiment(write_exp(setup), only_datasets=["d1"])
    assert list(exp.datasets) == ["d1"]
    with pytest.raises(ExperimentError, match=r"unknown dataset\(s\) mmlu; the file has d1, d2"):
        load_experiment(write_exp(setup), only_datasets=["mmlu"])
