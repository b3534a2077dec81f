"""Every ``dspy.Signature`` of hcqr-dspy, with the field definitions of the paper.

HCQR (Hypothesis-Conditioned Query Rewriting) has three LM steps:

1. :class:`FormHypothesis` — Hypothesis(x, A -> y0, f, e, r): from the question
   ``x`` and options ``A``, the discriminating features ``f``, brief reasoning
   ``r``, a best-guess option ``y0`` and the confirming evidence ``e``.
2. :class:`RewriteQueries` — Rewrite(h -> q1, q2, q3): three search queries,
   support / distinction / key features.
3. :class:`AnswerQuestion` — answer from question + options + retrieved
   context only; the hypothesis is never an input (no anchoring).

Option letters vary per question (any number of letter-labelled options), so
the letter fields are typed ``str`` here and narrowed per call to
``Literal[<that question's letters>]`` by :func:`restrict_letters`; with
``dspy.JSONAdapter`` and a schema-capable LM the narrowing becomes
constrained decoding.
"""

from __future__ import annotations

from typing import Literal

import dspy

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
        desc="f: 2-3 findings from the question that separate the leading options, separated by semicolons (at most 40 words)"
    )
    reasoning: str = dspy.OutputField(desc="r: brief reasoning from the features to the best option (at most 60 words)")
    working_hypothesis: str = dspy.OutputField(desc="y0: the letter of the single best option")
    confirming_evidence: str = dspy.OutputField(
        desc="e: 1-3 facts that must hold if the best option is right, separated by semicolons (at most 40 words)"
    )


class RewriteQueries(dspy.Signature):
    """Write exactly three different search queries that retrieve textbook evidence to test a working hypothesis.
    support_query: evidence that the hypothesised option is right (its name plus the confirming facts).
    distinction_query: what separates the hypothesised option from its strongest alternative option.
    key_feature_query: the salient findings of the question itself, whatever the hypothesis.
    Each query is a short keyword phrase, not a sentence and not a list of the options. For instance, for a
    hypothesis of digoxin toxicity: support_query "digoxin toxicity yellow vision nausea", distinction_query
    "digoxin toxicity versus hypokalemia arrhythmia", key_feature_query "elderly heart failure visual changes vomiting"."""

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    hypothesis: str = dspy.InputField(desc="the working hypothesis: best option, discriminating features, confirming evidence")
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


class AnswerQuestionNoContext(dspy.Signature):
    """Answer the medical exam question. Think step by step, then choose one option."""

    question: str = dspy.InputField(desc="the exam question")
    options: str = dspy.InputField(desc="the answer options, one per line as 'LETTER. text'")
    reasoning: str = dspy.OutputField(desc="step-by-step reasoning, at most 120 words")
    answer: str = dspy.OutputField(desc="the letter of the correct option")


def restrict_letters(signature: type[dspy.Signature], field: str, letters: list[str]) -> type[dspy.Signature]:
    """The signature with ``field`` typed ``Literal[letters]`` (instructions and other fields kept).

    Args:
        signature: A signature holding an output ``field``.
        field: Name of the letter field (``answer``, ``working_hypothesis``).
        letters: The question's option letters, e.g. ``["A", "B", "C", "D", "E"]``.
    """
    return signature.with_updated_fields(field, type_=Literal[tuple(letters)])
