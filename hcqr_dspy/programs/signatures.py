"""Every ``dspy.Signature`` of hcqr-dspy, with the field definitions of the paper.

HCQR (Hypothesis-Conditioned Query Rewriting) has three LM steps:

1. :class:`FormHypothesis` — Hypothesis(x, A -> y0, f, e, r): from the question
   ``x`` and options ``A``, the discriminating features ``f``, brief reasoning
   ``r``, a best-guess option ``y0`` and the confirming evidence ``e``.
   :class:`FormHypothesisReviewingOptions` first reviews each option, then
   commits to ``y0`` before writing ``f``, ``e`` and ``r`` (``HYPOTHESIS_STYLES``).
2. :class:`RewriteQueries` — Rewrite(h -> q1, q2, q3): three search queries,
   support / distinction / key features.
3. :class:`AnswerQuestion` — answer from question + options + retrieved
   context only; the hypothesis is never an input (no anchoring).
   :class:`AnswerQuestionWithHypothesis` adds it, for the anchoring ablation.

Baselines:

* :class:`WriteHypotheticalPassage` — HyDE (Gao et al. 2022): a textbook-style
  passage answering the question (options not shown), used as the query.
* :class:`RewriteQuestion` / :class:`RewriteQuestionWithOptions` — a generic
  query rewriter (Rewrite-Retrieve-Read, Ma et al. 2023), without and with the
  options, never with a hypothesis.
* :class:`RatePassageRelevance` — an LM reranker's 0-10 usefulness score.
* :class:`JudgeDocumentSupport` — MAIN-RAG's Yes/No judge of one passage.

The DUR judge (:mod:`hcqr_dspy.judge` runs it): :class:`JudgeContext` labels the whole context an answer step saw,
:class:`JudgePassage` one passage of it; both see the correct option and answer ``ENTAILED``, ``USEFUL`` or
``NOT_USEFUL`` (:data:`DUR_LABELS_DESC`).

Option letters vary per question (any number of letter-labelled options), so
the letter fields are typed ``str`` here and narrowed per call to
``Literal[<that question's letters>]`` by :func:`restrict_letters`; with
``dspy.JSONAdapter`` and a schema-capable LM the narrowing becomes
constrained decoding. Likewise :func:`restrict_range` narrows an integer score
to ``Literal[low..high]`` and :func:`ask_for_count` states how many items a
list field must hold.
"""

from __future__ import annotations

from typing import Literal

import dspy

# The example search queries the prompts below show the LM (RewriteQueries, RewriteQuestion,
# RewriteQuestionWithOptions). A small model often copies them back verbatim; such a copy is not a
# query about the question, so hcqr_dspy.programs.queries.clean_query treats it as unusable. Keep this
# list and the docstrings in step (tests/programs/test_programs.py checks each appears in a prompt).
PROMPT_EXAMPLE_QUERIES = (
    "digoxin toxicity yellow vision nausea",
    "digoxin toxicity versus hypokalemia arrhythmia",
    "elderly heart failure visual changes vomiting",
    "amoxicillin rash infectious mononucleosis",
    "maculopapular rash after aminopenicillin",
    "sore throat fever lymphadenopathy adolescent",
    "drug allergy versus viral exanthem rash",
)

QUERY_DESC = (
    "a short, keyword-dense search query for a medical textbook search engine: 4-16 words, "
    "noun phrases and key terms only, no full sentences, no option letters"
)


class FormHypothesis(dspy.Signature):
    """You are a medical expert taking a licensing exam. Before looking anything up, form a working hypothesis.
    Name the findings in the question that best separate the leading options, reason briefly, commit to the single
    best option, and state the facts that would have to be true if that option is right. Be brief: every field is
    a short phrase or sentence, not an essay."""

    question: str = dspy.InputField(desc="the exam question (clinical vignette)")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    discriminating_features: str = dspy.OutputField(
        desc="f: 2-3 findings from the question that separate the leading options, separated by semicolons "
        "(at most 40 words)"
    )
    reasoning: str = dspy.OutputField(desc="r: brief reasoning from the features to the best option (at most 60 words)")
    working_hypothesis: str = dspy.OutputField(desc="y0: the letter of the single best option")
    confirming_evidence: str = dspy.OutputField(
        desc="e: 1-3 facts that must hold if the best option is right, separated by semicolons (at most 40 words)"
    )


class FormHypothesisReviewingOptions(dspy.Signature):
    """You are a medical expert taking a licensing exam. Before looking anything up, form a working hypothesis.
    First review every option in one short clause: does it fit the findings in the question? Then commit to the
    single best option, name the findings that separate it from the runner-up, state the facts that would have to be
    true if it is right, and sum up why in one sentence. Be brief: every field is a short phrase or sentence."""

    question: str = dspy.InputField(desc="the exam question (clinical vignette)")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    option_review: str = dspy.OutputField(
        desc="one short clause per option, as 'A: fits because ...; B: does not fit because ...' "
        "(at most 15 words each)"
    )
    working_hypothesis: str = dspy.OutputField(desc="y0: the letter of the single best option")
    discriminating_features: str = dspy.OutputField(
        desc="f: 2-3 findings from the question that separate the best option from the runner-up, "
        "separated by semicolons (at most 40 words)"
    )
    confirming_evidence: str = dspy.OutputField(
        desc="e: 1-3 facts that must hold if the best option is right, separated by semicolons (at most 40 words)"
    )
    reasoning: str = dspy.OutputField(desc="r: why the best option, in one sentence (at most 40 words)")


# The hypothesis step's signature by style (HCQR's ``hypothesis_style`` option). ``features_first`` is the
# paper's field order (f, r, y0, e); ``options_first`` reviews every option before committing, as later
# variants of the HCQR reference code do, and writes the letter before the features and evidence.
HYPOTHESIS_STYLES = {"features_first": FormHypothesis, "options_first": FormHypothesisReviewingOptions}


class RewriteQueries(dspy.Signature):
    """Write exactly three different search queries that retrieve textbook evidence to test a working hypothesis.
    support_query: evidence that the hypothesised option is right (its name plus the confirming facts).
    distinction_query: what separates the hypothesised option from its strongest alternative option.
    key_feature_query: the salient findings of the question itself, whatever the hypothesis.
    Each query is a short keyword phrase, not a sentence and not a list of the options. For instance, for a
    hypothesis of digoxin toxicity: support_query "digoxin toxicity yellow vision nausea", distinction_query
    "digoxin toxicity versus hypokalemia arrhythmia", key_feature_query "elderly heart failure visual changes vomiting"."""  # noqa: E501 - prompt text: rewrapping would change the instructions

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    hypothesis: str = dspy.InputField(
        desc="the working hypothesis: best option, discriminating features, confirming evidence"
    )
    support_query: str = dspy.OutputField(desc="q1, support: " + QUERY_DESC)
    distinction_query: str = dspy.OutputField(desc="q2, distinction: " + QUERY_DESC)
    key_feature_query: str = dspy.OutputField(desc="q3, key features: " + QUERY_DESC)


class AnswerQuestion(dspy.Signature):
    """Answer the medical exam question using the relevant documents. Think step by step, then choose one option."""

    context: str = dspy.InputField(desc="retrieved documents, each as 'Document [i] (Title: ...) text'")
    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    reasoning: str = dspy.OutputField(desc="step-by-step reasoning, at most 120 words")
    answer: str = dspy.OutputField(desc="the letter of the correct option")


class AnswerQuestionWithHypothesis(dspy.Signature):
    """Answer the medical exam question using the relevant documents and a working hypothesis formed before
    retrieval. The hypothesis may be wrong: check it against the documents. Think step by step, then choose one
    option."""

    context: str = dspy.InputField(desc="retrieved documents, each as 'Document [i] (Title: ...) text'")
    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    hypothesis: str = dspy.InputField(
        desc="the working hypothesis formed before retrieval: best option, discriminating features, "
        "confirming evidence, reasoning"
    )
    reasoning: str = dspy.OutputField(desc="step-by-step reasoning, at most 120 words")
    answer: str = dspy.OutputField(desc="the letter of the correct option")


class AnswerQuestionNoContext(dspy.Signature):
    """Answer the medical exam question. Think step by step, then choose one option."""

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    reasoning: str = dspy.OutputField(desc="step-by-step reasoning, at most 120 words")
    answer: str = dspy.OutputField(desc="the letter of the correct option")


class WriteHypotheticalPassage(dspy.Signature):
    """Write a short passage from a medical textbook that answers the question. Write it as the textbook would:
    plain factual statements dense with the relevant medical terms (diagnosis, mechanism, findings, treatment), with
    no mention of the question or of a patient case. The passage is used only as a search query to find real
    textbook passages."""

    question: str = dspy.InputField(desc="the exam question")
    passage: str = dspy.OutputField(desc="a textbook-style paragraph answering the question, 40-100 words")


QUERIES_DESC = "different search queries; each is " + QUERY_DESC


class RewriteQuestion(dspy.Signature):
    """Rewrite the medical exam question into several different search queries that together retrieve the textbook
    evidence needed to answer it: the condition, mechanism or drug it asks about and its key findings. Each query
    is a short keyword phrase, not a sentence. For instance, for a child with a rash after amoxicillin given for a
    sore throat: "amoxicillin rash infectious mononucleosis", "maculopapular rash after aminopenicillin",
    "sore throat fever lymphadenopathy adolescent"."""

    question: str = dspy.InputField(desc="the exam question")
    queries: list[str] = dspy.OutputField(desc=QUERIES_DESC)


class RewriteQuestionWithOptions(dspy.Signature):
    """Rewrite the medical exam question into several different search queries that together retrieve the textbook
    evidence needed to choose between its options: the key findings of the question and what separates the
    options. Each query is a short keyword phrase, not a sentence and not a list of the options. For instance, for
    a child with a rash after amoxicillin given for a sore throat: "amoxicillin rash infectious mononucleosis",
    "drug allergy versus viral exanthem rash", "sore throat fever lymphadenopathy adolescent"."""

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    queries: list[str] = dspy.OutputField(desc=QUERIES_DESC)


class RatePassageRelevance(dspy.Signature):
    """Rate how useful a retrieved textbook passage is for answering a medical exam question: 0 means unrelated
    or useless, 5 means on topic but not deciding the answer, 10 means it states the fact that decides the answer."""

    question: str = dspy.InputField(desc="the exam question")
    passage: str = dspy.InputField(desc="one retrieved passage: its title, then its text")
    relevance: int = dspy.OutputField(desc="0-10 how useful this passage is for answering the question (an integer)")


class JudgeDocumentSupport(dspy.Signature):
    """Judge whether a retrieved document is relevant to a medical exam question and supports answering it.
    Answer Yes only if the document gives information that helps decide the correct answer; otherwise No."""

    question: str = dspy.InputField(desc="the exam question")
    passage: str = dspy.InputField(desc="one retrieved document: its title, then its text")
    judgment: Literal["Yes", "No"] = dspy.OutputField(desc="Yes or No")


def restrict_letters(signature: type[dspy.Signature], field: str, letters: list[str]) -> type[dspy.Signature]:
    """The signature with ``field`` typed ``Literal[letters]`` (instructions and other fields kept).

    Args:
        signature: A signature holding an output ``field``.
        field: Name of the letter field (``answer``, ``working_hypothesis``).
        letters: The question's option letters, e.g. ``["A", "B", "C", "D", "E"]``.
    """
    return signature.with_updated_fields(field, type_=Literal[tuple(letters)])


def restrict_range(signature: type[dspy.Signature], field: str, low: int, high: int) -> type[dspy.Signature]:
    """The signature with the integer ``field`` typed ``Literal[low, ..., high]``.

    A reply outside the range then fails to parse (``AdapterParseError``)
    instead of passing as an out-of-scale score.

    Args:
        signature: A signature holding an output ``field``.
        field: Name of the score field (``relevance``).
        low: Lowest allowed value.
        high: Highest allowed value (inclusive).
    """
    return signature.with_updated_fields(field, type_=Literal[tuple(range(low, high + 1))])


def ask_for_count(signature: type[dspy.Signature], field: str, n: int) -> type[dspy.Signature]:
    """The signature with the list ``field``'s description asking for exactly ``n`` items.

    Args:
        signature: A signature holding a list output ``field``.
        field: Name of the list field (``queries``).
        n: How many items to ask for.
    """
    desc = signature.output_fields[field].json_schema_extra.get("desc") or ""
    return signature.with_updated_fields(field, desc=f"exactly {n} {desc}")


# The output field names of the query-writing signatures: a small model sometimes echoes one back as
# its "query" ("support_query", "<support_query>"); clean_query treats that as unusable.
QUERY_FIELD_NAMES: tuple[str, ...] = tuple(
    name for sig in (RewriteQueries, RewriteQuestion, RewriteQuestionWithOptions) for name in sig.output_fields
)


DUR_LABELS_DESC = (
    "ENTAILED if the documents alone imply the correct answer; USEFUL if they strongly support it but need a "
    "small inference; NOT_USEFUL otherwise"
)


class JudgeContext(dspy.Signature):
    """Judge whether retrieved documents are decision-useful for answering an exam question correctly.
    Use only the documents, not your own knowledge: ENTAILED means the documents alone imply the correct answer;
    USEFUL means they give strong support for it but need a small inference; NOT_USEFUL means neither."""

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    correct_answer: str = dspy.InputField(desc="the correct option")
    context: str = dspy.InputField(desc="retrieved documents, each as 'Document [i] (Title: ...) text'")
    label: Literal["ENTAILED", "USEFUL", "NOT_USEFUL"] = dspy.OutputField(desc=DUR_LABELS_DESC)


class JudgePassage(dspy.Signature):
    """Judge whether one retrieved document is decision-useful for answering an exam question correctly.
    Use only the document, not your own knowledge: ENTAILED means it alone implies the correct answer;
    USEFUL means it gives strong support for it but needs a small inference; NOT_USEFUL means neither."""

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    correct_answer: str = dspy.InputField(desc="the correct option")
    passage: str = dspy.InputField(desc="one retrieved document as 'Document [i] (Title: ...) text'")
    label: Literal["ENTAILED", "USEFUL", "NOT_USEFUL"] = dspy.OutputField(desc=DUR_LABELS_DESC)
