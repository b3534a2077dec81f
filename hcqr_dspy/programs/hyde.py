"""HyDE: retrieve with a hypothetical document written by the LM.

question -> WriteHypotheticalPassage -> passage        (options not shown, as in HyDE)
         -> retriever.search([passage], k=budget)       (the passage is the only query)
(question, options, context) -> AnswerQuestion -> answer letter

Gao, Ma, Lin & Callan 2022, "Precise Zero-Shot Dense Retrieval without
Relevance Labels": an instruction-following LM writes a document that would
answer the query; its encoding, not the query's, finds real documents (the
generated text may be wrong; its vocabulary and form are what match).

Differences from the paper, so the method fits the shared retriever contract
(``search(queries: list[str], k)``, any backend, BM25 included): one passage,
written at the LM's configured temperature (0 in the reference setup), is the
query text itself; the paper samples several documents and averages their
embeddings with the query's. Retrieval does not see the options (MIRAGE's
rule holds). A reply that cannot be parsed, or an empty passage, does not give
the question up: it retrieves with the question itself (as Simple RAG), and the
fallback is counted (``passage_failed``, ``queries_from_question``), as with
HCQR's hypothesis step, so every method answers every question it can.
"""

from __future__ import annotations

import dspy

from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS
from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.signatures import AnswerQuestion, WriteHypotheticalPassage


@register_method("hyde")
class HyDE(MCQProgram):
    """Hypothetical-document retrieval (HyDE) over the shared retriever.

    Args:
        retriever: The shared retriever (not saved with the program).
        budget: Passages retrieved with the hypothetical passage and shown
            (15, as Simple RAG and HCQR).
        max_context_tokens: Token budget of the answer step's context.

    Examples:
        >>> program = HyDE(load_index("indexes/demo"))
        >>> pred = program(question="A 70-year-old ...", options={"A": "...", "B": "..."})
        >>> pred.hypothetical_passage, pred.queries == [pred.hypothetical_passage], pred.answer
    """

    def __init__(self, retriever, budget: int = 15, **kwargs):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        self.write_passage = dspy.Predict(WriteHypotheticalPassage)
        self.answer = dspy.Predict(AnswerQuestion)

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "hypothetical_passage"):
            try:
                passage = self.write_passage(question=question).passage
                error = None if isinstance(passage, str) and passage.strip() else f"empty passage {passage!r}"
            except BAD_REPLY_ERRORS as exc:
                passage, error = None, f"{type(exc).__name__}: {exc}"
        if error is not None:
            fallbacks = {"passage_failed": 1, "queries_from_question": 1}
            with stage(stages, "retrieval"):
                fused = self.fuse(self.retrieve([question], k=self.budget, names=["question"]), budget=self.budget)
            return dspy.Prediction(
                **self.answer_from_passages(question, options, fused, stages, fallbacks),
                hypothetical_passage=passage,
                passage_error=f"hypothetical_passage: {error}"[:500],
                queries=[question],
                query_sources=["question"],
            )
        passage = passage.strip()

        with stage(stages, "retrieval"):
            fused = self.fuse(
                self.retrieve([passage], k=self.budget, names=["hypothetical passage"]), budget=self.budget
            )
        return dspy.Prediction(
            **self.answer_from_passages(question, options, fused, stages),
            hypothetical_passage=passage,
            queries=[passage],
            query_sources=["passage"],
        )
