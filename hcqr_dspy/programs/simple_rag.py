"""Simple RAG: one query, the raw question, top ``budget`` passages (the paper's main baseline)."""

from __future__ import annotations

import dspy

from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.signatures import AnswerQuestion


@register_method("simple_rag")
class SimpleRAG(MCQProgram):
    """Retrieve with the question alone (options not shown to retrieval), answer from the top ``budget``.

    Args:
        retriever: The shared retriever.
        budget: Passages retrieved and shown (15 in the paper).
    """

    def __init__(self, retriever, budget: int = 15, **kwargs):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        self.answer = dspy.Predict(AnswerQuestion)

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "retrieval"):
            fused = self.fuse(self.retrieve([question], k=self.budget, names=["question"]), budget=self.budget)
        return dspy.Prediction(**self.answer_from_passages(question, options, fused, stages), queries=[question])
