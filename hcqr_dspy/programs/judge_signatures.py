"""The DUR judge's signatures: is the retrieved context decision-useful for the correct answer?

:class:`JudgeContext` labels the whole context an answer step saw, :class:`JudgePassage` one passage of
it; both see the correct option and answer ``ENTAILED``, ``USEFUL`` or ``NOT_USEFUL``
(:data:`DUR_LABELS_DESC`). The judge layer runs them; they live here, below it, with the other signatures.
"""

from __future__ import annotations

from typing import Literal

import dspy

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
