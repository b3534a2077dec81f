"""Rerank-RAG: retrieve a larger pool with the question, rerank it, keep the budget.

question -> retriever.search([question], k=pool_k)          (pool_k = 50)
         -> reranker scores each (question, passage) pair   -> best ``budget`` (15)
(question, options, context) -> AnswerQuestion -> answer letter

Two rerankers:

* a cross-encoder (``cross_encoder=``): any sentence-transformers
  ``CrossEncoder`` model name or local path (e.g. a MS MARCO or a biomedical
  cross-encoder, for users who have its weights; none ships with this
  package), loaded once at construction, or an already-built object with a
  ``predict(pairs) -> scores`` method; it scores the (question, passage text)
  pairs in one call;
* otherwise the LM (:class:`~hcqr_dspy.programs.signatures.RatePassageRelevance`): a
  0-10 usefulness score per passage, narrowed to ``Literal[0..10]``; a reply
  that cannot be parsed or is out of range scores 0 and is counted in
  ``rerank_parse_failures``.

Cost: the LM reranker makes ``pool_k`` LM calls per question (50 by default),
each a prompt of the question plus one passage (about 400-700 tokens), on top of
the one answer call Simple RAG makes: lower ``pool_k`` (e.g. 20) or use a
cross-encoder for large runs.

Ties keep retrieval order (a stable sort on the rerank score). Neither the
retriever nor the reranker sees the options (MIRAGE's rule holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import dspy

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS
from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.signatures import AnswerQuestion, RatePassageRelevance, restrict_range

RELEVANCE_RANGE = (0, 10)


class PairScorer(Protocol):
    """What the cross-encoder path needs: sentence-transformers' ``CrossEncoder.predict``."""

    def predict(self, pairs: Sequence[tuple[str, str]]) -> Sequence[float]: ...


def load_cross_encoder(name: str) -> PairScorer:
    """A sentence-transformers ``CrossEncoder`` from a model name or local path.

    Raises:
        HCQRError: the model cannot be loaded (offline without its weights,
            a wrong path); the message names it.
    """
    from sentence_transformers import CrossEncoder

    try:
        return CrossEncoder(name)
    except (OSError, ValueError) as exc:
        raise HCQRError(
            f"cannot load cross-encoder {name!r}: {exc}; give a local model folder or a name whose weights are cached"
        ) from None


def scorer_name(scorer: Any) -> str:
    """A readable name for a cross-encoder object (its model name or path, else its class)."""
    for attr in ("model_name", "name"):
        if isinstance(getattr(scorer, attr, None), str):
            return getattr(scorer, attr)
    name_or_path = getattr(getattr(scorer, "model", None), "name_or_path", None)
    return name_or_path if isinstance(name_or_path, str) and name_or_path else type(scorer).__name__


@register_method("rerank_rag")
class RerankRAG(MCQProgram):
    """Retrieve ``pool_k`` passages with the question, rerank them, answer from the best ``budget``.

    Args:
        retriever: The shared retriever (not saved with the program).
        budget: Passages kept after reranking and shown (15).
        pool_k: Passages retrieved before reranking, ``>= budget`` (50). With
            the LM reranker this is also the number of extra LM calls per
            question (see the module note on cost).
        cross_encoder: ``None`` (default): rerank with the LM. A string: a
            sentence-transformers ``CrossEncoder`` name or path, loaded once
            here. An object with ``predict(pairs) -> scores``: used as is.
        max_context_tokens: Token budget of the answer step's context.

    Examples:
        >>> program = RerankRAG(load_index("indexes/demo"), pool_k=20)   # LM reranker
        >>> program = RerankRAG(retriever, cross_encoder="cross-encoder/ms-marco-MiniLM-L-6-v2")
        >>> pred = program(question="A 70-year-old ...", options={"A": "...", "B": "..."})
        >>> [p["rerank_score"] for p in pred.passages], pred.reranker, pred.rerank_parse_failures
    """

    def __init__(
        self, retriever, budget: int = 15, pool_k: int = 50, cross_encoder: str | PairScorer | None = None, **kwargs
    ):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        if pool_k < budget:
            raise ValueError(f"pool_k must be >= budget ({budget}), got {pool_k}")
        self.pool_k = pool_k
        self.cross_encoder_name = cross_encoder if isinstance(cross_encoder, str) else None
        if cross_encoder is None:
            self.cross_encoder, self.reranker = None, "lm"
        elif isinstance(cross_encoder, str):
            self.cross_encoder, self.reranker = load_cross_encoder(cross_encoder), f"cross-encoder:{cross_encoder}"
        elif callable(getattr(cross_encoder, "predict", None)):
            self.cross_encoder, self.reranker = cross_encoder, f"cross-encoder:{scorer_name(cross_encoder)}"
        else:
            raise ValueError(
                f"cross_encoder must be a model name, a path or an object with predict(pairs); got {cross_encoder!r}"
            )
        self.rate = dspy.Predict(RatePassageRelevance)
        self.answer = dspy.Predict(AnswerQuestion)

    def settings(self):
        return {**super().settings(), "pool_k": self.pool_k, "reranker": self.reranker}

    def options(self):
        """Constructor options; a cross-encoder given by name or path is kept, an object cannot be.

        Raises:
            HCQRError: the cross-encoder is an object (it cannot be saved; give its name or path).
        """
        if self.cross_encoder is not None and self.cross_encoder_name is None:
            raise HCQRError(
                f"this program reranks with a {self.reranker} object, which cannot be saved; "
                "build it with cross_encoder=<model name or path>"
            )
        return {**super().options(), "cross_encoder": self.cross_encoder_name}

    def rerank_scores(self, question: str, texts: list[str]) -> tuple[list[float], int]:
        """Score each passage text for the question.

        Returns:
            The scores (aligned with ``texts``) and how many LM replies could
            not be parsed into a 0-10 score (scored 0; always 0 for a
            cross-encoder).
        """
        if not texts:
            return [], 0
        if self.cross_encoder is not None:
            scores = [float(s) for s in self.cross_encoder.predict([(question, t) for t in texts])]
            if len(scores) != len(texts):
                raise HCQRError(f"cross-encoder {self.reranker} returned {len(scores)} scores for {len(texts)} pairs")
            return scores, 0
        low, high = RELEVANCE_RANGE
        signature = restrict_range(self.rate.signature, "relevance", low, high)
        scores, failures = [], 0
        for text in texts:
            try:
                value = self.rate(question=question, passage=text, signature=signature).relevance
            except BAD_REPLY_ERRORS:
                value = None
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                failures += 1
                value = 0
            scores.append(float(value))
        return scores, failures

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "retrieval"):
            pool = self.fuse(self.retrieve([question], k=self.pool_k, names=["question"]), budget=self.pool_k)
        with stage(stages, "rerank"):
            scores, failures = self.rerank_scores(question, [self.retriever.get(f.passage_id).text for f in pool])
        order = sorted(range(len(pool)), key=lambda i: -scores[i])[: self.budget]  # stable: ties keep retrieval order
        kept = [pool[i] for i in order]
        fallbacks = {"rerank_parse_failures": failures}
        out = self.answer_from_passages(question, options, kept, stages, fallbacks)
        for record, i in zip(out["passages"] + out["dropped_passages"], order):
            record["rerank_score"] = round(scores[i], 6)
        return dspy.Prediction(
            **out,
            queries=[question],
            reranker=self.reranker,
            pool_size=len(pool),
            rerank_parse_failures=failures,
        )
