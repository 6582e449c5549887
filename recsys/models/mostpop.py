"""MostPop: rank items by their training-set popularity — the floor every model must clear.

Learns by counting (no gradient steps); the same `score` contract as the neural models, so evaluation and
the promotion gate treat it like any other model.
"""

from __future__ import annotations

import torch

from recsys.model_configs import TRAINABLE, MostPopConfig
from recsys.models.base import Batch, SequentialModel


class MostPop(SequentialModel):
    name = "mostpop"
    trainable = TRAINABLE["mostpop"]

    def __init__(self, config: MostPopConfig, n_items: int, n_users: int):
        super().__init__(n_items, n_users)
        self.config = config
        self.register_buffer("counts", torch.zeros(n_items + 1))

    def fit_statistics(self, train_items: torch.Tensor) -> None:
        counts = torch.bincount(train_items.cpu(), minlength=self.n_items + 1).float()
        self.counts.copy_(counts[: self.n_items + 1])

    def score(self, batch: Batch) -> torch.Tensor:
        scores = self.counts.expand(batch.items.shape[0], -1).clone()  # (B, I + 1)
        scores[:, 0] = float("-inf")
        return scores
