"""HCQR: Hypothesis-Conditioned Query Rewriting.

(question, options) -> FormHypothesis -> (y0, f, e, r)
                    -> RewriteQueries  -> (q1 support, q2 distinction, q3 key features)
                    -> retriever.search([q1, q2, q3], k=5)     (one batched call)
                    -> fuse(budget=15, score sum)              -> context
(question, options, context) -> AnswerQuestion -> answer letter

Defaults follow the HCQR reference setup: 5 passages per
query, budget 15, duplicates' scores summed. The hypothesis is never shown to
the answer step, so the answer may overturn it. If fewer than two of the
rewritten queries are usable, all three are built from the hypothesis fields
instead (reference behaviour); a single unusable (empty, too short, content-free,
a copy of the prompt's example, or repeating an earlier) query is replaced by
the query its role builds from the hypothesis. If the hypothesis reply itself
cannot be parsed, the question is not given up: it retrieves with the question
alone (as Simple RAG) and is answered. Each query's source is recorded, and
every fallback is counted in the prediction's ``fallbacks``
(``hypothesis_failed``, ``queries_from_question``, ``rewrite_failed``,
``queries_from_hypothesis``, and the answer step's ``context_cut``).

Queries that collapse to fewer distinct ones (a fallback that builds the
same text for several roles, e.g. the option's text when the hypothesis
fields name nothing) are not searched twice: each distinct query is searched
deeper, so the context is topped up to what distinct queries would have
brought (:meth:`HCQR.retrieve_and_fuse`); counted as ``queries_collapsed``,
and as ``budget_unfilled`` when the index still had too few passages.

Ablations are options of :class:`HCQR`, not copies: ``roles`` keeps a subset
of the three queries (the rewrite step is unchanged and still writes all
three, so the only difference from full HCQR is which queries reach the
retriever), and ``show_hypothesis`` shows the hypothesis to the answer step
(:class:`~hcqr_dspy.programs.signatures.AnswerQuestionWithHypothesis`), the anchoring
control. The registered variants ``hcqr_no_support``,
``hcqr_no_distinction``, ``hcqr_no_key_features`` and
``hcqr_show_hypothesis`` fix those options (:func:`~hcqr_dspy.programs.variants.variant`).

Note: retrieval here sees the options (through the hypothesis), which breaks
MIRAGE's rule that retrieval must not see them; this is HCQR's design.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dspy

from hcqr_dspy.data import format_options
from hcqr_dspy.programs.hypothesis import (
    QUERY_ROLES,
    check_style,
    form_hypothesis,
    format_hypothesis,
    hypothesis_queries,
    query_names,
)
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS, bad_reply
from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.queries import clean_query, dedupe
from hcqr_dspy.programs.signatures import (
    HYPOTHESIS_STYLES,
    AnswerQuestion,
    AnswerQuestionWithHypothesis,
    RewriteQueries,
)
from hcqr_dspy.programs.variants import variant
from hcqr_dspy.retrieval.fusion import STRATEGIES, FusedPassage


@register_method("hcqr")
class HCQR(MCQProgram):
    """Hypothesis-conditioned query rewriting over one shared retriever.

    Args:
        retriever: The shared retriever (not saved with the program).
        budget: Passages kept after fusion (paper: 15).
        k_per_query: Passages retrieved per query. ``None`` (default):
            ``ceil(budget / len(roles))``, so the candidates always cover the
            budget: 5 for the paper's 15 passages and three queries, 8 when
            one query is dropped (16 candidates, fused down to 15). An integer
            is used as given, whatever the roles. Queries that collapse to fewer
            distinct ones are searched deeper (:meth:`retrieve_and_fuse`).
        fusion: ``"score_sum"`` (reference), ``"rrf"`` or ``"round_robin"``.
        roles: The queries sent to the retriever, a non-empty subset of
            ``("support", "distinction", "key_features")`` (kept in that
            order). Default: all three. Dropping one is the paper's
            q1/q2/q3 ablation; the fallback rule (fewer than two usable
            rewritten queries of the three: all built from the hypothesis) is
            decided on all three, as in full HCQR.
        hypothesis_style: The hypothesis step's signature: ``"features_first"``
            (default, the paper's field order f, r, y0, e) or ``"options_first"``
            (review each option, then y0, f, e, r; ``HYPOTHESIS_STYLES``).
        show_hypothesis: Show the hypothesis (best option, features, evidence,
            reasoning) to the answer step. Default ``False``: the paper's
            no-anchoring rule; ``True`` is the anchoring ablation.
        max_context_tokens: Token budget of the answer step's context.

    Examples:
        >>> program = HCQR(load_index("indexes/demo"))
        >>> pred = program(question="A 70-year-old ...", options={"A": "...", "B": "..."})
        >>> pred.answer, pred.hypothesis["working_hypothesis"], pred.queries
        >>> HCQR(retriever, roles=("support", "key_features")).settings()["k_per_query"]
        8
    """

    def __init__(
        self,
        retriever,
        budget: int = 15,
        k_per_query: int | None = None,
        fusion: str = "score_sum",
        roles: Sequence[str] = QUERY_ROLES,
        show_hypothesis: bool = False,
        hypothesis_style: str = "features_first",
        **kwargs,
    ):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        if fusion not in STRATEGIES:
            raise ValueError(f"unknown fusion strategy {fusion!r}; choose one of {', '.join(STRATEGIES)}")
        if isinstance(roles, str) or not roles or len(set(roles)) != len(roles) or not set(roles) <= set(QUERY_ROLES):
            raise ValueError(f"roles must be distinct names from {QUERY_ROLES}, at least one; got {roles!r}")
        self.roles = tuple(r for r in QUERY_ROLES if r in roles)
        if k_per_query is None:
            k_per_query = math.ceil(budget / len(self.roles))
        if k_per_query < 1:
            raise ValueError(f"k_per_query must be >= 1, got {k_per_query}")
        self.k_per_query = k_per_query
        self.fusion = fusion
        self.show_hypothesis = bool(show_hypothesis)
        self.hypothesis_style = check_style(hypothesis_style)
        self.hypothesis = dspy.Predict(HYPOTHESIS_STYLES[self.hypothesis_style])
        self.rewrite = dspy.Predict(RewriteQueries)
        self.answer = dspy.Predict(AnswerQuestionWithHypothesis if self.show_hypothesis else AnswerQuestion)

    def settings(self):
        return {
            **super().settings(),
            "k_per_query": self.k_per_query,
            "fusion": self.fusion,
            "roles": list(self.roles),
            "show_hypothesis": self.show_hypothesis,
            "hypothesis_style": self.hypothesis_style,
        }

    def answer_inputs(self, row: dict[str, Any], question: str, options: dict[str, str]) -> dict[str, Any]:
        """The context as shown, and for the anchoring ablation the hypothesis the row records, as shown."""
        inputs = super().answer_inputs(row, question, options)
        if self.show_hypothesis and row.get("hypothesis"):
            inputs["hypothesis"] = format_hypothesis(row["hypothesis"], options)
        return inputs

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        opts = format_options(options)
        with stage(stages, "hypothesis") as span:
            hypothesis, exc = form_hypothesis(self.hypothesis, question, options)
            span.output(hypothesis if hypothesis is not None else {"error": f"{type(exc).__name__}: {exc}"[:500]})
        if hypothesis is None:
            return self.forward_without_hypothesis(question, options, stages, f"{type(exc).__name__}: {exc}"[:500])
        hypothesis_text = format_hypothesis(hypothesis, options)

        rewrite_failed = 0
        with stage(stages, "rewrite", inputs={"hypothesis": hypothesis_text}) as span:
            try:
                r = self.rewrite(question=question, options=opts, hypothesis=hypothesis_text)
                raw = [r.support_query, r.distinction_query, r.key_feature_query]
            except BAD_REPLY_ERRORS:
                raw, rewrite_failed = [None, None, None], 1
            span.output({"raw_queries": raw})
        rewritten = dedupe([clean_query(q) for q in raw])
        fallback = hypothesis_queries(hypothesis, options, question)
        if sum(q is not None for q in rewritten) < 2:
            queries, sources = fallback, ["hypothesis"] * 3
        else:
            queries = [q if q is not None else f for q, f in zip(rewritten, fallback)]
            sources = ["rewrite" if q is not None else "hypothesis" for q in rewritten]
        kept = [QUERY_ROLES.index(role) for role in self.roles]
        queries, sources = [queries[i] for i in kept], [sources[i] for i in kept]
        fallbacks = {"rewrite_failed": rewrite_failed, "queries_from_hypothesis": sources.count("hypothesis")}

        with stage(stages, "retrieval"):
            fused, top_up = self.retrieve_and_fuse(queries, query_names(self.roles))
        if top_up is not None:
            fallbacks["queries_collapsed"] = len(queries) - top_up["distinct_queries"]
            if top_up["passages"] < top_up["target"]:
                fallbacks["budget_unfilled"] = top_up["target"] - top_up["passages"]
        shown = {"hypothesis": hypothesis_text} if self.show_hypothesis else {}
        return dspy.Prediction(
            **self.answer_from_passages(question, options, fused, stages, fallbacks, **shown),
            hypothesis=hypothesis,
            queries=queries,
            query_sources=sources,
            query_roles=list(self.roles),
            raw_queries=raw,
            top_up=top_up,
        )

    def retrieve_and_fuse(
        self, queries: list[str], names: list[str]
    ) -> tuple[list[FusedPassage], dict[str, int] | None]:
        """Search the queries (``k_per_query`` hits each, one batched call) and fuse them into ``budget`` passages.

        Queries that repeat another (ignoring case, as :func:`~hcqr_dspy.programs.queries.dedupe`) are
        searched once, and deeper: each of the ``m`` distinct queries asks for ``ceil(k_per_query x n / m)``
        hits (``n`` queries; 15 for one distinct query of HCQR's three), so the context is topped up to
        ``target = min(budget, k_per_query x n)`` passages, what ``n`` distinct queries would have
        brought. If overlapping hit lists still leave fewer than ``target`` fused passages while a list
        came back full (the index may hold more), the distinct queries are searched once more with
        ``target`` hits each, which fills the target whenever one query's matches can. Distinct queries
        with overlapping hits are fused as they are (the reference behaviour: at most ``budget``).

        Args:
            queries: One query per kept role.
            names: Their labels (:func:`~hcqr_dspy.programs.hypothesis.query_names`); a collapsed query's spans
                are named by all its roles.

        Returns:
            The fused passages (``queries`` / ``ranks`` name role positions: a passage found by a
            collapsed query lists every role that shared it, at the same rank) and ``None`` when the
            queries were distinct, else the top-up record: ``distinct_queries``, ``k_per_query`` (hits
            asked per distinct query in the last search), ``searches`` (1 or 2), ``target`` and
            ``passages`` (fused; fewer than ``target`` when the index had too few matches).
        """
        groups: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            groups.setdefault(q.lower(), []).append(i)
        if len(groups) == len(queries):
            hit_lists = self.retrieve(queries, k=self.k_per_query, names=names)
            return self.fuse(hit_lists, budget=self.budget, strategy=self.fusion, names=names), None
        positions = list(groups.values())
        distinct = [queries[p[0]] for p in positions]
        labels = [" = ".join(names[i] for i in p) for p in positions]
        target = min(self.budget, self.k_per_query * len(queries))
        k = math.ceil(self.k_per_query * len(queries) / len(distinct))
        searches = 0
        while True:
            hit_lists = self.retrieve(distinct, k=k, names=labels)
            searches += 1
            fused = self.fuse(hit_lists, budget=self.budget, strategy=self.fusion, names=labels)
            if len(fused) >= target or k >= target or all(len(hits) < k for hits in hit_lists):
                break
            k = target
        fused = [_as_roles(f, positions) for f in fused]
        return fused, {
            "distinct_queries": len(distinct),
            "k_per_query": k,
            "searches": searches,
            "target": target,
            "passages": len(fused),
        }

    def forward_without_hypothesis(
        self, question: str, options: dict[str, str], stages: dict, error: str
    ) -> dspy.Prediction:
        """The hypothesis reply could not be parsed: retrieve with the question itself (top ``budget``,
        as Simple RAG) and answer, so HCQR answers every question the baselines can. Counted as the
        ``hypothesis_failed`` and ``queries_from_question`` fallbacks; ``hypothesis_error`` keeps the reply's error."""
        fallbacks = {"hypothesis_failed": 1, "queries_from_question": 1}
        with stage(stages, "retrieval"):
            fused = self.fuse(self.retrieve([question], k=self.budget, names=["question"]), budget=self.budget)
        # The anchoring ablation has no hypothesis to show: it answers like HCQR here.
        shown = {"hypothesis": "(no working hypothesis: its reply could not be parsed)"} if self.show_hypothesis else {}
        return dspy.Prediction(
            **self.answer_from_passages(question, options, fused, stages, fallbacks, **shown),
            hypothesis=None,
            hypothesis_error=error,
            queries=[question],
            query_sources=["question"],
            query_roles=[],
            raw_queries=[],
            top_up=None,
        )


def _as_roles(passage: FusedPassage, positions: list[list[int]]) -> FusedPassage:
    """A passage fused from distinct queries, its provenance restated per role: distinct query ``j`` stands for
    the roles at ``positions[j]``, each credited with the rank ``j`` found it at."""
    pairs = sorted((role, rank) for j, rank in zip(passage.queries, passage.ranks) for role in positions[j])
    return FusedPassage(passage.passage_id, passage.score, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


@register_method("hcqr_hypothesis")
class WorkingHypothesis(MCQProgram):
    """HCQR's working hypothesis alone, as the answer: no retrieval, no rewrite (``hcqr_hypothesis``).

    It measures the hypothesis step on its own terms, e.g. against CoT with the
    same paired test (is the hypothesis weaker than plain chain of
    thought?). It sends exactly the prompt HCQR's hypothesis step sends
    (:func:`~hcqr_dspy.programs.hypothesis.form_hypothesis`), so DSPy's cache shares the replies both ways.
    A reply that cannot be parsed makes the question invalid (stage ``hypothesis``).

    Args:
        hypothesis_style: ``"features_first"`` (the paper's order) or ``"options_first"``.
    """

    uses_retrieval = False

    def __init__(self, retriever=None, budget: int = 15, hypothesis_style: str = "features_first", **kwargs):
        super().__init__(retriever=None, budget=budget, **kwargs)
        self.hypothesis_style = check_style(hypothesis_style)
        self.hypothesis = dspy.Predict(HYPOTHESIS_STYLES[self.hypothesis_style])

    def settings(self):
        return {**super().settings(), "hypothesis_style": self.hypothesis_style}

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "hypothesis") as span:
            hypothesis, exc = form_hypothesis(self.hypothesis, question, options)
            span.output(hypothesis if hypothesis is not None else {"error": f"{type(exc).__name__}: {exc}"[:500]})
        if hypothesis is None:
            return dspy.Prediction(
                **bad_reply("hypothesis", exc), stages=stages, hypothesis=None, queries=[], passages=[]
            )
        return dspy.Prediction(
            answer=hypothesis["working_hypothesis"],
            valid=True,
            reasoning=hypothesis["reasoning"],
            error=None,
            invalid_stage=None,
            invalid_cause=None,
            stages=stages,
            hypothesis=hypothesis,
            queries=[],
            passages=[],
        )


HCQRNoSupport = register_method("hcqr_no_support")(
    variant(
        HCQR,
        "HCQRNoSupport",
        "HCQR ablation without q1 (support): distinction and key-feature queries only, budget kept.",
        roles=("distinction", "key_features"),
    )
)
HCQRNoDistinction = register_method("hcqr_no_distinction")(
    variant(
        HCQR,
        "HCQRNoDistinction",
        "HCQR ablation without q2 (distinction): support and key-feature queries only, budget kept.",
        roles=("support", "key_features"),
    )
)
HCQRNoKeyFeatures = register_method("hcqr_no_key_features")(
    variant(
        HCQR,
        "HCQRNoKeyFeatures",
        "HCQR ablation without q3 (key features): support and distinction queries only, budget kept.",
        roles=("support", "distinction"),
    )
)
HCQRShowHypothesis = register_method("hcqr_show_hypothesis")(
    variant(
        HCQR,
        "HCQRShowHypothesis",
        "HCQR ablation that shows the hypothesis to the answer step (anchoring control).",
        show_hypothesis=True,
    )
)
