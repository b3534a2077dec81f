"""Replicate compiles (`hcqr compile --seeds`, `--seed`, a recipe's `seeds`): one saved and registered program per
seed, the seed driving the draw, failed and interrupted seeds, and bad input refused in one line with nothing
written. The demo questions and an in-process stub LM that answers them right (tests/helpers.py GoldEngine)."""

import json
from pathlib import Path

import mlflow
import pytest
import yaml
from helpers import GoldEngine, compile_spec, demo_gold, schema_lm

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError, RecipeError
from hcqr_dspy.optimize.saved import read_meta
from hcqr_dspy.workflows.compile import run_compile
from hcqr_dspy.workflows.compile_seeds import parse_seeds, run_compile_seeds

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = str(REPO / "data" / "demo" / "questions.json")
RECIPES = REPO / "optimizers"


def gold_lm(**kw):
    return schema_lm(engine=GoldEngine(demo_gold(), **kw))


def spec(demo_bm25, out, **kw):
    return compile_spec(demo_bm25, out, **kw)


def demos(folder):
    """Each stage's demos as saved (program.json)."""
    state = json.loads((Path(folder) / "program.json").read_text())
    return {stage: state[stage]["demos"] for stage in ("hypothesis", "rewrite", "answer")}


def demo_questions(folder, stage="answer"):
    return [d["question"] for d in demos(folder)[stage]]


def test_each_seed_draws_its_own_demos_and_a_seed_repeated_draws_the_same(demo_bm25, tmp_path):
    done = run_compile_seeds(spec(demo_bm25, tmp_path / "bfs"), [0, 1, 2], track=False, lm=gold_lm())
    assert done["failed"] == [] and [s["status"] for s in done["seeds"]] == ["compiled"] * 3
    folders = [tmp_path / "bfs" / f"seed-{n}" for n in (0, 1, 2)]
    assert [s["out"] for s in done["seeds"]] == [str(f) for f in folders]
    drawn = [demo_questions(f) for f in folders]
    assert all(len(d) == 2 for d in drawn) and len({tuple(d) for d in drawn}) == 3  # three different demo sets
    for n, folder in enumerate(folders):
        meta = read_meta(folder)
        assert meta["recipe"]["seed"] == n and meta["recipe"]["seeds"] is None
        # BootstrapFewShot kept the first two training questions in the order this seed drew them
        assert [demo_gold()[i][0] for i in meta["train"]["ids"][:2]] == demo_questions(folder)
    # the same seed again (one compile, --seed): the same questions drawn, the same demos
    again = run_compile(spec(demo_bm25, tmp_path / "again", seed=1), track=False, lm=gold_lm())
    assert again["seed"] == 1 and demos(tmp_path / "again") == demos(folders[1])
    assert read_meta(tmp_path / "again")["train"]["ids"] == read_meta(folders[1])["train"]["ids"]


def test_the_seed_orders_the_training_questions_when_it_draws_them_all(demo_bm25, tmp_path):
    """With every question of the train file drawn, only their order can differ: BootstrapFewShot, which has no
    seed of its own, still compiles different demos for different seeds."""
    whole = spec(demo_bm25, tmp_path / "all", train_size=len(demo_gold()))
    done = run_compile_seeds(whole, [0, 1], track=False, lm=gold_lm())
    ids = [read_meta(s["out"])["train"]["ids"] for s in done["seeds"]]
    assert sorted(ids[0]) == sorted(ids[1]) == sorted(demo_gold()) and ids[0] != ids[1]
    assert demo_questions(done["seeds"][0]["out"]) != demo_questions(done["seeds"][1]["out"])


def test_a_failing_seed_keeps_the_others_and_a_rerun_compiles_only_what_is_missing(demo_bm25, tmp_path, monkeypatch):
    import hcqr_dspy.workflows.compile as compile_module

    real = compile_module.compile_program

    def seed_one_fails(recipe, *args, **kwargs):
        if recipe.seed == 1:
            raise RuntimeError("the optimizer crashed")
        return real(recipe, *args, **kwargs)

    monkeypatch.setattr(compile_module, "compile_program", seed_one_fails)
    lines = []
    done = run_compile_seeds(
        spec(demo_bm25, tmp_path / "out"), [0, 1, 2], track=False, lm=gold_lm(), report=lines.append
    )
    assert done["failed"] == [1]
    assert [s["status"] for s in done["seeds"]] == ["compiled", "failed", "compiled"]
    assert done["seeds"][1]["error"] == "RuntimeError: the optimizer crashed"
    assert "seed 1 failed: RuntimeError: the optimizer crashed" in lines
    # not an outage or bad input: the traceback says where it happened
    [trace] = [line for line in lines if line.startswith("Traceback")]
    assert "in seed_one_fails" in trace and trace.endswith("RuntimeError: the optimizer crashed")
    assert (tmp_path / "out" / "seed-0" / "meta.json").exists() and (tmp_path / "out" / "seed-2" / "meta.json").exists()
    assert not (tmp_path / "out" / "seed-1").exists()
    saved = {n: (tmp_path / "out" / f"seed-{n}" / "program.json").read_bytes() for n in (0, 2)}

    monkeypatch.setattr(compile_module, "compile_program", real)
    lines.clear()
    done = run_compile_seeds(
        spec(demo_bm25, tmp_path / "out"), [0, 1, 2], track=False, lm=gold_lm(), report=lines.append
    )
    assert [s["status"] for s in done["seeds"]] == ["skipped", "compiled", "skipped"] and done["failed"] == []
    assert any("seed 0:" in line and "skipped" in line for line in lines)
    assert {n: (tmp_path / "out" / f"seed-{n}" / "program.json").read_bytes() for n in (0, 2)} == saved
    assert done["seeds"][0]["result"]["predictors"]["answer"]["rendered"] == 2  # a skipped seed's counts, read back


def test_cli_seeds_register_one_version_per_seed_and_report_the_demos_each_prompt_shows(
    demo_bm25, tmp_path, mlflow_store, monkeypatch, capsys
):
    monkeypatch.setattr("hcqr_dspy.workflows.compile_inputs.build_lm", lambda *a, **k: gold_lm())
    out = tmp_path / "programs" / "bfs"
    argv = ["compile", "--recipe", "bootstrap_fewshot", "--train", QUESTIONS, "--train-size", "6"]
    argv += ["--index", str(demo_bm25), "--out", str(out), "--lm", "openai/unused", "--budget", "3"]
    argv += ["--k-per-query", "1", "--mlflow-dir", str(mlflow_store), "--register", "hcqr-seeds", "--alias", "champ"]
    monkeypatch.chdir(REPO)
    assert main(argv + ["--seeds", "0,1,2"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "Downloading artifacts" not in captured.err  # MLflow's progress bars are off in hcqr's commands
    client = mlflow.MlflowClient()
    versions = sorted(client.search_model_versions("name='hcqr-seeds'"), key=lambda v: int(v.version))
    assert [v.tags["seed"] for v in versions] == ["0", "1", "2"]
    for n, version in enumerate(versions):
        folder = out / f"seed-{n}"
        assert client.get_model_version_by_alias("hcqr-seeds", f"champ-seed-{n}").version == version.version
        run = client.get_run(version.run_id)
        assert run.data.tags["seed"] == str(n) and read_meta(folder)["mlflow_run_id"] == version.run_id
        counts = read_meta(folder)["demos"]
        for stage, c in counts.items():  # meta.json, the MLflow metrics and the summary agree
            assert run.data.metrics[f"demos.{stage}"] == c["rendered"] == len(demos(folder)[stage]) == 2
            assert run.data.metrics[f"demos.{stage}.bootstrapped"] == c["bootstrapped"] == 2
            assert run.data.metrics[f"demos.{stage}.labelled"] == c["labelled"] == 0
        assert f"seed {n}: compiled, {folder}: hypothesis 2 demos (2 bootstrapped, 0 labelled)" in printed
        assert f"registered as models:/hcqr-seeds/{version.version} (alias champ-seed-{n})" in printed
    # each seed's stages are versions of the prompts hcqr-seeds.<stage>, tagged with their seed
    prompt = mlflow.genai.load_prompt(f"prompts:/hcqr-seeds.answer/{len(versions) + 1}")  # 1: the zero-shot one
    assert prompt.tags["seed"] == "2" and prompt.tags["demos"] == "2" and prompt.tags["demos_bootstrapped"] == "2"
    assert len({tuple(demo_questions(out / f"seed-{n}")) for n in range(3)}) == 3

    # run again: every seed is saved, so nothing is compiled or registered
    assert main(argv + ["--seeds", "0,1,2"]) == 0
    printed = capsys.readouterr().out
    assert all(f"seed {n}: {out / f'seed-{n}'} holds its complete saved program; skipped" in printed for n in range(3))
    assert len(client.search_model_versions("name='hcqr-seeds'")) == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seeds", ""], "--seeds '' names no seed; give integers >= 0 separated by commas"),
        (["--seeds", "0,1,0"], "--seeds: seed 0 given more than once"),
        (["--seeds", "0,-1"], "--seeds: seed -1 is not an integer >= 0"),
        (["--seeds", "0,x"], "--seeds '0,x': 'x' is not an integer"),
        (["--seeds", "1.5"], "--seeds '1.5': '1.5' is not an integer"),
        (["--seed", "3", "--seeds", "0,1"], "give either --seed 3 or --seeds 0,1, not both"),
        (
            ["--seeds", "0,1", "--recipe", "NO_DEMOS"],
            "recipe 'r': BootstrapFewShot takes no seed of its own (the seed only draws and orders the training "
            "questions) and this recipe asks it for no demos (max_bootstrapped_demos: 0, max_labeled_demos: 0): "
            "every seed compiles the same program; compile one seed (--seed N)",
        ),
        (
            ["--seeds", "0,1", "--recipe", "NO_K"],
            "recipe 'r': LabeledFewShot takes no seed of its own (the seed only draws and orders the training "
            "questions) and this recipe asks it for no demos (k: 0)",
        ),
        (["--recipe", "BOTH"], "r.yaml:1: give either 'seed' or 'seeds', not both (seed 1, seeds [0, 1])"),
        (["--seeds", "0,1", "--out", "HOLDS_OTHER"], "holds other things than seed-<N>/ folders (notes.txt)"),
        (["--seeds", "0,1", "--holdout", QUESTIONS], "compile --holdout"),
    ],
)
def test_cli_bad_seeds_are_one_line_exit_2_and_write_nothing(demo_bm25, tmp_path, capsys, monkeypatch, extra, message):
    def no_lm(*args, **kwargs):
        raise AssertionError("an LM was built for a refused compile")

    monkeypatch.setattr("hcqr_dspy.workflows.compile_inputs.build_lm", no_lm)
    recipes = {
        "NO_DEMOS": {
            "optimizer": "BootstrapFewShot",
            "settings": {"max_bootstrapped_demos": 0, "max_labeled_demos": 0},
        },
        "NO_K": {"optimizer": "LabeledFewShot", "settings": {"k": 0}},
        "BOTH": {"optimizer": "BootstrapFewShot", "seed": 1, "seeds": [0, 1]},
    }
    for i, value in enumerate(extra):
        if value in recipes:
            (tmp_path / "r.yaml").write_text(yaml.safe_dump({"min_train": 2, **recipes[value]}))
            extra[i] = str(tmp_path / "r.yaml")
        if value == "HOLDS_OTHER":
            (tmp_path / "other").mkdir()
            (tmp_path / "other" / "notes.txt").write_text("mine")
            extra[i] = str(tmp_path / "other")
    out = tmp_path / "out"
    argv = ["compile", "--recipe", str(RECIPES / "bootstrap_fewshot.yaml"), "--train", QUESTIONS, "--train-size", "6"]
    argv += ["--index", str(demo_bm25), "--out", str(out), "--lm", "openai/unused", "--no-mlflow"]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_seeds_from_the_recipe_and_the_seed_override(demo_bm25, tmp_path):
    recipe = yaml.safe_load((RECIPES / "bootstrap_fewshot.yaml").read_text())
    del recipe["seed"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({**recipe, "seeds": [4, 5]}))
    done = run_compile_seeds(
        spec(demo_bm25, tmp_path / "out", recipe=str(tmp_path / "r.yaml")), track=False, lm=gold_lm()
    )
    assert [s["seed"] for s in done["seeds"]] == [4, 5] and (tmp_path / "out" / "seed-5" / "meta.json").exists()
    with pytest.raises(RecipeError, match=r"gives seeds \[4, 5\]: compile them with --seeds"):
        run_compile(spec(demo_bm25, tmp_path / "one", recipe=str(tmp_path / "r.yaml")), track=False, lm=gold_lm())
    one = run_compile(
        spec(demo_bm25, tmp_path / "one", recipe=str(tmp_path / "r.yaml"), seed=5), track=False, lm=gold_lm()
    )
    assert one["seed"] == 5 and demos(tmp_path / "one") == demos(tmp_path / "out" / "seed-5")
    with pytest.raises(HCQRError, match="give either --seed 5 or --seeds, not both"):
        run_compile_seeds(spec(demo_bm25, tmp_path / "x", seed=5), [0, 1], track=False, lm=gold_lm())


def test_a_seed_folder_holding_another_compile_is_refused_before_anything_runs(demo_bm25, tmp_path):
    run_compile(spec(demo_bm25, tmp_path / "out" / "seed-1", seed=2), track=False, lm=gold_lm())  # seed 2's program
    with pytest.raises(HCQRError, match=r"seed-1 holds another compile .* than seed 1 of this one"):
        run_compile_seeds(spec(demo_bm25, tmp_path / "out"), [0, 1], track=False, lm=gold_lm())
    assert not (tmp_path / "out" / "seed-0").exists()


def test_parse_seeds():
    assert parse_seeds("0,1, 2,3") == [0, 1, 2, 3] and parse_seeds("7") == [7]
    for bad in ("", ",", "0,,1", "a", "-2", "1,1"):
        with pytest.raises(HCQRError):
            parse_seeds(bad)


def test_an_evaluation_of_a_saved_program_records_its_compile_seed(demo_bm25, tmp_path):
    """config.json's saved_program names the compile's seed (replicate compiles are grouped by it); a run folder
    of format 1 (no seed recorded) resumes."""
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    run_compile(spec(demo_bm25, tmp_path / "bfs", seed=3), track=False, lm=gold_lm())
    trained = set(read_meta(tmp_path / "bfs")["train"]["ids"])
    held_out = [q for q in demo_gold() if q not in trained][:2]
    eval_spec = EvalSpec(
        method=None,
        program=str(tmp_path / "bfs"),
        dataset=QUESTIONS,
        ids=held_out,
        index=str(demo_bm25),
        lm="openai/unused",
        run_dir=str(tmp_path / "run"),
    )
    result, folder, _ = run_evaluation(eval_spec, progress=False, track=False, lm=gold_lm())
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    assert result.ran == 2 and config["saved_program"]["seed"] == 3
    del config["saved_program"]["seed"], config["format"]  # a run folder of format 1: no seed recorded
    config_file.write_text(json.dumps(config))
    again, _, _ = run_evaluation(eval_spec, progress=False, track=False, lm=gold_lm())
    assert again.ran == 0 and json.loads(config_file.read_text())["saved_program"]["seed"] == 3


def test_replicate_compiles_evaluations_are_named_apart_by_their_seed():
    from hcqr_dspy.tracking.evaluation_run import mlflow_run_name

    seeded = {"saved_program": {"recipe": "bootstrap_fewshot", "seed": 2}}
    assert mlflow_run_name("hcqr", "mmlu", "local", seeded) == "hcqr+bootstrap_fewshot seed 2 · mmlu · local"
    assert (
        mlflow_run_name("hcqr", "mmlu", "local", {"saved_program": {"recipe": "mipro"}}) == "hcqr+mipro · mmlu · local"
    )
