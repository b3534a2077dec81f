"""`hcqr register`: a saved program folder compiled elsewhere (no compile run in this store) registered here as a
tracked compile would register it: a model version with its recipe tag and alias, each stage's prompt, the same
program back from `models:/NAME@ALIAS`."""

import json
import shutil

import mlflow
import mlflow.genai
import pytest
from helpers import TINY_ROWS, schema_lm, snippet, write_jsonl
from test_optimize import setup, spec  # noqa: F401 (setup is a fixture)

from hcqr_dspy.cli import main
from hcqr_dspy.retrieval import BM25Retriever, load_corpus
from hcqr_dspy.workflows.compile import run_compile
from hcqr_dspy.workflows.programs import resolve_program_path


@pytest.fixture
def compiled(setup):  # noqa: F811
    """A BootstrapFewShot HCQR program compiled without MLflow, as a repository would carry it."""
    run_compile(spec(setup, out=str(setup / "bfs")), track=False, lm=schema_lm("A"))
    return setup / "bfs"


def test_register_a_saved_program(compiled, setup, mlflow_store, capsys):  # noqa: F811
    args = ["register", str(compiled), "--name", "carried", "--alias", "study", "--mlflow-dir", str(mlflow_store)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "as models:/carried/1 (alias study)" in out and f"serving with index {setup / 'idx'}" in out
    client = mlflow.MlflowClient()
    version = client.get_model_version_by_alias("carried", "study")
    assert str(version.version) == "1" and version.tags["recipe"] == "bootstrap_fewshot"
    run = client.get_run(version.run_id)
    assert run.data.tags["kind"] == "register" and run.data.tags["recipe"] == "bootstrap_fewshot"
    assert "**Registered** the saved `hcqr` program" in run.data.tags["mlflow.note.content"]
    # every stage's instructions and demos as a prompt version, with the alias
    state = json.loads((compiled / "program.json").read_text())
    for stage in ("hypothesis", "rewrite", "answer"):
        prompt = mlflow.genai.load_prompt(f"prompts:/carried.{stage}@study")
        system, *demos = prompt.template
        assert system["content"] == state[stage]["signature"]["instructions"]
        assert len(demos) == 2 * len(state[stage]["demos"]) and demos
        assert prompt.tags["recipe"] == "bootstrap_fewshot" and prompt.tags["run_id"] == version.run_id
    # the registered model carries the same program
    fetched = resolve_program_path("models:/carried@study", mlflow_store)
    assert json.loads((fetched / "program.json").read_text()) == state
    # registered again: a new model version, the unchanged prompts linked again, not copied
    assert main(["register", str(compiled), "--name", "carried", "--mlflow-dir", str(mlflow_store)]) == 0
    assert str(client.get_registered_model("carried").latest_versions[-1].version) == "2"
    assert "prompts:/carried.answer/2" in capsys.readouterr().out  # version 1: its zero-shot template


def test_register_with_another_or_no_index(compiled, setup, mlflow_store, capsys):  # noqa: F811
    moved = setup / "moved-bfs"
    shutil.copytree(compiled, moved)
    meta = json.loads((moved / "meta.json").read_text())
    (moved / "meta.json").write_text(json.dumps({**meta, "mlflow_run_id": "0123abcd"}))  # compiled in another store
    shutil.rmtree(setup / "idx")  # the recorded index is not on this machine
    base = ["register", str(moved), "--name", "moved", "--mlflow-dir", str(mlflow_store)]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a folder on this machine; give --index FOLDER" in err
    assert main([*base, "--index", str(setup / "idx"), "--no-index"]) == 2
    assert "either --index FOLDER or --no-index" in capsys.readouterr().err
    assert main([*base, "--no-index"]) == 0
    assert "serving with index none" in capsys.readouterr().out
    version = mlflow.MlflowClient().get_model_version("moved", "1")
    assert version.tags["recipe"] == "bootstrap_fewshot" and version.tags["compile_run_id"] == "0123abcd"
    # an index of another corpus serves it, and the command says so
    other = load_corpus(write_jsonl(setup / "other.jsonl", [snippet(*r) for r in TINY_ROWS[:3]]))
    BM25Retriever(other, show_progress=False).save(setup / "other-idx")
    assert main([*base, "--index", str(setup / "other-idx")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"note: {setup / 'other-idx'} indexes another corpus") and "(bundled in the model)" in out


@pytest.mark.parametrize(
    "folder, name, message",
    [
        ("NOPROGRAM", "ok", "not found"),
        ("PROGRAM", "bad/name", "--name 'bad/name'"),
        ("PROGRAM", "ok --alias latest", "--alias 'latest'"),
    ],
)
def test_register_refuses_bad_input(compiled, setup, mlflow_store, capsys, folder, name, message):  # noqa: F811
    path = {"NOPROGRAM": setup / "nothing", "PROGRAM": compiled}[folder]
    name, *rest = name.split(" ")
    assert main(["register", str(path), "--name", name, *rest, "--mlflow-dir", str(mlflow_store)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hcqr: error:") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lm", "foo"], "unknown --lm spec 'foo'"),
        (["--lm", "local:nosuch"], "unknown packaged model 'nosuch'"),
        (["--lm", ""], "empty --lm spec"),
        (["--lm", "nosuchprovider/model"], "nosuchprovider/model"),
        (["--index", ""], "--index is empty"),
    ],
)
def test_register_refuses_an_lm_or_index_no_command_could_use(compiled, mlflow_store, capsys, extra, message):
    args = ["register", str(compiled), "--name", "badlm", *extra, "--mlflow-dir", str(mlflow_store)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not mlflow.MlflowClient().search_model_versions("name = 'badlm'")  # nothing registered


def test_register_logs_only_the_program_files(compiled, setup, mlflow_store, capsys):  # noqa: F811
    (compiled / "notes.bin").write_bytes(b"x" * 1000)
    (compiled / "outside").symlink_to("/etc/hostname")  # a link out of the folder broke MLflow's artifact copy
    assert main(["register", str(compiled), "--name", "onlytwo", "--mlflow-dir", str(mlflow_store)]) == 0
    version = mlflow.MlflowClient().get_model_version("onlytwo", "1")
    logged = mlflow.artifacts.list_artifacts(run_id=version.run_id, artifact_path="program")
    assert sorted(a.path.rsplit("/", 1)[1] for a in logged) == ["meta.json", "program.json"]
    fetched = resolve_program_path("models:/onlytwo/1", mlflow_store)
    assert sorted(p.name for p in fetched.iterdir()) == ["meta.json", "program.json"]


def test_register_refuses_another_method_under_a_name(compiled, setup, mlflow_store, capsys):  # noqa: F811
    assert main(["register", str(compiled), "--name", "onemethod", "--mlflow-dir", str(mlflow_store)]) == 0
    meta = json.loads((compiled / "meta.json").read_text())
    assert mlflow.MlflowClient().get_model_version("onemethod", "1").tags["method"] == meta["method"] == "hcqr"
    run_compile(
        spec(setup, method="simple_rag", out=str(setup / "sr"), program_options={"budget": 3}),
        track=False,
        lm=schema_lm("A"),
    )
    assert main(["register", str(setup / "sr"), "--name", "onemethod", "--mlflow-dir", str(mlflow_store)]) == 2
    assert "holds 'hcqr' programs (version 1); register this 'simple_rag' program under another --name" in (
        capsys.readouterr().err
    )


def test_register_checks_the_index_it_serves_with(compiled, setup, mlflow_store, capsys):  # noqa: F811
    broken = setup / "broken-idx"
    shutil.copytree(setup / "idx", broken)
    next(p for p in broken.rglob("*") if p.is_file() and p.name != "manifest.json").unlink()
    base = ["register", str(compiled), "--name", "idxcheck", "--mlflow-dir", str(mlflow_store)]
    assert main([*base, "--index", str(broken)]) == 2
    assert "missing" in capsys.readouterr().err
    meta = json.loads((compiled / "meta.json").read_text())
    (compiled / "meta.json").write_text(json.dumps({**meta, "index": {**meta["index"], "path": 42}}))
    assert main(base) == 2
    assert "meta.json: index.path is 42, not a string" in capsys.readouterr().err
