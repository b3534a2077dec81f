"""Experiment files: validation before any LM call, a grid with parent/child MLflow runs, resume, comparison."""

import json
import os
import re
import shutil

import dspy
import mlflow
import pytest
from dspy.utils import DummyLM
from helpers import TINY_ROWS, snippet, write_jsonl

from hcqr_dspy.cli import main
from hcqr_dspy.errors import ExperimentError, HCQRError, SetupMismatchError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.optimize.saved import save_program
from hcqr_dspy.programs import HCQR
from hcqr_dspy.retrieval import BM25Retriever, load_corpus, load_index
from hcqr_dspy.workflows.experiment import run_experiment
from hcqr_dspy.workflows.experiment_file import load_experiment

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)


@pytest.fixture
def setup(tmp_path):
    return make_setup(tmp_path)


def make_setup(tmp_path):
    """Two datasets of three questions and a BM25 index of the tiny rows, in ``tmp_path``."""
    corpus = load_corpus(write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    BM25Retriever(corpus, show_progress=False).save(tmp_path / "idx")
    for name in ("d1", "d2"):
        rows = {
            f"{name}-{i}": {
                "question": f"Digoxin yellow vision case {name} {i}?",
                "options": {"A": "Digoxin toxicity", "B": "Graves"},
                "answer": "A",
            }
            for i in range(3)
        }
        (tmp_path / f"{name}.json").write_text(json.dumps(rows))
    return tmp_path


@pytest.fixture(scope="module")
def flat_index(tmp_path_factory):
    """A dense Flat index over the tiny rows (the packaged encoder)."""
    from hcqr_dspy.retrieval import DenseRetriever

    folder = tmp_path_factory.mktemp("flat") / "flat"
    corpus = load_corpus(write_jsonl(folder.parent / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    DenseRetriever(corpus, show_progress=False).save(folder)
    return folder


def write_exp(folder, **overrides):
    spec = {
        "name": "grid",
        "lm": "openai/test-model",
        "index": "idx",
        "budget": 3,
        "questions": {"limit": 2, "seed": 1},
        "datasets": {"d1": "d1.json", "d2": "d2.json"},
        "methods": ["cot", "simple_rag", "hcqr"],
        "reference": "simple_rag",
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
        ({"metods": ["cot"]}, r"metods: unknown key; allowed: api_base, .*, methods, .*threads$"),
        ({"methods": ["cot", "magic"]}, r"methods.1: unknown method 'magic'; allowed: cot, hcqr, hcqr_hypothesis"),
        ({"methods": ["cot", "cot"]}, r"methods: method\(s\) cot listed twice"),
        ({"methods": []}, r"methods: List should have at least 1 item"),
        ({"datasets": {"d1": "nope.json"}}, r"datasets.d1: file .*nope.json not found"),
        ({"datasets": {}}, r"datasets: Dictionary should have at least 1 item"),
        ({"index": "missing"}, r"index: .*missing is not an hcqr index folder"),
        ({"index": None}, r"retrieval methods need 'index'"),
        ({"lm": "gpt4"}, r"lm: unknown --lm spec 'gpt4'"),
        (
            {"method_options": {"hcqr": {"k_per_qurey": 2}}},
            r"method_options: hcqr: unknown hcqr option\(s\) k_per_qurey; "
            r"allowed: budget, fusion, hypothesis_style, k_per_query",
        ),
        (
            {"method_options": {"hcqr": {"k_per_query": "2"}}},
            r"method_options: hcqr: k_per_query: Input should be a valid integer \(got '2'\)",
        ),
        (
            {"method_options": {"hyde": {}}},
            r"method_options: 'hyde' is not one of the methods \(cot, simple_rag, hcqr\)",
        ),
        ({"questions": {"limt": 3}}, r"questions.limt: unknown key; allowed: ids, limit, seed"),
        ({"questions": {"limit": "zero"}}, r"questions.limit: Input should be a valid integer \(got 'zero'\)"),
        ({"questions": {"limit": 0}}, r"questions.limit: Input should be greater than or equal to 1 \(got 0\)"),
        ({"questions": {"ids": [1]}}, r"questions.ids.0: Input should be a valid string \(got 1\)"),
        ({"reference": "hyde"}, r"reference: 'hyde' is not one of the cells"),
        ({"budget": 0}, r"budget: Input should be greater than or equal to 1 \(got 0\)"),
        ({"budget": -3}, r"budget: Input should be greater than or equal to 1 \(got -3\)"),
        ({"budget": "abc"}, r"budget: Input should be a valid integer \(got 'abc'\)"),
        ({"budget": 2.5}, r"budget: Input should be a valid integer \(got 2.5\)"),
        ({"threads": True}, r"threads: Input should be a valid integer \(got True\)"),
        ({"judge": {"mode": "both"}}, r"judge.mode: Input should be 'context' or 'passage' \(got 'both'\)"),
        ({"judge": {"limit": 0}}, r"judge.limit: Input should be greater than or equal to 1 \(got 0\)"),
        ({"name": "../escape"}, r"name: String should match pattern"),
        ({"api_key_env": "sk-live-123"}, r"api_key_env: String should match pattern"),
        # values the constructors refuse, found by --check rather than by the run after other cells' LM calls
        ({"method_options": {"hcqr": {"k_per_query": 0}}}, r"method_options: hcqr: k_per_query must be >= 1, got 0"),
        ({"method_options": {"hcqr": {"fusion": "bogus"}}}, r"method_options: hcqr: unknown fusion strategy 'bogus'"),
        ({"method_options": {"hcqr": {"hypothesis_style": "weird"}}}, r"method_options: hcqr: .*weird"),
        (
            {"method_options": {"hcqr": {"roles": ["support", "support"]}}},
            r"method_options: hcqr: roles must be distinct",
        ),
        (
            {"methods": ["cot", "rerank_rag"], "reference": "cot", "method_options": {"rerank_rag": {"pool_k": 2}}},
            r"method_options: rerank_rag: pool_k must be >= budget \(3\), got 2",
        ),
        (
            {"methods": ["cot", "rerank_rag"], "reference": "cot", "method_options": {}, "budget": 60},
            r"budget 60 does not fit method 'rerank_rag': pool_k must be >= budget \(60\), got 50",
        ),
        # what loading the index would refuse (a helper found --check passing these)
        (
            {"encoder_backend": "openvino-bf16"},
            r"idx is a bm25 index and embeds no queries: --encoder-backend openvino-bf16 "
            r"does not apply",
        ),
        (
            {"encoder_backend": "tensorrt"},
            r"encoder_backend: unknown encoder backend 'tensorrt'; choose one of torch, onnx, "
            r"onnx-int8, openvino, openvino-bf16",
        ),
        ({"comparison": {"margin": 0}}, r"comparison.margin: Input should be greater than or equal to 0.01 \(got 0\)"),
        ({"comparison": {"margin": 1e-200}}, r"comparison.margin: Input should be greater than or equal to 0.01"),
        (
            {"comparison": {"margin_pgold": "5e-2"}},
            r"margin_pgold: Input should be a valid number \(got '5e-2'\); YAML reads a number in exponent form",
        ),
        ({"comparison": {"margin_pgold": float("nan")}}, r"comparison.margin_pgold: Input should be a finite number"),
        ({"comparison": {"margin": 101}}, r"comparison.margin: Input should be less than or equal to 100 \(got 101\)"),
        ({"comparison": {"margin_pgold": 1.5}}, r"comparison.margin_pgold: Input should be less than or equal to 1"),
        ({"comparison": {"margin": "5"}}, r"comparison.margin: Input should be a valid number \(got '5'\)"),
        ({"comparison": {"strict_setup": "yes"}}, r"comparison.strict_setup: Input should be a valid boolean"),
        ({"comparison": {"margins": 5}}, r"comparison.margins: unknown key; allowed: margin, margin_pgold, strict"),
        ({"search_options": {"nprobe": 8}}, r"idx is a bm25 index: search options \(nprobe\) apply to dense indexes"),
        (
            {"index": "FLAT", "search_options": {"efSearch": 64}},
            r"search option efSearch does not apply to faiss index 'Flat'",
        ),
    ],
)
def test_bad_experiment_files_fail_before_any_lm_call(setup, overrides, message, request):
    if overrides.get("index") == "FLAT":
        overrides = {**overrides, "index": str(request.getfixturevalue("flat_index"))}
    with pytest.raises(ExperimentError, match=message) as caught:
        load_experiment(write_exp(setup, **overrides))
    assert str(caught.value).startswith(str(setup / "exp.yaml")) and "\n" not in str(caught.value)


# What a reviewer found `hcqr experiment --check` accepting or crashing on: each is now one line naming the
# file, the line and the field (the YAML is written by hand so the line numbers are known).
GRID = """name: grid
lm: openai/test-model
index: idx
budget: {budget}
questions: {{limit: {limit}, seed: 1}}
datasets:
  d1: {d1}
methods: [cot, simple_rag]
"""


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"budget": "0"}, r"exp.yaml:4: budget: Input should be greater than or equal to 1 \(got 0\)$"),
        ({"budget": "-3"}, r"exp.yaml:4: budget: Input should be greater than or equal to 1 \(got -3\)$"),
        ({"budget": "fifteen"}, r"exp.yaml:4: budget: Input should be a valid integer \(got 'fifteen'\)$"),
        ({"limit": "zero"}, r"exp.yaml:5: questions.limit: Input should be a valid integer \(got 'zero'\)$"),
        ({"d1": "truncated.json"}, r"exp.yaml:7: datasets.d1: does not load: .*truncated.json:\d+: not valid JSON \("),
        ({"d1": "d2.json\nmethods: [cot]"}, r"exp.yaml:9: key 'methods' appears twice in one mapping$"),
    ],
)
def test_check_refuses_what_a_reviewer_found_with_one_line(setup, capsys, fields, message):
    from hcqr_dspy.cli import main

    good = (setup / "d1.json").read_text()
    (setup / "truncated.json").write_text(json.dumps(json.loads(good), indent=1)[:80])
    (setup / "exp.yaml").write_text(GRID.format(**{"budget": 3, "limit": 2, "d1": "d1.json", **fields}))
    assert main(["experiment", str(setup / "exp.yaml"), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hcqr: error: {setup / 'exp.yaml'}:") and "\n" not in err and "Traceback" not in err
    assert re.search(message, err), err


def test_check_refuses_a_non_utf8_file_naming_the_line(setup, capsys):
    from hcqr_dspy.cli import main

    text = GRID.format(budget=3, limit=2, d1="d1.json").replace("name: grid", "name: grid\ndescription: Gr\u00e4fe")
    (setup / "exp.yaml").write_bytes(text.encode("latin-1"))
    assert main(["experiment", str(setup / "exp.yaml"), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"hcqr: error: {setup / 'exp.yaml'}:2: not valid UTF-8 text (byte 0xe4 at column 16); save the file as UTF-8"
    )
    (setup / "exp.yaml").write_text(GRID.format(budget=3, limit=2, d1="d1.json"))
    assert main(["experiment", str(setup / "exp.yaml"), "--check"]) == 0
    assert "valid (1 dataset(s) x 2 method(s), lm openai/test-model)" in capsys.readouterr().out


def test_shipped_experiments_by_name_resolve_paths_from_the_working_folder(setup, monkeypatch, tmp_path_factory):
    # `hcqr experiment paper_main` from any folder: the shipped file's ../indexes/... and ../../shared/data/...
    # are read as if it stood in ./experiments/, i.e. ./indexes/... and ../shared/data/...
    root = tmp_path_factory.mktemp("elsewhere")
    work = root / "work"
    shutil.copytree(setup / "idx", work / "indexes" / "medcorpus-bm25")
    (root / "shared" / "data" / "benchmark").mkdir(parents=True)
    for name in ("medqa", "mmlu"):
        shutil.copy(setup / "d1.json", root / "shared" / "data" / "benchmark" / f"{name}.json")
    monkeypatch.chdir(work)
    exp = load_experiment("paper_main")
    assert exp.name == "paper_main" and exp.index == str(work / "indexes" / "medcorpus-bm25")
    assert exp.datasets == {n: str(root / "shared" / "data" / "benchmark" / f"{n}.json") for n in ("medqa", "mmlu")}
    assert load_experiment("ablations", limit=5).questions["limit"] == 5
    # the working folder's own experiments/ comes first
    (work / "experiments").mkdir()
    (work / "experiments" / "paper_main.yaml").write_text(
        GRID.format(budget=3, limit=2, d1="../../shared/data/benchmark/medqa.json").replace(
            "index: idx", "index: ../indexes/medcorpus-bm25"
        )
    )
    assert load_experiment("paper_main").name == "grid"
    with pytest.raises(
        ExperimentError,
        match=r"experiment 'nope' not found \(looked in experiments/, .*/experiments/\); "
        r"experiments there: ablations, paper_main, study_mmlu, study_optimizers$",
    ):
        load_experiment("nope")


def routed_lm():
    return DummyLM(
        {
            "`support_query`": {
                "support_query": "digoxin toxicity",
                "distinction_query": "digoxin versus graves",
                "key_feature_query": "yellow vision",
            },
            "`discriminating_features`": {
                "discriminating_features": "yellow vision",
                "reasoning": "r",
                "working_hypothesis": "A",
                "confirming_evidence": "glycoside",
            },
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
    cells = [c for c in children if c.data.tags.get("kind") != "comparison"]
    comparisons = [c for c in children if c.data.tags.get("kind") == "comparison"]
    assert len(cells) == 6 and len(comparisons) == 2  # one comparison per dataset, children of the experiment too
    assert {c.data.params["program.budget"] for c in cells} == {"3"}
    assert {c.data.tags["dataset"] for c in comparisons} == {"d1", "d2"}
    calls = len(lm.history)
    again = run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=lm)
    assert again["parent_run_id"] == out["parent_run_id"] and len(lm.history) == calls  # all resumed
    # the folders in another MLflow store (a committed study on a fresh clone): a new parent run, recorded
    moved = run_experiment(exp, runs_root=setup / "runs", mlflow_dir=setup / "other-store", progress=False, lm=lm)
    assert moved["parent_run_id"] != out["parent_run_id"] and len(lm.history) == calls
    state = json.loads((setup / "runs" / "grid" / "experiment.json").read_text())
    assert state["parent_run_id"] == moved["parent_run_id"]
    mlflow.MlflowClient().delete_run(moved["parent_run_id"])  # deleted in the store: MLflow cannot resume it
    anew = run_experiment(exp, runs_root=setup / "runs", mlflow_dir=setup / "other-store", progress=False, lm=lm)
    assert anew["parent_run_id"] not in (moved["parent_run_id"], out["parent_run_id"]) and len(lm.history) == calls


def test_the_files_comparison_margins_and_setup_check_reach_the_report(setup, mlflow_store):
    spec = {"datasets": {"d1": "d1.json"}, "methods": ["cot", "simple_rag"], "method_options": {}}
    comparison = {"margin": 5, "margin_pgold": 0.05, "strict_setup": True}
    exp = load_experiment(write_exp(setup, **spec, comparison=comparison))
    run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    folder = setup / "runs" / "grid" / "d1"
    summary = json.loads((folder / "comparison" / "comparison.json").read_text())
    assert summary["margins"] == {"accuracy": 0.05, "gold_prob": 0.05}  # accuracy as a fraction
    report = (folder / "comparison" / "comparison.md").read_text()
    assert "| cot vs simple_rag: accuracy | comparison with the reference | 2 |" in report.split("## Equivalence")[1]
    # one cell's recorded setup changed (another dspy answered it): the file's strict_setup refuses to compare
    sessions = folder / "cot" / "sessions.jsonl"
    record = json.loads(sessions.read_text().splitlines()[0])
    record["packages"]["dspy"] = "2.6.0"
    sessions.write_text(json.dumps(record) + "\n")
    # every cell complete: nothing to answer, so the report's check (not the one before answering) refuses
    with pytest.raises(HCQRError, match=r"^--strict-setup: runs .* differ in dspy"):
        run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    lenient = load_experiment(write_exp(setup, **spec, comparison={"margin": 5}))
    run_experiment(lenient, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert "2.6.0" in (folder / "comparison" / "comparison.md").read_text()  # flagged, not refused


def test_a_strict_setup_file_refuses_a_cell_on_another_setup_before_it_answers(setup, mlflow_store):
    spec = {"datasets": {"d1": "d1.json"}, "methods": ["cot", "simple_rag"], "method_options": {}}
    strict = {"strict_setup": True}
    exp = load_experiment(write_exp(setup, **spec, comparison=strict))
    run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    folder = setup / "runs" / "grid" / "d1"
    sessions = folder / "cot" / "sessions.jsonl"  # the cot cell answered on another dspy than this process's
    record = json.loads(sessions.read_text().splitlines()[0])
    record["packages"]["dspy"] = "2.6.0"
    sessions.write_text(json.dumps(record) + "\n")
    grown = load_experiment(write_exp(setup, **{**spec, "methods": ["cot", "simple_rag", "hcqr"]}, comparison=strict))
    before, state = tracked(), (setup / "runs" / "grid" / "experiment.json").read_text()
    with pytest.raises(SetupMismatchError, match=r"dspy is .*, but .*d1/cot \(session 1\) recorded 2.6.0"):
        run_experiment(grown, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert not (folder / "hcqr").exists()  # the new cell was refused before anything was written
    assert tracked() == before and (setup / "runs" / "grid" / "experiment.json").read_text() == state  # MLflow too
    lenient = load_experiment(write_exp(setup, **{**spec, "methods": ["cot", "simple_rag", "hcqr"]}))
    run_experiment(lenient, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert len(RunFolder(folder / "hcqr").rows()) == 2
    # every cell answered, on two setups: refused as its report would be, before an MLflow run is reopened
    before, state = tracked(), (setup / "runs" / "grid" / "experiment.json").read_text()
    differ = rf"--strict-setup: runs simple_rag and cot differ in dspy \({re.escape(dspy.__version__)} vs 2.6.0\)"
    with pytest.raises(HCQRError, match=differ):
        run_experiment(grown, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert tracked() == before and (setup / "runs" / "grid" / "experiment.json").read_text() == state
    # every cell on that other setup, and the file's sample grown by a question: each cell's folder holds another
    # configuration, refused before an MLflow run is reopened
    for cell in ("simple_rag", "hcqr"):
        (folder / cell / "sessions.jsonl").write_text(sessions.read_text())
    more = {**spec, "methods": ["cot", "simple_rag", "hcqr"], "questions": {"limit": 3, "seed": 1}}
    with pytest.raises(HCQRError, match=r"d1/cot holds a run with another configuration \(differs in: questions\)"):
        run_experiment(
            load_experiment(write_exp(setup, **more, comparison=strict)),
            runs_root=setup / "runs",
            mlflow_dir=mlflow_store,
            progress=False,
            lm=routed_lm(),
        )
    assert tracked() == before and (setup / "runs" / "grid" / "experiment.json").read_text() == state
    # the same file, a cell's last row lost (killed before it was written): that cell has a question left, so this
    # session's setup is refused, before an MLflow run is reopened
    rows = (folder / "hcqr" / "predictions.jsonl").read_text().splitlines()
    (folder / "hcqr" / "predictions.jsonl").write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(SetupMismatchError, match=r"dspy is .*, but .*d1/\w+ \(session 1\) recorded 2.6.0"):
        run_experiment(grown, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert tracked() == before and (setup / "runs" / "grid" / "experiment.json").read_text() == state


def tracked() -> dict:
    """Every MLflow run of the active store, with its status and end time."""
    client = mlflow.MlflowClient()
    ids = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_id: (r.info.status, r.info.end_time) for r in client.search_runs(ids, max_results=5000)}


def test_a_malformed_row_in_a_later_cell_is_refused_before_any_mlflow_run_is_reopened(setup, mlflow_store):
    spec = {"datasets": {"d1": "d1.json"}, "methods": ["cot", "simple_rag"], "method_options": {}}
    exp = load_experiment(write_exp(setup, **spec))
    run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    predictions = setup / "runs" / "grid" / "d1" / "simple_rag" / "predictions.jsonl"
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    rows[-1]["cpu_pressure"] = 1.5  # edited by hand: not a share
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    grown = load_experiment(write_exp(setup, **{**spec, "methods": ["cot", "simple_rag", "hcqr"]}))
    before, state = tracked(), (setup / "runs" / "grid" / "experiment.json").read_text()
    with pytest.raises(HCQRError, match=r"simple_rag/predictions.jsonl: the row of question .* cpu_pressure"):
        run_experiment(grown, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert tracked() == before and (setup / "runs" / "grid" / "experiment.json").read_text() == state
    assert not (setup / "runs" / "grid" / "d1" / "hcqr").exists()


ANSWERED = {"datasets": {"d1": "d1.json"}, "methods": ["cot", "simple_rag"], "method_options": {}}


@pytest.fixture(scope="module")
def answered(tmp_path_factory, mlflow_store):
    """A folder holding an experiment of two cells, every question answered."""
    setup = make_setup(tmp_path_factory.mktemp("answered"))
    exp = load_experiment(write_exp(setup, **ANSWERED))
    run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    return setup


def damage(cell, how):
    """Damage an answered cell's folder (or, for ``file``, put a file where a cell not yet run goes; for ``limit``
    and ``budget``, nothing: the experiment file changes)."""
    if how == "file":
        cell.parent.joinpath("hcqr").write_text("not a run folder\n")
    elif how == "option_probs":
        qid = json.loads((cell / "predictions.jsonl").read_text().splitlines()[0])["qid"]
        (cell / "option_probs.jsonl").write_text(json.dumps({"qid": qid, "option_probs": {"A": 7}}) + "\n")
    elif how == "foreign_option_probs":
        (cell / "option_probs.jsonl").write_text(json.dumps({"qid": "elsewhere", "option_probs": None}) + "\n")
    elif how == "judgments":
        (cell / "judgments.jsonl").write_text(json.dumps({"qid": "elsewhere", "valid": True}) + "\n")
    elif how == "sessions":
        (cell / "sessions.jsonl").write_text('{"session": "one"}\n')
    elif how == "looping_rows":
        (cell / "predictions.jsonl").unlink()
        (cell / "predictions.jsonl").symlink_to("predictions.jsonl")
    elif how == "dangling_sessions":
        (cell / "sessions.jsonl").unlink()
        (cell / "sessions.jsonl").symlink_to(cell / "nowhere.jsonl")
    elif how == "looping_cell":
        cell.parent.joinpath("hcqr").symlink_to("hcqr")
    elif how == "state":
        (cell.parent.parent / "experiment.json").write_bytes(b"\xff\xfe")
    elif how == "dataset_loop":  # the folder above the cells
        shutil.rmtree(cell.parent)
        cell.parent.symlink_to(cell.parent.name)
    elif how == "state_loop":
        (cell.parent.parent / "experiment.json").unlink()
        (cell.parent.parent / "experiment.json").symlink_to("experiment.json")
    elif how == "fifo_rows":  # reading it would wait for a writer
        (cell / "predictions.jsonl").unlink()
        os.mkfifo(cell / "predictions.jsonl")


@pytest.mark.parametrize(
    "how, message",
    [
        ("file", r"grid/d1/hcqr is a file, not a run folder, where the experiment keeps its cell .hcqr."),
        ("option_probs", r"simple_rag/option_probs.jsonl: question .*: option_probs is not a distribution"),
        ("foreign_option_probs", r"option_probs.jsonl scores 1 question\(s\) the run does not hold \(elsewhere\)"),
        ("judgments", r"simple_rag/judgments.jsonl"),
        ("sessions", r"simple_rag/sessions.jsonl"),
        # the file changed since the cells were answered: each cell's evaluation would refuse its folder
        ("limit", r"grid/d1/cot holds a run with another configuration \(differs in: questions\); the experiment's"),
        ("budget", r"grid/d1/cot holds a run with another configuration \(differs in: program\); the experiment's"),
        # links to nothing: records that would be written elsewhere or lost, a cell folder that is not there
        ("looping_rows", r"simple_rag/predictions.jsonl: cannot be read \(Too many levels of symbolic links\)"),
        ("dangling_sessions", r"simple_rag/sessions.jsonl is a symbolic link to nothing; remove it"),
        ("looping_cell", r"grid/d1/hcqr is a symbolic link to nothing \(a loop, or its target is gone\); remove it"),
        ("state", r"experiment.json:1: not valid UTF-8 text"),
        ("dataset_loop", r"grid/d1 is a symbolic link to nothing \(a loop, or its target is gone\); remove it"),
        ("state_loop", r"grid/experiment.json is a symbolic link to nothing"),
        ("fifo_rows", r"simple_rag/predictions.jsonl is not a regular file \(a FIFO or device would block\)"),
    ],
)
def test_a_damaged_cell_is_refused_before_any_mlflow_run_is_reopened(answered, tmp_path, mlflow_store, how, message):
    setup = tmp_path / "copy"
    shutil.copytree(answered, setup)  # its parent MLflow run is the original's, reopened by a run of the copy
    damage(setup / "runs" / "grid" / "d1" / "simple_rag", how)
    changed = {"limit": {"questions": {"limit": 3, "seed": 1}}, "budget": {"budget": 2}}.get(how, {})
    grown = load_experiment(write_exp(setup, **{**ANSWERED, "methods": ["cot", "simple_rag", "hcqr"], **changed}))
    state_file = setup / "runs" / "grid" / "experiment.json"
    before, state = tracked(), state_file.read_bytes() if state_file.exists() else None
    with pytest.raises(HCQRError, match=message):
        run_experiment(grown, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert tracked() == before and (state_file.read_bytes() if state_file.exists() else None) == state


def test_an_lm_that_cannot_be_built_is_refused_before_any_mlflow_run_is_reopened(setup, mlflow_store, monkeypatch):
    spec = {"datasets": {"d1": "d1.json"}, "methods": ["cot", "simple_rag"], "method_options": {}}
    keyed = {**spec, "api_base": "http://127.0.0.1:9/v1", "api_key_env": "HCQR_TEST_UNSET_KEY"}
    monkeypatch.setenv("HCQR_TEST_UNSET_KEY", "sk-test")
    exp = load_experiment(write_exp(setup, **keyed))
    run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    monkeypatch.delenv("HCQR_TEST_UNSET_KEY")  # every cell answered; the key's variable gone
    before, state = tracked(), (setup / "runs" / "grid" / "experiment.json").read_text()
    with pytest.raises(HCQRError, match=r"environment variable HCQR_TEST_UNSET_KEY .* is not set"):
        run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False)
    assert tracked() == before and (setup / "runs" / "grid" / "experiment.json").read_text() == state


def test_a_subset_of_the_datasets_can_be_run(setup):
    exp = load_experiment(write_exp(setup), only_datasets=["d1"])
    assert list(exp.datasets) == ["d1"]
    with pytest.raises(ExperimentError, match=r"unknown dataset\(s\) mmlu; the file has d1, d2"):
        load_experiment(write_exp(setup), only_datasets=["mmlu"])


def test_check_accepts_options_the_index_takes(setup, flat_index):
    spec = load_experiment(write_exp(setup, index=str(flat_index), encoder_backend="openvino-bf16", search_options={}))
    assert spec.encoder_backend == "openvino-bf16"
    with pytest.raises(ExperimentError, match="does not apply to faiss index 'Flat'"):
        load_experiment(write_exp(setup, index=str(flat_index), search_options={"nprobe": 4}))


def assert_check_lists(capsys, exp, expected, *args):
    """`hcqr experiment EXP --check ARGS` exits 2 with one line per problem: the patterns ``expected``, in order."""
    from hcqr_dspy.cli import main

    assert main(["experiment", str(exp), "--check", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(expected), err
    for line, pattern in zip(err, expected):
        assert line.startswith(f"hcqr: error: {exp}") and re.search(pattern, line), (line, pattern)


def test_check_lists_every_problem_one_line_each(setup, capsys):
    from hcqr_dspy.cli import main

    exp = setup / "exp.yaml"
    exp.write_text(
        GRID.format(budget=0, limit="zero", d1="nope.json").replace("[cot, simple_rag]", "[cot, magic]")
        + "metods: [cot]\n"
    )
    expected = [
        r"exp.yaml:7: datasets.d1: file .*nope.json not found",
        r"exp.yaml:8: methods.1: unknown method 'magic'; allowed: cot, ",
        r"exp.yaml:4: budget: Input should be greater than or equal to 1 \(got 0\)",
        r"exp.yaml:5: questions.limit: Input should be a valid integer \(got 'zero'\)",
        r"exp.yaml:9: metods: unknown key; allowed: api_base, ",
        r"exp.yaml: unknown dataset\(s\) d9; the file has d1",
    ]
    assert_check_lists(capsys, exp, expected, "--datasets", "d9")
    # a run (no --check) stops on one line: the first problem and how many more
    assert main(["experiment", str(exp)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert re.search(r"exp.yaml:7: datasets.d1: file .*nope.json not found \(and 4 more problems\)$", line), line


def test_check_also_lists_problems_that_need_other_fields_valid(setup, capsys):
    """A repeated method, a reference and method options that depend on the methods, and a file-wide check:
    all in one --check, not one fix-and-recheck round each."""
    exp = setup / "exp.yaml"
    exp.write_text(
        GRID.format(budget=15, limit=1, d1="d1.json").replace("[cot, simple_rag]", "[cot, cot, simple_rag]")
        + "reference: hyde\nmethod_options:\n  simple_rag: {fusion: bogus}\n"
    )
    expected = [
        r"exp.yaml:8: methods: .*method\(s\) cot listed twice",
        r"exp.yaml:10: method_options: simple_rag: unknown simple_rag option\(s\) fusion",
        r"exp.yaml:9: reference: .*'hyde' is not one of the cells \(cot, simple_rag\)",
    ]
    assert_check_lists(capsys, exp, expected)


def saved_hcqr(setup, budget=3):
    """A saved HCQR program over the tiny index with one answer-step demo (as a compile would leave it)."""
    program = HCQR(load_index(setup / "idx"), budget=budget, k_per_query=2)
    demo = {"question": "Digoxin case?", "options": "A. Digoxin toxicity\nB. Graves", "context": "Document [1] x"}
    program.answer.demos = [dspy.Example(**demo, reasoning="yellow vision", answer="A")]
    return save_program(program, setup / "programs" / f"hcqr-b{budget}")


def test_saved_programs_run_as_cells_beside_the_methods(setup, mlflow_store):
    folder = saved_hcqr(setup)
    exp = load_experiment(
        write_exp(setup, methods=["simple_rag", "hcqr"], programs={"hcqr_demo": "programs/hcqr-b3"}, reference="hcqr")
    )
    assert exp.programs == {"hcqr_demo": str(folder)}
    out = run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=routed_lm())
    assert list(out["cells"]["d1"]) == ["simple_rag", "hcqr", "hcqr_demo"]
    config = json.loads((setup / "runs" / "grid" / "d1" / "hcqr_demo" / "config.json").read_text())
    assert config["method"] == "hcqr" and config["saved_program"]["folder"] == str(folder)
    report = (setup / "runs" / "grid" / "d1" / "comparison" / "comparison.md").read_text()
    assert "(reference: hcqr)" in report and "| hcqr+saved |" in report


def test_a_folder_of_replicate_compiles_is_one_cell_a_seed(setup, mlflow_store):
    replicates = setup / "programs" / "hcqr-seeds"
    for seed in (2, 0):
        shutil.copytree(saved_hcqr(setup), replicates / f"seed-{seed}")
    (replicates / "seed-9").mkdir()  # a seed whose compile never finished: no meta.json, no cell
    exp = load_experiment(write_exp(setup, methods=["hcqr"], programs={"bfs": "programs/hcqr-seeds"}, reference="hcqr"))
    assert exp.programs == {"bfs-seed-0": str(replicates / "seed-0"), "bfs-seed-2": str(replicates / "seed-2")}
    twice = {"bfs": "programs/hcqr-seeds", "bfs-seed-0": "programs/hcqr-b3"}
    with pytest.raises(ExperimentError, match=r"program cell 'bfs-seed-0' is named twice"):
        load_experiment(write_exp(setup, methods=["hcqr"], programs=twice, reference="hcqr"))
    with pytest.raises(ExperimentError, match=r"no meta.json\) nor one of replicate compiles"):
        load_experiment(
            write_exp(setup, methods=["hcqr"], programs={"bfs": "programs/hcqr-seeds/seed-9"}, reference="hcqr")
        )


@pytest.mark.parametrize(
    "programs, message",
    [
        ({"hcqr": "programs/hcqr-b3"}, r"programs: program cell\(s\) hcqr share a method's name"),
        ({"comparison": "programs/hcqr-b3"}, r"program cell\(s\) comparison share a method's name or comparison"),
        ({"x": "programs/none"}, r"programs\.x: .*programs/none is not a saved program folder \(no meta.json\)"),
        ({"x/y": "programs/hcqr-b3"}, r"programs\.x/y\.\[key\]: String should match pattern"),
    ],
)
def test_bad_program_cells_are_refused_when_the_file_is_read(setup, programs, message):
    saved_hcqr(setup)
    with pytest.raises(ExperimentError, match=message):
        load_experiment(write_exp(setup, programs=programs))


def test_a_program_compiled_on_the_experiments_questions_is_refused_by_check_before_any_cell(
    setup, mlflow_store, capsys
):
    folder = saved_hcqr(setup)
    meta = json.loads((folder / "meta.json").read_text())
    ids = ["d1-0", "d1-1", "d1-2"]  # trained on the grid's questions
    meta["train"] = {"dataset": "d1", "ids": ids, "text_sha256": ["0" * 64] * 3}
    (folder / "meta.json").write_text(json.dumps(meta))
    path = write_exp(setup, programs={"b3": "programs/hcqr-b3"})
    assert main(["experiment", str(path), "--check", "--mlflow-dir", str(mlflow_store)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(r"program cell 'b3': saved program .*hcqr-b3: the evaluation set 'd1' overlaps the training", err)
    lm = routed_lm()
    with pytest.raises(ExperimentError, match="overlaps the training set"):
        run_experiment(load_experiment(path), runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=lm)
    assert lm.history == [] and not (setup / "runs").exists()


def test_a_program_with_another_budget_is_refused_before_any_lm_call(setup, mlflow_store, capsys):
    saved_hcqr(setup, budget=5)
    path = write_exp(setup, programs={"hcqr_b5": "programs/hcqr-b5"})
    exp = load_experiment(path)
    lm = routed_lm()
    runs_before = len(mlflow.search_runs(search_all_experiments=True))
    budget = r"program cell 'hcqr_b5' .* shows 5 passages, the file's budget is 3"
    with pytest.raises(ExperimentError, match=budget):
        run_experiment(exp, runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=lm)
    assert lm.history == [] and not (setup / "runs").exists()  # nothing written, no MLflow run left behind
    assert len(mlflow.search_runs(search_all_experiments=True)) == runs_before
    assert main(["experiment", str(path), "--check", "--mlflow-dir", str(mlflow_store)]) == 2  # --check finds it too
    assert re.search(budget, capsys.readouterr().err)
    # a program that records no budget, beside it: --check names both cells, one line each
    bare = shutil.copytree(setup / "programs" / "hcqr-b5", setup / "programs" / "hcqr-bare")
    meta = json.loads((bare / "meta.json").read_text())
    del meta["options"]["budget"]
    (bare / "meta.json").write_text(json.dumps(meta))
    both = write_exp(setup, programs={"hcqr_b5": "programs/hcqr-b5", "bare": "programs/hcqr-bare"})
    assert main(["experiment", str(both), "--check", "--mlflow-dir", str(mlflow_store)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    bare_budget = r"program cell 'bare' .*hcqr-bare\) records no budget, the file's budget is 3"
    assert len(lines) == 2 and any(re.search(budget, x) for x in lines), lines
    assert any(re.search(bare_budget, x) for x in lines), lines
    with pytest.raises(ExperimentError, match=r"program cell .* \(and 1 more problem\)$"):
        run_experiment(load_experiment(both), runs_root=setup / "runs", mlflow_dir=mlflow_store, progress=False, lm=lm)
    saved_hcqr(setup, budget=3)
    assert main(["experiment", str(write_exp(setup, programs={"b3": "programs/hcqr-b3"})), "--check"]) == 0
    assert "x 3 method(s) + 1 program(s)" in capsys.readouterr().out


def test_a_bad_program_cell_is_the_one_error_reported_for_it(setup, capsys):
    path = write_exp(setup, programs={"x": "programs/none"}, reference="x")
    assert main(["experiment", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "is not a saved program folder" in err and "reference" not in err
