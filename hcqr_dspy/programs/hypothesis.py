"""HCQR's hypothesis step and what is built from it: the step's call (:func:`form_hypothesis`, shared by
:class:`~hcqr_dspy.programs.hcqr.HCQR` and :class:`~hcqr_dspy.programs.hcqr.WorkingHypothesis`), the
hypothesis as the rewrite step sees it, the three queries built from its fields (the fallback for unusable
rewritten queries), the queries' labels and the known hypothesis styles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS
from hcqr_dspy.programs.queries import clean_query, is_content_free, key_terms
from hcqr_dspy.programs.signatures import HYPOTHESIS_STYLES, restrict_letters

QUERY_ROLES = ("support", "distinction", "key_features")


def hypothesis_queries(hypothesis: dict[str, str], options: dict[str, str], question: str) -> list[str]:
    """The three queries built from the hypothesis fields (the reference code's fallback when the
    rewrite gives fewer than two usable queries), one per role: support, distinction, key features.

    The hypothesised option's text names what to search for; when it carries
    no content (``"yes"``, ``"no"``, ``"maybe"``, a list of letters:
    :func:`~hcqr_dspy.programs.queries.is_content_free`), the question's key terms
    (:func:`~hcqr_dspy.programs.queries.key_terms`) stand in for it; content-free
    features or evidence (a letter list, a bare "yes") are left out. A role whose
    built text is unusable (:func:`~hcqr_dspy.programs.queries.clean_query`) falls
    back to the subject, then to the question's key terms.
    """
    guess = options.get(hypothesis.get("working_hypothesis") or "", "")
    terms = key_terms(question) or question
    subject = terms if is_content_free(guess) else guess
    features, evidence = (hypothesis.get(k) or "" for k in ("discriminating_features", "confirming_evidence"))
    features, evidence = ("" if is_content_free(t) else t for t in (features, evidence))  # "A; B", "Yes"
    built = [
        f"{subject} {evidence}",
        f"{subject} versus alternatives {features}" if features else "",
        features or subject,
    ]
    return [clean_query(q) or clean_query(subject) or clean_query(terms, max_words=64) or terms for q in built]


def form_hypothesis(
    predictor: dspy.Predict, question: str, options: dict[str, str]
) -> tuple[dict[str, Any] | None, BaseException | None]:
    """Run the hypothesis step: its letter field narrowed to the question's letters.

    Shared by :class:`~hcqr_dspy.programs.hcqr.HCQR` and
    :class:`~hcqr_dspy.programs.hcqr.WorkingHypothesis`, so both send the same
    prompt (and DSPy's cache answers one with the other's reply).

    Returns:
        ``(hypothesis, None)`` with ``working_hypothesis``, ``discriminating_features``,
        ``confirming_evidence``, ``reasoning`` (and ``option_review`` for the
        ``options_first`` style), or ``(None, error)`` for a reply that cannot be parsed.
    """
    try:
        h = predictor(
            question=question,
            options=format_options(options),
            signature=restrict_letters(predictor.signature, "working_hypothesis", list(options)),
        )
    except BAD_REPLY_ERRORS as exc:
        return None, exc
    hypothesis = {
        "working_hypothesis": str(h.working_hypothesis).strip().upper(),
        "discriminating_features": h.discriminating_features,
        "confirming_evidence": h.confirming_evidence,
        "reasoning": h.reasoning,
    }
    if "option_review" in h.keys():
        hypothesis["option_review"] = h.option_review
    return hypothesis, None


def query_names(roles: Sequence[str]) -> list[str]:
    """Labels of the queries of ``roles`` as the paper numbers them: ``q1 (support)``, ``q2 (distinction)``,
    ``q3 (key features)`` (an ablation keeps its queries' numbers)."""
    return [f"q{QUERY_ROLES.index(role) + 1} ({role.replace('_', ' ')})" for role in roles]


def format_hypothesis(hypothesis: dict[str, str], options: dict[str, str]) -> str:
    """The hypothesis as the rewrite step sees it."""
    y0 = hypothesis.get("working_hypothesis") or ""
    return (
        f"Best option: {y0}. {options.get(y0, '')}\n"
        f"Discriminating features: {hypothesis.get('discriminating_features') or ''}\n"
        f"Confirming evidence: {hypothesis.get('confirming_evidence') or ''}\n"
        f"Reasoning: {hypothesis.get('reasoning') or ''}"
    )


def check_style(style: str) -> str:
    """A known hypothesis style (:data:`~hcqr_dspy.programs.signatures.HYPOTHESIS_STYLES`).

    Raises:
        ValueError: another style (the known ones are named).
    """
    if style not in HYPOTHESIS_STYLES:
        raise ValueError(f"unknown hypothesis_style {style!r}; choose one of {', '.join(HYPOTHESIS_STYLES)}")
    return style
