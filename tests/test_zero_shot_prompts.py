"""Each registered prompt holds its stage's zero-shot template once (alias `zero-shot`), so `hcqr prompts NAME
zero-shot ALIAS` shows what compiling changed; `hcqr prompts NAME VERSION` prints one version; a version or alias
that does not exist is one line naming those that do. A real SQLite MLflow store, a BootstrapFewShot HCQR program
compiled with DummyLM-style schema replies (tests/helpers.py)."""

import json

import mlflow
import mlflow.genai
import pytest
from helpers import schema_lm
from test_optimize import setup, spec  # noqa: F401 (setup is a fixture)

from hcqr_dspy.cli import main
from hcqr_dspy.programs.method_registry import make_program
from hcqr_dspy.tracking.prompts import register_program_prompts
from hcqr_dspy.workflows.compile import run_compile

STAGES = ("hypothesis", "rewrite", "answer")


@pytest.fixture
def compiled(setup):  # noqa: F811
    """A BootstrapFewShot HCQR program compiled without MLflow (two demos per stage)."""
    run_compile(spec(setup, out=str(setup / "bfs")), track=False, lm=schema_lm("A"))
    return setup / "bfs"


def versions(name):
    """Every version of prompt ``name``, oldest first; none when there is no such prompt."""
    try:
        found = mlflow.MlflowClient().search_prompt_versions(name, max_results=1000)
    except mlflow.exceptions.MlflowException:
        return []
    return sorted(getattr(found, "prompt_versions", found), key=lambda v: int(v.version))


def cli(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_zero_shot_prompt_is_registered_once_and_the_diff_shows_the_demos(compiled, mlflow_store, capsys):
    store = ["--mlflow-dir", str(mlflow_store)]
    code, out, err = cli(capsys, ["register", str(compiled), "--name", "zs-twice", "--alias", "first", *store])
    assert code == 0, err
    assert (
        f"what compiling changed in a stage: hcqr prompts zs-twice.answer zero-shot first --mlflow-dir {mlflow_store}"
        in out
    )
    code, _, err = cli(capsys, ["register", str(compiled), "--name", "zs-twice", "--alias", "second", *store])
    assert code == 0 and "zero-shot" not in err, err
    state = json.loads((compiled / "program.json").read_text())
    fresh = dict(make_program("hcqr", object(), budget=3, k_per_query=1).named_predictors())
    for stage in STAGES:
        found = versions(f"zs-twice.{stage}")
        zero = [v for v in found if v.tags.get("zero_shot") == "true"]
        assert len(zero) == 1 and len(found) == 2, [(v.version, v.tags) for v in found]  # zero-shot, compiled
        loaded = mlflow.genai.load_prompt(f"prompts:/zs-twice.{stage}@zero-shot")
        assert loaded.version == zero[0].version == 1
        assert loaded.template == [{"role": "system", "content": fresh[stage].signature.instructions}]  # no demos
        assert zero[0].tags["method"] == "hcqr" and zero[0].tags["demos"] == "0"
        compiled_version = mlflow.genai.load_prompt(f"prompts:/zs-twice.{stage}@second")
        assert compiled_version.version == 2 == mlflow.genai.load_prompt(f"prompts:/zs-twice.{stage}@first").version
        assert len(compiled_version.template) == 1 + 2 * len(state[stage]["demos"]) > 1
    # the diff is the optimizer's change: the same instructions, the demos added
    code, diff, err = cli(capsys, ["prompts", "zs-twice.answer", "zero-shot", "second", *store])
    assert code == 0 and diff.startswith("--- zs-twice.answer v1\n+++ zs-twice.answer v2\n"), err
    lines = diff.splitlines()[2:]
    assert not [line for line in lines if line.startswith("-")]
    assert lines.count("+## user") == lines.count("+## assistant") == len(state["answer"]["demos"]) == 2
    assert any(state["answer"]["demos"][0]["question"] in line for line in lines if line.startswith("+"))


def notes(caplog) -> list[str]:
    """The hcqr_dspy logger's messages since the last call."""
    said = [r.getMessage() for r in caplog.records if r.name.startswith("hcqr_dspy")]
    caplog.clear()
    return said


def test_a_zero_shot_template_that_changed_is_a_new_version_and_a_note(mlflow_store, caplog):
    """Two methods' programs under one prompt name (two `--out` folders of the same name, say): CoT's answer step
    has other instructions than Simple RAG's, so the answer prompt gets a second zero-shot version."""
    register_program_prompts(make_program("simple_rag", object()), "zs-shared")
    assert notes(caplog) == []
    register_program_prompts(make_program("cot"), "zs-shared")
    [err] = notes(caplog)  # one WARNING of the hcqr_dspy logger (what `hcqr` prints on stderr)
    assert err.startswith(
        "hcqr: note: the zero-shot prompt of zs-shared.answer changed: version 1 holds the 'simple_rag' program's "
        "template, this 'cot' program's differs (another method registered under the name 'zs-shared', or its "
        "signature reworded); registered it as version 2 and moved the alias zero-shot to it"
    ), err
    found = versions("zs-shared.answer")
    assert [v.tags.get("zero_shot") for v in found] == ["true", "true"]  # a zero-shot program: nothing compiled
    assert mlflow.genai.load_prompt("prompts:/zs-shared.answer@zero-shot").version == 2
    register_program_prompts(make_program("cot"), "zs-shared")  # the same again: nothing new, nothing said
    assert notes(caplog) == [] and len(versions("zs-shared.answer")) == 2


def test_one_version_is_printed(compiled, mlflow_store, capsys):
    store = ["--mlflow-dir", str(mlflow_store)]
    assert cli(capsys, ["register", str(compiled), "--name", "zs-one", "--alias", "study", *store])[0] == 0
    code, out, err = cli(capsys, ["prompts", "zs-one.answer", "zero-shot", *store])
    assert code == 0, err
    head, *body = out.splitlines()
    assert head.startswith("zs-one.answer v1  aliases: zero-shot  demos: 0  recipe: -")
    assert body[0] == "## system" and "## user" not in body and len(body) > 1
    code, out, err = cli(capsys, ["prompts", "zs-one.answer", "study", *store])
    assert code == 0 and out.startswith("zs-one.answer v2  aliases: study  demos: 2  recipe: bootstrap_fewshot"), err
    assert out.splitlines().count("## user") == 2 and out.splitlines().count("## assistant") == 2


@pytest.mark.parametrize(
    "refs, uri",
    [
        (["9"], "prompts:/zs-bad.answer/9"),
        (["champion"], "prompts:/zs-bad.answer@champion"),
        (["zero-shot", "7"], "prompts:/zs-bad.answer/7"),
        (["../1"], "prompts:/zs-bad.answer@../1"),
    ],
)
def test_a_version_or_alias_that_does_not_exist_is_one_line_naming_those_that_do(
    compiled, mlflow_store, capsys, refs, uri
):
    store = ["--mlflow-dir", str(mlflow_store)]
    if not versions("zs-bad.answer"):
        assert cli(capsys, ["register", str(compiled), "--name", "zs-bad", "--alias", "study", *store])[0] == 0
    code, out, err = cli(capsys, ["prompts", "zs-bad.answer", *refs, *store])
    assert code == 2 and out == ""
    assert err == (
        f"hcqr: error: no prompt {uri}: zs-bad.answer has versions 1, 2 and aliases study (v2), zero-shot (v1)\n"
    )
    code, out, err = cli(capsys, ["prompts", "nothing.answer", "1", *store])
    assert (
        code == 2 and err.startswith("hcqr: error: no prompt 'nothing.answer' in this store") and err.count("\n") == 1
    )
