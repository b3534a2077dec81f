"""Multi-query fusion: merge several ranked hit lists into one fixed budget.

HCQR retrieves with three queries through one retriever and keeps at most
``budget`` unique passages (15 in the paper, 5 per query). Strategies:

* ``score_sum`` — a passage's fused score is the sum of its scores in every
  list it appears in; sort by fused score (the HCQR reference code: duplicate
  passages' scores summed, then sorted).
* ``rrf`` — reciprocal rank fusion, ``sum 1 / (rrf_k + rank)`` over lists,
  rank starting at 1, ``rrf_k = 60`` by default (Cormack, Clarke & Büttcher
  2009, "Reciprocal rank fusion outperforms Condorcet and individual rank
  learning methods").
* ``round_robin`` — take each list's best not-yet-kept passage in turn
  (query 1, query 2, ..., then each list's second, ...).

Ties are broken deterministically by best rank, then first query position,
then passage id. Every fused passage records which queries (by position)
retrieved it and at which rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hcqr_dspy.errors import QueryError
from hcqr_dspy.retrieval.retriever_base import Hit

FusionStrategy = Literal["score_sum", "rrf", "round_robin"]
STRATEGIES: tuple[str, ...] = ("score_sum", "rrf", "round_robin")
DEFAULT_RRF_K = 60


@dataclass(frozen=True)
class FusedPassage:
    """A passage kept by :func:`fuse`.

    Attributes:
        passage_id: The passage.
        score: Fused score (strategy-specific; higher is better; for
            ``round_robin`` the reciprocal of the pick order).
        queries: Positions (0-based) of the queries whose hit lists held it,
            ascending.
        ranks: Its rank (1-based) in each of those lists, aligned with
            ``queries``.
    """

    passage_id: str
    score: float
    queries: tuple[int, ...]
    ranks: tuple[int, ...]


def fuse(
    hit_lists: Sequence[Sequence[Hit]],
    budget: int,
    strategy: FusionStrategy = "score_sum",
    rrf_k: int = DEFAULT_RRF_K,
) -> list[FusedPassage]:
    """Fuse ranked hit lists into at most ``budget`` unique passages.

    Args:
        hit_lists: One ranked list of :class:`Hit` per query (best first).
            A passage repeated inside one list counts once, at its best rank.
        budget: Maximum passages returned, ``>= 1``.
        strategy: ``"score_sum"`` (default, HCQR reference), ``"rrf"`` or
            ``"round_robin"``.
        rrf_k: RRF constant (Cormack et al. 2009 use 60).

    Returns:
        Fused passages, best first, unique ids, ``len <= budget``.

    Raises:
        QueryError: ``budget < 1``, ``rrf_k < 0`` or an unknown strategy.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise QueryError(f"budget must be a positive integer, got {budget!r}")
    if strategy not in STRATEGIES:
        raise QueryError(f"unknown fusion strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if rrf_k < 0:
        raise QueryError(f"rrf_k must be >= 0, got {rrf_k!r}")

    # passage id -> list of (query position, rank, raw score); first-seen order kept.
    seen: dict[str, list[tuple[int, int, float]]] = {}
    for q, hits in enumerate(hit_lists):
        in_this_list: set[str] = set()
        for rank, hit in enumerate(hits, start=1):
            if hit.passage_id in in_this_list:
                continue
            in_this_list.add(hit.passage_id)
            seen.setdefault(hit.passage_id, []).append((q, rank, float(hit.score)))

    def make(pid: str, score: float) -> FusedPassage:
        occ = seen[pid]
        return FusedPassage(pid, score, tuple(o[0] for o in occ), tuple(o[1] for o in occ))

    if strategy == "round_robin":
        picked: list[FusedPassage] = []
        kept: set[str] = set()
        depth = max((len(h) for h in hit_lists), default=0)
        for rank in range(depth):
            for hits in hit_lists:
                if len(picked) == budget:
                    return picked
                if rank < len(hits) and hits[rank].passage_id not in kept:
                    pid = hits[rank].passage_id
                    kept.add(pid)
                    picked.append(make(pid, 1.0 / (len(picked) + 1)))
        return picked

    def fused_score(occ: list[tuple[int, int, float]]) -> float:
        if strategy == "score_sum":
            return sum(o[2] for o in occ)
        return sum(1.0 / (rrf_k + o[1]) for o in occ)

    ranked = sorted(
        seen.items(),
        key=lambda item: (-fused_score(item[1]), min(o[1] for o in item[1]), item[1][0][0], item[0]),
    )
    return [make(pid, fused_score(occ)) for pid, occ in ranked[:budget]]
