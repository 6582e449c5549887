"""The contract every model follows, and the batch it sees.

Training and evaluation share one `Batch` layout: sequences are left-padded with item 0 (padding), so the
newest event is always at position -1. A model implements

    loss(batch)  -> scalar tensor          (training objective on `targets`)
    score(batch) -> (B, n_items + 1)       (scores for the event after the last input; column 0 = padding)

and may override `fit_statistics` for what it learns by counting (MostPop). The training objective lives in
the model (causal next-item for SASRec/MOJITO, cloze for BERT4Rec) — the encoder is the shared part.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from recsys.model_configs import fixed_shape_loss_refusal


@dataclass
class Batch:
    items: torch.Tensor  # (B, L) long, left-padded with 0
    times: torch.Tensor  # (B, L) long, UTC seconds of each input event (0 at padding)
    users: torch.Tensor  # (B,) long, 1-based user index (0 = unknown user)
    # Training: the next item after each position (0 = no target) and its time.
    targets: torch.Tensor | None = None  # (B, L) long
    target_times: torch.Tensor | None = None  # (B, L) long
    # Evaluation / serving: the time of the event being predicted.
    next_time: torch.Tensor | None = None  # (B,) long
    # Training at a fixed shape (`train.cuda_graph`): the loss covers every position with padding masked
    # out, instead of selecting the positions that hold targets (a data-dependent shape the host waits for).
    fixed_shape: bool = False
    # With `fixed_shape`: compute the loss on this many positions (0: all of them), the ones that hold a loss
    # term gathered first; a bound on their count in this batch (recsys/step_graph.py sets it per epoch).
    loss_rows: int = 0

    def to(self, device: torch.device | str) -> Batch:
        moved = {
            f.name: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for f in fields(self)
            if (v := getattr(self, f.name)) is not None
        }
        return replace(self, **moved)


class SequentialModel(nn.Module):
    """Base class: `n_items` real items with ids 1..n_items; id 0 is padding."""

    name: ClassVar[str]
    # False for models that learn only by counting (MostPop): the trainer skips gradient steps.
    trainable: ClassVar[bool] = True
    # For a warm start (recsys/warm.py). `id_rows`: the tensors indexed by id (state-dict name → "items" or
    # "users"), whose rows are carried over by raw id; row 0 is padding, rows after the last id (BERT4Rec's
    # [mask]) are special and stay in place. `warm_free_fields`: config fields that only shape training or
    # initialisation, in which a champion may differ; every other field must match.
    id_rows: ClassVar[dict[str, str]] = {}
    warm_free_fields: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, n_items: int, n_users: int):
        super().__init__()
        self.n_items = n_items
        self.n_users = n_users

    def loss(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def score(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def scoring_elements_per_row(self) -> int:
        """Elements of the largest table `score` builds per scored row (`recsys.ranking.scoring_batch_size`
        sizes GPU scoring batches by it): the (I + 1) scores."""
        return self.n_items + 1

    def fixed_shape_refusal(self) -> str | None:
        """Why this model's `loss` cannot take a `fixed_shape` batch (`train.cuda_graph`), or None when it
        can (its `config.loss` is one of its `FIXED_SHAPE_LOSSES`, recsys/model_configs.py): its loss then has
        no data-dependent shape and never waits for the device."""
        return fixed_shape_loss_refusal(self.name, getattr(getattr(self, "config", None), "loss", None))

    def loss_terms(self, lengths: np.ndarray) -> np.ndarray:
        """How many terms `loss` averages over for training spans of `lengths` events (in expectation where
        they are drawn): the weights of a step's micro-batches. Next-item models: one per target, n - 1."""
        return lengths - 1

    def loss_positions(self, lengths: np.ndarray) -> np.ndarray:
        """At most how many positions of a training span of `lengths` events hold a loss term (a bound, not
        an expectation: `Batch.loss_rows`). Next-item models: one per target, n - 1, up to max_len."""
        return np.minimum(lengths - 1, self.config.max_len)

    def fit_statistics(self, train_items: torch.Tensor) -> None:
        """Called once before training with every training event's item id (1-D long tensor)."""
        return None
