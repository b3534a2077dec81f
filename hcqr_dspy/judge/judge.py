"""The DUR judge as a DSPy module: labels one question's context and its two controls.

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
from hcqr_dspy.programs.base import stage
from hcqr_dspy.programs.judge_signatures import JudgeContext, JudgePassage
from hcqr_dspy.programs.replies import BAD_REPLY_ERRORS


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

    def forward(
        self,
        question: str,
        options: dict[str, str],
        answer: str,
        documents: list[str],
        negative_documents: list[str] | None = None,
    ) -> dspy.Prediction:
        """Judge ``documents`` (formatted as the answer step saw them) and the two controls.

        Returns:
            ``label`` (or ``None`` for a bad reply), ``rationale`` (passage mode: that of the passage
            whose label is the context's), ``error``, ``passage_labels`` and ``passage_rationales``
            (passage mode), ``positive_label`` / ``positive_rationale``, ``negative_label`` /
            ``negative_rationale`` (``None`` when there is no negative control), ``stages``.
        """
        common = dict(
            question=question, options=format_options(options), correct_answer=correct_answer_text(options, answer)
        )
        stages: dict = {}
        passage_labels = passage_rationales = None
        with stage(stages, "judge"):
            if self.mode == "context":
                label, rationale, error = self.label_context(common, documents)
            else:
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
                label = passage_labels[best] if best is not None else None
                rationale = passage_rationales[best] if best is not None else None
                error = None if valid else "no valid passage judgment"
        with stage(stages, "controls"):
            positive_document = positive_control_document(question, options, answer)
            positive, positive_why, _ = self.label_context(common, [positive_document])
            negative, negative_why, _ = (
                self.label_context(common, negative_documents) if negative_documents else (None, None, None)
            )
        return dspy.Prediction(
            label=label,
            rationale=rationale,
            error=error,
            passage_labels=passage_labels,
            passage_rationales=passage_rationales,
            positive_label=positive,
            positive_rationale=positive_why,
            negative_label=negative,
            negative_rationale=negative_why,
            stages=stages,
        )
