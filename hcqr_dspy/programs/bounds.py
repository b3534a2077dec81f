"""Bounds on what retrieval can do for a reader: an oracle-context ceiling and a no-context floor.

``oracle_rag`` (the ceiling) retrieves with the question *and the gold option's text* as one query, through the
same retriever, budget and answer step as Simple RAG: the best a one-query retrieval can hand this reader when
it already knows what to look for. It uses the answer, so it is an upper bound for evaluations, never a method:
``hcqr predict``, serving and compiling refuse it, and every comparison flags it. The construction follows the
oracle-retrieval upper bounds of the RAG literature (e.g. "gold passage" settings of Lewis et al. 2020, section
4, and MedRAG's analysis of retrieval upper bounds, Xiong et al. 2024), here for a corpus without gold
passages: the gold option's text stands in for them.

``no_context`` (the floor) is Simple RAG's answer step with an empty context: the same prompt, signature and
budget of tokens, so the difference from a RAG method is the retrieved passages alone (CoT's own prompt has no
context field at all).
"""

from __future__ import annotations

import dspy

from hcqr_dspy.programs.cot import CoT
from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.signatures import AnswerQuestion


@register_method("oracle_rag")
class OracleRAG(MCQProgram):
    """Retrieve with ``question + gold option text`` (one query), answer as Simple RAG does.

    Args:
        retriever: The shared retriever.
        budget: Passages retrieved and shown (15, as Simple RAG).
    """

    uses_answer = True

    def __init__(self, retriever, budget: int = 15, **kwargs):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        self.answer = dspy.Predict(AnswerQuestion)

    def forward(self, question: str, options: dict[str, str], gold: str | None = None) -> dspy.Prediction:
        if gold not in options:
            raise ValueError(f"oracle_rag needs the gold answer (one of {list(options)}), got {gold!r}")
        query = f"{question} {options[gold]}"
        stages: dict = {}
        with stage(stages, "retrieval"):
            fused = self.fuse(self.retrieve([query], k=self.budget, names=["oracle"]), budget=self.budget)
        return dspy.Prediction(**self.answer_from_passages(question, options, fused, stages), queries=[query])


@register_method("no_context")
class NoContext(CoT):
    """Simple RAG's answer step with an empty context (no retrieval)."""

    def __init__(self, retriever=None, budget: int = 15, **kwargs):
        super().__init__(retriever, budget, **kwargs)
        self.answer = dspy.Predict(AnswerQuestion)

    def answer_inputs(self, row: dict, question: str, options: dict[str, str]) -> dict:
        """The question and the empty context (demos are the predictor's own)."""
        return {"question": question, "context": ""}

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "answer"):
            out = self.answer_step(self.answer, options, question=question, context="")
        return dspy.Prediction(**out, stages=stages, queries=[], passages=[])
