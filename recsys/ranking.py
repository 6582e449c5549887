"""Full-ranking of a split's targets: the one piece both training (validation) and evaluation (test) use.

Every item is a candidate except padding and the items the user already interacted with before the target;
ties count against the target (`recsys.metrics.target_rank`).
"""

from __future__ import annotations

import numpy as np
import torch

from recsys.metrics import target_rank
from recsys.models.base import SequentialModel
from recsys.sequences import SequenceData, eval_batch


def model_max_len(model: SequentialModel) -> int:
    return int(getattr(getattr(model, "config", None), "max_len", 1) or 1)


@torch.no_grad()
def rank_targets(
    model: SequentialModel,
    data: SequenceData,
    split: str,
    *,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
    item_map: np.ndarray | None = None,
    user_map: np.ndarray | None = None,
    sampled_negatives: int = 0,
    seed: int = 0,
) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None]:
    """(users, full-ranking ranks, sampled ranks or None) for every target of `split`."""
    was_training = model.training
    model.eval()
    targets = data.eval_targets(split)
    max_len = model_max_len(model)
    generator = torch.Generator().manual_seed(seed)
    users, ranks, sampled = [], [], []
    for start in range(0, len(targets), batch_size):
        eb = eval_batch(data, targets[start : start + batch_size], max_len, item_map, user_map)
        scores = model.score(eb.batch.to(device)).float()  # (B, I_model + 1)
        if item_map is not None:
            scores = torch.where(torch.from_numpy(item_map > 0).to(scores.device), scores[:, item_map], float("-inf"))
        scores = scores.cpu()  # (B, I + 1) in dataset ids
        candidates = torch.ones_like(scores, dtype=torch.bool)
        candidates[:, 0] = False
        candidates[eb.seen_rows, eb.seen_items] = False
        ranks.append(target_rank(scores, eb.targets, candidates))
        users.append(eb.users)
        if sampled_negatives:
            sampled.append(_sampled_rank(scores, eb.targets, candidates, sampled_negatives, generator))
    model.train(was_training)
    if not ranks:
        return np.zeros(0, np.int64), torch.zeros(0, dtype=torch.long), None
    return np.concatenate(users), torch.cat(ranks), (torch.cat(sampled) if sampled else None)


def _sampled_rank(scores, targets, candidates, n, generator) -> torch.Tensor:
    """Rank among `n` uniformly sampled unseen negatives — a labelled extra, never the headline."""
    weights = candidates.double()
    weights[torch.arange(len(targets)), targets] = 0.0
    n = min(n, int(weights.sum(1).min().item()))
    neg = torch.multinomial(weights, n, replacement=False, generator=generator)  # (B, n)
    sub = torch.cat([targets[:, None], neg], dim=1)
    sub_scores = scores.gather(1, sub)
    return target_rank(sub_scores, torch.zeros_like(targets), torch.ones_like(sub_scores, dtype=torch.bool))


def summarise(per_user: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(values.mean()) if len(values) else float("nan") for name, values in per_user.items()}
