"""The bounds: an oracle-context ceiling that retrieves with the gold option, a no-context floor with the RAG
answer step's own prompt; DummyLM for the LM, a spying retriever over the tiny corpus."""

import dspy
import pytest
from dspy.utils import DummyLM
from programs.program_helpers import ANSWER, OPTIONS, QUESTION, full_prompts, run

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs import PROGRAMS, SimpleRAG, make_program, refuse_bound


def answering():
    return DummyLM({"`answer`": ANSWER}, adapter=dspy.JSONAdapter())


def test_the_oracle_retrieves_with_the_question_and_the_gold_options_text(spy):
    lm = answering()
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        pred = make_program("oracle_rag", spy)(question=QUESTION, options=OPTIONS, gold="C")
    assert spy.calls == [([f"{QUESTION} {OPTIONS['C']}"], 15)]
    assert pred.queries == [f"{QUESTION} {OPTIONS['C']}"] and pred.valid
    assert PROGRAMS["oracle_rag"].uses_answer and not PROGRAMS["simple_rag"].uses_answer
    with pytest.raises(ValueError, match="needs the gold answer"):
        run(make_program("oracle_rag", spy), lm)  # no gold: a misuse, not a bad reply


def test_no_context_shows_the_rag_answer_prompt_with_an_empty_context(spy):
    lm = answering()
    pred = run(make_program("no_context"), lm)
    assert pred.valid and pred.passages == [] and pred.queries == []
    run(SimpleRAG(spy), lm)
    floor, rag = full_prompts(lm, "answer")
    assert "[[ ## context ## ]]\n\n" in floor  # the same field, empty
    head = floor.split("[[ ## context ## ]]")[0]
    assert rag.startswith(head)  # same instructions and fields up to the context


@pytest.mark.parametrize("command", ["hcqr predict", "hcqr ask", "hcqr compile"])
def test_a_bound_is_refused_where_no_gold_answer_may_be_used(command):
    with pytest.raises(HCQRError, match=f"upper bound.*not a method `{command}` can run"):
        refuse_bound("oracle_rag", command)
    refuse_bound("no_context", command)  # the floor uses no answer
    refuse_bound("simple_rag", command)


def test_the_oracle_runs_in_eval_is_refused_by_predict_and_flagged_by_compare(tmp_path):
    from hcqr_dspy.data import load_questions
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.reporting.report import compare
    from hcqr_dspy.resources import shipped_dir
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus
    from hcqr_dspy.workflows.evaluate import run_evaluation, run_prediction
    from hcqr_dspy.workflows.specs import EvalSpec

    demo = shipped_dir("demo")
    BM25Retriever(load_corpus(demo / "corpus.jsonl"), show_progress=False).save(tmp_path / "bm25")
    runs = []
    for method in ("oracle_rag", "simple_rag"):
        spec = EvalSpec(
            method=method,
            dataset=str(demo / "questions.json"),
            index=str(tmp_path / "bm25"),
            lm="openai/dummy",
            limit=2,
            run_dir=str(tmp_path / method),
        )
        result, folder, _ = run_evaluation(spec, lm=answering(), track=False, progress=False)
        runs.append(folder)
    questions = {q.qid: q for q in load_questions(demo / "questions.json")}
    for row in RunFolder.open(runs[0]).rows():
        q = questions[row["qid"]]
        assert row["queries"] == [f"{q.question} {q.options[q.answer]}"]
    spec.method, spec.run_dir = "oracle_rag", str(tmp_path / "predicted")
    with pytest.raises(HCQRError, match="not a method `hcqr predict` can run"):
        run_prediction(spec, tmp_path / "answers.jsonl", track=False)
    report, _ = compare([str(runs[1]), str(runs[0])], out_dir=tmp_path / "cmp")
    assert "oracle_rag retrieves with the gold answer (an oracle)" in report
