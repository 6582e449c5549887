"""Prepared events → padded tensor batches for training and evaluation.

Events are held as flat arrays sorted by user (CSR-style `offsets`), so building a batch is slicing, never a
per-event Python loop. Training batches are either length-bucketed (sequences of similar length share a
batch, which cuts padding several-fold on long-tailed data like MovieLens) or uniform random samples
(`train.batching`); either way a step may run as length-sorted micro-batches (`train.micro_batches`), so a
uniform batch costs what a bucketed one does on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recsys.models.base import Batch
from recsys.prepare import ROLE_OF_SPLIT, TRAIN, Prepared


@dataclass(frozen=True)
class SequenceData:
    n_items: int
    n_users: int
    offsets: np.ndarray  # (n_users + 1,) events of user u (1-based) are offsets[u - 1]:offsets[u]
    items: np.ndarray  # (n_events,) int64
    times: np.ndarray  # (n_events,) int64
    roles: np.ndarray  # (n_events,) int8

    @classmethod
    def from_prepared(cls, prepared: Prepared) -> SequenceData:
        ev = prepared.events
        users = ev["user"].to_numpy()
        counts = np.bincount(users, minlength=prepared.n_users + 1)[1:]
        return cls(
            n_items=prepared.n_items,
            n_users=prepared.n_users,
            offsets=np.r_[0, np.cumsum(counts)].astype(np.int64),
            items=ev["item"].to_numpy(np.int64),
            times=ev["timestamp"].to_numpy(np.int64),
            roles=ev["role"].to_numpy(np.int8),
        )

    def train_spans(self, max_len: int, windows: str = "last") -> np.ndarray:
        """(n, 3) rows of (user, start, end), each a training sequence of at most `max_len + 1` events.

        `windows="last"`: each user's newest `max_len + 1` training events (SASRec's reference code, RecTools).
        `windows="all"`: the whole training history, cut from the newest event backwards into windows of
        `max_len + 1` events that overlap by one, so every training transition is a target exactly once
        (on MovieLens-1M a third of the training events lie before users' newest 201). Training events come
        first in each user's sequence under both split methods."""
        # bincount, not reduceat: users may have no events left (a global-time split drops them).
        user_of_event = np.repeat(np.arange(self.n_users), np.diff(self.offsets))
        n_train = np.bincount(user_of_event[self.roles == TRAIN], minlength=self.n_users)
        users = np.flatnonzero(n_train >= 2)
        ends = self.offsets[users] + n_train[users]
        if windows == "all":
            per_user = -(-(n_train[users] - 1) // max_len)  # ceil((n - 1) / max_len) windows
            rank = np.arange(per_user.sum()) - np.repeat(np.cumsum(per_user) - per_user, per_user)
            users, first = np.repeat(users, per_user), np.repeat(self.offsets[users], per_user)
            ends = np.repeat(ends, per_user) - rank * max_len
            starts = np.maximum(first, ends - (max_len + 1))
        elif windows == "last":
            starts = np.maximum(self.offsets[users], ends - (max_len + 1))
        else:
            raise ValueError(f"windows must be 'last' or 'all', got {windows!r}")
        return np.stack([users + 1, starts, ends], axis=1)

    def train_items(self) -> torch.Tensor:
        return torch.from_numpy(self.items[self.roles == TRAIN])

    def eval_targets(self, split: str) -> np.ndarray:
        """Event indices of the validation or test targets, in user order."""
        return np.flatnonzero(self.roles == ROLE_OF_SPLIT[split])


def _pad_left(rows: list[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):
        if len(row):
            out[r, width - len(row) :] = row
    return out


def train_batch(data: SequenceData, spans: np.ndarray) -> Batch:
    """Inputs are events[start:end-1], targets the events one step later."""
    width = int((spans[:, 2] - spans[:, 1]).max()) - 1
    items = [data.items[s : e - 1] for _, s, e in spans]
    targets = [data.items[s + 1 : e] for _, s, e in spans]
    times = [data.times[s : e - 1] for _, s, e in spans]
    target_times = [data.times[s + 1 : e] for _, s, e in spans]
    return Batch(
        items=torch.from_numpy(_pad_left(items, width)),
        times=torch.from_numpy(_pad_left(times, width)),
        users=torch.from_numpy(spans[:, 0].astype(np.int64)),
        targets=torch.from_numpy(_pad_left(targets, width)),
        target_times=torch.from_numpy(_pad_left(target_times, width)),
    )


def bucketed_batch_rows(lengths: np.ndarray, batch_size: int, generator: torch.Generator) -> list[np.ndarray]:
    """Row indices of each batch: shuffle, sort by length within chunks of 50 batches, split into batches,
    shuffle the batch order. Similar lengths share a batch (less padding) while the order stays random."""
    order = torch.randperm(len(lengths), generator=generator).numpy()
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(order), chunk):
        part = order[c : c + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(part[b : b + batch_size] for b in range(0, len(part), batch_size))
    perm = torch.randperm(len(batches), generator=generator).numpy()
    return [batches[i] for i in perm]


def random_batch_rows(lengths: np.ndarray, batch_size: int, generator: torch.Generator) -> list[np.ndarray]:
    """Row indices of each batch: one shuffle, cut into batches (every batch a uniform sample of the spans).
    Unlike `bucketed_batch_rows`, which groups spans of similar length — so the same short histories meet
    every epoch and each of their targets weighs more in its batch's mean loss. Rows within a batch are sorted
    by length (the batch is the same set), so `micro_batches` and DDP shards slice it into similar lengths."""
    order = torch.randperm(len(lengths), generator=generator).numpy()
    batches = (order[b : b + batch_size] for b in range(0, len(order), batch_size))
    return [rows[np.argsort(lengths[rows], kind="stable")] for rows in batches]


def batch_rows(lengths: np.ndarray, batch_size: int, generator: torch.Generator, batching: str) -> list[np.ndarray]:
    """The epoch's batch plan for `train.batching` ("bucketed" or "random")."""
    plan = {"bucketed": bucketed_batch_rows, "random": random_batch_rows}.get(batching)
    if plan is None:
        raise ValueError(f"train.batching must be 'bucketed' or 'random', got {batching!r}")
    return plan(lengths, batch_size, generator)


MICRO_BATCHES_CPU = 8  # `train.micro_batches: 0` (auto) on a CPU; 1 on CUDA (benchmarks/batching_cost.py)


def micro_batch_count(setting: int, device: torch.device) -> int:
    """`train.micro_batches` for `device`: the setting itself, or for 0 (auto) 8 on a CPU — where a padded
    position costs as much as a real one — and 1 on CUDA, where small launches cost more than padding."""
    if setting > 0:
        return setting
    return 1 if device.type == "cuda" else MICRO_BATCHES_CPU


def micro_batches(lengths: np.ndarray, parts: int, terms: np.ndarray) -> list[tuple[int, int, int, float]]:
    """One optimiser step's rows, sorted by span length (`lengths`, events per span), as up to `parts`
    contiguous micro-batches: (start, stop, input width, weight) each.

    A micro-batch is padded only to its own longest span, and its weight is its share of the step's loss
    terms — `terms` per row, the model's `loss_terms` (next-item models: a span of n events holds n - 1
    targets) — so Σ weight × mean loss of each micro-batch is the step's mean loss over all its terms:
    accumulating those gradients gives the step one batch would, with the padding of length-sorted batches.
    (BERT4Rec draws its masked positions per micro-batch; its weights are their expected share.)"""
    if parts < 1 or len(lengths) == 0:
        raise ValueError(f"micro_batches needs parts >= 1 and at least one row, got {parts} and {len(lengths)}")
    if np.any(np.diff(lengths) < 0):
        raise ValueError("micro_batches needs the step's rows sorted by span length")
    targets = np.asarray(terms, dtype=np.float64)
    total = float(targets.sum())
    bounds = np.linspace(0, len(lengths), min(parts, len(lengths)) + 1).round().astype(int)
    return [(int(lo), int(hi), int(lengths[hi - 1]) - 1, float(targets[lo:hi].sum()) / total)
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def bucketed_batches(spans: np.ndarray, batch_size: int, generator: torch.Generator) -> list[np.ndarray]:
    """`bucketed_batch_rows` as the spans themselves (for `train_batch`)."""
    return [spans[rows] for rows in bucketed_batch_rows(spans[:, 2] - spans[:, 1], batch_size, generator)]


class TrainingTensors:
    """Every training span, left-padded once into (n, W) item and time matrices that live on the training
    device, so a batch is cut there by indexing — nothing is built on the host per batch, and on a GPU the
    trainer is not bound by the host. `batch(rows, width)` equals `train_batch(data, spans[rows])`."""

    def __init__(self, data: SequenceData, spans: np.ndarray, device: torch.device | str = "cpu"):
        self.lengths = (spans[:, 2] - spans[:, 1]).astype(np.int64)  # events per span (host: batch planning)
        width = int(self.lengths.max()) if len(spans) else 1
        # Event index of every cell, -1 at padding: row r holds events start..end-1 right-aligned.
        col = np.arange(width)[None, :] - (width - self.lengths)[:, None]  # (n, W) offset into the span
        idx = np.where(col >= 0, spans[:, 1:2] + col, -1)
        pad = idx < 0
        items = np.where(pad, 0, data.items[np.maximum(idx, 0)])
        times = np.where(pad, 0, data.times[np.maximum(idx, 0)])
        self.items = torch.from_numpy(items).to(device)  # (n, W)
        self.times = torch.from_numpy(times).to(device)
        self.users = torch.from_numpy(spans[:, 0].astype(np.int64)).to(device)  # (n,)

    def batch(self, rows: torch.Tensor, width: int) -> Batch:
        """Rows `rows` (on the device) as a training batch of `width` input positions, `width` = the longest
        span in the batch minus one (computed on the host from `lengths`, so no device sync)."""
        seq, t = self.items[rows, -(width + 1) :], self.times[rows, -(width + 1) :]  # (B, width + 1)
        has_input = seq[:, :-1] > 0  # a target right after padding has no input to predict it from
        return Batch(
            items=seq[:, :-1], times=t[:, :-1], users=self.users[rows],
            targets=seq[:, 1:] * has_input, target_times=t[:, 1:] * has_input,
        )


@dataclass(frozen=True)
class EvalBatch:
    batch: Batch
    targets: torch.Tensor  # (B,) target item (dataset ids)
    seen_rows: torch.Tensor  # (S,) row of each seen (row, item) pair
    seen_items: torch.Tensor  # (S,) item of each pair (dataset ids)
    users: np.ndarray  # (B,) dataset user ids (1-based)


def eval_batch(
    data: SequenceData,
    target_idx: np.ndarray,
    max_len: int,
    item_map: np.ndarray | None = None,
    user_map: np.ndarray | None = None,
) -> EvalBatch:
    """Model input = every earlier event of the target's user (newest `max_len`), seen = all of them.

    `item_map` / `user_map` translate dataset ids into a model's own ids (0 = unknown to the model); unknown
    items are dropped from the model input. Seen items and targets stay in dataset ids.
    """
    user_of = np.searchsorted(data.offsets, target_idx, side="right")  # 1-based user
    starts = data.offsets[user_of - 1]
    histories = [data.items[s:t] for s, t in zip(starts, target_idx)]
    hist_times = [data.times[s:t] for s, t in zip(starts, target_idx)]
    model_items, model_times = [], []
    for hist, ts in zip(histories, hist_times):
        if item_map is not None:
            mapped = item_map[hist]
            known = mapped > 0
            hist, ts = mapped[known], ts[known]
        model_items.append(hist[-max_len:])
        model_times.append(ts[-max_len:])
    width = max(1, max(len(h) for h in model_items))
    seen_rows = np.concatenate([np.full(len(h), r) for r, h in enumerate(histories)]).astype(np.int64)
    seen_items = np.concatenate(histories).astype(np.int64) if histories else np.zeros(0, np.int64)
    users = user_of.astype(np.int64)
    return EvalBatch(
        batch=Batch(
            items=torch.from_numpy(_pad_left(model_items, width)),
            times=torch.from_numpy(_pad_left(model_times, width)),
            users=torch.from_numpy(user_map[users] if user_map is not None else users),
            next_time=torch.from_numpy(data.times[target_idx]),
        ),
        targets=torch.from_numpy(data.items[target_idx]),
        seen_rows=torch.from_numpy(seen_rows),
        seen_items=torch.from_numpy(seen_items),
        users=users,
    )
