"""`hcqr eval --answer-step`: a fresh method (the oracle-context ceiling, say) answering with a saved program's answer
step, its instructions and demos; recorded in the run folder, rebuilt by `rescore`/`replay`, refused where it does
not fit. DummyLM answers; the demo data and a tiny BM25 index over the demo corpus."""

import dspy
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.errors import HCQRError, ProgramFormatError
from hcqr_dspy.optimize.answer_step import adopt_answer_step
from hcqr_dspy.optimize.saved import NoRetriever, question_keys, save_program
from hcqr_dspy.programs import make_program
from hcqr_dspy.resources import shipped_dir

INSTRUCTIONS = "Quote the passage that decides the question before answering."
DEMO_QUESTION = "Which vitamin deficiency causes scurvy? (a compiled demo)"


def answering():
    return DummyLM({"`answer`": {"reasoning": "r", "answer": "A"}}, adapter=dspy.JSONAdapter())


def compiled(method: str, folder=None, **meta):
    """A saved ``method`` program whose answer step an optimizer changed: new instructions and one demo."""
    program = make_program(method, NoRetriever())
    answer = dict(program.named_predictors())["answer"]
    answer.signature = answer.signature.with_instructions(INSTRUCTIONS)
    answer.demos = [
        dspy.Example(
            question=DEMO_QUESTION,
            options="A. Vitamin C\nB. Vitamin D",
            context="[1] Scurvy ...",
            reasoning="r",
            answer="A",
        )
    ]
    return save_program(program, folder, demo_context_tokens=77, **meta)  # a recipe's demo context cut


@pytest.fixture
def world(tmp_path):
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    demo = shipped_dir("demo")
    BM25Retriever(load_corpus(demo / "corpus.jsonl"), show_progress=False).save(tmp_path / "bm25")
    return {"root": tmp_path, "questions": str(demo / "questions.json"), "index": str(tmp_path / "bm25")}


def spec(world, method="oracle_rag", **kw):
    from hcqr_dspy.workflows.specs import EvalSpec

    return EvalSpec(
        method=method,
        dataset=world["questions"],
        index=world["index"],
        lm="openai/dummy",
        limit=2,
        run_dir=str(world["root"] / "run"),
        **kw,
    )


def test_the_oracle_answers_with_the_compiled_answer_step_and_rescore_rebuilds_it(world):
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.reporting.runs import run_label
    from hcqr_dspy.retrieval import load_index
    from hcqr_dspy.tracking.evaluation_run import mlflow_run_name, program_label
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.programs import run_program

    prog = compiled("hcqr", folder=world["root"] / "hcqr-bfs")
    lm = answering()
    result, folder, _ = run_evaluation(spec(world, answer_step=str(prog)), lm=lm, track=False, progress=False)
    assert result.ran == 2
    prompts = [m["content"] for h in lm.history for m in h["messages"]]
    assert sum(INSTRUCTIONS in p for p in prompts) == 2  # every answer prompt has the compiled instructions
    assert sum(DEMO_QUESTION in p for p in prompts) == 2  # and its demo
    run = RunFolder.open(folder)
    assert run.config["answer_step"]["folder"] == str(prog.resolve()) and run.config["saved_program"] is None
    assert run_label(run.config, folder) == "oracle_rag+answer:saved"
    assert program_label(run.config) == "answer-step:saved"
    assert mlflow_run_name("oracle_rag", "questions", "x", run.config).startswith("oracle_rag+answer:saved")
    rebuilt = run_program(run, load_index(world["index"]))  # what rescore and replay run
    answer = dict(rebuilt.named_predictors())["answer"]
    assert answer.signature.instructions == INSTRUCTIONS and len(answer.demos) == 1
    assert rebuilt.demo_context_tokens == 77
    # the same folder without the answer step is another configuration: refused, not mixed
    with pytest.raises(HCQRError, match="another configuration"):
        run_evaluation(spec(world), lm=answering(), track=False, progress=False)


def test_an_answer_step_that_does_not_fit_is_refused_before_any_lm_call(world):
    from hcqr_dspy.workflows.evaluate import run_evaluation

    lm = answering()
    shown = compiled("hcqr_show_hypothesis", folder=world["root"] / "shown")  # its answer step reads the hypothesis
    with pytest.raises(ProgramFormatError, match="answers from fields .*hypothesis.* does not fit"):
        run_evaluation(spec(world, answer_step=str(shown)), lm=lm, track=False, progress=False)
    cot = compiled("cot", folder=world["root"] / "cot")  # no context field
    with pytest.raises(ProgramFormatError, match="does not fit"):
        run_evaluation(spec(world, method="simple_rag", answer_step=str(cot)), lm=lm, track=False, progress=False)
    with pytest.raises(HCQRError, match="own answer step: drop --answer-step"):
        run_evaluation(
            spec(world, method=None, program=str(shown), answer_step=str(shown)), lm=lm, track=False, progress=False
        )
    with pytest.raises(ProgramFormatError):
        run_evaluation(spec(world, answer_step=str(world["root"])), lm=lm, track=False, progress=False)
    assert lm.history == []
    assert not (world["root"] / "run" / "predictions.jsonl").exists()


def test_an_answer_step_compiled_on_the_test_questions_is_refused(world):
    from hcqr_dspy.data import load_questions, select
    from hcqr_dspy.workflows.evaluate import run_evaluation

    questions = select(load_questions(world["questions"]), limit=2, seed=0)
    keys = question_keys(questions, "questions")
    train = {"dataset": "questions", **keys, "train_count": len(keys["ids"]), "val_count": 0}
    prog = compiled("simple_rag", folder=world["root"] / "leaky", train=train)
    with pytest.raises(HCQRError, match="answer step .*leaky"):
        run_evaluation(spec(world, answer_step=str(prog)), lm=answering(), track=False, progress=False)


def test_the_no_context_floor_takes_a_simple_rag_answer_step(tmp_path):
    prog = compiled("simple_rag", folder=tmp_path / "sr")
    floor = make_program("no_context")
    adopt_answer_step(floor, prog)
    assert floor.answer.signature.instructions == INSTRUCTIONS and len(floor.answer.demos) == 1


def test_a_run_resumes_with_its_inputs_moved_and_still_refuses_other_inputs(world, tiny_corpus_file, caplog):
    """A checkout, data folder or program somewhere else is the same run (matched by the questions', corpus' and
    program's identities); the config then records the new places. Another corpus is still refused."""
    import logging
    import shutil
    from pathlib import Path

    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus, load_index
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.programs import run_program

    root = world["root"]
    prog = compiled("hcqr", folder=root / "hcqr-bfs")
    first, folder, _ = run_evaluation(spec(world, answer_step=str(prog)), lm=answering(), track=False, progress=False)
    rows = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(rows[0])  # the run stopped after its first question
    moved = {
        "root": root,
        "questions": str(shutil.copy(world["questions"], root / "questions.json")),
        "index": str(shutil.copytree(world["index"], root / "elsewhere" / "bm25")),
    }
    shutil.rmtree(world["index"])
    prog = Path(shutil.move(prog, root / "elsewhere" / "program"))
    caplog.set_level(logging.INFO, logger="hcqr_dspy")  # the moved-inputs note is INFO
    lm = answering()
    result, _, _ = run_evaluation(spec(moved, answer_step=str(prog)), lm=lm, track=False, progress=False)
    assert result.ran == 1 and len(lm.history) == 1  # only the question the first session did not answer
    moved_note = "other places (dataset, index.path, answer_step.source, answer_step.folder)"
    assert moved_note in caplog.text  # an INFO note of the hcqr_dspy logger
    config = RunFolder.open(folder).config
    assert config["dataset"] == moved["questions"] and config["index"]["path"] == moved["index"]
    assert config["answer_step"]["folder"] == str(prog.resolve())
    rebuilt = run_program(RunFolder.open(folder), load_index(moved["index"]))  # rescore and replay find it too
    assert dict(rebuilt.named_predictors())["answer"].signature.instructions == INSTRUCTIONS

    BM25Retriever(load_corpus(tiny_corpus_file), show_progress=False).save(root / "other")  # another corpus
    lm = answering()
    with pytest.raises(HCQRError, match=r"another configuration \(differs in: index\)"):
        run_evaluation(spec({**moved, "index": str(root / "other")}, answer_step=str(prog)), lm=lm, track=False)
    assert lm.history == []


def test_a_program_edited_since_the_run_is_refused_on_resume_and_rebuild(world):
    """Instructions or demos edited in ``program.json`` after a run started make another program (same compile
    run, same creation time): reading it is refused (meta.json's hash); for a program saved without that hash the
    resume is refused, and so is rebuilding it for rescore or replay. A format 1 run folder without the program's
    hash resumes and records it from then on."""
    import json
    from pathlib import Path

    from hcqr_dspy.errors import RunError
    from hcqr_dspy.evaluation.run_folder import RunFolder
    from hcqr_dspy.files import file_sha256
    from hcqr_dspy.retrieval import load_index
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.programs import run_program

    prog = Path(compiled("hcqr", folder=world["root"] / "hcqr-bfs"))
    _, folder, _ = run_evaluation(spec(world, answer_step=str(prog)), lm=answering(), track=False, progress=False)
    state = prog / "program.json"
    assert RunFolder.open(folder).config["answer_step"]["program_sha256"] == file_sha256(state)
    rows = (folder / "predictions.jsonl").read_text().splitlines(keepends=True)
    (folder / "predictions.jsonl").write_text(rows[0])  # the run stopped after its first question
    original = state.read_text()
    state.write_text(original.replace(INSTRUCTIONS, "Answer with the first option."))
    lm = answering()
    with pytest.raises(HCQRError, match=r"program.json was changed after the program was saved"):  # meta.json's hash
        run_evaluation(spec(world, answer_step=str(prog)), lm=lm, track=False, progress=False)
    meta = json.loads((prog / "meta.json").read_text())
    del meta["program_sha256"]  # a program saved before meta.json recorded it: the run's own record catches it
    (prog / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(HCQRError, match=r"another configuration \(differs in: answer_step, prompts_sha256\)"):
        run_evaluation(spec(world, answer_step=str(prog)), lm=lm, track=False, progress=False)
    assert lm.history == []
    with pytest.raises(RunError, match="program.json changed since the run"):
        run_program(RunFolder.open(folder), load_index(world["index"]))

    state.write_text(original)
    config = json.loads((folder / "config.json").read_text())
    del config["answer_step"]["program_sha256"], config["format"]  # a format 1 folder, which may lack the hash
    (folder / "config.json").write_text(json.dumps(config))
    result, _, _ = run_evaluation(spec(world, answer_step=str(prog)), lm=answering(), track=False, progress=False)
    assert result.ran == 1
    assert RunFolder.open(folder).config["answer_step"]["program_sha256"] == file_sha256(state)
