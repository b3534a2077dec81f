import pytest

from hcqr_dspy.errors import QueryError
from hcqr_dspy.retrieval import STRATEGIES, Hit, fuse

LISTS = [
    [Hit("a", 0.9), Hit("b", 0.8), Hit("c", 0.7)],
    [Hit("b", 0.85), Hit("d", 0.6), Hit("a", 0.1)],
    [Hit("e", 0.95), Hit("b", 0.5)],
]


# Worked by hand from LISTS (ranks start at 1; rrf_k = 60):
#   score_sum: b .8+.85+.5 = 2.15, a .9+.1 = 1.0, e .95, c .7, d .6
#   rrf:       b 1/62+1/61+1/62, a 1/61+1/63, e 1/61, d 1/62, c 1/63
#   round_robin: rank 1 of q1, q2, q3 = a, b, e; rank 2 = b (kept), d, b (kept); rank 3 = c, a (kept)
EXPECTED = {
    "score_sum": [
        ("b", 2.15, (0, 1, 2), (2, 1, 2)),
        ("a", 1.0, (0, 1), (1, 3)),
        ("e", 0.95, (2,), (1,)),
        ("c", 0.7, (0,), (3,)),
        ("d", 0.6, (1,), (2,)),
    ],
    "rrf": [
        ("b", 1 / 62 + 1 / 61 + 1 / 62, (0, 1, 2), (2, 1, 2)),
        ("a", 1 / 61 + 1 / 63, (0, 1), (1, 3)),
        ("e", 1 / 61, (2,), (1,)),
        ("d", 1 / 62, (1,), (2,)),
        ("c", 1 / 63, (0,), (3,)),
    ],
    "round_robin": [
        ("a", 1.0, (0, 1), (1, 3)),
        ("b", 1 / 2, (0, 1, 2), (2, 1, 2)),
        ("e", 1 / 3, (2,), (1,)),
        ("d", 1 / 4, (1,), (2,)),
        ("c", 1 / 5, (0,), (3,)),
    ],
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("budget", [1, 2, 3, 5, 100])
def test_fused_passages_scores_and_provenance_match_hand_computed_values(strategy, budget):
    fused = fuse(LISTS, budget=budget, strategy=strategy)
    want = EXPECTED[strategy][:budget]
    assert [f.passage_id for f in fused] == [w[0] for w in want]
    assert [f.score for f in fused] == pytest.approx([w[1] for w in want])
    assert [(f.queries, f.ranks) for f in fused] == [(w[2], w[3]) for w in want]


def test_score_sum_sums_duplicates():
    fused = fuse(LISTS, budget=5, strategy="score_sum")
    assert [f.passage_id for f in fused] == ["b", "a", "e", "c", "d"]
    b = fused[0]
    assert b.score == pytest.approx(0.8 + 0.85 + 0.5)
    assert b.queries == (0, 1, 2) and b.ranks == (2, 1, 2)
    a = fused[1]
    assert a.score == pytest.approx(1.0) and a.queries == (0, 1) and a.ranks == (1, 3)


def test_rrf_uses_ranks_not_scores():
    fused = fuse(LISTS, budget=5, strategy="rrf", rrf_k=60)
    assert fused[0].passage_id == "b"
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61 + 1 / 62)
    # a: ranks 1 and 3 -> 1/61 + 1/63; e: rank 1 only
    assert [f.passage_id for f in fused[:3]] == ["b", "a", "e"]


def test_round_robin_interleaves_queries():
    fused = fuse(LISTS, budget=5, strategy="round_robin")
    # rank 1 of q1, q2, q3 -> a, b, e; then rank 2: b (dup), d, b (dup); rank 3: c
    assert [f.passage_id for f in fused] == ["a", "b", "e", "d", "c"]
    assert fused[1].queries == (0, 1, 2)


def test_ties_broken_by_rank_then_query_then_id():
    lists = [[Hit("z", 1.0), Hit("y", 0.5)], [Hit("x", 1.0), Hit("w", 0.5)]]
    assert [f.passage_id for f in fuse(lists, 4)] == ["z", "x", "y", "w"]


def test_duplicate_within_one_list_counted_once():
    fused = fuse([[Hit("a", 1.0), Hit("a", 1.0)]], budget=3)
    assert len(fused) == 1 and fused[0].score == 1.0 and fused[0].ranks == (1,)


def test_empty_lists_give_empty_result():
    assert fuse([[], []], budget=3) == []


@pytest.mark.parametrize("budget", [0, -1, 1.5, True])
def test_bad_budget(budget):
    with pytest.raises(QueryError, match="budget"):
        fuse(LISTS, budget=budget)


def test_unknown_strategy():
    with pytest.raises(QueryError, match="unknown fusion strategy 'max'.*score_sum"):
        fuse(LISTS, budget=3, strategy="max")
