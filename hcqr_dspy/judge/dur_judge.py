"""The DUR judge as a DSPy module: labels one question's context and its controls.

By default the judge reasons before it labels (``dspy.ChainOfThought``); ``reasoning=False`` asks for the
label alone (``dspy.Predict``). Two modes: ``context`` (one judgment over the shown context, as in the paper)
and ``passage`` (each passage judged alone; the context label is the best passage label).
"""

from __future__ import annotations

from typing import Literal

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.judge.controls import positive_control_document
from hcqr_dspy.judge.labels import LABELS
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS
from hcqr_dspy.programs.program_base import stage
from hcqr_dspy.programs.signatures import JudgeContext, JudgePassage


def correct_answer_text(options: dict[str, str], answer: str) -> str:
    """The gold option as the judge is shown it: ``"<letter>. <text>"``."""
    return f"{answer}. {options[answer]}"


class DURJudge(dspy.Module):
    """Labels a context with the DUR judge.

    Args:
        mode: ``"context"`` (one call per context) or ``"passage"`` (one per passage).
        reasoning: The judge writes its reasoning before the label (``dspy.ChainOfThought``);
            ``False`` asks for the label alone (``dspy.Predict``).
    """

    def __init__(self, mode: Literal["context", "passage"] = "context", reasoning: bool = True):
        super().__init__()
        if mode not in ("context", "passage"):
            raise HCQRError(f"unknown DUR mode {mode!r}; choose context or passage")
        self.mode = mode
        self.reasoning = bool(reasoning)
        module = dspy.ChainOfThought if self.reasoning else dspy.Predict
        self.judge_context = module(JudgeContext)
        self.judge_passage = module(JudgePassage)

    def label_context(self, common: dict[str, str], documents: list[str]) -> tuple[str | None, str | None, str | None]:
        """``(label, rationale, error)`` of one context-mode judgment; a bad reply gives ``(None, None, error)``."""
        try:
            pred = self.judge_context(context="\n".join(documents), **common)
        except BAD_REPLY_ERRORS as exc:
            return None, None, f"{type(exc).__name__}: {exc}"[:300]
        label = pred.label if pred.label in LABELS else None
        return label, pred.get("reasoning"), None if label else f"label {pred.label!r} is not one of {LABELS}"

    def label(self, common: dict[str, str], documents: list[str]) -> dict:
        """One context judged in this judge's mode (no controls).

        Args:
            common: ``question``, ``options`` (formatted) and ``correct_answer`` as the signatures take them.
            documents: The context, one formatted document each.

        Returns:
            ``label`` (``None`` for a bad reply), ``rationale`` (passage mode: that of the passage whose label is
            the context's), ``error``, and in passage mode ``passage_labels`` and ``passage_rationales``
            (``None`` in context mode).
        """
        if self.mode == "context":
            label, rationale, error = self.label_context(common, documents)
            return dict(label=label, rationale=rationale, error=error, passage_labels=None, passage_rationales=None)
        passage_labels, passage_rationales = [], []
        for doc in documents:
            try:
                pred = self.judge_passage(passage=doc, **common)
                lab, why = pred.label, pred.get("reasoning")
            except BAD_REPLY_ERRORS:
                lab, why = None, None
            passage_labels.append(lab if lab in LABELS else None)
            passage_rationales.append(why if lab in LABELS else None)
        valid = [i for i, lab in enumerate(passage_labels) if lab]
        best = min(valid, key=lambda i: LABELS.index(passage_labels[i])) if valid else None
        return dict(
            label=passage_labels[best] if best is not None else None,
            rationale=passage_rationales[best] if best is not None else None,
            error=None if valid else "no valid passage judgment",
            passage_labels=passage_labels,
            passage_rationales=passage_rationales,
        )

    def forward(
        self,
        question: str,
        options: dict[str, str],
        answer: str,
        documents: list[str],
        negative_documents: list[str] | None = None,
        on_topic_documents: list[str] | None = None,
    ) -> dspy.Prediction:
        """Judge ``documents`` (formatted as the answer step saw them) and the controls
        (:mod:`hcqr_dspy.judge.controls`): the positive control always, the negative and on-topic controls
        when their documents are given. Controls are judged as one context each, whatever the mode.

        Returns:
            ``label`` (or ``None`` for a bad reply), ``rationale`` (passage mode: that of the passage
            whose label is the context's), ``error``, ``passage_labels`` and ``passage_rationales``
            (passage mode), ``positive_label`` / ``positive_rationale``, ``negative_label`` /
            ``negative_rationale`` and ``on_topic_label`` / ``on_topic_rationale`` (``None`` when that
            control is not given), ``stages``.
        """
        common = dict(
            question=question, options=format_options(options), correct_answer=correct_answer_text(options, answer)
        )
        stages: dict = {}
        with stage(stages, "judge"):
            judged = self.label(common, documents)
        controls = {}
        with stage(stages, "controls"):
            positive_document = positive_control_document(question, options, answer)
            for name, docs in (
                ("positive", [positive_document]),
                ("negative", negative_documents),
                ("on_topic", on_topic_documents),
            ):
                label, why, _ = self.label_context(common, docs) if docs else (None, None, None)
                controls[f"{name}_label"], controls[f"{name}_rationale"] = label, why
        return dspy.Prediction(**judged, **controls, stages=stages)
