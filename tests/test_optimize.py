"""Prompt optimization with deterministic fake LMs: every recipe compiles HCQR, saved programs round-trip,
overlap and bad recipes are refused before any LM call, compiled runs are recorded and compared."""

import json
import re
import socket
from pathlib import Path

import dspy
import mlflow
import pytest
from helpers import (
    FINDINGS,
    TAUGHT,
    TEACHING_OPTIONS,
    TINY_ROWS,
    TeachableEngine,
    schema_lm,
    snippet,
    teachable_lm,
    teaching_questions,
    write_jsonl,
)
from pydantic import ValidationError

from hcqr_dspy.errors import HCQRError, LMUnavailableError, ProgramFormatError, RecipeError
from hcqr_dspy.evaluation.evidence import mentions
from hcqr_dspy.lm import build_lm
from hcqr_dspy.optimize.demo_counts import count_saved_program
from hcqr_dspy.optimize.feedback import diagnose, make_metric
from hcqr_dspy.optimize.recipe_compile import build_optimizer, compile_program, optimizer_scores, split_train
from hcqr_dspy.optimize.recipes import load_recipe
from hcqr_dspy.optimize.saved import load_program, save_program
from hcqr_dspy.programs import HCQR, CoT
from hcqr_dspy.programs.answer_slot_probs import NO_LOGPROBS
from hcqr_dspy.programs.program_base import MCQProgram
from hcqr_dspy.reporting import compare
from hcqr_dspy.retrieval import BM25Retriever, load_corpus, load_index
from hcqr_dspy.workflows.compile import CompileSpec, run_compile
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.specs import EvalSpec

RECIPES = Path(__file__).resolve().parents[1] / "optimizers"
OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease"}


def questions(prefix, n, answer=lambda i: "A" if i % 3 else "B"):
    return {
        f"{i:04d}": {
            "question": f"{prefix} case {i}: a patient on digoxin sees yellow halos. Cause?",
            "options": OPTIONS,
            "answer": answer(i),
        }
        for i in range(n)
    }


@pytest.fixture
def setup(tmp_path):
    corpus = load_corpus(write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    BM25Retriever(corpus, show_progress=False).save(tmp_path / "idx")
    (tmp_path / "medmcqa.json").write_text(json.dumps(questions("Train", 12)))
    (tmp_path / "medqa.json").write_text(json.dumps(questions("Test", 4)))
    return tmp_path


def examples(n=6):
    return load_questions_from(questions("Train", n))


def load_questions_from(rows):
    return [
        dspy.Example(qid=k, question=v["question"], options=v["options"], answer=v["answer"]).with_inputs(
            "question", "options"
        )
        for k, v in rows.items()
    ]


# -- each shipped recipe compiles HCQR, and what the optimizer produced works ----------------------
# The teachable LM (tests/helpers.py) answers "yellow halos" questions right zero-shot, "exophthalmos" ones only
# when the prompt shows a demo, "fatigable ptosis" ones only under the instruction TAUGHT, which it proposes when
# an optimizer asks it for instructions. So zero-shot it solves a third of the questions, and whatever an
# optimizer adds (demos, instructions) shows up as questions it now solves.
NONE, DEMOS, TAUGHT_ONLY, BOTH = (
    {f: f == "yellow halos" for f in FINDINGS},
    {f: f != "fatigable ptosis" for f in FINDINGS},
    {f: f != "exophthalmos" for f in FINDINGS},
    {f: True for f in FINDINGS},
)


@pytest.fixture
def teaching(tmp_path):
    corpus = load_corpus(write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    BM25Retriever(corpus, show_progress=False).save(tmp_path / "idx")
    rows = load_questions_from(teaching_questions("Train", 12))
    return {
        "retriever": load_index(tmp_path / "idx"),
        "train": rows[:6],
        "val": rows[6:],
        "test": load_questions_from(teaching_questions("Test", 6)),
    }


def compile_with(recipe, teaching, **lms):
    student = HCQR(teaching["retriever"], budget=3, k_per_query=1)
    with dspy.context(lm=teachable_lm(), adapter=dspy.JSONAdapter()):
        compiled = compile_program(recipe, student, teaching["train"], teaching["val"], **lms)
    assert isinstance(compiled, HCQR) and [n for n, _ in compiled.named_predictors()] == [
        "hypothesis",
        "rewrite",
        "answer",
    ]
    assert all(not p.demos for p in student.predictors())  # the student is untouched
    return student, compiled


def solved(program, questions):
    """For each finding, whether the program answers all its questions right (a fresh teachable LM)."""
    with dspy.context(lm=teachable_lm(), adapter=dspy.JSONAdapter()):
        right = [(q, program(question=q.question, options=q.options).answer == q.answer) for q in questions]
    return {f: all(ok for q, ok in right if f in q.question) for f in FINDINGS}


def demo_questions(predictor):
    return [d["question"] for d in predictor.demos]


def test_bootstrap_fewshot_keeps_traces_of_correctly_answered_train_questions(teaching):
    recipe = load_recipe(RECIPES / "bootstrap_fewshot.yaml")  # as shipped
    student, compiled = compile_with(recipe, teaching)
    train = {q.question: q for q in teaching["train"]}
    for predictor in compiled.predictors():  # max_bootstrapped_demos: 2, max_labeled_demos: 2 -> 2 traces, 0 raw
        assert len(predictor.demos) == recipe.settings["max_bootstrapped_demos"]
        assert all(q in train for q in demo_questions(predictor))
    # only traces the metric passed became demos: the teacher (labeled demos, no taught instruction) fails the
    # first train question (fatigable ptosis), so the demos are the next two, with their gold answers
    assert demo_questions(compiled.answer) == [q.question for q in teaching["train"][1:3]]
    assert [d["answer"] for d in compiled.answer.demos] == [train[q].answer for q in demo_questions(compiled.answer)]
    assert solved(student, teaching["test"]) == NONE and solved(compiled, teaching["test"]) == DEMOS


def test_a_compile_whose_metric_reads_no_option_probabilities_does_not_score_them(teaching, monkeypatch):
    """The letter-distribution prefill is skipped while an accuracy metric scores candidates; the compiled program
    and the student score their answers again afterwards."""
    asked = []
    real = MCQProgram.option_probabilities

    def counted(self, *args, **kwargs):
        asked.append(self.score_options)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MCQProgram, "option_probabilities", counted)
    student, compiled = compile_with(load_recipe(RECIPES / "bootstrap_fewshot.yaml"), teaching)
    assert asked and not any(asked)  # every answer step of the compile ran unscored
    question = teaching["test"][0]
    with dspy.context(lm=teachable_lm(), adapter=dspy.JSONAdapter()):
        for program in (compiled, student):
            pred = program(question=question.question, options=question.options)
            assert asked[-1] is True and pred.option_probs_absent == NO_LOGPROBS  # asked, not switched off


def test_random_search_scores_every_candidate_and_keeps_the_best(teaching):
    recipe = load_recipe(RECIPES / "bootstrap_random_search.yaml")  # as shipped
    student, compiled = compile_with(recipe, teaching)
    candidates = compiled.candidate_programs  # recorded by DSPy, best first
    # zero-shot, labeled-only and unshuffled bootstrap (seeds -3, -2, -1), then num_candidate_programs random ones
    assert sorted(c["seed"] for c in candidates) == list(range(-3, recipe.settings["num_candidate_programs"]))
    zero_shot = next(c for c in candidates if c["seed"] == -3)
    assert zero_shot["score"] == pytest.approx(100 / 3, abs=0.01)  # the validation split, a third solved
    assert candidates[0]["score"] == max(c["score"] for c in candidates) == pytest.approx(200 / 3, abs=0.01)
    assert candidates[0]["program"] is compiled
    assert optimizer_scores(compiled, recipe.optimizer) == {
        "val_score": pytest.approx(2 / 3, abs=1e-4),
        "candidates": len(candidates),
    }
    train = {q.question for q in teaching["train"]}
    assert compiled.answer.demos and all(q in train for q in demo_questions(compiled.answer))
    assert solved(student, teaching["test"]) == NONE and solved(compiled, teaching["test"]) == DEMOS


def test_mipro_light_as_shipped_picks_proposed_instructions_and_demos(teaching):
    recipe = load_recipe(RECIPES / "mipro_light.yaml")  # auto: light and every other setting as shipped
    assert recipe.settings["auto"] == "light"
    student, compiled = compile_with(recipe, teaching)
    assert compiled.trial_logs[1]["full_eval_score"] == pytest.approx(100 / 3, abs=0.01)  # the zero-shot program
    assert compiled.score == 100.0  # reachable only with the proposed instruction and demos on the answer step
    assert optimizer_scores(compiled, recipe.optimizer)["val_score"] == 1.0
    assert compiled.answer.signature.instructions == TAUGHT != student.answer.signature.instructions
    train = {q.question for q in teaching["train"]}
    assert compiled.answer.demos and all(q in train for q in demo_questions(compiled.answer))
    assert solved(student, teaching["test"]) == NONE and solved(compiled, teaching["test"]) == BOTH


def test_mipro_instructions_as_shipped_searches_instructions_only(teaching):
    recipe = load_recipe(RECIPES / "mipro_instructions.yaml")  # MIPROv2 light with no demos, as shipped
    assert recipe.settings["auto"] == "light"
    student, compiled = compile_with(recipe, teaching)
    assert compiled.answer.signature.instructions == TAUGHT != student.answer.signature.instructions
    assert all(not p.demos for p in compiled.predictors())  # zero-shot prompts: nothing taught by example
    assert solved(student, teaching["test"]) == NONE and solved(compiled, teaching["test"]) == TAUGHT_ONLY


def test_gepa_rewrites_the_instruction_that_matters(teaching):
    recipe = load_recipe(RECIPES / "gepa.yaml")
    metric = make_metric(recipe.metric)
    assert (
        build_optimizer(recipe, metric, reflection_lm=teachable_lm()).auto == "light"
    )  # the shipped budget reaches GEPA
    # auto: light means ~1,100 metric calls whatever the data size (26 s here): the only change is a smaller budget
    fast = recipe.model_copy(update={"settings": {**recipe.settings, "auto": None, "max_metric_calls": 60}})
    student, compiled = compile_with(fast, teaching, reflection_lm=teachable_lm())
    assert compiled.answer.signature.instructions == TAUGHT
    for name in ("hypothesis", "rewrite"):  # proposals there change no score, so GEPA kept the originals
        assert getattr(compiled, name).signature.instructions == getattr(student, name).signature.instructions
    assert all(not p.demos for p in compiled.predictors())  # GEPA evolves instructions only
    assert solved(student, teaching["test"]) == NONE and solved(compiled, teaching["test"]) == TAUGHT_ONLY


def test_round_trip_gives_identical_prompts_and_predictions(setup):
    recipe = load_recipe(RECIPES / "bootstrap_fewshot.yaml")
    retriever = load_index(setup / "idx")
    train = load_questions_from(questions("Train", 6))
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        compiled = compile_program(recipe, HCQR(retriever, budget=3, k_per_query=1), train, [])
    save_program(compiled, setup / "prog", optimizer="BootstrapFewShot")
    loaded, meta = load_program(setup / "prog", retriever)
    assert meta["method"] == "hcqr" and meta["options"]["k_per_query"] == 1 and meta["optimizer"] == "BootstrapFewShot"
    tests = load_questions_from(questions("Test", 3))
    outputs = []
    for program in (compiled, loaded):
        lm = schema_lm("A")
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            preds = [program(question=q.question, options=q.options) for q in tests]
        outputs.append(
            ([(p.answer, p.queries, [x["id"] for x in p.passages]) for p in preds], lm.schema_engine.prompts)
        )
    assert outputs[0] == outputs[1]
    assert any("Train case" in prompt for prompt in outputs[1][1])  # the demos reached the prompts


def test_saved_program_format_errors(setup):
    retriever = load_index(setup / "idx")
    save_program(HCQR(retriever, budget=3), setup / "p")
    with pytest.raises(ProgramFormatError, match="saved 'hcqr' program, not 'cot'"):
        load_program(setup / "p", retriever, method="cot")
    meta = json.loads((setup / "p" / "meta.json").read_text())
    (setup / "p" / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ProgramFormatError, match="format version 99, newer than this hcqr-dspy reads"):
        load_program(setup / "p", retriever)
    (setup / "p" / "meta.json").write_text(json.dumps({**meta, "method": "magic"}))
    with pytest.raises(ProgramFormatError, match="holds method 'magic'"):
        load_program(setup / "p", retriever)
    save_program(CoT(), setup / "c")  # a CoT state loaded as an HCQR program: predictors do not match
    c_hash = json.loads((setup / "c" / "meta.json").read_text())["program_sha256"]
    (setup / "c" / "meta.json").write_text(json.dumps({**meta, "options": {"budget": 3}, "program_sha256": c_hash}))
    with pytest.raises(ProgramFormatError, match="holds predictors"):
        load_program(setup / "c", retriever)
    with pytest.raises(ProgramFormatError, match="not found"):
        load_program(setup / "missing", retriever)
    (setup / "junk").mkdir()
    (setup / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ProgramFormatError, match="not a saved program folder"):
        save_program(CoT(), setup / "junk")
    assert (setup / "junk" / "notes.txt").read_text() == "mine"


def test_a_program_json_edited_after_it_was_saved_is_refused_when_read(setup):
    """meta.json records program.json's SHA-256 as saved: a hand edit (an instruction or a demo changed) would run
    under the recipe and compile run meta.json names, so reading it is refused, before any retriever or LM is
    needed; without the hash (a program saved before it was recorded, or the user's own) it loads as it is."""
    from hcqr_dspy.files import file_sha256
    from hcqr_dspy.optimize.saved import read_meta

    retriever = load_index(setup / "idx")
    save_program(HCQR(retriever, budget=3), setup / "p")
    state, meta_file = setup / "p" / "program.json", setup / "p" / "meta.json"
    assert read_meta(setup / "p")["program_sha256"] == file_sha256(state)
    edited = json.loads(state.read_text())
    edited["hypothesis"]["signature"]["instructions"] += " Be terse."  # one instruction changed by hand
    state.write_text(json.dumps(edited, indent=2))
    for read in (lambda: read_meta(setup / "p"), lambda: load_program(setup / "p", retriever)):
        with pytest.raises(ProgramFormatError, match=r"program.json was changed after the program was saved"):
            read()
    meta = json.loads(meta_file.read_text())
    del meta["program_sha256"]
    meta_file.write_text(json.dumps(meta))
    program, loaded = load_program(setup / "p", retriever)
    assert loaded["program_sha256"] is None and "Be terse." in json.dumps(program.dump_state())
    if Path("/proc/self/mem").exists():  # Linux: a program.json that is a file but cannot be read (EIO)
        state.unlink()
        state.symlink_to("/proc/self/mem")
        for recorded in (None, "0" * 64):  # read by load_program alone, and by read_meta's hash check
            meta_file.write_text(json.dumps({**meta, "program_sha256": recorded}))
            with pytest.raises(ProgramFormatError, match=r"program.json is unreadable: "):
                load_program(setup / "p", retriever)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"format_version": 6, "new_key": 1},
            r"meta.json: saved in program format version 6, newer than this hcqr-dspy reads \(5\)",
        ),
        ({"format": "other"}, r"meta.json is not an hcqr-dspy-program file"),
        ({"format_version": "1"}, r"meta.json: format_version: Input should be a valid integer \(got '1'\)"),
        (
            {"optimiser": "x"},
            r"meta.json: optimiser: unknown key; allowed: .*options, program_sha256, recipe, reflection_lm, train$",
        ),
        (
            {"options": {"budget": 3, "k_per_qurey": 1}},
            r"meta.json: options: unknown hcqr option\(s\) k_per_qurey; allowed: budget",
        ),
        ({"options": {"budget": "3"}}, r"meta.json: options: budget: Input should be a valid integer \(got '3'\)"),
        ({"recipe": {"name": "r"}}, r"meta.json: recipe.optimizer: required \(and \d+ more problems?\)"),
        (
            {"train": {"dataset": "medmcqa", "ids": ["1"], "text_sha256": []}},
            r"meta.json: train: 1 ids but 0 text hashes",
        ),
        (
            {"train": {"dataset": "medmcqa", "ids": ["1"], "text_sha256": ["x"]}},
            r"meta.json: train.text_sha256.0: String should match pattern '\^\[0-9a-f\]\{64\}\$' \(got 'x'\)",
        ),
        (
            {"demo_context_tokens": -1},
            r"meta.json: demo_context_tokens: Input should be greater than or equal to 0 \(got -1\)",
        ),
    ],
)
def test_saved_program_meta_is_validated(setup, change, message):
    retriever = load_index(setup / "idx")
    save_program(HCQR(retriever, budget=3), setup / "p")
    meta = json.loads((setup / "p" / "meta.json").read_text())
    (setup / "p" / "meta.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(ProgramFormatError, match=message) as caught:
        load_program(setup / "p", retriever)
    assert "\n" not in str(caught.value)


def test_saved_program_meta_unreadable_and_refused_when_written(setup):
    retriever = load_index(setup / "idx")
    save_program(HCQR(retriever, budget=3), setup / "p")
    (setup / "p" / "meta.json").write_bytes(b'{"format": "hcqr-dspy-program",\n "method": "hcq\xff"}')
    with pytest.raises(ProgramFormatError, match=r"meta.json:2: not valid UTF-8 text \(byte 0xff at column 16\)"):
        load_program(setup / "p", retriever)
    (setup / "p" / "meta.json").write_text('{"format": "hcqr-dspy-program",\n')
    with pytest.raises(ProgramFormatError, match=r"meta.json:2: not valid JSON \("):
        load_program(setup / "p", retriever)
    # a record read_meta would refuse is never written (a caller's bug: pydantic's error, nothing on disk)
    with pytest.raises(ValidationError, match="optimiser"):
        save_program(HCQR(retriever, budget=3), setup / "q", optimiser="BootstrapFewShot")
    assert not (setup / "q").exists()


def write_recipe(folder, **fields):
    import yaml

    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump({"optimizer": "BootstrapFewShot", **fields}))
    return path


@pytest.mark.parametrize(
    "fields, message",
    [  # yaml.safe_dump sorts the keys: "optimizer" comes after "compile" and "metric", before the rest
        (
            {"optimizer": "SuperOpt"},
            r"r\.yaml:1: optimizer: Input should be 'BootstrapFewShot', .*'LabeledFewShot' or 'SIMBA' "
            r"\(got 'SuperOpt'\)$",
        ),
        (
            {"settings": {"max_demos": 3}},
            r"r\.yaml:2: settings: unknown BootstrapFewShot setting\(s\) max_demos; "
            r"allowed: max_bootstrapped_demos, .*max_rounds",
        ),
        (
            {"compile": {"valset": []}},
            r"r\.yaml:1: compile: unknown BootstrapFewShot.compile argument\(s\) valset; allowed: \(none\)",
        ),
        (
            {"settings": {"metric": "x"}},
            r"settings: unknown BootstrapFewShot setting\(s\) metric;",
        ),  # set by hcqr, not recipes
        (
            {"settings": {"max_bootstrapped_demos": "two"}},
            r"settings: max_bootstrapped_demos: Input should be a valid integer \(got 'two'\)",
        ),
        (
            {"optimizer": "MIPROv2", "settings": {"auto": "lite"}},
            r"settings: auto: Input should be 'light', 'medium' or 'heavy' \(got 'lite'\)",
        ),
        (
            {"metric": "f1"},
            r"r\.yaml:1: metric: Input should be 'accuracy', 'grounded', 'feedback' or 'feedback_gold_prob' "
            r"\(got 'f1'\)",
        ),
        ({"metric": "feedback_gold_prob"}, r"metric 'feedback_gold_prob' is for GEPA; BootstrapFewShot needs metric"),
        (
            {"optimizer": "GEPA", "metric": "grounded", "settings": {}},
            r"GEPA needs metric 'feedback' or 'feedback_gold_prob' \(a score with textual feedback\), not 'grounded'",
        ),
        ({"demo_predictors": []}, r"demo_predictors: List should have at least 1 item"),
        ({"metric": "feedback"}, r"metric 'feedback' is for GEPA; BootstrapFewShot needs metric 'accuracy'"),
        (
            {"train_sise": 3},
            r"r\.yaml:2: train_sise: unknown key; allowed: compile, demo_context_tokens, .*train_size, val_size$",
        ),
        ({"train_size": 0}, r"train_size: Input should be greater than or equal to 1 \(got 0\)"),
        ({"train_size": "5"}, r"train_size: Input should be a valid integer \(got '5'\)"),
        ({"val_size": True}, r"val_size: Input should be a valid integer \(got True\)"),
        ({"seed": -1}, r"seed: Input should be greater than or equal to 0 \(got -1\)"),
        ({"train_size": 3, "min_train": 4}, r"train_size 3 is under the recipe's own min_train 4"),
        ({"reflection_lm": "local"}, r"'reflection_lm' is for GEPA only, not BootstrapFewShot"),
    ],
)
def test_bad_recipes_are_refused(tmp_path, fields, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(write_recipe(tmp_path, **fields))


@pytest.mark.parametrize(
    "content, message",
    [
        (
            b"optimizer: MIPROv2\ndescription: caf\xe9 au lait\n",
            r"r\.yaml:2: not valid UTF-8 text \(byte 0xe9 at column 17\)",
        ),
        (b"optimizer: MIPROv2\nsettings: {auto: light\n", r"r\.yaml:3: not valid YAML \("),
        (b"optimizer: MIPROv2\nseed: 1\nseed: 2\n", r"r\.yaml:3: key 'seed' appears twice in one mapping"),
        (b"", r"r\.yaml: expected a mapping of keys \(compile, .*\), got an empty file"),
        (b"- optimizer: MIPROv2\n", r"r\.yaml: expected a mapping of keys .*, got list"),
    ],
)
def test_unreadable_recipes_are_one_line(tmp_path, content, message):
    (tmp_path / "r.yaml").write_bytes(content)
    with pytest.raises(RecipeError, match=message) as caught:
        load_recipe(tmp_path / "r.yaml")
    assert "\n" not in str(caught.value)


def test_unknown_recipe_lists_the_shipped_ones(monkeypatch, tmp_path):
    monkeypatch.chdir(RECIPES.parent)
    with pytest.raises(
        RecipeError,
        match=r"recipe 'nope' not found \(looked in optimizers/\); recipes there: bootstrap_fewshot, .*mipro_light",
    ):
        load_recipe("nope")
    assert load_recipe("bootstrap_fewshot").optimizer == "BootstrapFewShot"
    # from any other folder, a bare name still finds the shipped recipes (and the user's ./optimizers/ first)
    monkeypatch.chdir(tmp_path)
    assert load_recipe("gepa").optimizer == "GEPA"
    (tmp_path / "optimizers").mkdir()
    (tmp_path / "optimizers" / "gepa.yaml").write_text((RECIPES / "bootstrap_fewshot.yaml").read_text())
    assert load_recipe("gepa").optimizer == "BootstrapFewShot"
    with pytest.raises(RecipeError, match=r"looked in optimizers/, .*/optimizers/\); recipes there: bootstrap_fewshot"):
        load_recipe("nope")


def test_train_set_too_small_names_the_minimum():
    recipe = load_recipe(RECIPES / "mipro_light.yaml")
    with pytest.raises(
        RecipeError,
        match=r"train set of 3 question\(s\) is too small for recipe 'mipro_light' \(MIPROv2\); it needs at least 5",
    ):
        split_train(examples(20), recipe, train_size=3)
    with pytest.raises(RecipeError, match="the train file has 6 questions; recipe 'mipro_light' needs 30 \\+ 10"):
        split_train(examples(6), recipe)
    train, val = split_train(examples(20), recipe, train_size=6, val_size=4)
    assert len(train) == 6 and len(val) == 4 and not {e.qid for e in train} & {e.qid for e in val}


def spec(setup, **kw):
    base = dict(
        recipe=str(RECIPES / "bootstrap_fewshot.yaml"),
        method="hcqr",
        train=str(setup / "medmcqa.json"),
        index=str(setup / "idx"),
        out=str(setup / "programs" / "bfs"),
        lm="openai/unused",
        train_size=6,
        val_size=0,
        program_options={"budget": 3, "k_per_query": 1},
    )
    return CompileSpec(**{**base, **kw})


class NoCall:
    """An LM stand-in that fails the test if any call reaches it."""

    def __getattr__(self, name):
        raise AssertionError(f"LM used before input was checked ({name})")


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"recipe": str(RECIPES / "gepa.yaml")}, RecipeError, "needs a reflection LM"),
        (
            {"recipe": str(RECIPES / "gepa.yaml"), "reflection_lm": "gpt4"},
            HCQRError,
            "unknown --reflection-lm spec 'gpt4'",
        ),
        ({"method": "magic"}, HCQRError, "unknown method 'magic'"),
        ({"train_size": 2}, RecipeError, "too small for recipe 'bootstrap_fewshot'.*at least 4"),
        (
            {"holdout": ["HOLDOUT"]},
            HCQRError,
            r"overlaps the training set 'medmcqa': 6 question\(s\) \(.*; 6 match by id, 6 by question text\)",
        ),
        ({"out": "CORPUS"}, ProgramFormatError, "exists and is not a saved program folder"),
        ({"out": "/proc/hcqr-test/out"}, HCQRError, "--out /proc/hcqr-test/out is not writable"),  # even for root
    ],
)
def test_compile_refuses_bad_input_before_any_lm_call(setup, overrides, error, message):
    overrides = {
        k: ([str(setup / "medmcqa.json")] if v == ["HOLDOUT"] else str(setup / "corpus.jsonl") if v == "CORPUS" else v)
        for k, v in overrides.items()
    }
    with pytest.raises(error, match=message):
        run_compile(spec(setup, **overrides), track=False, lm=NoCall())


def test_an_lm_going_down_during_the_compile_stops_it_and_saves_nothing(setup, monkeypatch):
    # BootstrapFewShot counts a failed example as an error and goes on below max_errors: without the check,
    # 6 refused calls would yield a program with no demos, saved as if compiled.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections to it are refused
    monkeypatch.setenv("DOWN_KEY", "unused")
    lm = build_lm(
        "openai/down", api_base=f"http://127.0.0.1:{port}/v1", api_key_env="DOWN_KEY", cache=False, num_retries=0
    )
    with pytest.raises(
        LMUnavailableError,
        match=r"during the compile \(LMTransportError: .*nothing was saved to .*run the same command again",
    ):
        run_compile(spec(setup), track=False, lm=lm)
    assert not (setup / "programs" / "bfs" / "program.json").exists()


class SmallWindowEngine(TeachableEngine):
    """The teachable LM with a window too small for the optimizer's own proposal prompt (as the 1.5B model's
    8,192 tokens were for MIPROv2's proposer shown three traces with retrieved context): asked for an
    instruction, it refuses as the in-process engine does."""

    def fill(self, request, properties: dict) -> dict:
        if any("instruction" in k for k in properties):
            from dspy.lm15 import ContextLengthError

            raise ContextLengthError("prompt of about 10948 tokens + 1024 output tokens exceeds n_ctx=8192")
        return super().fill(request, properties)


def test_an_optimizer_prompt_over_the_window_is_one_line_and_saves_nothing(setup):
    # A program's own over-long prompt is a bad reply (counted invalid); the optimizer's is a recipe/window
    # mismatch that no rerun fixes: one line naming both ways out.
    recipe = str(RECIPES / "mipro_instructions.yaml")
    with pytest.raises(
        RecipeError,
        match=r"recipe 'mipro_instructions': a prompt of the MIPROv2 optimizer itself does not fit the LM's window "
        r"\(.*exceeds n_ctx=8192\); nothing was saved to .*give a larger --n-ctx",
    ):
        run_compile(spec(setup, recipe=recipe, val_size=4), track=False, lm=schema_lm(engine=SmallWindowEngine()))
    assert not (setup / "programs" / "bfs" / "program.json").exists()


def test_overlap_by_question_text_across_datasets(setup):
    # the same question texts under another dataset name and other ids: caught by text
    rows = {f"x{k}": v for k, v in questions("Train", 12).items()}
    (setup / "other.json").write_text(json.dumps(rows))
    with pytest.raises(
        HCQRError,
        match=r"overlaps the training set 'medmcqa': 6 question\(s\) \(x\d+, .*; 0 match by id, 6 by question text\)",
    ):
        run_compile(spec(setup, holdout=[str(setup / "other.json")]), track=False, lm=NoCall())


def test_compile_track_evaluate_and_compare_zero_shot_vs_compiled(setup, mlflow_store):
    lm = schema_lm("A")
    out = run_compile(spec(setup, register="hcqr-bfs-test", alias="champion"), mlflow_dir=mlflow_store, lm=lm)
    folder = Path(out["out"])
    # the compile's cost: every LM request it made (the served ones with their tokens), in meta.json and the run
    cost = out["compile_cost"]
    assert cost["lm_calls"] + cost["cached_lm_calls"] == len(lm.history) > 0
    assert cost["prompt_tokens"] == sum(h["usage"]["prompt_tokens"] for h in lm.history if h["usage"])
    assert out["train"] == 6 and all(p["demos"] >= 1 for p in out["predictors"].values())
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["optimizer"] == "BootstrapFewShot" and meta["recipe"]["name"] == "bootstrap_fewshot"
    assert meta["train"]["dataset"] == "medmcqa" and len(meta["train"]["ids"]) == 6
    assert meta["index"]["corpus_count"] == len(TINY_ROWS) and meta["mlflow_run_id"] == out["mlflow_run_id"]
    client = mlflow.MlflowClient()
    run = client.get_run(out["mlflow_run_id"])
    assert run.data.tags["kind"] == "compile" and run.data.params["recipe.optimizer"] == "BootstrapFewShot"
    artifacts = {a.path for a in client.list_artifacts(out["mlflow_run_id"], "program")}
    assert {"program/program.json", "program/meta.json"} <= artifacts
    assert client.list_artifacts(out["mlflow_run_id"], "recipe")
    # the compile run's figures: BootstrapFewShot validates nothing, so it says so instead of a score
    assert run.data.metrics["train_size"] == 6 and run.data.metrics["demos.answer"] >= 1
    assert meta["compile_cost"] == cost and run.data.metrics["compile.lm_calls"] == cost["lm_calls"]
    assert "val_score" not in run.data.metrics and "does not score" in run.data.tags["val_score"]
    # the MLflow model: a pyfunc logged from code, holding the program's JSON files and naming its index and LM;
    # registered, with an alias
    model = mlflow.models.get_model_info(out["model_uri"])
    assert model.run_id == out["mlflow_run_id"] and set(model.flavors) == {"python_function"}
    pyfunc = model.flavors["python_function"]
    assert pyfunc["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert pyfunc["config"]["lm"] == "openai/unused" and pyfunc["config"]["index"] == "bundled"
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=out["model_uri"]))
    assert (
        (local / Path(pyfunc["model_code_path"]).name).read_text().startswith('"""The code of the MLflow pyfunc model')
    )
    assert not [p for p in local.rglob("*") if p.suffix in (".pkl", ".pickle", ".cloudpickle")]
    assert {p.name for p in (local / pyfunc["artifacts"]["program"]["path"]).iterdir()} == {"program.json", "meta.json"}
    assert out["registered"] == "models:/hcqr-bfs-test/1"
    version = client.get_model_version_by_alias("hcqr-bfs-test", "champion")
    assert (
        str(version.version) == "1"
        and version.run_id == out["mlflow_run_id"]
        and version.tags["recipe"] == "bootstrap_fewshot"
        and version.tags["method"] == "hcqr"
        and version.tags["compile_run_id"] == out["mlflow_run_id"]
    )

    common = dict(dataset=str(setup / "medqa.json"), index=str(setup / "idx"), lm="openai/unused")
    zero, zero_dir, _ = run_evaluation(
        EvalSpec(
            method="hcqr",
            program_options={"budget": 3, "k_per_query": 1},
            run_dir=str(setup / "runs" / "zero"),
            **common,
        ),
        mlflow_dir=mlflow_store,
        progress=False,
        lm=schema_lm("A"),
    )
    comp, comp_dir, comp_id = run_evaluation(
        EvalSpec(
            method=None, program=f"runs:/{out['mlflow_run_id']}", run_dir=str(setup / "runs" / "compiled"), **common
        ),
        mlflow_dir=mlflow_store,
        progress=False,
        lm=schema_lm("A"),
    )
    # evaluated again, the runs:/ program is downloaded to another folder: the same run, resumed with nothing to do
    again, _, _ = run_evaluation(
        EvalSpec(
            method=None, program=f"runs:/{out['mlflow_run_id']}", run_dir=str(setup / "runs" / "compiled"), **common
        ),
        mlflow_dir=mlflow_store,
        progress=False,
        lm=NoCall(),
    )
    assert again.ran == 0
    # the registered version, by number and by alias, is the same program: the same predictions
    for uri in ("models:/hcqr-bfs-test/1", "models:/hcqr-bfs-test@champion"):
        again, _, again_id = run_evaluation(
            EvalSpec(method=None, program=uri, run_dir=str(setup / "runs" / uri[-8:]), **common),
            mlflow_dir=mlflow_store,
            progress=False,
            track=False,
            lm=schema_lm("A"),
        )
        assert [r["prediction"] for r in again.rows] == [r["prediction"] for r in comp.rows]
    with pytest.raises(HCQRError, match="cannot fetch saved program models:/hcqr-bfs-test/7"):
        run_evaluation(
            EvalSpec(method=None, program="models:/hcqr-bfs-test/7", run_dir=str(setup / "runs" / "no"), **common),
            mlflow_dir=mlflow_store,
            progress=False,
            lm=NoCall(),
        )
    comp_run = client.get_run(comp_id)
    assert comp_run.info.run_name == "hcqr+bootstrap_fewshot seed 0 · medqa · openai/unused"
    assert comp_run.data.tags["program"] == "compiled:bootstrap_fewshot"
    assert comp_run.data.tags["compile_run_id"] == out["mlflow_run_id"]
    # a runs:/ program is evaluated against the model its compile logged
    assert comp_run.data.tags["model_id"] == mlflow.models.get_model_info(out["model_uri"]).model_id
    assert f"runs/{out['mlflow_run_id']})" in comp_run.data.tags["mlflow.note.content"]
    config = json.loads((comp_dir / "config.json").read_text())
    assert config["method"] == "hcqr" and config["saved_program"]["optimizer"] == "BootstrapFewShot"
    assert config["saved_program"]["recipe"] == "bootstrap_fewshot" and config["saved_program"]["train_count"] == 6
    assert client.get_run(comp_id).data.params["saved_program.optimizer"] == "BootstrapFewShot"
    assert zero.metrics["n"] == comp.metrics["n"] == 4

    report, files = compare([zero_dir, comp_dir], out_dir=setup / "cmp")
    assert "| hcqr+bootstrap_fewshot |" in report and "McNemar" in report
    assert "## Differences from the reference" in report and "Δ hypothesis accuracy" in report
    assert "## Programs: instructions and demos" in report
    # demos as the prompts show them (a bare labelled example never reaches the hypothesis or rewrite prompt)
    shown = count_saved_program(folder)
    for stage, c in shown.items():
        assert f"**{stage}**: demos 0 -> {c['rendered']} shown ({c['bootstrapped']} bootstrapped, " in report
    assert "instructions unchanged" in report

    # the compiled program refuses questions it was trained on (the train file itself)
    with pytest.raises(HCQRError, match="overlaps the training set 'medmcqa'"):
        run_evaluation(
            EvalSpec(
                method=None,
                program=str(folder),
                dataset=str(setup / "medmcqa.json"),
                index=str(setup / "idx"),
                lm="openai/unused",
                run_dir=str(setup / "runs" / "bad"),
            ),
            mlflow_dir=mlflow_store,
            progress=False,
            lm=NoCall(),
        )
    with pytest.raises(HCQRError, match="saved 'hcqr' program, not 'cot'"):
        run_evaluation(
            EvalSpec(method="cot", program=str(folder), run_dir=str(setup / "runs" / "bad2"), **common),
            mlflow_dir=mlflow_store,
            progress=False,
            lm=NoCall(),
        )


def test_feedback_names_where_an_hcqr_trace_went_wrong():
    ex = dspy.Example(question="q", options={"A": "Digoxin toxicity", "B": "Graves disease"}, answer="A")

    def pred(answer, y0=None, valid=True):
        return dspy.Prediction(
            answer=answer,
            valid=valid,
            error=None if valid else "answer: AdapterParseError",
            hypothesis={"working_hypothesis": y0} if y0 else None,
            passages=[],
        )

    assert diagnose(ex, pred("A", "A"))[:2] == (1.0, "correct")
    assert diagnose(ex, pred("A", "B"))[:2] == (1.0, "wrong_hypothesis_corrected")
    assert diagnose(ex, pred(None, "A", valid=False))[:2] == (0.0, "invalid_answer")
    score, case, text = diagnose(ex, pred("B", "A"))
    assert (score, case) == (0.0, "right_hypothesis_flipped") and "flipped away to B" in text
    score, case, text = diagnose(ex, pred("B", "B"), ["Graves disease: TSH receptor antibodies."])
    assert case == "wrong_hypothesis_no_evidence" and "did not contain distinguishing evidence" in text
    _, case, _ = diagnose(ex, pred("B", "B"), ["Digoxin toxicity gives yellow vision."])
    assert case == "wrong_hypothesis_evidence_ignored"
    assert diagnose(ex, pred("B"))[1] == "wrong"  # no hypothesis (not HCQR)

    metric = make_metric("feedback")
    out = metric(ex, pred("B", "A"), None, "answer", None)
    assert out.score == 0.0 and "flipped" in out.feedback and "not mainly due" not in out.feedback
    out = metric(ex, pred("B", "A"), None, "rewrite", None)
    assert "not mainly due to the rewrite step" in out.feedback
    assert make_metric("accuracy")(ex, pred("A")) is True


def test_demo_contexts_are_trimmed_and_counted_against_the_context_budget(setup):
    recipe = load_recipe(RECIPES / "bootstrap_fewshot.yaml").model_copy(update={"demo_context_tokens": 40})
    retriever = load_index(setup / "idx")
    train = load_questions_from(questions("Train", 6))
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        student = HCQR(retriever, budget=3, k_per_query=1)
        compiled = compile_program(recipe, student, train, [])
        demos = [d for d in compiled.answer.demos if d.get("context")]
        assert demos and all(len(d["context"]) // 4 <= 40 for d in demos)  # SchemaEngine counts ~4 chars a token
        assert all(d["context"].startswith("Document [1]") and "Document [3]" not in d["context"] for d in demos)
        lm.engine.n_ctx = 4000  # a windowed LM: the budget is what the window leaves
        q = train[0]
        assert compiled.context_budget(q.question, q.options) < student.context_budget(q.question, q.options)


def test_cli_compile_refuses_bad_input_with_one_line(setup, capsys, monkeypatch):
    from hcqr_dspy.cli import main

    monkeypatch.chdir(RECIPES.parent)
    base = [
        "compile",
        "--train",
        str(setup / "medmcqa.json"),
        "--index",
        str(setup / "idx"),
        "--out",
        str(setup / "p"),
        "--lm",
        "openai/unused",
        "--no-mlflow",
    ]
    assert main(base + ["--recipe", "gepa"]) == 2
    assert "needs a reflection LM: give --reflection-lm" in capsys.readouterr().err
    assert main(base + ["--recipe", "nope"]) == 2
    assert (
        "recipe 'nope' not found (looked in optimizers/); recipes there: bootstrap_fewshot" in capsys.readouterr().err
    )
    assert main(base + ["--recipe", "bootstrap_fewshot", "--train-size", "2"]) == 2
    assert "it needs at least 4" in capsys.readouterr().err
    assert not (setup / "p").exists()


def test_every_registered_program_round_trips_its_options(setup):
    from hcqr_dspy.programs import PROGRAMS, accepted_options, make_program

    retriever = load_index(setup / "idx")
    non_default = {
        "budget": 4,
        "k_per_query": 2,
        "fusion": "rrf",
        "n_queries": 3,
        "pool_k": 6,
        "n_std": 0.5,
        "scoring": "vote",
        "top_logprobs": 5,
        "max_context_tokens": 3000,
    }
    for method, cls in PROGRAMS.items():
        options = {k: v for k, v in non_default.items() if k in accepted_options(cls)}
        program = make_program(method, retriever, **options)
        save_program(program, setup / "rt" / method)
        loaded, meta = load_program(setup / "rt" / method, retriever)
        assert type(loaded) is cls and loaded.settings() == program.settings(), method
        assert {k: meta["options"][k] for k in options} == options, method


def test_answer_demos_are_shown_trimmed(setup):
    retriever = load_index(setup / "idx")
    program = HCQR(retriever, budget=3, k_per_query=1)
    long_context = "\n".join(f"Document [{i}] (Title: T{i}) " + "word " * 300 for i in range(1, 6))
    program.answer.demos = [
        dspy.Example(question="Demo question?", options="A. x\nB. y", context=long_context, reasoning="r", answer="A")
    ]
    program.demo_context_tokens = 400  # SchemaEngine counts ~4 characters a token: one document is ~380
    lm = schema_lm("A")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        program(question="Live question?", options=OPTIONS)
    [answer_prompt] = [p for p in lm.schema_engine.prompts if "Demo question?" in p]
    assert "Document [1] (Title: T1)" in answer_prompt and "Document [2] (Title: T2)" not in answer_prompt
    assert program.answer.demos[0]["context"] == long_context  # the program's own demo is untouched


# -- recipes that teach the answer step to use its context ------------------------------------------------------
class CitingEngine(TeachableEngine):
    """The teachable LM whose answer-step reasoning names the option it answers (as a reader drawing on a passage
    would), so the ``grounded`` metric can pass; ``cite=False``: a reasoning that names no option."""

    def __init__(self, cite: bool = True):
        super().__init__()
        self.cite = cite

    def fill(self, request, properties: dict) -> dict:
        reply = super().fill(request, properties)
        if "answer" in properties and "reasoning" in properties:
            named = TEACHING_OPTIONS[reply["answer"]] if self.cite else "the option"
            reply["reasoning"] = f"The passage on {named} fits the finding."
        return reply


def test_grounded_metric_needs_a_right_answer_a_context_and_a_reasoning_that_name_the_gold_option(setup):
    retriever = load_index(setup / "idx")
    gold = dspy.Example(question="q", options={"A": "Digoxin toxicity", "B": "Graves disease"}, answer="A")
    metric = make_metric("grounded", retriever)

    def pred(answer="A", shown=("p3",), reasoning="Digoxin toxicity explains the halos."):
        passages = [{"id": i} for i in shown]
        return dspy.Prediction(answer=answer, valid=True, passages=passages, reasoning=reasoning)

    assert metric(gold, pred()) is True
    assert metric(gold, pred(shown=("p4", "p7"))) is False  # the context never names the gold option
    assert metric(gold, pred(reasoning="The halos point to it.")) is False  # the reasoning does not draw on it
    assert metric(gold, pred(answer="B", reasoning="Graves disease.")) is False
    with pytest.raises(RecipeError, match="needs a retrieval method"):
        make_metric("grounded", None)(gold, pred())


def gold_text(demo):
    """The text of a demo's answer, read from its options as the answer step was shown them ('A. text' lines)."""
    return dict(line.split(". ", 1) for line in demo["options"].splitlines())[demo["answer"]]


def test_a_grounded_recipe_bootstraps_only_answer_demos_whose_context_decides(teaching):
    recipe = load_recipe(RECIPES / "bootstrap_grounded.yaml")  # as shipped
    assert recipe.metric == "grounded" and recipe.demo_predictors == ["answer"]
    student = HCQR(teaching["retriever"], budget=3, k_per_query=1)
    with dspy.context(lm=schema_lm(engine=CitingEngine()), adapter=dspy.JSONAdapter()):
        compiled = compile_program(recipe, student, teaching["train"], teaching["val"])
    assert not compiled.hypothesis.demos and not compiled.rewrite.demos  # only the answer step is taught
    demos = compiled.answer.demos
    assert demos and all("context" in d for d in demos)  # bootstrapped traces, no bare labelled examples
    for d in demos:  # each shows a context naming the gold option, and a reasoning drawing on it
        assert mentions(gold_text(d), [d["context"]]) and gold_text(d) in d["reasoning"]


def test_the_grounded_metric_refuses_right_answers_whose_reasoning_does_not_use_the_context(teaching):
    # the same answers from the same contexts, but a reasoning that names no option
    student = HCQR(teaching["retriever"], budget=3, k_per_query=1)
    shipped = load_recipe(RECIPES / "bootstrap_grounded.yaml")
    demos = {}
    for metric in ("grounded", "accuracy"):
        with dspy.context(lm=schema_lm(engine=CitingEngine(cite=False)), adapter=dspy.JSONAdapter()):
            recipe = shipped.model_copy(update={"metric": metric})
            demos[metric] = compile_program(recipe, student, teaching["train"], teaching["val"]).answer.demos
    assert demos["grounded"] == [] and len(demos["accuracy"]) == 2


@pytest.mark.parametrize(
    "fields, method, message",
    [
        ({"demo_predictors": ["answr"]}, "hcqr", r"demo_predictors answr are not predictors of this program"),
        ({"metric": "grounded"}, "cot", r"metric 'grounded' needs a retrieval method; cot shows no context"),
    ],
)
def test_a_recipe_the_program_cannot_use_is_refused_before_any_lm_call_and_leaves_no_run(
    setup, mlflow_store, fields, method, message
):
    import yaml

    shipped = yaml.safe_load((RECIPES / "bootstrap_fewshot.yaml").read_text())
    recipe = write_recipe(setup, **{**shipped, **fields})
    options = {} if method == "cot" else {"budget": 3, "k_per_query": 1}
    runs_before = len(mlflow.search_runs(search_all_experiments=True))
    with pytest.raises(RecipeError, match=rf"recipe {re.escape(str(recipe))}: {message}"):
        run_compile(
            spec(setup, recipe=str(recipe), method=method, program_options=options),
            lm=NoCall(),
            mlflow_dir=mlflow_store,
        )
    assert len(mlflow.search_runs(search_all_experiments=True)) == runs_before  # no run for a refused compile


def test_gold_probability_feedback_scores_the_mean_of_accuracy_and_the_gold_probability():
    gold = dspy.Example(question="q", options={"A": "x", "B": "y"}, answer="A")
    metric = make_metric("feedback_gold_prob")
    right = dspy.Prediction(answer="A", valid=True, option_probs={"A": 0.7, "B": 0.3}, passages=[])
    wrong = dspy.Prediction(answer="B", valid=True, option_probs={"A": 0.4, "B": 0.6}, passages=[])
    assert metric(gold, right).score == pytest.approx(0.85) and "probability of 0.70" in metric(gold, right).feedback
    assert metric(gold, wrong).score == pytest.approx(0.2)
    invalid = dspy.Prediction(answer=None, valid=False, error="no letter", option_probs=None, passages=[])
    assert metric(gold, invalid).score == 0.0
    unscored = dspy.Prediction(answer="A", valid=True, option_probs=None, option_probs_absent="no logprobs")
    with pytest.raises(RecipeError, match=r"option probabilities, which this LM does not give \(no logprobs\)"):
        metric(gold, unscored)


def test_gepa_on_gold_probability_stops_at_an_lm_without_option_probabilities(teaching, monkeypatch):
    recipe = load_recipe(RECIPES / "gepa_gold_prob.yaml")  # as shipped, with a small budget
    fast = recipe.model_copy(update={"settings": {**recipe.settings, "auto": None, "max_metric_calls": 12}})
    student = HCQR(teaching["retriever"], budget=3, k_per_query=1)
    lm = teachable_lm()
    with pytest.raises(RecipeError, match=r"metric feedback_gold_prob\): the LM gives no next-token log-prob"):
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            compile_program(fast, student, teaching["train"], teaching["val"], reflection_lm=teachable_lm())
    assert lm.history == []  # refused before any call
    # a question scored without them (here: the capability check passed wrongly) stops the compile after GEPA,
    # which catches a metric's exception and would otherwise have gone on with failure scores
    monkeypatch.setattr("hcqr_dspy.optimize.recipe_compile.scores_options", lambda lm: True)
    with pytest.raises(RecipeError, match=r"option probabilities, which this LM does not give \(the LM gives no next"):
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            compile_program(fast, student, teaching["train"], teaching["val"], reflection_lm=teachable_lm())
    assert lm.history
