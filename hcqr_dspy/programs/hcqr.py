"""HCQR: Hypothesis-Conditioned Query Rewriting.

(question, options) -> FormHypothesis -> (y0, f, e, r)
                    -> RewriteQueries  -> (q1 support, q2 distinction, q3 key features)
                    -> retriever.search([q1, q2, q3], k=5)     (one batched call)
                    -> fuse(budget=15, score sum)              -> context
(question, options, context) -> AnswerQuestion -> answer letter

Defaults follow the HCQR reference setup (../shared/DESIGN.md): 5 passages per
query, budget 15, duplicates' scores summed. The hypothesis is never shown to
the answer step, so the answer may overturn it. If fewer than two of the
rewritten queries are usable, all three are built from the hypothesis fields
instead (reference behaviour); a single unusable (empty, too short, or
repeating an earlier) query is replaced by the
query its role builds from the hypothesis. Each query's source is recorded.

Note: retrieval here sees the options (through the hypothesis), which breaks
MIRAGE's rule that retrieval must not see them; this is HCQR's design.
"""

from __future__ import annotations

import re

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.programs.base import BAD_REPLY_ERRORS, MCQProgram, passage_records, stage
from hcqr_dspy.retrieval.fusion import STRATEGIES, fuse
from hcqr_dspy.signatures import AnswerQuestion, FormHypothesis, RewriteQueries, restrict_letters

QUERY_ROLES = ("support", "distinction", "key_features")
MAX_QUERY_WORDS = 32


def clean_query(text: object, max_words: int = MAX_QUERY_WORDS) -> str | None:
    """A usable search query, or ``None``.

    Strips quotes, labels like ``q1:`` and whitespace; keeps at most
    ``max_words`` words (the 1.5B model's "queries" were often 30-60-word
    copies of its reasoning). Empty or letter-only text, and a template
    placeholder echoed back (``{support_query}``, seen with SmolLM2-135M),
    are unusable.
    """
    if not isinstance(text, str) or re.fullmatch(r"\s*\{[\w ]*\}\s*", text):
        return None  # missing, or a template placeholder echoed back ("{support_query}")
    q = re.sub(r"^\s*(q[123]|query|support|distinction|key[ _]features?)\s*[:\-]\s*", "", text.strip(), flags=re.I)
    q = " ".join(q.strip().strip("\"'`").split())
    if len(re.sub(r"[^A-Za-z0-9]", "", q)) < 3:
        return None
    return " ".join(q.split()[:max_words])


def dedupe(queries: list[str | None]) -> list[str | None]:
    """Mark a query that repeats an earlier one (ignoring case) as unusable."""
    seen: set[str] = set()
    out: list[str | None] = []
    for q in queries:
        key = q.lower() if q else None
        out.append(None if key is None or key in seen else q)
        if key:
            seen.add(key)
    return out


def hypothesis_queries(hypothesis: dict[str, str], options: dict[str, str]) -> list[str]:
    """The three queries built from the hypothesis fields (fallback of the reference code)."""
    guess = options.get(hypothesis.get("working_hypothesis") or "", "")
    features = hypothesis.get("discriminating_features") or ""
    evidence = hypothesis.get("confirming_evidence") or ""
    built = [f"{guess} {evidence}", f"{guess} versus alternatives {features}", features or guess]
    return [clean_query(q) or clean_query(guess) or guess or "medical" for q in built]


def format_hypothesis(hypothesis: dict[str, str], options: dict[str, str]) -> str:
    """The hypothesis as the rewrite step sees it."""
    y0 = hypothesis.get("working_hypothesis") or ""
    return (
        f"Best option: {y0}. {options.get(y0, '')}\n"
        f"Discriminating features: {hypothesis.get('discriminating_features') or ''}\n"
        f"Confirming evidence: {hypothesis.get('confirming_evidence') or ''}\n"
        f"Reasoning: {hypothesis.get('reasoning') or ''}"
    )


class HCQR(MCQProgram):
    """Hypothesis-conditioned query rewriting over one shared retriever.

    Args:
        retriever: The shared retriever (not saved with the program).
        budget: Passages kept after fusion (paper: 15).
        k_per_query: Passages retrieved per query (paper: 5).
        fusion: ``"score_sum"`` (reference), ``"rrf"`` or ``"round_robin"``.
        max_context_tokens: Token budget of the answer step's context.

    Example:
        >>> program = HCQR(load_index("indexes/demo"))
        >>> pred = program(question="A 70-year-old ...", options={"A": "...", "B": "..."})
        >>> pred.answer, pred.hypothesis["working_hypothesis"], pred.queries
    """

    method = "hcqr"

    def __init__(self, retriever, budget: int = 15, k_per_query: int = 5, fusion: str = "score_sum", **kwargs):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        if fusion not in STRATEGIES:
            raise ValueError(f"unknown fusion strategy {fusion!r}; choose one of {', '.join(STRATEGIES)}")
        if k_per_query < 1:
            raise ValueError(f"k_per_query must be >= 1, got {k_per_query}")
        self.k_per_query = k_per_query
        self.fusion = fusion
        self.hypothesis = dspy.Predict(FormHypothesis)
        self.rewrite = dspy.Predict(RewriteQueries)
        self.answer = dspy.Predict(AnswerQuestion)

    def settings(self):
        return {**super().settings(), "k_per_query": self.k_per_query, "fusion": self.fusion}

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        opts = format_options(options)
        with stage(stages, "hypothesis"):
            try:
                h = self.hypothesis(
                    question=question,
                    options=opts,
                    signature=restrict_letters(self.hypothesis.signature, "working_hypothesis", list(options)),
                )
            except BAD_REPLY_ERRORS as exc:
                return dspy.Prediction(
                    answer=None, valid=False, reasoning=None, error=f"hypothesis: {type(exc).__name__}: {exc}"[:500],
                    stages=stages, hypothesis=None, queries=[], query_sources=[], passages=[],
                )
        hypothesis = {
            "working_hypothesis": str(h.working_hypothesis).strip().upper(),
            "discriminating_features": h.discriminating_features,
            "confirming_evidence": h.confirming_evidence,
            "reasoning": h.reasoning,
        }

        with stage(stages, "rewrite"):
            try:
                r = self.rewrite(question=question, options=opts, hypothesis=format_hypothesis(hypothesis, options))
                raw = [r.support_query, r.distinction_query, r.key_feature_query]
            except BAD_REPLY_ERRORS:
                raw = [None, None, None]
        rewritten = dedupe([clean_query(q) for q in raw])
        fallback = hypothesis_queries(hypothesis, options)
        if sum(q is not None for q in rewritten) < 2:
            queries, sources = fallback, ["hypothesis"] * 3
        else:
            queries = [q if q is not None else f for q, f in zip(rewritten, fallback)]
            sources = ["rewrite" if q is not None else "hypothesis" for q in rewritten]

        with stage(stages, "retrieval"):
            hit_lists = self.retriever.search(queries, k=self.k_per_query)
            fused = fuse(hit_lists, budget=self.budget, strategy=self.fusion)
        context, cut = self.build_context([f.passage_id for f in fused], self.context_budget(question, options))

        with stage(stages, "answer"):
            out = self.answer_step(self.answer, options, question=question, context=context)
        return dspy.Prediction(
            **out,
            stages=stages,
            hypothesis=hypothesis,
            queries=queries,
            query_sources=sources,
            raw_queries=raw,
            passages=passage_records(self.retriever, fused),
            context_cut=cut,
        )
