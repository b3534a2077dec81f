"""`hcqr demo`: its time estimate from the first questions, and the whole command against a stub endpoint."""

from __future__ import annotations

import re

import pytest
from stub_server import SECRET, Stub
from support.cli_args import stub_args

from hcqr_dspy.cli import main
from hcqr_dspy.cli.demo_command import DemoPace


def hcqr_row(seconds, hypothesis, rewrite, answer):
    stages = {"hypothesis": {"seconds": hypothesis}, "rewrite": {"seconds": rewrite}, "answer": {"seconds": answer}}
    return {"seconds": seconds, "stages": stages}


def test_pace_stands_in_for_methods_not_started_from_hcqr_stages_then_measures_them():
    pace = DemoPace(["hcqr", "cot", "simple_rag"], {"hcqr": 3, "cot": 3, "simple_rag": 2})
    first = hcqr_row(30.0, 8.0, 5.0, 10.0)
    first["stages"]["answer"]["prompt_tokens"] = 1400  # of which 1,000 are the context of 10 passages
    pace.add("hcqr", {**first, "passages": [{"id": str(i)} for i in range(10)], "context_cut": {"tokens_after": 1000}})
    assert pace.pace("hcqr") == (30.0, True)
    assert pace.pace("cot") == (8.0, False)  # CoT reads and reasons as HCQR's hypothesis step does
    # Simple RAG reads a context as HCQR's answer step does, of 15 passages where HCQR's showed 10: a prompt of
    # 400 + 1,500 tokens where HCQR's had 1,400
    assert pace.pace("simple_rag") == (pytest.approx(10.0 * 1900 / 1400), False)
    assert pace.left() == pytest.approx(2 * 30 + 3 * 8 + 2 * 10.0 * 1900 / 1400)
    assert pace.line() == (
        "about 2 min left on this machine: hcqr 30 s, cot ~8 s, simple_rag ~14 s a question "
        "(~ estimated from the first HCQR question's steps)"
    )
    pace.add("hcqr", hcqr_row(50.0, 8.0, 5.0, 15.0))
    pace.add("hcqr", hcqr_row(40.0, 8.0, 5.0, 15.0))
    pace.add("cot", {"seconds": 12.0})
    pace.add("cot", {"seconds": 10.0})
    assert pace.pace("cot") == (11.0, True) and pace.pace("hcqr") == (40.0, True)
    assert pace.left() == pytest.approx(1 * 11 + 2 * 10.0 * 1900 / 1400)
    assert (
        pace.line() == "about 38 s left on this machine: cot 11 s, simple_rag ~14 s a question (~ estimated "
        "from the first HCQR question's steps)"
    )


def test_pace_without_hcqr_stands_in_with_the_first_question_of_the_first_method():
    pace = DemoPace(["cot", "simple_rag"], {"cot": 2, "simple_rag": 2})
    pace.add("cot", {"seconds": 6.0})
    assert pace.pace("simple_rag") == (6.0, False) and pace.left() == 6 + 12


def test_demo_against_an_endpoint_shows_the_first_answer_its_pace_and_the_comparison(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STUB_KEY", SECRET)
    stub = Stub(delay=0.1)
    try:
        code = main(
            [
                "demo",
                "--limit",
                "3",
                "--retriever",
                "bm25",
                "--index",
                str(tmp_path / "index"),
                "--runs",
                str(tmp_path / "runs"),
                "--mlflow-dir",
                str(tmp_path / "mlruns"),
                *stub_args(stub),
            ]
        )
    finally:
        stub.stop()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "demo: 3 questions x 3 methods (hcqr, cot, simple_rag)" in err and "(all 20: --limit 20)" in err
    assert "First HCQR answer" in out and "Queries" in out
    paces = [line.strip() for line in err.splitlines() if "left on this machine" in line]
    # after each method's first question (the last method's then has two left): three estimates
    assert len(paces) == 3, err
    assert re.search(r"hcqr \d+ s, cot ~\d+ s, simple_rag ~\d+ s a question \(~ estimated", paces[0]), paces
    assert re.search(r": cot \d+ s, simple_rag ~\d+ s a question", paces[1]), paces
    assert re.search(r": simple_rag \d+ s a question$", paces[2]), paces
    # each method's LM check, then HCQR's three calls a question, CoT's and Simple RAG's one
    assert len(stub.seen) == 3 + 3 * 3 + 3 + 3
    assert (tmp_path / "runs" / "comparison").is_dir() and "McNemar" in out


def test_a_bad_lm_spec_is_refused_before_the_demo_index_is_built(tmp_path, capsys):
    code = main(["demo", "--lm", "nonsense", "--index", str(tmp_path / "index"), "--runs", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("hcqr: error: unknown --lm spec 'nonsense'")
    assert not (tmp_path / "index").exists()
