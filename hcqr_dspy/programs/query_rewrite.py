"""Generic query rewriting: the LM turns the question into several search queries.

(question[, options]) -> RewriteQuestion[WithOptions] -> (q1, ..., qn)      (n = 5)
                      -> retriever.search([q1, ..., qn], k=ceil(15 / n))    (one batched call)
                      -> fuse(budget=15, score sum)                         -> context
(question, options, context) -> AnswerQuestion -> answer letter

Rewrite-Retrieve-Read (Ma, Gong, He, Zhao & Duan 2023, "Query Rewriting for
Retrieval-Augmented Large Language Models"), with a frozen LM as the rewriter.
The HCQR reference setup uses it as a baseline with five sub-queries x 3
passages = 15. Two registered methods, one class:

* ``query_rewrite`` — the rewriter sees the question only (retrieval does not
  see the options: MIRAGE's rule holds);
* ``query_rewrite_options`` — the rewriter also sees the options but no
  hypothesis: the paper's control for "just exposing the options" (it breaks
  MIRAGE's rule, like HCQR).

Queries are cleaned like HCQR's (:func:`~hcqr_dspy.programs.queries.clean_query`:
labels, list markers and quotes stripped, at most 32 words, too-short and
repeated ones dropped) and at most ``n_queries`` are kept. Each of the ``m``
usable queries retrieves ``ceil(budget / m)`` passages, so the candidates
always cover the budget, and fusion keeps ``budget``. If no usable query comes
back (or the reply cannot be parsed), the question itself is the only query,
recorded as ``query_sources=["question"]`` (the run goes on as Simple RAG for
that question, and the record says so).
"""

from __future__ import annotations

import math

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS
from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.queries import clean_query, dedupe
from hcqr_dspy.programs.signatures import AnswerQuestion, RewriteQuestion, RewriteQuestionWithOptions, ask_for_count
from hcqr_dspy.programs.variants import variant
from hcqr_dspy.retrieval.fusion import STRATEGIES


@register_method("query_rewrite")
class QueryRewrite(MCQProgram):
    """A generic LM query rewriter (no hypothesis) over the shared retriever.

    Args:
        retriever: The shared retriever (not saved with the program).
        budget: Passages kept after fusion (15).
        n_queries: Search queries asked of the rewriter, and the most kept
            (reference: 5, with 3 passages each).
        fusion: ``"score_sum"`` (default, as HCQR), ``"rrf"`` or ``"round_robin"``.
        show_options: Show the rewriter the answer options
            (``query_rewrite_options``); never a hypothesis.
        max_context_tokens: Token budget of the answer step's context.

    Examples:
        >>> program = QueryRewrite(load_index("indexes/demo"), show_options=True)
        >>> program.method
        'query_rewrite_options'
        >>> pred = program(question="A 70-year-old ...", options={"A": "...", "B": "..."})
        >>> pred.queries, pred.query_sources, pred.k_per_query
    """

    def __init__(
        self,
        retriever,
        budget: int = 15,
        n_queries: int = 5,
        fusion: str = "score_sum",
        show_options: bool = False,
        **kwargs,
    ):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        if fusion not in STRATEGIES:
            raise ValueError(f"unknown fusion strategy {fusion!r}; choose one of {', '.join(STRATEGIES)}")
        if n_queries < 1:
            raise ValueError(f"n_queries must be >= 1, got {n_queries}")
        self.n_queries = n_queries
        self.fusion = fusion
        self.show_options = bool(show_options)
        self.method = "query_rewrite_options" if self.show_options else "query_rewrite"
        self.rewrite = dspy.Predict(RewriteQuestionWithOptions if self.show_options else RewriteQuestion)
        self.answer = dspy.Predict(AnswerQuestion)

    def settings(self):
        return {
            **super().settings(),
            "n_queries": self.n_queries,
            "fusion": self.fusion,
            "show_options": self.show_options,
        }

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        shown = {"options": format_options(options)} if self.show_options else {}
        with stage(stages, "rewrite"):
            try:
                r = self.rewrite(
                    question=question,
                    signature=ask_for_count(self.rewrite.signature, "queries", self.n_queries),
                    **shown,
                )
                raw = list(r.queries) if isinstance(r.queries, (list, tuple)) else [r.queries]
                rewrite_failed = 0
            except BAD_REPLY_ERRORS:
                raw, rewrite_failed = [], 1
        queries = [q for q in dedupe([clean_query(q) for q in raw]) if q is not None][: self.n_queries]
        sources = ["rewrite"] * len(queries)
        if not queries:
            queries, sources = [question], ["question"]
        fallbacks = {"rewrite_failed": rewrite_failed, "queries_from_question": sources.count("question")}
        k = math.ceil(self.budget / len(queries))

        with stage(stages, "retrieval"):
            names = [f"q{i + 1} ({source})" for i, source in enumerate(sources)]
            fused = self.fuse(
                self.retrieve(queries, k=k, names=names), budget=self.budget, strategy=self.fusion, names=names
            )
        return dspy.Prediction(
            **self.answer_from_passages(question, options, fused, stages, fallbacks),
            queries=queries,
            query_sources=sources,
            raw_queries=raw,
            k_per_query=k,
        )


QueryRewriteOptions = register_method("query_rewrite_options")(
    variant(
        QueryRewrite,
        "QueryRewriteOptions",
        "Generic query rewriter shown the options but no hypothesis (the paper's control for exposing the options).",
        show_options=True,
    )
)
