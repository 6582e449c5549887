"""Ranking metrics as pure tensor functions of 1-based ranks, and the tie-safe rank itself."""

from __future__ import annotations

import torch


def target_rank(scores: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """1-based rank of each target among its candidates, ties counted against the target.

    scores (B, N) float, targets (B,) long, candidates (B, N) bool (True = rankable; the target's own
    column may be either). rank = 1 + #{candidate i ≠ target : score_i ≥ score_target}. A NaN score never
    helps the target: a NaN target ranks after every candidate, a NaN competitor counts as beating it.
    """
    rows = torch.arange(scores.shape[0], device=scores.device)
    target_scores = scores[rows, targets]  # (B,)
    others = candidates.clone()
    others[rows, targets] = False
    beats = (scores >= target_scores[:, None]) | scores.isnan() | target_scores.isnan()[:, None]
    return 1 + (beats & others).sum(dim=1)


def ndcg_at_k(ranks: torch.Tensor, k: int) -> torch.Tensor:
    """One relevant item per user, so the ideal DCG is 1."""
    return torch.where(ranks <= k, 1.0 / torch.log2(ranks.double() + 1.0), 0.0)


def hit_rate_at_k(ranks: torch.Tensor, k: int) -> torch.Tensor:
    return (ranks <= k).double()


def reciprocal_rank(ranks: torch.Tensor) -> torch.Tensor:
    return 1.0 / ranks.double()


def per_user_metrics(ranks: torch.Tensor, ks: tuple[int, ...]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k in ks:
        out[f"ndcg@{k}"] = ndcg_at_k(ranks, k)
        out[f"hr@{k}"] = hit_rate_at_k(ranks, k)
    out["mrr"] = reciprocal_rank(ranks)
    return out
