"""Demos counted as the LM sees them (each stage's prompt rendered by the adapter through DummyLM), the demos a
compile keeps, a bootstrap shortfall said loudly, the LabeledFewShot control recipe, and the optimizer catalog
(where each optimizer takes its seed, its score scale, its metrics)."""

import json
from pathlib import Path
from types import SimpleNamespace

import dspy
import mlflow
import pytest
import yaml
from dspy.utils import DummyLM
from helpers import GoldEngine, compile_spec, demo_gold, schema_lm

from hcqr_dspy.cli import main
from hcqr_dspy.errors import RecipeError
from hcqr_dspy.lm.adapter import HCQRAdapter
from hcqr_dspy.optimize.catalog import CATALOG, seed_problem
from hcqr_dspy.optimize.demo_counts import count_saved_program, keep_rendered_demos, stage_demos
from hcqr_dspy.optimize.recipe_compile import build_optimizer, optimizer_scores
from hcqr_dspy.optimize.recipes import load_recipe
from hcqr_dspy.optimize.saved import NoRetriever, load_program, read_meta
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.workflows.compile_inputs import draw_questions, seeded
from hcqr_dspy.workflows.compile_seeds import run_compile_seeds

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = str(REPO / "data" / "demo" / "questions.json")
RECIPES = REPO / "optimizers"
INCOMPLETE = "This is an example of the task, though some input or output fields are not supplied."


def spec(demo_bm25, out, **kw):
    return compile_spec(demo_bm25, out, **kw)


def prompts_by_stage(program, question):
    """Run ``program`` on one question with DummyLM through the adapter every command uses, and return each
    stage's prompt as sent: ``{stage: messages}`` (the first call of the stage)."""
    lm = DummyLM(
        {
            "`support_query`": {"support_query": "q1", "distinction_query": "q2", "key_feature_query": "q3"},
            "`discriminating_features`": {
                "discriminating_features": "f",
                "reasoning": "r",
                "working_hypothesis": "A",
                "confirming_evidence": "e",
            },
            "`answer`": {"reasoning": "r", "answer": "A"},
        },
        adapter=dspy.JSONAdapter(),
    )
    with dspy.context(lm=lm, adapter=HCQRAdapter()):
        program(question=question["question"], options=question["options"])
    out = {}
    for entry in lm.history:
        last = entry["messages"][-1]["content"]
        stage = "rewrite" if "`support_query`" in last else "hypothesis" if "`working_hypothesis`" in last else "answer"
        out.setdefault(stage, entry["messages"])
    return out


def shown(messages):
    """``(demos, incomplete demos)`` in a rendered prompt: each demo is one assistant turn before the live
    question; an incomplete one (a labelled example lacking fields) opens with DSPy's incomplete-demo prefix."""
    demos = sum(m["role"] == "assistant" for m in messages[:-1])
    incomplete = sum(m["role"] == "user" and m["content"].startswith(INCOMPLETE) for m in messages[:-1])
    return demos, incomplete


def test_the_demos_counted_are_the_demos_each_stage_prompt_shows(
    demo_bm25, tmp_path, mlflow_store, capsys, monkeypatch
):
    """One training question answered right: BootstrapFewShot keeps one full trace per stage and fills the answer
    step with a labelled example; the hypothesis and rewrite steps, whose outputs a labelled example lacks, get
    none. The counts (summary, meta.json, MLflow) are what the rendered prompts hold; the shortfall is said."""
    recipe = load_recipe(RECIPES / "bootstrap_fewshot.yaml")
    one = spec(demo_bm25, tmp_path / "bfs", seed=0)
    first = draw_questions(one, seeded(recipe, 0))[1][0].qid  # the only training question the LM gets right
    engine = GoldEngine(demo_gold(), right=lambda qid: qid == first, wrong="E")  # "E": no option, a bad reply
    monkeypatch.setattr("hcqr_dspy.workflows.compile_inputs.build_lm", lambda *a, **k: schema_lm(engine=engine))
    argv = ["compile", "--recipe", str(RECIPES / "bootstrap_fewshot.yaml"), "--train", QUESTIONS, "--train-size"]
    argv += ["6", "--index", str(demo_bm25), "--out", one.out, "--lm", "openai/unused", "--budget", "3"]
    argv += ["--k-per-query", "1", "--seed", "0", "--mlflow-dir", str(mlflow_store)]
    assert main(argv) == 0
    printed = capsys.readouterr()
    expected = {
        "hypothesis": {"bootstrapped": 1, "labelled": 0, "rendered": 1, "saved": 1},
        "rewrite": {"bootstrapped": 1, "labelled": 0, "rendered": 1, "saved": 1},
        "answer": {"bootstrapped": 1, "labelled": 1, "rendered": 2, "saved": 2},
    }
    meta = read_meta(one.out)
    assert meta["demos"] == expected and meta["bootstrap_shortfall"] == {"asked": 2, "bootstrapped": 1}
    assert "  hypothesis: 1 demos (1 bootstrapped, 0 labelled) in its prompt" in printed.out
    assert "  answer: 2 demos (1 bootstrapped, 1 labelled) in its prompt" in printed.out
    warning = "warning: BootstrapFewShot (seed 0) kept 1 bootstrapped trace(s) per stage, fewer than the 2 asked"
    assert [line for line in printed.err.splitlines() if line.startswith("warning:")][0].startswith(warning)
    run = mlflow.MlflowClient().get_run(meta["mlflow_run_id"])
    assert run.data.tags["bootstrap_shortfall"] == "1 of 2 asked"
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("demos.")} == {
        **{f"demos.{s}": c["rendered"] for s, c in expected.items()},
        **{f"demos.{s}.{k}": c[k] for s, c in expected.items() for k in ("bootstrapped", "labelled")},
    }
    # the prompts as the adapter renders them hold exactly the demos counted, labelled ones as incomplete examples
    program, _ = load_program(one.out, load_index(demo_bm25))
    question = json.loads(Path(QUESTIONS).read_text())["demo-020"]
    for stage, messages in prompts_by_stage(program, question).items():
        assert shown(messages) == (expected[stage]["rendered"], expected[stage]["labelled"]), stage
    assert count_saved_program(one.out) == expected
    # a bare labelled example given to the hypothesis step (as compiles did before) is never shown there
    bare = dspy.Example(question="q?", options={"A": "x", "B": "y"}, answer="A")
    program.hypothesis.demos = [*program.hypothesis.demos, bare]
    counts = stage_demos(program, HCQRAdapter())
    assert counts["hypothesis"] == {"bootstrapped": 1, "labelled": 0, "rendered": 1, "saved": 2}
    assert shown(prompts_by_stage(program, question)["hypothesis"]) == (1, 0)
    assert keep_rendered_demos(program, None, HCQRAdapter()) == {"hypothesis": 1}
    assert stage_demos(program, HCQRAdapter())["hypothesis"]["saved"] == 1


def test_labeled_fewshot_draws_labelled_answer_demos_by_seed_and_runs_no_program(demo_bm25, tmp_path, mlflow_store):
    lm = schema_lm("A")
    out = tmp_path / "lfs"
    done = run_compile_seeds(
        spec(demo_bm25, out, recipe="labeled_fewshot", method="simple_rag", program_options={"budget": 3}),
        [0, 1],
        mlflow_dir=mlflow_store,
        lm=lm,
    )
    assert done["failed"] == [] and lm.history == []  # LabeledFewShot copies questions: no LM call
    answers = []
    for item in done["seeds"]:
        meta = read_meta(item["out"])
        assert meta["recipe"]["metric"] is None and meta["bootstrap_shortfall"] is None
        assert meta["demos"] == {"answer": {"bootstrapped": 0, "labelled": 2, "rendered": 2, "saved": 2}}
        state = json.loads((Path(item["out"]) / "program.json").read_text())
        demos = state["answer"]["demos"]
        assert all(d["options"].startswith("A. ") and "augmented" not in d for d in demos)  # shown as live options
        assert {d["qid"] for d in demos} <= set(meta["train"]["ids"])
        answers.append([d["qid"] for d in demos])
        run = mlflow.MlflowClient().get_run(meta["mlflow_run_id"])
        assert run.data.metrics["demos.answer.labelled"] == 2 and run.data.tags["optimizer"] == "LabeledFewShot"
    assert answers[0] != answers[1]  # the seed chose other questions
    program, _ = load_program(done["seeds"][0]["out"], load_index(demo_bm25))
    question = json.loads(Path(QUESTIONS).read_text())["demo-020"]
    assert shown(prompts_by_stage(program, question)["answer"]) == (2, 2)
    # LabeledFewShot on HCQR: the hypothesis and rewrite steps keep nothing they would not show
    lfs = run_compile_seeds(spec(demo_bm25, tmp_path / "hcqr-lfs", recipe="labeled_fewshot"), [3], track=False, lm=lm)
    assert read_meta(lfs["seeds"][0]["out"])["demos"]["hypothesis"] == {
        "bootstrapped": 0,
        "labelled": 0,
        "rendered": 0,
        "saved": 0,
    }


def test_every_shipped_recipe_names_a_catalogued_optimizer_and_every_catalogued_one_ships_a_recipe():
    names = {p.stem: load_recipe(p).optimizer for p in RECIPES.glob("*.yaml")}
    assert names["labeled_fewshot"] == "LabeledFewShot" and names["simba"] == "SIMBA"
    assert set(names.values()) == set(CATALOG)  # a catalog entry comes with its recipe file


def test_the_seed_goes_where_each_optimizer_takes_it():
    mipro = load_recipe(RECIPES / "mipro_light.yaml").model_copy(update={"seed": 7})
    with dspy.context(lm=schema_lm("A")):  # MIPROv2 takes the context's LM as its task and prompt model
        assert build_optimizer(mipro, lambda *a: 1.0).seed == 7  # the constructor's seed (its compile's is `or`)
    gepa = load_recipe(RECIPES / "gepa.yaml").model_copy(update={"seed": 5})
    assert build_optimizer(gepa, lambda *a: 1.0, reflection_lm=schema_lm("A")).seed == 5
    bfs = build_optimizer(load_recipe(RECIPES / "bootstrap_fewshot.yaml"), lambda *a: 1.0)
    assert not hasattr(bfs, "seed")  # no seed of its own: the training questions' order carries it
    lfs = build_optimizer(load_recipe(RECIPES / "labeled_fewshot.yaml"), None)
    assert lfs.k == 2 and not hasattr(lfs, "metric")
    assert seed_problem("MIPROv2", {"max_bootstrapped_demos": 0, "max_labeled_demos": 0}, {}) is None
    assert "asks it for no demos" in seed_problem(
        "BootstrapFewShotWithRandomSearch", {"max_bootstrapped_demos": 0, "max_labeled_demos": 0}, {}
    )
    assert "one question" in seed_problem("BootstrapFewShot", {}, {}, file_questions=1)
    assert seed_problem("BootstrapFewShot", {}, {}, file_questions=2) is None


def test_optimizer_scores_read_each_optimizer_on_its_scale():
    candidates = SimpleNamespace(candidate_programs=[{"score": 60.0}, {"score": 20.0}])
    assert optimizer_scores(candidates, "BootstrapFewShotWithRandomSearch") == {"val_score": 0.6, "candidates": 2.0}
    assert optimizer_scores(SimpleNamespace(score=75.0), "MIPROv2") == {"val_score": 0.75}
    gepa = SimpleNamespace(detailed_results=SimpleNamespace(val_aggregate_scores=[0.2, 0.7, 0.5], best_idx=1))
    assert optimizer_scores(gepa, "GEPA") == {"val_score": 0.7, "candidates": 3.0}
    for name in ("BootstrapFewShot", "LabeledFewShot"):  # they score no candidate, whatever the object holds
        assert optimizer_scores(SimpleNamespace(score=75.0, candidate_programs=[{"score": 1.0}]), name) == {}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"settings": {"seed": 3}}, r"'seed' is the recipe's own key \(seed, or seeds\).*remove it from 'settings'"),
        ({"optimizer": "MIPROv2", "compile": {"seed": 3}}, r"remove it from 'compile'"),
        ({"optimizer": "LabeledFewShot", "metric": "accuracy"}, r"LabeledFewShot takes no metric .*leave 'metric' out"),
        ({"seeds": [0, 2, 2]}, r"seeds: 2 given more than once"),
        ({"seeds": []}, r"seeds: List should have at least 1 item"),
        ({"seeds": [-1]}, r"seeds.0: Input should be greater than or equal to 0"),
        ({"optimizer": "LabeledFewShot", "reflection_lm": "local"}, r"'reflection_lm' is for GEPA only"),
    ],
)
def test_recipe_seed_and_metric_rules(tmp_path, fields, message):
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"optimizer": "BootstrapFewShot", **fields}))
    with pytest.raises(RecipeError, match=message):
        load_recipe(tmp_path / "r.yaml")


def test_recount_of_a_saved_folder_reads_it_only(demo_bm25, tmp_path):
    program, _ = load_program(_saved(demo_bm25, tmp_path), NoRetriever())
    before = {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir()}
    assert count_saved_program(tmp_path / "p") == stage_demos(program)
    assert {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir()} == before


def _saved(demo_bm25, tmp_path):
    from hcqr_dspy.optimize.saved import save_program
    from hcqr_dspy.programs import HCQR

    program = HCQR(load_index(demo_bm25), budget=3)
    program.answer.demos = [dspy.Example(question="q?", options="A. x\nB. y", answer="A")]
    program.rewrite.demos = [dspy.Example(question="q?", options="A. x\nB. y", answer="A")]  # never shown
    save_program(program, tmp_path / "p")
    return tmp_path / "p"
