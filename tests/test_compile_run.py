"""What a compile's MLflow run shows of the compile, read back through MLflow's API: its training and validation
questions as datasets, one trace per bootstrapping attempt (qid, round, passed) that agrees with the demos the
compile kept, and the optimizer's score of each candidate as a metric with steps."""

import json
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import yaml
from helpers import schema_lm, teachable_lm, teaching_questions
from test_optimize import RECIPES, setup, spec  # noqa: F401 - setup is a fixture

from hcqr_dspy.optimize.attempts import watch_bootstrapping
from hcqr_dspy.optimize.feedback import make_metric
from hcqr_dspy.optimize.recipe_compile import build_optimizer
from hcqr_dspy.optimize.recipes import load_recipe
from hcqr_dspy.optimize.saved import load_program
from hcqr_dspy.optimize.trials import trial_scores
from hcqr_dspy.retrieval import load_index
from hcqr_dspy.workflows.compile import run_compile


def attempt_traces(run_id):
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    traces = mlflow.search_traces(
        locations=[experiment_id],
        run_id=run_id,
        return_type="list",
        filter_string="tag.kind = 'bootstrap_attempt'",
    )
    return sorted(traces, key=lambda t: int(t.info.tags["attempt"]))


def test_a_bootstrap_compile_run_shows_its_questions_and_one_trace_per_attempt(setup, mlflow_store):  # noqa: F811
    # the LM always answers A: the training questions whose gold is B fail the metric, the others pass
    out = run_compile(spec(setup, val_size=2), mlflow_dir=mlflow_store, lm=schema_lm("A"))
    run_id = out["mlflow_run_id"]
    run = mlflow.get_run(run_id)
    meta = json.loads((Path(out["out"]) / "meta.json").read_text())
    train_ids, val_ids = meta["train"]["ids"][:6], meta["train"]["ids"][6:]
    gold = {k: v["answer"] for k, v in json.loads((setup / "medmcqa.json").read_text()).items()}

    # the questions, as two datasets with the contexts training and validation
    logged = {
        {t.key: t.value for t in d.tags}["mlflow.data.context"]: d.dataset.name for d in run.inputs.dataset_inputs
    }
    assert set(logged) == {"training", "validation"}
    for context, ids in (("training", train_ids), ("validation", val_ids)):
        assert logged[context].startswith("medmcqa-")
        [dataset] = mlflow.genai.datasets.search_datasets(
            experiment_ids=[run.info.experiment_id], filter_string=f"name = '{logged[context]}'"
        )
        records = dataset.to_df()
        assert sorted(t["qid"] for t in records["tags"]) == sorted(ids)
        assert sorted(e["answer"] for e in records["expectations"]) == sorted(gold[q] for q in ids)

    # one trace per attempt, in the order BootstrapFewShot ran the training questions, until it kept 2
    traces = attempt_traces(run_id)
    tags = [t.info.tags for t in traces]
    qids = [t["qid"] for t in tags]
    assert qids and qids == train_ids[: len(qids)]
    assert len(traces) == run.data.metrics["bootstrap.attempts"]
    assert [t["passed"] for t in tags] == ["true" if gold[q] == "A" else "false" for q in qids]
    assert [t["passed"] for t in tags].count("true") == 2 == run.data.metrics["bootstrap.passed"]
    assert "false" in [t["passed"] for t in tags] and tags[-1]["passed"] == "true"  # it stopped at the second
    assert {t["round"] for t in tags} == {"0"} and {t["bootstrap_run"] for t in tags} == {"0"}
    assert all(t["method"] == "hcqr" and t["recipe"] == "bootstrap_fewshot" for t in tags)
    for trace in traces:
        assert trace.info.request_metadata["mlflow.sourceRun"] == run_id  # linked to the compile run
        root = trace.data.spans[0]
        assert root.name == "bootstrap_attempt" and root.outputs["answer"] == "A"
        assert root.outputs["gold"] == gold[trace.info.tags["qid"]]
        assert root.outputs["passed"] == (trace.info.tags["passed"] == "true")
        assert {s.name for s in trace.data.spans} >= {"hypothesis", "rewrite", "answer"}  # the program's stages

    # the passed attempts are the compile's bootstrapped demos, in order
    program, _ = load_program(out["out"], retriever=load_index(setup / "idx"))
    question = {q: v["question"] for q, v in json.loads((setup / "medmcqa.json").read_text()).items()}
    bootstrapped = [d["question"] for d in dict(program.named_predictors())["answer"].demos if d.get("augmented")]
    assert bootstrapped == [question[t["qid"]] for t in tags if t["passed"] == "true"]


def test_a_simba_compile_run_logs_each_candidates_score_with_its_step(tmp_path, setup, mlflow_store):  # noqa: F811
    recipe = yaml.safe_load((RECIPES / "simba.yaml").read_text())  # as shipped, but a small search for a test
    recipe.update(train_size=6, min_train=4)
    recipe["settings"].update(bsize=4, num_candidates=2, max_steps=2, max_demos=1, num_threads=1)
    (tmp_path / "simba_small.yaml").write_text(yaml.safe_dump(recipe))
    (setup / "teaching.json").write_text(json.dumps(teaching_questions("Train", 12)))
    out = run_compile(
        spec(
            setup, recipe=str(tmp_path / "simba_small.yaml"), train=str(setup / "teaching.json"), out=str(setup / "s")
        ),
        mlflow_dir=mlflow_store,
        lm=teachable_lm(),
    )
    run_id = out["mlflow_run_id"]
    history = mlflow.MlflowClient().get_metric_history(run_id, "candidate.train_score")
    steps = sorted((m.step, m.value) for m in history)
    assert [s for s, _ in steps] == list(range(int(out["scores"]["candidates"])))  # one per candidate, in order
    assert max(v for _, v in steps) == pytest.approx(out["scores"]["train_score"])
    assert all(0.0 <= v <= 1.0 for _, v in steps)  # fractions, as train_score
    assert mlflow.get_run(run_id).data.metrics["candidate.train_score"] in [v for _, v in steps]
    assert attempt_traces(run_id) == []  # SIMBA does not bootstrap


def test_attempts_are_watched_one_compile_at_a_time_and_the_method_is_restored():
    from dspy.teleprompt import BootstrapFewShot

    before = BootstrapFewShot._bootstrap_one_example
    with watch_bootstrapping(lambda attempt: None):
        assert BootstrapFewShot._bootstrap_one_example is not before
        with pytest.raises(RuntimeError, match="already watched"), watch_bootstrapping(lambda attempt: None):
            pass
    assert BootstrapFewShot._bootstrap_one_example is before


def test_each_optimizers_scores_are_read_in_the_order_it_measured_them_as_fractions():
    mipro = SimpleNamespace(
        trial_logs={1: {"full_eval_score": 50.0}, 2: {"mb_score": 80.0}, 3: {"full_eval_score": 75.0, "mb_score": 60.0}}
    )
    assert trial_scores(mipro, "MIPROv2") == {
        "trial.val_score": [(1, 0.5), (3, 0.75)],
        "trial.minibatch_score": [(2, 0.8), (3, 0.6)],
    }
    search = SimpleNamespace(candidate_programs=[{"score": 80.0, "seed": 1}, {"score": 40.0, "seed": -3}])
    assert trial_scores(search, "BootstrapFewShotWithRandomSearch") == {"candidate.val_score": [(0, 0.4), (4, 0.8)]}
    # SIMBA: best first; trial_logs[i] holds the (i + 1)-th program's score, the one left is the student's
    simba = SimpleNamespace(
        candidate_programs=[{"score": 0.75}, {"score": 0.5}, {"score": 0.25}],
        trial_logs={0: {"train_score": 0.75}, 1: {"train_score": 0.25}, 2: {}},
    )
    assert trial_scores(simba, "SIMBA") == {"candidate.train_score": [(0, 0.5), (1, 0.75), (2, 0.25)]}
    gepa = SimpleNamespace(detailed_results=SimpleNamespace(val_aggregate_scores=[0.25, 0.5]))
    assert trial_scores(gepa, "GEPA") == {"candidate.val_score": [(0, 0.25), (1, 0.5)]}
    assert trial_scores(SimpleNamespace(), "BootstrapFewShot") == {} == trial_scores(SimpleNamespace(), "SIMBA")


def test_gepa_is_built_to_return_its_candidates_scores():
    recipe = load_recipe(RECIPES / "gepa.yaml")
    assert build_optimizer(recipe, make_metric(recipe.metric), reflection_lm=teachable_lm()).track_stats is True
