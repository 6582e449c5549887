"""Ranking metrics against hand-computed values, and the tie-safe `target_rank`."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys.metrics import hit_rate_at_k, ndcg_at_k, per_user_metrics, reciprocal_rank, target_rank

NEG_INF = float("-inf")
NAN = float("nan")


def rank_of(scores: list[float], target: int, candidates: list[bool] | None = None) -> int:
    s = torch.tensor([scores], dtype=torch.float32)
    c = torch.tensor([candidates if candidates is not None else [True] * len(scores)])
    return int(target_rank(s, torch.tensor([target]), c)[0])


# --- metrics of known ranks --------------------------------------------------------------------------------


def test_ndcg_at_10_hand_computed():
    ranks = torch.tensor([1, 2, 3, 10, 11, 100])
    expected = [1.0, 1 / math.log2(3), 0.5, 1 / math.log2(11), 0.0, 0.0]
    assert ndcg_at_k(ranks, 10).tolist() == pytest.approx(expected, abs=1e-12)


def test_ndcg_cutoff_is_inclusive():
    ranks = torch.tensor([5, 6])
    assert ndcg_at_k(ranks, 5).tolist() == pytest.approx([1 / math.log2(6), 0.0])  # 0.38685…
    assert ndcg_at_k(ranks, 5)[0].item() == pytest.approx(0.386852807, abs=1e-9)


def test_hit_rate_hand_computed():
    ranks = torch.tensor([1, 5, 10, 11, 20, 21])
    assert hit_rate_at_k(ranks, 10).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert hit_rate_at_k(ranks, 20).tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]


def test_mrr_hand_computed():
    ranks = torch.tensor([1, 2, 4, 10])
    assert reciprocal_rank(ranks).tolist() == pytest.approx([1.0, 0.5, 0.25, 0.1])
    assert reciprocal_rank(ranks).mean().item() == pytest.approx((1 + 0.5 + 0.25 + 0.1) / 4)


def test_per_user_metrics_keys_and_values():
    ranks = torch.tensor([1, 3, 7])
    out = per_user_metrics(ranks, (5, 10))
    assert set(out) == {"ndcg@5", "hr@5", "ndcg@10", "hr@10", "mrr"}
    assert out["hr@5"].tolist() == [1.0, 1.0, 0.0]
    assert out["ndcg@5"].tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert out["ndcg@10"].tolist() == pytest.approx([1.0, 0.5, 1 / 3])  # log2(8) = 3
    assert out["mrr"].tolist() == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert all(v.dtype == torch.float64 for v in out.values())


@pytest.mark.parametrize("ks", [(10,), (5, 10, 20), (1, 3)])
def test_the_gate_may_compare_exactly_the_per_user_metrics_evaluate_writes(ks):
    """params.yaml's gate.metric is checked against `gate_metrics` (no torch), so it must name these."""
    from recsys.config import gate_metrics

    assert gate_metrics(ks) == list(per_user_metrics(torch.tensor([1, 4]), ks))


# --- target_rank --------------------------------------------------------------------------------------------


def test_rank_counts_strictly_better_items():
    # Column 0 is padding (not a candidate); target 2 scores 0.5, only column 1 (0.9) beats it.
    assert rank_of([NEG_INF, 0.9, 0.5, 0.3, 0.1], 2, [False, True, True, True, True]) == 2
    assert rank_of([NEG_INF, 0.9, 0.5, 0.3, 0.1], 1, [False, True, True, True, True]) == 1
    assert rank_of([NEG_INF, 0.9, 0.5, 0.3, 0.1], 4, [False, True, True, True, True]) == 4


def test_ties_count_against_the_target():
    # Target 0.5 and two others at 0.5: the target is placed after both → rank 3.
    assert rank_of([NEG_INF, 0.5, 0.5, 0.5, 0.1], 1, [False, True, True, True, True]) == 3
    assert rank_of([NEG_INF, 0.5, 0.5, 0.5, 0.1], 3, [False, True, True, True, True]) == 3
    # Everything tied (e.g. an untrained constant model): the target is last among the candidates.
    assert rank_of([0.0] * 6, 2, [False] + [True] * 5) == 5


def test_nan_target_ranks_worst():
    assert rank_of([NEG_INF, NAN, 0.1, 0.2, 0.3], 1, [False, True, True, True, True]) == 4
    # Even against -inf competitors.
    assert rank_of([NEG_INF, NAN, NEG_INF, NEG_INF], 1, [False, True, True, True]) == 3


def test_nan_competitor_counts_against_target():
    assert rank_of([NEG_INF, 0.9, NAN, 0.1], 1, [False, True, True, True]) == 2
    assert rank_of([NEG_INF, 0.9, NAN, NAN, 0.1], 1, [False, True, True, True, True]) == 3


def test_masked_items_never_count():
    # Column 2 (0.9) was already seen by the user: masked, so only column 3 (0.5 ≥ 0.1) beats the target.
    assert rank_of([NEG_INF, 0.1, 0.9, 0.5], 1, [False, True, False, True]) == 2
    # A masked NaN does not count either.
    assert rank_of([NEG_INF, 0.1, NAN, 0.05], 1, [False, True, False, True]) == 1


def test_padding_column_never_counts():
    # Even if a model gave the padding column the highest score, it is not a candidate.
    assert rank_of([10.0, 0.5, 0.1], 1, [False, True, True]) == 1
    assert rank_of([NAN, 0.5, 0.1], 1, [False, True, True]) == 1


def test_target_column_may_be_masked_or_not():
    scores = [NEG_INF, 0.3, 0.7, 0.5]
    assert rank_of(scores, 3, [False, True, True, True]) == rank_of(scores, 3, [False, True, True, False]) == 2


def test_rows_are_independent():
    scores = torch.tensor([[NEG_INF, 0.5, 0.5, 0.5], [NEG_INF, 0.1, 0.2, 0.3], [NEG_INF, 0.3, 0.2, 0.1]])
    candidates = torch.tensor([[False, True, True, True]] * 3)
    assert target_rank(scores, torch.tensor([1, 1, 1]), candidates).tolist() == [3, 3, 1]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_rank_matches_naive_definition(data):
    """rank = 1 + #{candidate i ≠ target : score_i ≥ score_target or either is NaN}, computed naively."""
    n = data.draw(st.integers(2, 8))
    values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, NAN, NEG_INF]), st.floats(-3, 3, width=32))
    scores = data.draw(st.lists(values, min_size=n, max_size=n))
    candidates = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    target = data.draw(st.integers(0, n - 1))
    t = scores[target]
    expected = 1 + sum(
        1
        for i, (s, c) in enumerate(zip(scores, candidates))
        if c and i != target and (math.isnan(s) or math.isnan(t) or s >= t)
    )
    assert rank_of(scores, target, candidates) == expected


def test_a_repeated_target_is_a_miss_not_ranked_among_the_unseen_items():
    """PROTOCOL.md masks every item in the input: a target the user already has there (a repeat) was ranked
    among the unseen items only — its seen competitors removed, itself kept — which doubled MostPop's test
    NDCG@10 on the generated data (a third of its targets repeat). Now a miss, after every item."""
    from recsys.ranking import MISS_RANK, ranks_of

    scores = torch.tensor([[NEG_INF, 0.9, 0.8, 0.1], [NEG_INF, 0.9, 0.8, 0.1]])
    candidates = torch.tensor([[False, False, True, True],   # item 1 seen; target 2 unseen: rank 1
                               [False, True, False, True]])  # target 2 seen (a repeat): a miss
    ranks = ranks_of(scores, torch.tensor([2, 2]), candidates)
    assert ranks.tolist() == [1, MISS_RANK]  # past every cutoff, though the catalogue has 3 items
    assert ndcg_at_k(ranks, 10).tolist() == [1.0, 0.0] and hit_rate_at_k(ranks, 20).tolist() == [1.0, 0.0]
    assert reciprocal_rank(ranks)[1].item() < 1e-9
