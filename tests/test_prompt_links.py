"""An evaluation of a registered program links each question's trace to the prompt versions its stages used
(MLflow's prompt-to-trace linking): the trace's ``mlflow.linkedPrompts`` tag, the store's trace-to-prompt link
(``prompt = "NAME/VERSION"`` in ``mlflow.search_traces``, what a prompt's Traces tab reads) and each stage span's
``prompt`` attribute. A zero-shot program's traces are linked to nothing. A real SQLite MLflow store; BootstrapFewShot
HCQR programs compiled with DummyLM-style schema replies (tests/helpers.py)."""

import json

import mlflow
import pytest
from helpers import schema_lm
from test_optimize import setup, spec  # noqa: F401 (setup is a fixture)

from hcqr_dspy.workflows.compile import run_compile
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

pytestmark = pytest.mark.slow  # two compiles and two evaluations: scheduled first (conftest.py)


def evaluate(setup, mlflow_store, name, **kw):  # noqa: F811
    """Evaluate on the 4 test questions; the run's traces, by question."""
    common = dict(dataset=str(setup / "medqa.json"), index=str(setup / "idx"), lm="openai/unused")
    result, _, run_id = run_evaluation(
        EvalSpec(run_dir=str(setup / "runs" / name), **common, **kw),
        mlflow_dir=mlflow_store,
        progress=False,
        lm=schema_lm("A"),
    )
    experiment = mlflow.get_run(run_id).info.experiment_id
    traces = mlflow.search_traces(locations=[experiment], run_id=run_id, return_type="list")
    assert len(traces) == result.metrics["n"] == 4
    return traces, experiment


def linked_to(uri: str, experiment: str) -> set[str]:
    """The traces the store links to prompt version ``prompts:/NAME/VERSION``."""
    name_version = uri[len("prompts:/") :]
    found = mlflow.search_traces(
        locations=[experiment], filter_string=f'prompt = "{name_version}"', include_spans=False, return_type="list"
    )
    return {t.info.trace_id for t in found}


def test_each_question_trace_is_linked_to_the_prompt_versions_of_the_model_version_it_ran(setup, mlflow_store):  # noqa: F811
    first = run_compile(
        spec(setup, register="plink", out=str(setup / "v1")), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    second = run_compile(
        spec(setup, register="plink", out=str(setup / "v2"), train_size=4), mlflow_dir=mlflow_store, lm=schema_lm("A")
    )
    assert set(first["prompts"]) != set(second["prompts"])  # version 2 holds other demos: other prompt versions
    by_stage = {uri.split(".", 1)[1].split("/")[0]: uri for uri in first["prompts"]}
    assert set(by_stage) == {"hypothesis", "rewrite", "answer"}

    traces, experiment = evaluate(setup, mlflow_store, "v1", method=None, program="models:/plink/1")
    ids = {t.info.trace_id for t in traces}
    for trace in traces:
        linked = json.loads(trace.info.tags["mlflow.linkedPrompts"])
        assert {f"prompts:/{p['name']}/{p['version']}" for p in linked} == set(first["prompts"])
        stages = {s.name: s for s in trace.data.spans if s.name in by_stage}
        assert set(stages) == set(by_stage)
        for stage, span in stages.items():
            assert span.attributes["prompt"] == by_stage[stage]
            [own] = span.attributes["mlflow.linkedPrompts"]  # MLflow's own span attribute, read back as a list
            assert f"prompts:/{own['name']}/{own['version']}" == by_stage[stage]
        assert "prompt" not in (trace.data.spans[0].attributes or {})  # the root span is no stage
    for uri in first["prompts"]:
        assert linked_to(uri, experiment) == ids, uri  # the prompt version's Traces tab lists the 4 questions
    for uri in set(second["prompts"]) - set(first["prompts"]):
        assert not linked_to(uri, experiment) & ids, uri  # version 2's prompts were not used

    # a zero-shot program: no registered prompts known, so its traces are linked to none
    zero, _ = evaluate(setup, mlflow_store, "zero", method="hcqr", program_options={"budget": 3, "k_per_query": 1})
    for trace in zero:
        assert "mlflow.linkedPrompts" not in trace.info.tags
        assert not [s for s in trace.data.spans if "prompt" in (s.attributes or {})]
    zero_ids = {t.info.trace_id for t in zero}
    assert not any(linked_to(uri, experiment) & zero_ids for uri in first["prompts"] + second["prompts"])
