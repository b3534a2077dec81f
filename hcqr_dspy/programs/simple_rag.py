"""Simple RAG: one query, the raw question, top ``budget`` passages (the paper's main baseline)."""

from __future__ import annotations

import dspy

from hcqr_dspy.programs.base import MCQProgram, passage_records, stage
from hcqr_dspy.retrieval.fusion import fuse
from hcqr_dspy.signatures import AnswerQuestion


class SimpleRAG(MCQProgram):
    """Retrieve with the question alone (options not shown to retrieval), answer from the top ``budget``.

    Args:
        retriever: The shared retriever.
        budget: Passages retrieved and shown (15 in the paper).
    """

    method = "simple_rag"

    def __init__(self, retriever, budget: int = 15, **kwargs):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        self.answer = dspy.Predict(AnswerQuestion)

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "retrieval"):
            fused = fuse(self.retriever.search([question], k=self.budget), budget=self.budget)
        context, cut = self.build_context([f.passage_id for f in fused], self.context_budget(question, options))
        with stage(stages, "answer"):
            out = self.answer_step(self.answer, options, question=question, context=context)
        return dspy.Prediction(
            **out, stages=stages, queries=[question], passages=passage_records(self.retriever, fused), context_cut=cut
        )
