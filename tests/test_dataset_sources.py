"""`hcqr eval --dataset` from a Hugging Face dataset saved to disk (`FOLDER`, `FOLDER:SPLIT`) and from an MLflow
evaluation dataset (`mlflow:NAME`, `mlflow:ID`, `mlflow:REF@STORE`): the same questions as the JSON file give the
same rows and the same recorded question identity; a dataset `hcqr eval` logged is evaluated again as the same
questions in the same order; bad sources are refused in one line, exit 2, nothing written. The LM is the stub
OpenAI-compatible server; the MLflow store is a real SQLite one in tmp_path."""

import json

import datasets
import mlflow
import pytest
from mlflow.genai import datasets as mlflow_datasets
from stub_server import OPTIONS, SECRET, Stub

from hcqr_dspy.cli import main
from hcqr_dspy.evaluation.run_folder import RunFolder

FOUR = {**OPTIONS, "D": "delta"}
ROWS = {
    **{f"q{i}": {"question": f"Question number {i}?", "options": OPTIONS, "answer": "ABC"[i % 3]} for i in range(5)},
    "q5": {"question": "Question number 5?", "options": FOUR, "answer": "D"},  # more options than the others
    "q6": {"question": "Question number 2?", "options": OPTIONS, "answer": "C"},  # q2's text and options again
}
# in an order of their own: not the ids' order, which a reader that lost the file's order would fall back on
QUESTIONS = {qid: ROWS[qid] for qid in ("q4", "q1", "q6", "q0", "q5", "q3", "q2")}


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", SECRET)
    (tmp_path / "qs.json").write_text(json.dumps(QUESTIONS))
    stub = Stub()
    yield {
        "root": tmp_path,
        "stub": stub,
        "lm": ["--lm", "openai/stub-model", "--api-base", stub.base, "--api-key-env", "STUB_KEY"],
    }
    stub.stop()


def hf_columns(qids, options_as_list=False):
    """The questions ``qids`` of QUESTIONS as a dict of columns (``options`` a struct, or a list of texts)."""
    rows = [QUESTIONS[q] for q in qids]
    return {
        "qid": list(qids),
        "question": [r["question"] for r in rows],
        "options": [list(r["options"].values()) if options_as_list else r["options"] for r in rows],
        "answer": [r["answer"] for r in rows],
    }


def evaluate(world, dataset, run, *extra):
    return main(
        ["eval", "--method", "cot", "--dataset", str(dataset), "--run-dir", str(world["root"] / run)]
        + world["lm"]
        + list(extra)
    )


def run_of(world, run):
    folder = world["root"] / run
    rows = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    config = json.loads((folder / "config.json").read_text())
    return {r["qid"]: (r["prediction"], r["gold"], r["correct"]) for r in rows}, config


def test_a_saved_hf_dataset_and_a_datasetdict_split_give_the_json_files_rows(world):
    root = world["root"]
    datasets.Dataset.from_dict(hf_columns(QUESTIONS)).save_to_disk(str(root / "hf"))
    split = datasets.Dataset.from_dict(hf_columns(QUESTIONS, options_as_list=True))
    datasets.DatasetDict({"test": split, "train": split.select([0])}).save_to_disk(str(root / "hfdict"))

    assert evaluate(world, root / "qs.json", "from-json", "--no-mlflow") == 0
    assert evaluate(world, root / "hf", "from-hf", "--no-mlflow") == 0
    assert evaluate(world, f"{root / 'hfdict'}:test", "from-split", "--no-mlflow", "--limit", "4", "--seed", "3") == 0
    assert evaluate(world, root / "qs.json", "from-json-4", "--no-mlflow", "--limit", "4", "--seed", "3") == 0

    rows, config = run_of(world, "from-json")
    assert len(rows) == 7 and rows["q5"][1] == "D"
    hf_rows, hf_config = run_of(world, "from-hf")
    assert hf_rows == rows and hf_config["questions"] == config["questions"]
    assert hf_config["dataset"] == str((root / "hf").resolve())
    split_rows, split_config = run_of(world, "from-split")
    json_rows, json_config = run_of(world, "from-json-4")
    assert split_rows == json_rows and split_config["questions"] == json_config["questions"]
    assert split_config["dataset"] == f"{(root / 'hfdict').resolve()}:test"


def test_a_dataset_hcqr_logged_is_evaluated_again_as_the_same_questions(world, capsys, monkeypatch):
    root, store = world["root"], world["root"] / "mlruns"
    sample = ["--limit", "6", "--seed", "1"]  # leaves q0 out
    assert evaluate(world, root / "qs.json", "from-json", "--mlflow-dir", str(store), *sample) == 0
    rows, config = run_of(world, "from-json")
    assert {"q2", "q6"} <= set(rows) and list(rows) != sorted(rows)
    name = f"qs-{config['questions']['content_sha256'][:12]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    [logged] = mlflow_datasets.search_datasets(filter_string=f"name = '{name}'")
    assert len(logged.to_df()) == 6  # q6 repeats q2's text and options and keeps a record of its own

    # by name from the command's store, tracked there again (under the same dataset, not a new one)
    assert evaluate(world, f"mlflow:{name}", "from-name", "--mlflow-dir", str(store)) == 0
    by_name, name_config = run_of(world, "from-name")
    assert by_name == rows and name_config["questions"]["content_sha256"] == config["questions"]["content_sha256"]
    assert name_config["questions"]["ids_sha256"] == config["questions"]["ids_sha256"]
    assert name_config["dataset"] == f"mlflow:{name}@sqlite:///{store.resolve() / 'mlflow.db'}"
    assert RunFolder.open(root / "from-name").dataset_name == name
    assert set(RunFolder.open(root / "from-name").load_questions()) == set(rows)  # as judge, rescore, replay read it
    assert [d.name for d in mlflow_datasets.search_datasets()] == [name]
    # by id from a store named after @ (a folder), untracked
    assert evaluate(world, f"mlflow:{logged.dataset_id}@{store}", "from-id", "--no-mlflow") == 0
    assert run_of(world, "from-id")[0] == rows
    # hcqr predict --input reads it the same way
    out = root / "answers.jsonl"
    argv = ["predict", "--method", "cot", "--input", f"mlflow:{name}", "--out", str(out), "--mlflow-dir", str(store)]
    assert main([*argv, "--no-mlflow", "--run-dir", str(root / "predicted"), *world["lm"]]) == 0
    assert [json.loads(line)["qid"] for line in out.read_text().splitlines()] == list(rows)
    capsys.readouterr()
    # the runs compare as runs over the same questions
    assert main(["compare", str(root / "from-json"), str(root / "from-name"), "--out", str(root / "cmp")]) == 0


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An MLflow store holding ``other-fields`` (inputs ``query``), ``no-qid`` (a record without a qid),
    ``one-option`` (a question with one option) and two datasets named ``twice``."""
    folder = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = mlflow.set_experiment("sources").experiment_id

    def dataset(name, records):
        mlflow_datasets.create_dataset(name=name, experiment_id=experiment).merge_records(records)

    dataset("other-fields", [{"inputs": {"query": "Which?"}, "expectations": {"expected_response": "A"}}])
    dataset("no-qid", [{"inputs": {"question": "Which?", "options": OPTIONS}, "expectations": {"answer": "A"}}])
    question = {"question": "Which?", "options": {"A": "alpha"}, "qid": "x1"}
    dataset("one-option", [{"inputs": question, "expectations": {"answer": "A"}}])
    mlflow.set_experiment("sources-2")
    for experiment in ("sources", "sources-2"):
        mlflow.set_experiment(experiment)
        question = {"question": "Which?", "options": OPTIONS, "qid": "x1"}
        dataset("twice", [{"inputs": question, "expectations": {"answer": "A"}}])
    return folder


def test_bad_mlflow_datasets_are_refused_in_one_line(world, store, tmp_path, capsys):
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "mlflow.db").write_bytes(b"not a database" * 300)
    cases = [
        (f"mlflow:x@{tmp_path / 'garbage'}", "cannot be read (DatabaseError: (sqlite3.DatabaseError) file is not a"),
        ("mlflow:nope", "mlflow:nope: no evaluation dataset of that name in"),
        ("mlflow:d-" + "0" * 32, "no evaluation dataset with that id in"),
        (f"mlflow:nope@{tmp_path / 'none'}", f"mlflow:nope: no MLflow store at {tmp_path / 'none'}"),
        ("mlflow:other-fields", "its records' inputs hold query and their expectations expected_response; questions"),
        ("mlflow:no-qid", "has no qid (the input qid or id, or the tag qid)"),
        ("mlflow:one-option", "mlflow:one-option: question 'x1' has 1 option(s); at least two are needed"),
        ("mlflow:twice", "2 evaluation datasets in"),
        ("mlflow:", "give mlflow:NAME or mlflow:ID"),
    ]
    for dataset, message in cases:
        argv = ["eval", "--method", "cot", "--dataset", dataset, "--mlflow-dir", str(store), "--no-mlflow"]
        code = main([*argv, "--run-dir", str(tmp_path / "run"), *world["lm"]])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], (dataset, err)
        assert not (tmp_path / "run").exists() and not (tmp_path / "none").exists() and world["stub"].count == 0


def test_bad_saved_hf_datasets_are_refused_in_one_line(world, tmp_path, capsys):
    columns = hf_columns(["q0", "q1"])
    datasets.Dataset.from_dict({"query": ["Which?"], "label": [0]}).save_to_disk(str(tmp_path / "other"))
    datasets.Dataset.from_dict({**columns, "qid": ["q0", "q0"]}).save_to_disk(str(tmp_path / "twice"))
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "one"))
    split = datasets.Dataset.from_dict(columns)
    datasets.DatasetDict({"test": split, "train": split}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "plain").mkdir()
    capsys.readouterr()  # save_to_disk's progress bars
    cases = [
        (tmp_path / "other", "its columns are query, label; a question dataset needs question, options, answer"),
        (tmp_path / "dict", "holds the splits test, train (a DatasetDict): name one, e.g."),
        (f"{tmp_path / 'dict'}:dev", "no split 'dev'; its splits are test, train"),
        (f"{tmp_path / 'one'}:test", "holds one split (a Dataset, not a DatasetDict); drop :test"),
        (tmp_path / "twice", "question id 'q0' appears twice; ids must be unique"),
        (tmp_path / "plain", "is a folder but not a saved Hugging Face dataset"),
    ]
    for dataset, message in cases:
        argv = ["eval", "--method", "cot", "--dataset", str(dataset), "--no-mlflow"]
        code = main([*argv, "--run-dir", str(tmp_path / "run"), *world["lm"]])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], (dataset, err)
        assert not (tmp_path / "run").exists() and world["stub"].count == 0
