"""MLflow tracking of evaluations: params, metrics, artifacts; a resumed run continues its MLflow run."""

import json

import dspy
import mlflow
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.errors import LMUnavailableError
from hcqr_dspy.programs.cot import CoT
from hcqr_dspy.tracking.mlflow_runs import flatten
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec


@pytest.fixture
def bench(tmp_path):
    rows = {
        f"t{i}": {"question": f"Tracked question {i}?", "options": {"A": "a", "B": "b"}, "answer": "A"}
        for i in range(3)
    }
    path = tmp_path / "tiny_bench.json"
    path.write_text(json.dumps(rows))
    return path


def dummy():
    return DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())


def test_run_logged_with_params_metrics_artifacts(bench, tmp_path, mlflow_store):
    spec = EvalSpec(
        method="cot",
        dataset=str(bench),
        lm="openai/test-model",
        api_key_env="SOME_KEY_VAR",
        run_dir=str(tmp_path / "run"),
    )
    result, run_dir, run_id = run_evaluation(spec, mlflow_dir=mlflow_store, progress=False, lm=dummy())
    run = mlflow.get_run(run_id)
    assert run.data.metrics["accuracy"] == 1.0 and run.data.metrics["n"] == 3
    assert run.data.params["lm.spec"] == "openai/test-model"
    assert run.data.params["lm.api_key_env"] == "SOME_KEY_VAR"
    assert run.data.params["questions.count"] == "3"
    assert run.data.tags["method"] == "cot"
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "run")}
    assert {"run/config.json", "run/predictions.jsonl", "run/metrics.json"} <= names


def test_resumed_evaluation_continues_its_mlflow_run(bench, tmp_path, mlflow_store, monkeypatch):
    spec = EvalSpec(method="cot", dataset=str(bench), lm="openai/test-model", run_dir=str(tmp_path / "run"))
    calls = {"n": 0}
    real_forward = CoT.forward

    def flaky(self, question, options):
        calls["n"] += 1
        if calls["n"] == 2:
            from dspy.utils.exceptions import LMTransportError

            raise LMTransportError("down", model="test")
        return real_forward(self, question, options)

    monkeypatch.setattr(CoT, "forward", flaky)
    with pytest.raises(LMUnavailableError):
        run_evaluation(spec, mlflow_dir=mlflow_store, progress=False, lm=dummy())
    first_id = json.loads((tmp_path / "run" / "config.json").read_text())["mlflow_run_id"]
    assert mlflow.get_run(first_id).info.status == "FAILED"

    result, _, run_id = run_evaluation(spec, mlflow_dir=mlflow_store, progress=False, lm=dummy())
    assert run_id == first_id and result.resumed == 1 and result.ran == 2
    run = mlflow.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["n"] == 3


def test_flatten_nested_config():
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1, 2]}) == {"a.b": "1", "a.c.d": "None", "e": "[1, 2]"}


def test_dspy_traces_reach_mlflow(bench, tmp_path, mlflow_store):
    spec = EvalSpec(method="cot", dataset=str(bench), lm="openai/test-model", run_dir=str(tmp_path / "run"))
    _, _, run_id = run_evaluation(spec, mlflow_dir=mlflow_store, progress=False, lm=dummy())
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    traces = mlflow.search_traces(locations=[experiment_id], run_id=run_id, return_type="list")
    assert len(traces) >= 3  # one per question at least


def test_resume_after_the_store_moved_tracks_a_new_run(bench, tmp_path, tmp_path_factory):
    spec = EvalSpec(method="cot", dataset=str(bench), lm="openai/test-model", run_dir=str(tmp_path / "run"))
    first_store = tmp_path_factory.mktemp("store1")
    _, _, first = run_evaluation(spec, mlflow_dir=first_store, progress=False, lm=dummy(), track=True)
    second_store = tmp_path_factory.mktemp("store2")
    result, _, second = run_evaluation(spec, mlflow_dir=second_store, progress=False, lm=dummy())
    assert second != first and result.resumed == 3


def test_a_store_mlflow_tracking_uri_names_keeps_the_artifacts_beside_it(bench, tmp_path, mlflow_store, monkeypatch):
    """With ``$MLFLOW_TRACKING_URI`` naming an SQLite store elsewhere, a new experiment's artifacts go beside that
    store's file, not under ``./mlruns`` of the folder the command ran in."""
    from hcqr_dspy.tracking import store as tracking

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere / 'tracking.db'}")
    spec = EvalSpec(method="cot", dataset=str(bench), lm="openai/test-model", run_dir=str(tmp_path / "run"))
    try:
        _, _, run_id = run_evaluation(spec, progress=False, lm=dummy())
        client = mlflow.MlflowClient()
        location = client.get_experiment(client.get_run(run_id).info.experiment_id).artifact_location
        assert location == (elsewhere / "artifacts" / tracking.EXPERIMENT).as_uri()
        assert (elsewhere / "artifacts" / tracking.EXPERIMENT / run_id / "artifacts" / "run" / "config.json").is_file()
        assert not (tmp_path / "mlruns" / "artifacts").exists()
    finally:
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
        tracking.configure(mlflow_store)  # the session's store again, for the tests after this one
    assert tracking.sqlite_file("http://127.0.0.1:5000") is None  # a server: its own artifact root, no lock file


@pytest.mark.parametrize(
    "uri, folder",
    [
        ("sqlite:///{tmp}/pct%20dir/x.db", "pct dir"),  # percent-escapes decoded, as SQLAlchemy opens the file
        ("sqlite:///{tmp}/q/x.db?timeout=20", "q"),  # the query is not part of the path
        ("sqlite:///rel/x.db", "rel"),  # relative to the working folder
    ],
)
def test_the_store_folder_is_where_sqlite_opens_the_file(tmp_path, monkeypatch, mlflow_store, uri, folder):
    """The lock and the artifacts go beside the file SQLite opens; nothing is made in ./mlruns."""
    from hcqr_dspy.tracking import store as tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(tmp=tmp_path))
    try:
        experiment_id = tracking.configure()
        location = mlflow.MlflowClient().get_experiment(experiment_id).artifact_location
    finally:
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
        tracking.configure(mlflow_store)
    assert (tmp_path / folder / "x.db").is_file() and (tmp_path / folder / ".init.lock").is_file()
    assert location == (tmp_path / folder / "artifacts" / tracking.EXPERIMENT).as_uri()
    assert not (tmp_path / "mlruns").exists()


def test_an_in_memory_store_is_refused(tmp_path, monkeypatch):
    """``sqlite://`` would track every run in memory, lost when the command ends: refused with one line."""
    from hcqr_dspy.errors import HCQRError
    from hcqr_dspy.tracking import store as tracking

    monkeypatch.chdir(tmp_path)
    for uri in ("sqlite://", "sqlite:///:memory:"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(HCQRError, match="in-memory SQLite store: every run would be lost"):
            tracking.open_store()
    assert not (tmp_path / "mlruns").exists()
