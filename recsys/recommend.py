"""Serving: top-k next items for one user history, scored by any model's `score(batch)`.

Ids here are the *model's* ids (index into the checkpoint's `items.json`/`users.json`); mapping raw dataset
ids to them is the caller's job (see `recsys.commands.recommend`), because the champion may have been
trained on an older dataset version than the one the history comes from.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch


def _max_len(model: Any, meta: dict[str, Any]) -> int:
    config = getattr(model, "config", None)
    value = getattr(config, "max_len", None) or (meta.get("config") or {}).get("max_len")
    return int(value) if value else 0


@torch.no_grad()
def recommend(
    model: Any,
    meta: dict[str, Any],
    history_items: Sequence[int],
    k: int,
    at_time: int | None,
    *,
    history_times: Sequence[int] | None = None,
    user_index: int = 0,
) -> list[tuple[int, float]]:
    """The k best (item_index, score) pairs, best first; padding and already-seen items are never returned.

    `history_items` are model item ids (1..n_items) in time order, `history_times` their UTC seconds (0 when
    unknown), `at_time` the moment being recommended for (default: now), `user_index` the model's user id
    (0 = unknown user).
    """
    from recsys.models.base import Batch

    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    n_items = int(meta.get("n_items", getattr(model, "n_items", 0)))
    history = [int(i) for i in history_items if 0 < int(i) <= n_items]
    times = [int(t) for t in (history_times if history_times is not None else [0] * len(history_items))]
    if len(times) != len(history_items):
        raise ValueError("history_times must have one entry per history item")
    times = [t for i, t in zip(history_items, times) if 0 < int(i) <= n_items]
    max_len = _max_len(model, meta) or max(len(history), 1)
    window, window_times = history[-max_len:], times[-max_len:]
    pad = max_len - len(window)
    now = int(time.time()) if at_time is None else int(at_time)
    batch = Batch(
        items=torch.tensor([[0] * pad + window], dtype=torch.long),  # (1, L) left-padded
        times=torch.tensor([[0] * pad + window_times], dtype=torch.long),  # (1, L)
        users=torch.tensor([int(user_index)], dtype=torch.long),  # (1,)
        next_time=torch.tensor([now], dtype=torch.long),  # (1,)
    )
    model.eval()
    scores = model.score(batch)[0].float().cpu().clone()  # (n_items + 1,)
    scores = torch.nan_to_num(scores, nan=float("-inf"))  # topk would rank NaN first
    scores[0] = float("-inf")
    if history:
        scores[torch.tensor(sorted(set(history)), dtype=torch.long)] = float("-inf")
    allowed = int((scores > float("-inf")).sum())
    if allowed == 0:
        return []
    values, indices = torch.topk(scores, min(k, allowed))
    return [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist())]
