"""Prompt optimization with deterministic fake LMs: every recipe compiles HCQR, saved programs round-trip,
overlap and bad recipes are refused before any LM call, compiled runs are recorded and compared."""

import dataclasses
import json
import socket
from pathlib import Path

import dspy
import mlflow
import pytest

from helpers import TINY_ROWS, schema_lm, snippet, write_jsonl
from hcqr_dspy.compare import compare
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluate import LMUnavailableError
from hcqr_dspy.lm import build_lm
from hcqr_dspy.optimize import (
    CompileSpec,
    RecipeError,
    compile_program,
    diagnose,
    load_recipe,
    make_metric,
    run_compile,
    split_train,
)
from hcqr_dspy.program_io import ProgramFormatError, load_program, save_program
from hcqr_dspy.programs import HCQR, CoT
from hcqr_dspy.retrieval import BM25Retriever, load_corpus, load_index
from hcqr_dspy.run import EvalSpec, run_evaluation

RECIPES = Path(__file__).resolve().parents[1] / "optimizers"
OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease"}


def questions(prefix, n, answer=lambda i: "A" if i % 3 else "B"):
    return {
        f"{i:04d}": {"question": f"{prefix} case {i}: a patient on digoxin sees yellow halos. Cause?",
                     "options": OPTIONS, "answer": answer(i)}
        for i in range(n)
    }


@pytest.fixture
def setup(tmp_path):
    corpus = load_corpus(write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    BM25Retriever(corpus, show_progress=False).save(tmp_path / "idx")
    (tmp_path / "medmcqa.json").write_text(json.dumps(questions("Train", 12)))
    (tmp_path / "medqa.json").write_text(json.dumps(questions("Test", 4)))
    return tmp_path


def examples(n=6):
    return load_questions_from(questions("Train", n))


def load_questions_from(rows):
    return [
        dspy.Example(qid=k, question=v["question"], options=v["options"], answer=v["answer"]).with_inputs("question", "options")
        for k, v in rows.items()
    ]


def fast(recipe):
    """The shipped recipe with search budgets a unit test can afford (same optimizer, same code path)."""
    settings = dict(recipe.settings)
    if recipe.optimizer == "GEPA":
        settings.update(auto=None, max_metric_calls=40)
    if recipe.optimizer == "MIPROv2":
        settings.update(num_candidates=2, auto=None)
        return dataclasses.replace(recipe, settings=settings, compile={**recipe.compile, "num_trials": 2, "minibatch_size": 2})
    return dataclasses.replace(recipe, settings=settings)


@pytest.mark.parametrize("name", ["bootstrap_fewshot", "bootstrap_random_search", "mipro_light", "gepa"])
def test_every_shipped_recipe_compiles_hcqr(setup, name):
    recipe = fast(load_recipe(RECIPES / f"{name}.yaml"))
    student = HCQR(load_index(setup / "idx"), budget=3, k_per_query=1)
    train = load_questions_from(questions("Train", 8))
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        compiled = compile_program(recipe, student, train[:6], train[6:], reflection_lm=schema_lm("A"))
        pred = compiled(question=train[0].question, options=OPTIONS)
    assert isinstance(compiled, HCQR) and compiled is not student
    assert [n for n, _ in compiled.named_predictors()] == ["hypothesis", "rewrite", "answer"]
    assert pred.answer == "A" and len(pred.queries) == 3
    assert all(not p.demos for p in student.predictors())  # the student is untouched
    if name == "bootstrap_fewshot":  # questions answered A are right: their traces became demos
        assert all(len(p.demos) >= 1 for p in compiled.predictors())


def test_round_trip_gives_identical_prompts_and_predictions(setup):
    recipe = load_recipe(RECIPES / "bootstrap_fewshot.yaml")
    retriever = load_index(setup / "idx")
    train = load_questions_from(questions("Train", 6))
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        compiled = compile_program(recipe, HCQR(retriever, budget=3, k_per_query=1), train, [])
    save_program(compiled, setup / "prog", optimizer="BootstrapFewShot")
    loaded, meta = load_program(setup / "prog", retriever)
    assert meta["method"] == "hcqr" and meta["options"]["k_per_query"] == 1 and meta["optimizer"] == "BootstrapFewShot"
    tests = load_questions_from(questions("Test", 3))
    outputs = []
    for program in (compiled, loaded):
        lm = schema_lm("A")
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            preds = [program(question=q.question, options=q.options) for q in tests]
        outputs.append(([(p.answer, p.queries, [x["id"] for x in p.passages]) for p in preds], lm.schema_engine.prompts))
    assert outputs[0] == outputs[1]
    assert any("Train case" in prompt for prompt in outputs[1][1])  # the demos reached the prompts


def test_saved_program_format_errors(setup):
    retriever = load_index(setup / "idx")
    save_program(HCQR(retriever, budget=3), setup / "p")
    with pytest.raises(ProgramFormatError, match="saved 'hcqr' program, not 'cot'"):
        load_program(setup / "p", retriever, method="cot")
    meta = json.loads((setup / "p" / "meta.json").read_text())
    (setup / "p" / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ProgramFormatError, match="format version 99, newer than this hcqr-dspy reads"):
        load_program(setup / "p", retriever)
    (setup / "p" / "meta.json").write_text(json.dumps({**meta, "method": "magic"}))
    with pytest.raises(ProgramFormatError, match="holds method 'magic'"):
        load_program(setup / "p", retriever)
    save_program(CoT(), setup / "c")  # a CoT state loaded as an HCQR program: predictors do not match
    (setup / "c" / "meta.json").write_text(json.dumps({**meta, "options": {"budget": 3}}))
    with pytest.raises(ProgramFormatError, match="holds predictors"):
        load_program(setup / "c", retriever)
    with pytest.raises(ProgramFormatError, match="not found"):
        load_program(setup / "missing", retriever)
    (setup / "junk").mkdir()
    (setup / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ProgramFormatError, match="not a saved program folder"):
        save_program(CoT(), setup / "junk")
    assert (setup / "junk" / "notes.txt").read_text() == "mine"


def write_recipe(folder, **fields):
    import yaml

    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump({"optimizer": "BootstrapFewShot", **fields}))
    return path


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"optimizer": "SuperOpt"}, r"unknown optimizer 'SuperOpt'; valid optimizers: BootstrapFewShot, .*GEPA"),
        ({"settings": {"max_demos": 3}}, r"unknown settings for BootstrapFewShot: max_demos; valid: .*max_bootstrapped_demos"),
        ({"compile": {"valset": []}}, r"unknown compile for BootstrapFewShot: valset"),
        ({"settings": {"metric": "x"}}, r"unknown settings for BootstrapFewShot: metric"),  # set by hcqr, not recipes
        ({"metric": "f1"}, r"unknown metric 'f1'; valid metrics: accuracy, feedback"),
        ({"metric": "feedback"}, r"metric 'feedback' is for GEPA"),
        ({"train_sise": 3}, r"unknown key\(s\) train_sise"),
        ({"train_size": 0}, r"'train_size' must be an integer >= 1"),
        ({"reflection_lm": "local"}, r"'reflection_lm' is for GEPA only"),
    ],
)
def test_bad_recipes_are_refused(tmp_path, fields, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(write_recipe(tmp_path, **fields))


def test_unknown_recipe_lists_the_shipped_ones(monkeypatch, tmp_path):
    monkeypatch.chdir(RECIPES.parent)
    with pytest.raises(RecipeError, match=r"recipe 'nope' not found \(looked in optimizers/\); recipes there: bootstrap_fewshot, .*mipro_light"):
        load_recipe("nope")
    assert load_recipe("bootstrap_fewshot").optimizer == "BootstrapFewShot"
    # from any other folder, a bare name still finds the shipped recipes (and the user's ./optimizers/ first)
    monkeypatch.chdir(tmp_path)
    assert load_recipe("gepa").optimizer == "GEPA"
    (tmp_path / "optimizers").mkdir()
    (tmp_path / "optimizers" / "gepa.yaml").write_text((RECIPES / "bootstrap_fewshot.yaml").read_text())
    assert load_recipe("gepa").optimizer == "BootstrapFewShot"
    with pytest.raises(RecipeError, match=r"looked in optimizers/, .*/optimizers/\); recipes there: bootstrap_fewshot"):
        load_recipe("nope")


def test_train_set_too_small_names_the_minimum():
    recipe = load_recipe(RECIPES / "mipro_light.yaml")
    with pytest.raises(RecipeError, match=r"train set of 3 question\(s\) is too small for recipe 'mipro_light' \(MIPROv2\); it needs at least 5"):
        split_train(examples(20), recipe, train_size=3)
    with pytest.raises(RecipeError, match="the train file has 6 questions; recipe 'mipro_light' needs 30 \\+ 10"):
        split_train(examples(6), recipe)
    train, val = split_train(examples(20), recipe, train_size=6, val_size=4)
    assert len(train) == 6 and len(val) == 4 and not {e.qid for e in train} & {e.qid for e in val}


def spec(setup, **kw):
    base = dict(recipe=str(RECIPES / "bootstrap_fewshot.yaml"), method="hcqr", train=str(setup / "medmcqa.json"),
                index=str(setup / "idx"), out=str(setup / "programs" / "bfs"), lm="openai/unused", train_size=6,
                val_size=0, program_options={"budget": 3, "k_per_query": 1})
    return CompileSpec(**{**base, **kw})


class NoCall:
    """An LM stand-in that fails the test if any call reaches it."""

    def __getattr__(self, name):
        raise AssertionError(f"LM used before input was checked ({name})")


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"recipe": str(RECIPES / "gepa.yaml")}, RecipeError, "needs a reflection LM"),
        ({"method": "magic"}, HCQRError, "unknown method 'magic'"),
        ({"train_size": 2}, RecipeError, "too small for recipe 'bootstrap_fewshot'.*at least 4"),
        ({"holdout": ["HOLDOUT"]}, HCQRError, r"overlaps the training set 'medmcqa': 6 question\(s\) \(.*; 6 match by id, 6 by question text\)"),
        ({"out": "CORPUS"}, ProgramFormatError, "exists and is not a saved program folder"),
        ({"out": "/proc/hcqr-test/out"}, HCQRError, "--out /proc/hcqr-test/out is not writable"),  # even for root
    ],
)
def test_compile_refuses_bad_input_before_any_lm_call(setup, overrides, error, message):
    overrides = {k: ([str(setup / "medmcqa.json")] if v == ["HOLDOUT"] else str(setup / "corpus.jsonl") if v == "CORPUS" else v)
                 for k, v in overrides.items()}
    with pytest.raises(error, match=message):
        run_compile(spec(setup, **overrides), track=False, lm=NoCall())


def test_an_lm_going_down_during_the_compile_stops_it_and_saves_nothing(setup, monkeypatch):
    # BootstrapFewShot counts a failed example as an error and goes on below max_errors: without the check,
    # 6 refused calls would yield a program with no demos, saved as if compiled.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections to it are refused
    monkeypatch.setenv("DOWN_KEY", "unused")
    lm = build_lm("openai/down", api_base=f"http://127.0.0.1:{port}/v1", api_key_env="DOWN_KEY", cache=False, num_retries=0)
    with pytest.raises(LMUnavailableError, match=r"during the compile \(LMTransportError: .*nothing was saved to .*run the same command again"):
        run_compile(spec(setup), track=False, lm=lm)
    assert not (setup / "programs" / "bfs" / "program.json").exists()


def test_overlap_by_question_text_across_datasets(setup):
    # the same question texts under another dataset name and other ids: caught by text
    rows = {f"x{k}": v for k, v in questions("Train", 12).items()}
    (setup / "other.json").write_text(json.dumps(rows))
    with pytest.raises(HCQRError, match=r"overlaps the training set 'medmcqa': 6 question\(s\) \(x\d+, .*; 0 match by id, 6 by question text\)"):
        run_compile(spec(setup, holdout=[str(setup / "other.json")]), track=False, lm=NoCall())


def test_compile_track_evaluate_and_compare_zero_shot_vs_compiled(setup, mlflow_store):
    out = run_compile(spec(setup), mlflow_dir=mlflow_store, lm=schema_lm("A"))
    folder = Path(out["out"])
    assert out["train"] == 6 and all(p["demos"] >= 1 for p in out["predictors"].values())
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["optimizer"] == "BootstrapFewShot" and meta["recipe"]["name"] == "bootstrap_fewshot"
    assert meta["train"]["dataset"] == "medmcqa" and len(meta["train"]["ids"]) == 6
    assert meta["index"]["corpus_count"] == len(TINY_ROWS) and meta["mlflow_run_id"] == out["mlflow_run_id"]
    client = mlflow.MlflowClient()
    run = client.get_run(out["mlflow_run_id"])
    assert run.data.tags["kind"] == "compile" and run.data.params["recipe.optimizer"] == "BootstrapFewShot"
    artifacts = {a.path for a in client.list_artifacts(out["mlflow_run_id"], "program")}
    assert {"program/program.json", "program/meta.json"} <= artifacts
    assert client.list_artifacts(out["mlflow_run_id"], "recipe")
    model = mlflow.models.get_model_info(out["model_uri"])
    assert model.run_id == out["mlflow_run_id"] and model.flavors.get("dspy")

    common = dict(dataset=str(setup / "medqa.json"), index=str(setup / "idx"), lm="openai/unused")
    zero, zero_dir, _ = run_evaluation(EvalSpec(method="hcqr", program_options={"budget": 3, "k_per_query": 1},
                                                run_dir=str(setup / "runs" / "zero"), **common),
                                       mlflow_dir=mlflow_store, progress=False, lm=schema_lm("A"))
    comp, comp_dir, comp_id = run_evaluation(EvalSpec(method=None, program=f"runs:/{out['mlflow_run_id']}",
                                                      run_dir=str(setup / "runs" / "compiled"), **common),
                                             mlflow_dir=mlflow_store, progress=False, lm=schema_lm("A"))
    config = json.loads((comp_dir / "config.json").read_text())
    assert config["method"] == "hcqr" and config["saved_program"]["optimizer"] == "BootstrapFewShot"
    assert config["saved_program"]["recipe"] == "bootstrap_fewshot" and config["saved_program"]["train_count"] == 6
    assert client.get_run(comp_id).data.params["saved_program.optimizer"] == "BootstrapFewShot"
    assert zero.metrics["n"] == comp.metrics["n"] == 4

    report, files = compare([zero_dir, comp_dir], out_dir=setup / "cmp")
    assert "| hcqr+bootstrap_fewshot |" in report and "McNemar" in report
    assert "## Differences from the reference" in report and "Δ hypothesis accuracy" in report
    assert "## Programs: instructions and demos" in report
    assert "**answer**: 0 -> " in report and "instructions unchanged" in report

    # the compiled program refuses questions it was trained on (the train file itself)
    with pytest.raises(HCQRError, match="overlaps the training set 'medmcqa'"):
        run_evaluation(EvalSpec(method=None, program=str(folder), dataset=str(setup / "medmcqa.json"),
                                index=str(setup / "idx"), lm="openai/unused", run_dir=str(setup / "runs" / "bad")),
                       mlflow_dir=mlflow_store, progress=False, lm=NoCall())
    with pytest.raises(HCQRError, match="saved 'hcqr' program, not 'cot'"):
        run_evaluation(EvalSpec(method="cot", program=str(folder), run_dir=str(setup / "runs" / "bad2"), **common),
                       mlflow_dir=mlflow_store, progress=False, lm=NoCall())


def test_feedback_names_where_an_hcqr_trace_went_wrong():
    ex = dspy.Example(question="q", options={"A": "Digoxin toxicity", "B": "Graves disease"}, answer="A")

    def pred(answer, y0=None, valid=True):
        return dspy.Prediction(answer=answer, valid=valid, error=None if valid else "answer: AdapterParseError",
                               hypothesis={"working_hypothesis": y0} if y0 else None, passages=[])

    assert diagnose(ex, pred("A", "A"))[:2] == (1.0, "correct")
    assert diagnose(ex, pred("A", "B"))[:2] == (1.0, "wrong_hypothesis_corrected")
    assert diagnose(ex, pred(None, "A", valid=False))[:2] == (0.0, "invalid_answer")
    score, case, text = diagnose(ex, pred("B", "A"))
    assert (score, case) == (0.0, "right_hypothesis_flipped") and "flipped away to B" in text
    score, case, text = diagnose(ex, pred("B", "B"), ["Graves disease: TSH receptor antibodies."])
    assert case == "wrong_hypothesis_no_evidence" and "did not contain distinguishing evidence" in text
    _, case, _ = diagnose(ex, pred("B", "B"), ["Digoxin toxicity gives yellow vision."])
    assert case == "wrong_hypothesis_evidence_ignored"
    assert diagnose(ex, pred("B"))[1] == "wrong"  # no hypothesis (not HCQR)

    metric = make_metric("feedback")
    out = metric(ex, pred("B", "A"), None, "answer", None)
    assert out.score == 0.0 and "flipped" in out.feedback and "not mainly due" not in out.feedback
    out = metric(ex, pred("B", "A"), None, "rewrite", None)
    assert "not mainly due to the rewrite step" in out.feedback
    assert make_metric("accuracy")(ex, pred("A")) is True


def test_demo_contexts_are_trimmed_and_counted_against_the_context_budget(setup):
    recipe = dataclasses.replace(load_recipe(RECIPES / "bootstrap_fewshot.yaml"), demo_context_tokens=40)
    retriever = load_index(setup / "idx")
    train = load_questions_from(questions("Train", 6))
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        student = HCQR(retriever, budget=3, k_per_query=1)
        compiled = compile_program(recipe, student, train, [])
        demos = [d for d in compiled.answer.demos if d.get("context")]
        assert demos and all(len(d["context"]) // 4 <= 40 for d in demos)  # SchemaEngine counts ~4 chars a token
        assert all(d["context"].startswith("Document [1]") and "Document [3]" not in d["context"] for d in demos)
        lm.engine.n_ctx = 4000  # a windowed LM: the budget is what the window leaves
        q = train[0]
        assert compiled.context_budget(q.question, q.options) < student.context_budget(q.question, q.options)


def test_cli_compile_refuses_bad_input_with_one_line(setup, capsys, monkeypatch):
    from hcqr_dspy.cli import main

    monkeypatch.chdir(RECIPES.parent)
    base = ["compile", "--train", str(setup / "medmcqa.json"), "--index", str(setup / "idx"), "--out", str(setup / "p"),
            "--lm", "openai/unused", "--no-mlflow"]
    assert main(base + ["--recipe", "gepa"]) == 2
    assert "needs a reflection LM: give --reflection-lm" in capsys.readouterr().err
    assert main(base + ["--recipe", "nope"]) == 2
    assert "recipe 'nope' not found (looked in optimizers/); recipes there: bootstrap_fewshot" in capsys.readouterr().err
    assert main(base + ["--recipe", "bootstrap_fewshot", "--train-size", "2"]) == 2
    assert "it needs at least 4" in capsys.readouterr().err
    assert not (setup / "p").exists()


def test_every_registered_program_round_trips_its_options(setup):
    from hcqr_dspy.programs import PROGRAMS, accepted_options, make_program

    retriever = load_index(setup / "idx")
    non_default = {"budget": 4, "k_per_query": 2, "fusion": "rrf", "n_queries": 3, "pool_k": 6, "n_std": 0.5,
                   "scoring": "vote", "top_logprobs": 5, "max_context_tokens": 3000}
    for method, cls in PROGRAMS.items():
        options = {k: v for k, v in non_default.items() if k in accepted_options(cls)}
        program = make_program(method, retriever, **options)
        save_program(program, setup / "rt" / method)
        loaded, meta = load_program(setup / "rt" / method, retriever)
        assert type(loaded) is cls and loaded.settings() == program.settings(), method
        assert {k: meta["options"][k] for k in options} == options, method


def test_answer_demos_are_shown_trimmed(setup):
    retriever = load_index(setup / "idx")
    program = HCQR(retriever, budget=3, k_per_query=1)
    long_context = "\n".join(f"Document [{i}] (Title: T{i}) " + "word " * 300 for i in range(1, 6))
    program.answer.demos = [dspy.Example(question="Demo question?", options="A. x\nB. y", context=long_context,
                                         reasoning="r", answer="A")]
    program.demo_context_tokens = 400  # SchemaEngine counts ~4 characters a token: one document is ~380
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        program(question="Live question?", options=OPTIONS)
    [answer_prompt] = [p for p in lm.schema_engine.prompts if "Demo question?" in p]
    assert "Document [1] (Title: T1)" in answer_prompt and "Document [2] (Title: T2)" not in answer_prompt
    assert program.answer.demos[0]["context"] == long_context  # the program's own demo is untouched
