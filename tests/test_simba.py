"""SIMBA from its catalog entry and one recipe file: its seed reaches ``compile()``, its candidates' scores are read
as the fractions they are (measured on the training questions), and a mini-batch larger than the training
questions is refused before any LM call."""

from types import SimpleNamespace

import pytest
from test_optimize import RECIPES, compile_with, demo_questions, teaching  # noqa: F401 - teaching is a fixture

from hcqr_dspy.errors import RecipeError
from hcqr_dspy.optimize.catalog import entry, seed_problem
from hcqr_dspy.optimize.recipe_compile import optimizer_scores
from hcqr_dspy.optimize.recipes import load_recipe


def small(seed: int):
    recipe = load_recipe(RECIPES / "simba.yaml")  # as shipped, but a small search for a test
    recipe.settings.update(bsize=4, num_candidates=2, max_steps=2, max_demos=1, num_threads=1)
    recipe.seed = seed
    return recipe


def test_simba_compiles_with_its_seed_and_reports_a_train_score_as_a_fraction(teaching):  # noqa: F811
    runs = {}
    for seed in (0, 0, 1):
        recipe = small(seed)
        _, compiled = compile_with(recipe, teaching)
        runs.setdefault(seed, []).append(
            (str(compiled.dump_state()), [c["score"] for c in compiled.candidate_programs])
        )
        scores = optimizer_scores(compiled, recipe.optimizer)
        assert set(scores) == {"train_score", "candidates"}  # scored on the training questions, said so
        assert 0.0 <= scores["train_score"] <= 1.0  # a fraction, not a percentage divided by 100
        assert scores["train_score"] == max(c["score"] for c in compiled.candidate_programs)
        train = {q.question for q in teaching["train"]}
        assert all(q in train for p in compiled.predictors() for q in demo_questions(p))
    assert runs[0][0] == runs[0][1]  # one seed twice: the same program and scores
    assert seed_problem("SIMBA", {}, {}) is None and entry("SIMBA").seed == "compile"


def test_simba_seed_reaches_compile(teaching, monkeypatch):  # noqa: F811
    import dspy

    seen = []
    real = dspy.SIMBA.compile

    def spy(self, student, *, trainset, seed=0):
        seen.append(seed)
        return real(self, student, trainset=trainset, seed=seed)

    monkeypatch.setattr(dspy.SIMBA, "compile", spy)
    compile_with(small(7), teaching)
    assert seen == [7]


def test_a_mini_batch_larger_than_the_training_questions_is_refused_before_any_call(teaching):  # noqa: F811
    recipe = small(0)
    recipe.settings["bsize"] = 50
    with pytest.raises(RecipeError, match=r"SIMBA bsize 50 is more than the 6 training questions"):
        compile_with(recipe, teaching)


def test_simba_scores_are_read_on_their_own_scale():
    candidates = SimpleNamespace(candidate_programs=[{"score": 0.5}, {"score": 0.25}])
    assert optimizer_scores(candidates, "SIMBA") == {"train_score": 0.5, "candidates": 2.0}
