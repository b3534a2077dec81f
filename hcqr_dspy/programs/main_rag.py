"""MAIN-RAG-style filtering: an LM judge scores every retrieved passage, an adaptive bar keeps the best.

question -> retriever.search([question], k=pool_k)                 (pool_k = 20)
         -> JudgeDocumentSupport(question, passage) -> Yes / No   (one LM call per passage)
         -> score s_i; keep s_i >= mean(s) - n_std * std(s), best first, at most ``budget``
(question, options, context) -> AnswerQuestion -> answer letter

Source: Chang et al., "MAIN-RAG: Multi-Agent Filtering Retrieval-Augmented
Generation", ACL 2025 (arXiv:2501.00332): the judge's score of a document is
log P("Yes") - log P("No"), the per-query "adaptive judge bar" is the mean
score adjusted by ``n`` standard deviations (``n = 0``, the plain mean, is
the paper's base setting), and kept documents are ordered by descending
score. Simplification here: the paper's Agent-1 first writes an answer from
each document and the judge sees (document, query, answer) triplets; this
program judges (question, document) pairs, saving one LM call per passage.

Scores:

* ``scoring="auto"`` (default): the judge call asks for token
  log-probabilities (``config={"logprobs": True, "top_logprobs": 20}``). Where
  the reply carries them (the packaged llama.cpp models do, and OpenAI-style
  servers), the score is log P(Yes) - log P(No) read at the position where
  the judgment token is written (:func:`yes_no_margin`); where it does not,
  the score is a vote, +1 for Yes and -1 for No. Each passage records which,
  and the prediction says ``judge_scoring`` = ``logprob``, ``vote``,
  ``mixed``, or ``none`` when no judgment could be parsed.
* ``scoring="logprob"``: a reply without log-probabilities stops the run
  (:class:`~hcqr_dspy.errors.LMCapabilityError`; finished questions are
  kept), for runs that must not mix scores.
* ``scoring="vote"``: never ask for log-probabilities (providers that refuse
  the parameter, e.g. Anthropic, need this).

A judge reply that cannot be parsed leaves its passage unscored: it is not
kept, does not enter the mean and standard deviation, and is counted in
``judge_failures``. The bar is relative: when every passage gets the same
score (e.g. all voted No), every one clears it and the budget alone cuts,
as in MAIN-RAG, where the bar adapts to each query's score distribution.
Scores are compared with the bar with a tolerance of 1e-9 (floating-point
means of equal scores can land a hair above them). Neither retrieval nor the judge sees the options
(MIRAGE's rule holds).

Cost: ``pool_k`` judge calls per question (20 by default), each a prompt of the
question plus one passage and a reply of a few tokens.
"""

from __future__ import annotations

from typing import Any

import dspy
import numpy as np
from scipy.special import logsumexp

from hcqr_dspy.errors import LMCapabilityError
from hcqr_dspy.programs.invalid_replies import BAD_REPLY_ERRORS
from hcqr_dspy.programs.method_registry import register_method
from hcqr_dspy.programs.program_base import MCQProgram, stage
from hcqr_dspy.programs.signatures import AnswerQuestion, JudgeDocumentSupport

SCORING_MODES = ("auto", "logprob", "vote")
SCORE_TOLERANCE = 1e-9
TOP_LOGPROBS = 20


def _norm(token: str) -> str:
    return token.strip().strip("\"'").strip().lower()


def yes_no_margin(logprobs: Any, positive: str = "Yes", negative: str = "No") -> tuple[float, bool] | None:
    """log P(positive) - log P(negative) at the step where the judgment token was written.

    The step is the first generated token that reads ``positive`` or
    ``negative`` (case, spaces and quotes ignored, so JSON's ``"Yes"`` counts).
    At that step the probability of each label is summed over the listed
    alternatives that spell it (``Yes``, `` Yes``, ``yes`` ...), in log space
    (``scipy.special.logsumexp``).

    Args:
        logprobs: DSPy's ``Prediction.logprobs``: ``{"content": [{"token",
            "logprob", "top_logprobs": [{"token", "logprob"}, ...]}, ...]}``
            (natural logs).
        positive: The label scored up.
        negative: The label scored down.

    Returns:
        ``(margin, bounded)``, or ``None`` when no generated token spells
        either label. ``bounded`` is True when one label was not among the
        listed alternatives: its log-probability is then taken as the lowest
        listed one, an upper bound, so the margin is clipped towards 0.
    """
    content = (logprobs or {}).get("content") if hasattr(logprobs, "get") else None
    pos, neg = positive.lower(), negative.lower()
    for entry in content or []:
        if _norm(entry["token"]) not in (pos, neg):
            continue
        alternatives = {t["token"]: float(t["logprob"]) for t in entry.get("top_logprobs") or []}
        alternatives.setdefault(entry["token"], float(entry["logprob"]))
        floor = min(alternatives.values())
        sides = []
        for label in (pos, neg):
            values = [lp for tok, lp in alternatives.items() if _norm(tok) == label]
            sides.append(float(logsumexp(values)) if values else None)
        bounded = None in sides
        lp_pos, lp_neg = (floor if side is None else side for side in sides)
        return lp_pos - lp_neg, bounded
    return None


def judge_bar(scores: list[float], n_std: float) -> tuple[float, float, float]:
    """MAIN-RAG's adaptive judge bar: ``mean - n_std * std`` of the pool's scores.

    Args:
        scores: Scores of the judged passages (at least one).
        n_std: ``n``; 0 keeps what scores at least the mean, larger ``n`` keeps more.

    Returns:
        ``(threshold, mean, std)`` with the population standard deviation (ddof=0).
    """
    values = np.asarray(scores, dtype=float)
    mean, std = float(values.mean()), float(values.std())
    return mean - n_std * std, mean, std


@register_method("main_rag")
class MainRAG(MCQProgram):
    """Retrieve ``pool_k`` passages with the question, keep those the LM judge scores above the adaptive bar.

    Args:
        retriever: The shared retriever (not saved with the program).
        budget: Most passages shown to the answer step (15); fewer when the
            bar keeps fewer.
        pool_k: Passages retrieved and judged (20, the retrieval depth used by
            MAIN-RAG); one judge call each.
        n_std: ``n`` in ``mean - n * std`` (0).
        scoring: ``"auto"``, ``"logprob"`` or ``"vote"`` (see the module note).
        top_logprobs: Alternatives requested per generated token (20).
        max_context_tokens: Token budget of the answer step's context.

    Raises:
        ValueError: ``pool_k < 1``, an unknown ``scoring``.

    Examples:
        >>> program = MainRAG(load_index("indexes/demo"), n_std=0.5)
        >>> pred = program(question="A 70-year-old ...", options={"A": "...", "B": "..."})
        >>> pred.judge_scoring, pred.judge_threshold, [p["judge_score"] for p in pred.passages]
    """

    def __init__(
        self,
        retriever,
        budget: int = 15,
        pool_k: int = 20,
        n_std: float = 0.0,
        scoring: str = "auto",
        top_logprobs: int = TOP_LOGPROBS,
        **kwargs,
    ):
        super().__init__(retriever=retriever, budget=budget, **kwargs)
        if pool_k < 1:
            raise ValueError(f"pool_k must be >= 1, got {pool_k}")
        if scoring not in SCORING_MODES:
            raise ValueError(f"scoring must be one of {', '.join(SCORING_MODES)}, got {scoring!r}")
        self.pool_k, self.n_std, self.scoring, self.top_logprobs = pool_k, float(n_std), scoring, top_logprobs
        self.judge = dspy.Predict(JudgeDocumentSupport)
        self.answer = dspy.Predict(AnswerQuestion)

    def settings(self):
        return {
            **super().settings(),
            "pool_k": self.pool_k,
            "n_std": self.n_std,
            "scoring": self.scoring,
            "top_logprobs": self.top_logprobs,
        }

    def judge_passage(self, question: str, passage: str) -> dict[str, Any]:
        """One judge call: ``{"judgment", "score", "scored_by", "bounded"}``; ``score`` is None on a bad reply.

        Raises:
            LMCapabilityError: ``scoring="logprob"`` and the reply has no usable log-probabilities.
        """
        config = {} if self.scoring == "vote" else {"logprobs": True, "top_logprobs": self.top_logprobs}
        try:
            pred = self.judge(question=question, passage=passage, config=config)
        except BAD_REPLY_ERRORS:
            return {"judgment": None, "score": None, "scored_by": None, "bounded": False}
        judgment = pred.judgment if pred.judgment in ("Yes", "No") else None
        margin = None if self.scoring == "vote" else yes_no_margin(pred.get("logprobs"))
        if margin is not None:
            return {"judgment": judgment, "score": margin[0], "scored_by": "logprob", "bounded": margin[1]}
        if self.scoring == "logprob":
            raise LMCapabilityError(
                "main_rag scoring='logprob' but the LM's reply carries no log-probabilities of Yes/No; "
                "use scoring='auto' or 'vote' with this LM"
            )
        if judgment is None:
            return {"judgment": None, "score": None, "scored_by": None, "bounded": False}
        return {
            "judgment": judgment,
            "score": 1.0 if judgment == "Yes" else -1.0,
            "scored_by": "vote",
            "bounded": False,
        }

    def forward(self, question: str, options: dict[str, str]) -> dspy.Prediction:
        stages: dict = {}
        with stage(stages, "retrieval"):
            pool = self.fuse(self.retrieve([question], k=self.pool_k, names=["question"]), budget=self.pool_k)
        with stage(stages, "judge"):
            judged = []
            for f in pool:
                judged.append(self.judge_passage(question, self.retriever.get(f.passage_id).text))
        scored = [i for i, j in enumerate(judged) if j["score"] is not None]
        threshold = mean = std = None
        kept_idx: list[int] = []
        if scored:
            threshold, mean, std = judge_bar([judged[i]["score"] for i in scored], self.n_std)
            above = [i for i in scored if judged[i]["score"] >= threshold - SCORE_TOLERANCE]
            kept_idx = sorted(above, key=lambda i: -judged[i]["score"])[: self.budget]  # stable: ties keep rank
        fallbacks = {
            "judge_vote_scored": sum(judged[i]["scored_by"] == "vote" for i in scored),
            "judge_failures": len(pool) - len(scored),
        }
        out = self.answer_from_passages(question, options, [pool[i] for i in kept_idx], stages, fallbacks)
        for record, i in zip(out["passages"] + out["dropped_passages"], kept_idx):
            record["judge_score"] = round(judged[i]["score"], 6)
            record["judge_scored_by"] = judged[i]["scored_by"]
        used = sorted({judged[i]["scored_by"] for i in scored})
        return dspy.Prediction(
            **out,
            queries=[question],
            pool_size=len(pool),
            judge_scoring=used[0] if len(used) == 1 else ("mixed" if used else "none"),
            judge_threshold=None if threshold is None else round(threshold, 6),
            judge_mean=None if mean is None else round(mean, 6),
            judge_std=None if std is None else round(std, 6),
            judge_yes=sum(j["judgment"] == "Yes" for j in judged),
            judge_failures=len(pool) - len(scored),
            judge_bounded=sum(j["bounded"] for j in judged),
            judge_pool=[
                {
                    "id": f.passage_id,
                    "judgment": j["judgment"],
                    "score": None if j["score"] is None else round(j["score"], 6),
                }
                for f, j in zip(pool, judged)
            ],
        )
