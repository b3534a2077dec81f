"""CoT: no retrieval, step-by-step reasoning then an option letter (the paper's no-retrieval baseline)."""

from __future__ import annotations

import dspy

from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.signatures import AnswerQuestionNoContext


@register_method("cot")
class CoT(MCQProgram):
    """Chain-of-thought answering without retrieval.

    Examples:
        >>> CoT()(question="...", options={"A": "...", "B": "..."}).answer
    """

    uses_retrieval = False

    def __init__(self, retriever=None, budget: int = 15, **kwargs):
        super().__init__(retriever=None, budget=budget, **kwargs)
        self.answer = dspy.Predict(AnswerQuestionNoContext)

    def answer_inputs(self, row: dict, question: str, options: dict[str, str]) -> dict:
        """The answer step sees the question alone (its demos are the predictor's own)."""
        return {"question": question}

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "answer"):
            out = self.answer_step(self.answer, options, question=question)
        return dspy.Prediction(**out, stages=stages, queries=[], passages=[])
