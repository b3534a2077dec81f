"""Methods register themselves (``@register_method``): the names the command line reads from the programs'
source are the registered ones, the docs' methods table names each, bad registrations are refused, and a
method written in this test module runs through ``hcqr eval`` against the stub OpenAI-compatible server."""

import ast
import json
import re
from pathlib import Path

import dspy
import pytest
from stub_server import Stub
from support.cli_args import eval_argv, stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.cli.method_names import builtin_method_names, method_names, registered_names
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs import (
    PROGRAMS,
    MCQProgram,
    SimpleRAG,
    make_program,
    method_registry,
    refuse_bound,
    register_method,
)
from hcqr_dspy.programs.program_base import stage

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


class GuessLetter(dspy.Signature):
    """Toy method of the registry test: name the option letter."""

    question: str = dspy.InputField()
    options: str = dspy.InputField()
    reasoning: str = dspy.OutputField()
    answer: str = dspy.OutputField()


class OneGuess(MCQProgram):
    """A toy method: one LM call through :class:`GuessLetter` (stage ``guess``), no retrieval."""

    uses_retrieval = False

    def __init__(self, retriever=None, budget: int = 15, **kwargs):
        super().__init__(retriever=None, budget=budget, **kwargs)
        self.answer = dspy.Predict(GuessLetter)

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "guess"):
            out = self.answer_step(self.answer, options, question=question)
        return dspy.Prediction(**out, stages=stages, queries=[], passages=[])


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is now, given back after the test: what a test registers does not outlive it."""
    monkeypatch.setattr(method_registry, "_REGISTERED", dict(method_registry._REGISTERED))


def builtin_methods() -> list[str]:
    return [name for name, cls in PROGRAMS.items() if cls.__module__.startswith("hcqr_dspy.programs.")]


def docs_table_methods() -> set[str]:
    """The method names in the first column of the table under ``## Methods`` in docs/usage.md."""
    section = USAGE.read_text(encoding="utf-8").split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_the_names_read_from_the_programs_source_are_the_registered_ones():
    assert builtin_method_names() == tuple(builtin_methods()) == tuple(sorted(builtin_methods()))
    assert len(builtin_methods()) == 15 and {"cot", "simple_rag", "hcqr", "oracle_rag"} <= set(PROGRAMS)
    assert all(cls.method == name for name, cls in PROGRAMS.items())
    source = 'A = register_method("a")(variant(B, "A", "doc"))\n@reg.register_method("b")\nclass C: ...\nx = f("c")\n'
    assert registered_names(ast.parse(source)) == ["a", "b"]


def test_the_docs_methods_table_names_every_registered_method():
    assert docs_table_methods() == set(builtin_methods())


def test_bad_registrations_are_refused(scratch_registry):
    with pytest.raises(ValueError, match=r"lower-case letters, digits and _ .*got 'Simple RAG'"):
        register_method("Simple RAG")
    with pytest.raises(ValueError, match=r"'simple_rag' is already registered by hcqr_dspy.programs.simple_rag"):
        register_method("simple_rag")(OneGuess)
    with pytest.raises(ValueError, match=r"hcqr_dspy.programs.simple_rag.SimpleRAG is already registered as"):
        register_method("simple_rag_again")(SimpleRAG)
    with pytest.raises(TypeError, match="decorates a subclass of MCQProgram"):
        register_method("toy_signature")(GuessLetter)
    assert "toy_signature" not in PROGRAMS and "simple_rag_again" not in PROGRAMS


def test_a_bound_registered_by_a_test_is_refused_where_no_gold_answer_may_be_used(scratch_registry):
    bound = register_method("toy_bound")(type("ToyBound", (OneGuess,), {"uses_answer": True}))
    assert PROGRAMS["toy_bound"] is bound and bound.method == "toy_bound"
    with pytest.raises(HCQRError, match="toy_bound retrieves with the gold answer"):
        refuse_bound("toy_bound", "hcqr predict")


def test_a_method_written_in_a_test_module_runs_through_hcqr_eval(scratch_registry, bench, capsys):
    assert "toy_one_guess" not in method_names()
    register_method("toy_one_guess")(OneGuess)
    assert isinstance(make_program("toy_one_guess"), OneGuess) and OneGuess.method == "toy_one_guess"
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "toy_one_guess" in capsys.readouterr().out.replace("\n", " ")  # listed beside the built-in ones
    stub = Stub()
    try:
        run_dir = bench / "run"
        code = main(eval_argv(bench, run_dir, *stub_args(stub), "--no-mlflow", method="toy_one_guess"))
    finally:
        stub.stop()
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert [r["qid"] for r in rows] == [f"q{i}" for i in range(6)]
    assert {r["method"] for r in rows} == {"toy_one_guess"} and all(set(r["stages"]) == {"guess"} for r in rows)
    assert [r["prediction"] for r in rows] == list("ACBACB")  # the stub's letter for "Question number i?"
    assert [r["correct"] for r in rows] == [True, False, False, True, False, False]
    assert json.loads((run_dir / "config.json").read_text())["method"] == "toy_one_guess"
    prompts = [json.loads(body)["messages"][0]["content"] for _, body in stub.seen if body.startswith("{")]
    asked = [p for p in prompts if "`question`" in p]  # (the LM's start-up probe asks for a word)
    assert len(asked) == 6 and all("Toy method of the registry test" in p for p in asked)
