"""A compile in MLflow 3's model-centric terms: each stage's prompt in the Prompt Registry (a version per change,
the model's alias, a diff), no placeholder models beside the real one, a run description."""

import json

import mlflow
import mlflow.genai
from helpers import schema_lm
from test_optimize import setup, spec  # noqa: F401 (setup is a fixture)

from hcqr_dspy.cli import main
from hcqr_dspy.workflows.compile import run_compile


def test_compile_registers_each_stage_as_a_versioned_prompt(setup, mlflow_store, capsys):  # noqa: F811
    first = run_compile(
        spec(setup, register="ptest", alias="champion", out=str(setup / "p1")),
        mlflow_dir=mlflow_store,
        lm=schema_lm("A"),
    )
    assert first["prompts"] == ["prompts:/ptest.hypothesis/1", "prompts:/ptest.rewrite/1", "prompts:/ptest.answer/1"]
    state = json.loads((setup / "p1" / "program.json").read_text())
    for stage in ("hypothesis", "rewrite", "answer"):
        prompt = mlflow.genai.load_prompt(f"prompts:/ptest.{stage}/1")
        system, *demos = prompt.template
        assert system == {"role": "system", "content": state[stage]["signature"]["instructions"]}
        assert len(demos) == 2 * len(state[stage]["demos"]) and len(demos) >= 2
        assert [m["role"] for m in demos[:2]] == ["user", "assistant"]
        assert state[stage]["demos"][0]["question"] in demos[0]["content"]
        assert prompt.tags["run_id"] == first["mlflow_run_id"] and prompt.tags["recipe"] == "bootstrap_fewshot"
        assert mlflow.genai.load_prompt(f"prompts:/ptest.{stage}@champion").version == 1
    # linked to the compile run and to the logged model
    client = mlflow.MlflowClient()
    run = client.get_run(first["mlflow_run_id"])
    assert "ptest.answer" in run.data.tags.get("mlflow.linkedPrompts", "")
    model_id = mlflow.models.get_model_info(first["model_uri"]).model_id
    assert "ptest.answer" in mlflow.get_logged_model(model_id).tags.get("mlflow.linkedPrompts", "")
    # the placeholders mlflow.dspy.autolog logs per optimizer compile call are gone; the real model stays
    models = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{first['mlflow_run_id']}'",
        output_format="list",
    )
    assert [m.model_id for m in models] == [model_id]
    note = run.data.tags["mlflow.note.content"]
    assert "**Compile** of `hcqr` with recipe `bootstrap_fewshot`" in note and "`prompts:/ptest.answer/1`" in note
    assert "Registered as `models:/ptest/1`" in note

    # other demos: a new version of every stage whose template changed; the same program again: no new version
    second = run_compile(
        spec(setup, register="ptest", out=str(setup / "p2"), train_size=4), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    assert "prompts:/ptest.answer/2" in second["prompts"]
    again = run_compile(
        spec(setup, register="ptest", out=str(setup / "p3"), train_size=4), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    assert again["prompts"] == second["prompts"]
    assert mlflow.genai.load_prompt("prompts:/ptest.answer@champion").version == 1  # the alias stays where it was

    capsys.readouterr()
    assert main(["prompts", "ptest.answer", "1", "2", "--mlflow-dir", str(mlflow_store)]) == 0
    diff = capsys.readouterr().out
    assert diff.startswith("--- ptest.answer v1\n+++ ptest.answer v2\n")
    assert any(line.startswith("-") and not line.startswith("---") for line in diff.splitlines())
    assert main(["prompts", "ptest.answer", "--mlflow-dir", str(mlflow_store)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("ptest.answer v1  aliases: champion") and listed[1].startswith("ptest.answer v2")
    assert main(["prompts", "ptest.answer", "1", "9", "--mlflow-dir", str(mlflow_store)]) == 2
    assert capsys.readouterr().err.startswith("hcqr: error: no prompt prompts:/ptest.answer/9")
