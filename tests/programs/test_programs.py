"""Program logic with dspy.utils.DummyLM: routing, budget, anchoring, invalid replies, ablations."""

import inspect

import dspy
import pytest
from dspy.utils import DummyLM
from programs.program_helpers import ANSWER, OPTIONS, QUESTION, SpyRetriever, full_prompts, run

from hcqr_dspy.programs import (
    HCQR,
    PROGRAMS,
    CoT,
    HCQRNoSupport,
    HCQRShowHypothesis,
    SimpleRAG,
    make_program,
)
from hcqr_dspy.programs.queries import clean_query

# Marker strings that appear only in the hypothesis; they must never reach the answer prompt.
HYPOTHESIS = {
    "discriminating_features": "HYPMARK-features yellow vision",
    "reasoning": "HYPMARK-reasoning cardiac glycoside",
    "working_hypothesis": "A",
    "confirming_evidence": "HYPMARK-evidence hypokalemia worsens it",
}
QUERIES = {
    "support_query": "digoxin toxicity yellow vision",
    "distinction_query": "digoxin toxicity versus hypokalemia",
    "key_feature_query": "nausea visual changes elderly",
}


def scripted(hypothesis=HYPOTHESIS, queries=QUERIES, answer=ANSWER):
    # DummyLM answers with the first entry whose key occurs in the last message.
    return DummyLM(
        {"`support_query`": queries, "`discriminating_features`": hypothesis, "`answer`": answer},
        adapter=dspy.JSONAdapter(),
    )


def answer_prompts(lm):
    return [h["messages"] for h in lm.history if "`answer`" in h["messages"][-1]["content"]]


def test_hcqr_hypothesis_never_reaches_answer_prompt(spy):
    lm = scripted()
    pred = run(HCQR(spy), lm)
    assert pred.valid and pred.answer == "A"
    assert pred.hypothesis["working_hypothesis"] == "A"
    [messages] = answer_prompts(lm)
    text = "\n".join(m["content"] for m in messages)
    assert "HYPMARK" not in text
    assert "Document [1]" in text  # the context did reach it
    # ...while the rewrite step did see the hypothesis
    rewrite = [h for h in lm.history if "`support_query`" in h["messages"][-1]["content"]]
    assert "HYPMARK-evidence" in rewrite[0]["messages"][-1]["content"]


def test_hcqr_sends_exactly_three_queries_in_one_batched_call(spy):
    pred = run(HCQR(spy), scripted())
    assert spy.calls == [(list(QUERIES.values()), 5)]
    assert pred.queries == list(QUERIES.values())
    assert pred.query_sources == ["rewrite"] * 3
    assert len(pred.stages) == 4 and pred.stages["retrieval"]["lm_calls"] == 0
    assert [pred.stages[s]["lm_calls"] for s in ("hypothesis", "rewrite", "answer")] == [1, 1, 1]


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_fused_context_never_exceeds_budget(spy, budget):
    lm = scripted()
    pred = run(HCQR(spy, budget=budget, k_per_query=5), lm)
    assert 1 <= len(pred.passages) <= budget
    [messages] = answer_prompts(lm)
    prompt = messages[-1]["content"]
    assert prompt.count("Document [") == len(pred.passages)
    assert f"Document [{budget + 1}]" not in prompt
    # provenance: each kept passage names the queries that found it
    assert all(p["queries"] and set(p["queries"]) <= {0, 1, 2} for p in pred.passages)


def test_invalid_answer_is_invalid_not_defaulted(spy):
    pred = run(HCQR(spy), scripted(answer={"reasoning": "?", "answer": "Z"}))
    assert pred.valid is False and pred.answer is None
    assert pred.error.startswith("answer: AdapterParseError")


@pytest.mark.parametrize("method", ["hcqr", "hcqr_show_hypothesis", "hcqr_no_support"])
def test_garbage_hypothesis_falls_back_to_the_question_and_still_answers(spy, method):
    lm = DummyLM({"`discriminating_features`": {"oops": "no fields"}, "`answer`": ANSWER}, adapter=dspy.JSONAdapter())
    pred = run(make_program(method, spy), lm)
    assert pred.valid is True and pred.answer == "A"  # answered on the same terms as Simple RAG
    assert pred.hypothesis is None and pred.hypothesis_error.startswith("AdapterParseError")
    assert spy.calls == [([QUESTION], 15)] and pred.query_sources == ["question"]
    assert pred.fallbacks == {"hypothesis_failed": 1, "queries_from_question": 1}
    assert not [h for h in lm.history if "`support_query`" in h["messages"][-1]["content"]]  # no rewrite call


def test_unusable_queries_fall_back_to_hypothesis_fields(spy):
    dup = {"support_query": "A", "distinction_query": "digoxin toxicity", "key_feature_query": "Digoxin Toxicity"}
    pred = run(HCQR(spy), scripted(queries=dup))
    # one usable query (the duplicate and the bare letter are not): all three built from the hypothesis
    assert pred.query_sources == ["hypothesis"] * 3
    assert len(spy.calls) == 1 and len(spy.calls[0][0]) == 3
    assert pred.queries[0].startswith("Digoxin toxicity HYPMARK-evidence")


def test_one_unusable_query_is_replaced_by_its_role(spy):
    partial = {**QUERIES, "distinction_query": "  "}
    pred = run(HCQR(spy), scripted(queries=partial))
    assert pred.query_sources == ["rewrite", "hypothesis", "rewrite"]
    assert "versus alternatives" in pred.queries[1]


def test_simple_rag_retrieves_with_the_question_alone(spy):
    lm = scripted()
    pred = run(SimpleRAG(spy, budget=3), lm)
    assert spy.calls == [([QUESTION], 3)]
    assert pred.valid and len(pred.passages) <= 3
    assert all(o not in spy.calls[0][0][0] for o in ("Graves disease", "Myasthenia"))


def test_cot_uses_no_retrieval():
    lm = scripted()
    pred = run(CoT(), lm)
    assert pred.valid and pred.answer == "A" and pred.passages == []
    assert "Document [" not in lm.history[-1]["messages"][-1]["content"]


def test_answer_letters_follow_the_question():
    lm = scripted(answer={"reasoning": "r", "answer": "E"})
    options = {**OPTIONS, "E": "Lambert-Eaton syndrome"}
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        pred = CoT()(question=QUESTION, options=options)
    assert pred.valid and pred.answer == "E"
    assert "Literal['A', 'B', 'C', 'D', 'E']" in lm.history[-1]["messages"][-1]["content"]


def test_context_is_cut_to_the_token_budget(spy):
    lm = scripted()
    pred = run(SimpleRAG(spy, budget=8, max_context_tokens=20), lm)
    cut = pred.context_cut
    assert cut["tokens_before"] > 20 and cut["tokens_after"] <= 20 + 3 and cut["tokens_dropped"] > 0
    assert cut["passages_kept"] == len(pred.passages) and cut["passages_dropped"] == len(pred.dropped_passages)
    assert cut["passages_dropped"] > 0 and pred.fallbacks == {
        "context_cut": 1,
        "passages_dropped": cut["passages_dropped"],
    }


def test_registry_and_construction_errors(spy):
    assert isinstance(make_program("hcqr", spy), HCQR)
    with pytest.raises(Exception, match="unknown method 'rag'; choose one of cot, hcqr, .*, simple_rag$"):
        make_program("rag", spy)
    with pytest.raises(ValueError, match="needs a retriever"):
        HCQR(None)
    with pytest.raises(ValueError, match="unknown fusion strategy"):
        HCQR(spy, fusion="max")


# Another corpus on the same topics, with other ids and texts: a saved program must retrieve from it once loaded.
OTHER_ROWS = [
    (
        "q1",
        "Cardiac glycoside poisoning",
        "Digoxin excess: nausea, yellow vision and arrhythmia, worse with hypokalemia.",
    ),
    ("q2", "Thyroid eye disease", "Graves disease gives exophthalmos through TSH receptor antibodies."),
    ("q3", "Neuromuscular junction", "Myasthenia gravis: fatigable ptosis from acetylcholine receptor antibodies."),
    ("q4", "Microcytic anemia", "Iron deficiency with low ferritin and high iron-binding capacity."),
]


def test_saved_program_holds_no_corpus_and_runs_against_another_retriever(tmp_path, tiny_corpus):
    from hcqr_dspy.optimize.saved import load_program, save_program
    from hcqr_dspy.retrieval import Corpus, Passage

    first = SpyRetriever(tiny_corpus)
    program = HCQR(first, budget=4, k_per_query=2)
    used = run(program, scripted())  # it has searched its own retriever
    assert used.passages and {p["id"] for p in used.passages} <= {p.id for p in tiny_corpus}
    program.answer.demos = [
        dspy.Example(
            question="Demo question?",
            options="A. x\nB. y",
            context="Document [1] (Title: T) c",
            reasoning="r",
            answer="A",
        )
    ]
    save_program(program, tmp_path / "saved")
    saved = "\n".join(f.read_text() for f in sorted((tmp_path / "saved").iterdir()))
    for passage in tiny_corpus:  # nothing of the retriever or its corpus travels with the program
        assert f'"{passage.id}"' not in saved and passage.title not in saved and passage.text not in saved
    assert "BM25" not in saved and "bm25" not in saved

    second = SpyRetriever(Corpus([Passage(*r) for r in OTHER_ROWS], source="other"))
    loaded, meta = load_program(tmp_path / "saved", second)
    searched_before = len(first.calls)
    pred = run(loaded, scripted())
    assert loaded.retriever is second and len(first.calls) == searched_before
    assert len(second.calls) == 1 and len(second.calls[0][0]) == 3 and second.calls[0][1] == 2
    assert pred.passages and {p["id"] for p in pred.passages} <= {r[0] for r in OTHER_ROWS}
    assert [d["question"] for d in loaded.answer.demos] == ["Demo question?"] and meta["options"]["k_per_query"] == 2


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("q1: digoxin toxicity", "digoxin toxicity"),
        ('"yellow vision"', "yellow vision"),
        ("A", None),
        ("1. digoxin toxicity", "digoxin toxicity"),
        ("- yellow vision", "yellow vision"),
        ("query 2: hypokalemia arrhythmia", "hypokalemia arrhythmia"),
        ("1.5 mg digoxin level", "1.5 mg digoxin level"),
        ("{support_query}", None),
        (None, None),
        (" ".join(["word"] * 50), " ".join(["word"] * 32)),
        ("A. Fava beans", "Fava beans"),  # an option letter prefix is not searchable
        ("(B) hepatitis B vaccine", "hepatitis B vaccine"),
        ("A; B; C", None),  # a list of option letters names nothing to search for
        ("both A and C", None),
        ("options B, D", None),
        ("yes", None),
        ("no", None),
        ("vitamin B12 deficiency", "vitamin B12 deficiency"),  # a letter inside content is kept
        ("hepatitis B vaccine", "hepatitis B vaccine"),
        ("Digoxin toxicity, yellow vision; nausea", None),  # the rewrite prompt's own example, copied back
        ("amoxicillin rash infectious mononucleosis", None),
        ("digoxin toxicity yellow vision", "digoxin toxicity yellow vision"),  # not the example: kept
        # combinations of yes/no/maybe words, letters and joiners name nothing either
        ("no Yes", None),
        ("yes or no", None),
        ("Yes, B", None),
        ("maybe yes", None),
        ("no versus yes", None),
        ("true or false", None),
        ("None of these", None),
        ("no fever", "no fever"),  # a negated finding is content
        ("vitamin A deficiency or not", "vitamin A deficiency or not"),
        # a field name echoed back, bare or bracketed (like "{support_query}")
        ("support_query", None),
        ("<distinction_query>", None),
        ("[key feature query]", None),
        # the prompt's example up to punctuation, stopwords and word order is still a copy
        ("Digoxin toxicity, yellow vision and nausea", None),
        ("nausea, yellow vision: digoxin toxicity", None),
    ],
)
def test_clean_query(raw, expected):
    assert clean_query(raw) == expected


def test_every_prompt_example_query_is_in_a_prompt():
    """clean_query refuses copies of the prompts' example queries: the list must follow the prompts."""
    from hcqr_dspy.programs.signatures import (
        PROMPT_EXAMPLE_QUERIES,
        RewriteQueries,
        RewriteQuestion,
        RewriteQuestionWithOptions,
    )

    prompts = " ".join(s.instructions for s in (RewriteQueries, RewriteQuestion, RewriteQuestionWithOptions))
    assert all(f'"{q}"' in prompts for q in PROMPT_EXAMPLE_QUERIES)


def test_yes_no_options_build_queries_from_the_question_not_the_option():
    from hcqr_dspy.programs.hypothesis import hypothesis_queries

    h = {"working_hypothesis": "B", "discriminating_features": "A; B", "confirming_evidence": "Yes"}
    queries = hypothesis_queries(
        h, {"A": "yes", "B": "no", "C": "maybe"}, "Is metformin first-line therapy in type 2 diabetes?"
    )
    assert all("metformin first-line therapy type diabetes" in q for q in queries)
    assert not any(q.lower() in ("no yes", "yes", "no") or "versus alternatives a" in q.lower() for q in queries)


def test_content_free_rewrites_on_yes_no_questions_fall_back_and_are_counted(spy):
    """Rewritten queries made only of option words ("no Yes", "yes or no", "Yes, B") are unusable: HCQR
    builds its queries from the question's key terms instead and counts it, never searching "no Yes"."""
    lm = scripted(
        hypothesis={
            "discriminating_features": "no versus yes",
            "reasoning": "r",
            "working_hypothesis": "B",
            "confirming_evidence": "maybe yes",
        },
        queries={"support_query": "no Yes", "distinction_query": "yes or no", "key_feature_query": "Yes, B"},
        answer={"reasoning": "r", "answer": "B"},
    )
    question = "Does digoxin toxicity cause yellow vision in elderly patients?"
    pred = run(HCQR(spy), lm, question=question, options={"A": "yes", "B": "no", "C": "maybe"})
    assert pred.valid and pred.query_sources == ["hypothesis"] * 3
    assert pred.fallbacks["queries_from_hypothesis"] == 3
    assert pred.queries == ["digoxin toxicity cause yellow vision elderly patients"] * 3  # the key terms
    assert not any("yes" in q.lower().split() or "versus" in q.lower() for q in pred.queries)


def test_rewrite_that_always_fails_runs_on_hypothesis_queries_and_counts_it(spy):
    lm = DummyLM(
        {"`support_query`": {"oops": "unparseable"}, "`discriminating_features`": HYPOTHESIS, "`answer`": ANSWER},
        adapter=dspy.JSONAdapter(),
    )
    pred = run(HCQR(spy), lm)
    assert pred.valid and pred.query_sources == ["hypothesis"] * 3
    assert pred.fallbacks == {"rewrite_failed": 1, "queries_from_hypothesis": 3}


# -- ablations: options of HCQR, registered with the option fixed -----------------------------------

Q1, Q2, Q3 = QUERIES.values()


@pytest.mark.parametrize(
    "method, roles, queries",
    [
        ("hcqr_no_support", ["distinction", "key_features"], [Q2, Q3]),
        ("hcqr_no_distinction", ["support", "key_features"], [Q1, Q3]),
        ("hcqr_no_key_features", ["support", "distinction"], [Q1, Q2]),
    ],
)
def test_dropping_a_role_sends_two_queries_and_keeps_the_budget(spy, method, roles, queries):
    program = make_program(method, spy)
    settings = program.settings()
    assert (settings["method"], settings["roles"], settings["k_per_query"], settings["budget"]) == (
        method,
        roles,
        8,
        15,
    )
    pred = run(program, scripted())
    # k per query = ceil(15 / 2) = 8, one batched call, the dropped query never reaches the retriever
    assert spy.calls == [(queries, 8)]
    assert pred.queries == queries and pred.query_roles == roles
    assert pred.query_sources == ["rewrite", "rewrite"]
    assert pred.raw_queries == [Q1, Q2, Q3]  # the rewrite step itself is unchanged
    assert len(pred.passages) <= 15 and all(set(p["queries"]) <= {0, 1} for p in pred.passages)


def test_roles_are_an_option_of_hcqr_with_explicit_k(spy):
    lm = scripted()
    pred = run(HCQR(spy, budget=2, roles=("key_features", "support"), k_per_query=3), lm)
    assert spy.calls == [([Q1, Q3], 3)]  # canonical role order, explicit k used as given
    assert pred.query_roles == ["support", "key_features"]
    assert len(pred.passages) <= 2
    assert full_prompts(lm, "answer")[0].count("Document [") <= 2
    single = HCQR(spy, roles=["key_features"])
    assert single.settings()["roles"] == ["key_features"] and single.k_per_query == 15


def test_fallback_rule_is_decided_on_all_three_rewritten_queries(spy):
    # two of three unusable: all built from the hypothesis, as in full HCQR, then the kept roles are sent
    bad = {"support_query": "A", "distinction_query": "", "key_feature_query": "nausea visual changes elderly"}
    pred = run(HCQRNoSupport(spy), scripted(queries=bad))
    assert pred.query_sources == ["hypothesis", "hypothesis"]
    assert "versus alternatives" in pred.queries[0]


@pytest.mark.parametrize(
    "roles",
    [(), ("support", "support"), ("support", "diagnosis"), "support"],
    ids=["empty", "repeated", "unknown", "string"],
)
def test_bad_roles_are_refused(spy, roles):
    with pytest.raises(ValueError, match="roles must be"):
        HCQR(spy, roles=roles)


def test_variants_refuse_to_change_their_fixed_option(spy):
    with pytest.raises(ValueError, match="hcqr_no_support.*fixes roles"):
        HCQRNoSupport(spy, roles=("support", "distinction", "key_features"))
    # the same value (as a list, the way settings() records it) is accepted
    program = HCQRNoSupport(spy, roles=["distinction", "key_features"], budget=6)
    assert program.k_per_query == 3 and program.method == "hcqr_no_support"
    assert {"hcqr_no_support", "hcqr_no_distinction", "hcqr_no_key_features", "hcqr_show_hypothesis"} <= set(PROGRAMS)
    # introspection (an experiment's method_options check) sees HCQR's options minus the fixed one
    params = inspect.signature(HCQRNoSupport.__init__).parameters
    assert "roles" not in params and {"k_per_query", "fusion", "show_hypothesis"} <= set(params)


def test_show_hypothesis_puts_the_hypothesis_in_the_answer_prompt(spy):
    lm = scripted()
    pred = run(HCQR(spy, show_hypothesis=True), lm)
    assert pred.valid and pred.answer == "A"
    [text] = full_prompts(lm, "answer")
    assert "HYPMARK-evidence" in text and "HYPMARK-reasoning" in text and "Document [1]" in text
    assert spy.calls == [(list(QUERIES.values()), 5)]  # retrieval unchanged


def test_show_hypothesis_registered_and_recorded(spy):
    program = make_program("hcqr_show_hypothesis", spy)
    assert isinstance(program, HCQRShowHypothesis) and isinstance(program, HCQR)
    settings = program.settings()
    assert settings["method"] == "hcqr_show_hypothesis" and settings["show_hypothesis"] is True
    assert HCQR(spy).settings()["show_hypothesis"] is False
    lm = scripted()
    run(program, lm)
    assert "HYPMARK" in full_prompts(lm, "answer")[0]


def test_hypothesis_queries_use_the_question_key_terms_when_fields_are_empty():
    from hcqr_dspy.programs.hypothesis import hypothesis_queries

    empty = {"working_hypothesis": "A", "discriminating_features": "", "confirming_evidence": ""}
    queries = hypothesis_queries(empty, {"A": "No", "B": "Yes"}, "Does aspirin prevent stroke recurrence?")
    assert queries == ["aspirin prevent stroke recurrence"] * 3


def test_working_hypothesis_answers_with_hcqrs_own_hypothesis_prompt(spy):
    """hcqr_hypothesis sends HCQR's hypothesis prompt and answers with y0 (so the two share DSPy's cache)."""
    lm = scripted()
    pred = run(make_program("hcqr_hypothesis"), lm)
    assert pred.valid and pred.answer == "A" and pred.hypothesis["confirming_evidence"].startswith("HYPMARK")
    full = scripted()
    run(HCQR(spy), full)
    hyp = [h["messages"] for h in full.history if "`discriminating_features`" in h["messages"][-1]["content"]]
    assert [h["messages"] for h in lm.history] == hyp
    bad = DummyLM({"`discriminating_features`": {"oops": "x"}}, adapter=dspy.JSONAdapter())
    pred = run(make_program("hcqr_hypothesis"), bad)
    assert not pred.valid and (pred.invalid_stage, pred.invalid_cause) == ("hypothesis", "unparseable")


def test_options_first_style_reviews_the_options_before_the_letter(spy):
    review = {
        "option_review": "A: fits; B: no",
        "working_hypothesis": "A",
        "discriminating_features": "yellow vision",
        "confirming_evidence": "low potassium",
        "reasoning": "glycoside",
    }
    lm = DummyLM(
        {"`option_review`": review, "`support_query`": QUERIES, "`answer`": ANSWER}, adapter=dspy.JSONAdapter()
    )
    pred = run(HCQR(spy, hypothesis_style="options_first"), lm)
    assert pred.valid and pred.hypothesis["option_review"] == "A: fits; B: no"
    prompt = lm.history[0]["messages"][-1]["content"]
    assert (
        prompt.index("`option_review`")
        < prompt.index("`working_hypothesis`")
        < prompt.index("`discriminating_features`")
    )
    with pytest.raises(ValueError, match="unknown hypothesis_style 'x'"):
        HCQR(spy, hypothesis_style="x")
