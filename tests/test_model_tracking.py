"""A compile in MLflow 3's model-centric terms: each stage's prompt in the Prompt Registry (a version per change,
the model's alias, a diff), no placeholder models beside the real one, a run description."""

import json

import mlflow
import mlflow.genai
import pytest
from helpers import schema_lm
from test_judge_controls import ScriptedJudge, reads_the_answer
from test_optimize import NoCall, setup, spec  # noqa: F401 (setup is a fixture)

from hcqr_dspy.cli import main
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.tracking.prompts import prompt_name, safe_name
from hcqr_dspy.workflows.compile import run_compile

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)


def test_compile_registers_each_stage_as_a_versioned_prompt(setup, mlflow_store, capsys):  # noqa: F811
    first = run_compile(
        spec(setup, register="ptest", alias="champion", out=str(setup / "p1")),
        mlflow_dir=mlflow_store,
        lm=schema_lm("A"),
    )
    # version 1 of each stage is its zero-shot template (alias zero-shot), version 2 the compiled one
    assert first["prompts"] == ["prompts:/ptest.hypothesis/2", "prompts:/ptest.rewrite/2", "prompts:/ptest.answer/2"]
    state = json.loads((setup / "p1" / "program.json").read_text())
    for stage in ("hypothesis", "rewrite", "answer"):
        prompt = mlflow.genai.load_prompt(f"prompts:/ptest.{stage}/2")
        system, *demos = prompt.template
        assert system == {"role": "system", "content": state[stage]["signature"]["instructions"]}
        assert len(demos) == 2 * len(state[stage]["demos"]) and len(demos) >= 2
        assert [m["role"] for m in demos[:2]] == ["user", "assistant"]
        assert state[stage]["demos"][0]["question"] in demos[0]["content"]
        assert prompt.tags["run_id"] == first["mlflow_run_id"] and prompt.tags["recipe"] == "bootstrap_fewshot"
        assert mlflow.genai.load_prompt(f"prompts:/ptest.{stage}@champion").version == 2
        assert mlflow.genai.load_prompt(f"prompts:/ptest.{stage}@zero-shot").template == [system]
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
    assert "**Compile** of `hcqr` with recipe `bootstrap_fewshot`" in note and "`prompts:/ptest.answer/2`" in note
    assert "Registered as `models:/ptest/1`" in note

    # other demos: a new version of every stage whose template changed; the same program again: no new version
    second = run_compile(
        spec(setup, register="ptest", out=str(setup / "p2"), train_size=4), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    assert "prompts:/ptest.answer/3" in second["prompts"]
    again = run_compile(
        spec(setup, register="ptest", out=str(setup / "p3"), train_size=4), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    assert again["prompts"] == second["prompts"]
    assert mlflow.genai.load_prompt("prompts:/ptest.answer@champion").version == 2  # the alias stays where it was
    # moving the model's alias with `hcqr prompts MODEL VERSION --alias` moves its prompts' alias along
    assert main(["prompts", "ptest", "2", "--alias", "champion", "--mlflow-dir", str(mlflow_store)]) == 0
    assert str(mlflow.MlflowClient().get_model_version_by_alias("ptest", "champion").version) == "2"
    assert {s: mlflow.genai.load_prompt(f"prompts:/ptest.{s}@champion").version for s in ("answer", "rewrite")} == {
        s: int(next(u for u in second["prompts"] if f".{s}/" in u).rsplit("/", 1)[1]) for s in ("answer", "rewrite")
    }

    capsys.readouterr()
    assert main(["prompts", "ptest.answer", "2", "3", "--mlflow-dir", str(mlflow_store)]) == 0
    diff = capsys.readouterr().out
    assert diff.startswith("--- ptest.answer v2\n+++ ptest.answer v3\n")
    assert any(line.startswith("-") and not line.startswith("---") for line in diff.splitlines())
    assert main(["prompts", "ptest.answer", "--mlflow-dir", str(mlflow_store)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("ptest.answer v1  aliases: zero-shot  demos: 0")
    assert listed[1].startswith("ptest.answer v2  aliases: -") and listed[2].startswith(
        "ptest.answer v3  aliases: champion"
    )
    assert main(["prompts", "ptest.answer", "1", "9", "--mlflow-dir", str(mlflow_store)]) == 2
    assert capsys.readouterr().err.startswith("hcqr: error: no prompt prompts:/ptest.answer/9")


def test_evaluations_are_logged_against_the_model_version_they_ran(setup, mlflow_store):  # noqa: F811
    from hcqr_dspy.tracking.model_links import resolve_model_uri
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.judge import judge_and_track
    from hcqr_dspy.workflows.specs import EvalSpec

    client = mlflow.MlflowClient()
    run_compile(
        spec(setup, register="ltest", alias="champion", out=str(setup / "l1")),
        mlflow_dir=mlflow_store,
        lm=schema_lm("A"),
    )
    run_compile(
        spec(setup, register="ltest", out=str(setup / "l2"), train_size=4), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    v1, v2 = (resolve_model_uri(f"models:/ltest/{v}") for v in (1, 2))
    assert resolve_model_uri("models:/ltest/latest")["version"] == "2"
    assert v1["model_id"].startswith("m-") and v1["model_id"] != v2["model_id"]
    assert mlflow.get_logged_model(v1["model_id"]).source_run_id == client.get_model_version("ltest", "1").run_id
    common = dict(dataset=str(setup / "medqa.json"), index=str(setup / "idx"), lm="openai/unused")

    def evaluate(name, **kw):
        result, folder, run_id = run_evaluation(
            EvalSpec(run_dir=str(setup / "runs" / name), **common, **kw),
            mlflow_dir=mlflow_store,
            progress=False,
            lm=schema_lm("A"),
        )
        return result, json.loads((folder / "config.json").read_text()), client.get_run(run_id)

    result, config, run = evaluate("champion-1", method=None, program="models:/ltest@champion")
    assert config["saved_program"]["model"] == {
        "uri": "models:/ltest@champion",
        "name": "ltest",
        "version": "1",
        "alias": "champion",
        "model_id": v1["model_id"],
    }
    assert (run.data.tags["model_id"], run.data.tags["model_version"]) == (v1["model_id"], "1")
    assert run.info.run_name == "ltest v1 · medqa · openai/unused"
    assert run.data.metrics["n_correct"] == result.metrics["correct"] and "correct" not in run.data.metrics
    assert [i.model_id for i in run.inputs.model_inputs] == [v1["model_id"]]
    [accuracy] = [m for m in mlflow.get_logged_model(v1["model_id"]).metrics if m.key == "accuracy"]
    assert accuracy.value == result.metrics["accuracy"] and accuracy.run_id == run.info.run_id
    assert accuracy.dataset_name.startswith("medqa-")
    traces = mlflow.search_traces(model_id=v1["model_id"], return_type="list")
    assert len(traces) == result.metrics["n"] == 4
    # `hcqr judge` of that run puts its DUR on the same model and question set
    metrics = judge_and_track(
        setup / "runs" / "champion-1",
        judge_lm="scripted",
        lm=ScriptedJudge(reads_the_answer),
        mlflow_dir=mlflow_store,
        progress=False,
    )
    [dur] = [m for m in mlflow.get_logged_model(v1["model_id"]).metrics if m.key == "dur"]
    assert (dur.value, dur.run_id, dur.dataset_name) == (metrics["dur"], run.info.run_id, accuracy.dataset_name)

    # the alias moves: the same URI now evaluates version 2, and the record says so
    client.set_registered_model_alias("ltest", "champion", "2")
    first = run
    _, config, run = evaluate("champion-2", method=None, program="models:/ltest@champion")
    # one question set, one dataset digest (its content's), however many runs used it
    digests = {i.dataset.digest for r in (first, run) for i in r.inputs.dataset_inputs}
    assert digests == {config["questions"]["content_sha256"][:8]} and accuracy.dataset_digest in digests
    assert config["saved_program"]["model"]["version"] == "2" and run.data.tags["model_id"] == v2["model_id"]
    found = mlflow.search_runs(
        experiment_ids=[run.info.experiment_id], filter_string="tags.model_version = '2'", output_format="list"
    )
    assert [r.info.run_id for r in found] == [run.info.run_id]

    # zero-shot programs are logged models too, one per method, settings and LM, reused by each evaluation
    options = {"budget": 3, "k_per_query": 1}
    _, _, zero = evaluate("zero-a", method="hcqr", program_options=options)
    _, _, again = evaluate("zero-b", method="hcqr", program_options=options)
    _, _, other = evaluate("zero-c", method="hcqr", program_options={"budget": 2, "k_per_query": 1})
    model = mlflow.get_logged_model(zero.data.tags["model_id"])
    assert model.name == "hcqr-zero-shot" and model.model_type == "zero-shot"
    assert again.data.tags["model_id"] == model.model_id != other.data.tags["model_id"]
    # (the store is the session's: another test's evaluation of the same program may share the model)
    on_model = {m.run_id for m in model.metrics if m.key == "accuracy"}
    assert {zero.info.run_id, again.info.run_id} <= on_model and other.info.run_id not in on_model


@pytest.mark.parametrize(
    "register, alias, message",
    [
        ("a/b", None, "--register 'a/b': Invalid model name 'a/b'. Names cannot contain '/' or ':'."),
        ("", None, "--register '': Missing value"),
        ("ok", "latest", "--alias 'latest': 'latest' alias name (case insensitive) is reserved."),
        ("ok", "v2", "--alias 'v2': Version alias name 'v2' is reserved."),
        ("ok", "bad alias", "--alias 'bad alias': Invalid alias name"),
    ],
)
def test_a_name_the_registry_would_refuse_is_refused_before_the_compile(
    setup,  # noqa: F811
    mlflow_store,
    register,
    alias,
    message,  # noqa: F811
):
    with pytest.raises(HCQRError) as refused:
        run_compile(spec(setup, register=register, alias=alias), mlflow_dir=mlflow_store, lm=NoCall())
    assert str(refused.value).startswith(message)


def test_program_names_that_differ_only_in_characters_a_prompt_name_cannot_hold_stay_apart():
    assert safe_name("hcqr-medqa_v1.2") == "hcqr-medqa_v1.2"  # a valid name is kept as it is
    assert safe_name("bad name!") != safe_name("bad name?")
    assert safe_name("bad name!").startswith("bad-name-") and prompt_name("bad name!", "answer").endswith(".answer")
