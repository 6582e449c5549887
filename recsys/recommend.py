"""Serving: top-k next items for one user, scored by any model's `score(batch)`.

`recommend` works in the *model's* ids (index into the checkpoint's `items.json`/`users.json`);
`recommend_for_user` maps a raw user id's history from the prepared dataset to them, because the champion may
have been trained on an older dataset version than the one the history comes from. `describe_champion` is
what the pipeline prints at the end. The CLI (`recsys recommend`) and the flows call these.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
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


class RecommendError(ValueError):
    """The request cannot be served (unknown user, missing prepared data, bad time); says why."""


@dataclass(frozen=True)
class Recommendation:
    rank: int
    item_id: str
    title: str | None
    score: float


def parse_time(value: str) -> int:
    """ISO-8601 → UTC seconds; a time without a zone is taken as UTC."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise RecommendError(f"--at {value!r} is not an ISO-8601 time (e.g. 2024-05-01T12:00:00Z)") from err
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp())


def recommend_for_user(
    model: Any,
    meta: dict[str, Any],
    checkpoint_dir: Path,
    prepared_dir: Path,
    user_id: str,
    k: int,
    at_time: int | None,
) -> list[Recommendation]:
    import pandas as pd

    try:
        events = pd.read_parquet(prepared_dir / "events.parquet", columns=["user", "item", "timestamp"])
        items = pd.read_parquet(prepared_dir / "items.parquet")
        users = pd.read_parquet(prepared_dir / "users.parquet")
    except (FileNotFoundError, OSError) as err:
        raise RecommendError(
            f"prepared dataset not found under {prepared_dir} ({err}); run `dvc repro prepare` first"
        ) from err
    match = users.loc[users["user_id"].astype(str) == str(user_id), "user"]
    if match.empty:
        raise RecommendError(f"unknown user {user_id!r}: not in {prepared_dir / 'users.parquet'}")
    history = events[events["user"] == int(match.iloc[0])]  # already in stable time order
    if at_time is not None:
        history = history[history["timestamp"] <= at_time]

    raw_of_dataset_item = dict(zip(items["item"].astype(int), items["item_id"].astype(str)))
    titles: dict[str, str] = {}
    if "title" in items.columns:
        titles = {
            str(i): str(t) for i, t in zip(items["item_id"], items["title"]) if t is not None and t == t
        }
    model_items: list[Any] = json.loads((checkpoint_dir / "items.json").read_text())
    model_users: list[Any] = json.loads((checkpoint_dir / "users.json").read_text())
    index_of_raw = {str(raw): i for i, raw in enumerate(model_items) if raw is not None}
    user_index = {str(raw): i for i, raw in enumerate(model_users) if raw is not None}.get(str(user_id), 0)

    history_items: list[int] = []
    history_times: list[int] = []
    for item, ts in zip(history["item"].astype(int), history["timestamp"].astype("int64")):
        index = index_of_raw.get(raw_of_dataset_item.get(int(item), ""))
        if index is not None:  # items the champion never saw cannot be fed to it
            history_items.append(index)
            history_times.append(int(ts))
    ranked = recommend(model, meta, history_items, k, at_time, history_times=history_times,
                       user_index=user_index)
    out = []
    for rank, (index, score) in enumerate(ranked, start=1):
        raw = str(model_items[index])
        out.append(Recommendation(rank, raw, titles.get(raw), score))
    return out


def gate_metric(decision: dict[str, Any] | None, champion_version: int) -> float | None:
    """The champion's metric as the gate last measured it on the current test set: the candidate's own
    value when it was just promoted, the re-scored champion's when the candidate was refused."""
    if not decision:
        return None
    if decision.get("promoted") and decision.get("version") == champion_version:
        return decision.get("candidate_metric")
    if decision.get("baseline_kind") == "champion" and decision.get("baseline_version") == champion_version:
        return decision.get("baseline_metric")
    return None


def describe_champion(repo_root: Path, decision: dict[str, Any] | None = None, k: int = 5) -> str:
    """A few lines for people: the champion, its NDCG@10 as the gate used it, what it recommends to one user."""
    from recsys.config import load_params
    from recsys.layout import Layout
    from recsys.prepare import load
    from recsys.registry import open_registry

    paths = Layout(repo_root)
    params = load_params(paths.params)
    with open_registry(params.registry, paths.root, params.gate) as registry:
        version = registry.champion_version()
        if version is None:
            return "no champion yet"
        info = registry.get_version(version)
        model, meta = registry.load_champion()
        user = str(load(paths.prepared).users["user_id"].iloc[0])
        recs = recommend_for_user(model, meta, registry.champion_dir(), paths.prepared, user, k, None)
    metric = (decision or {}).get("metric") or "ndcg@10"
    used = gate_metric(decision, version)
    if used is not None:
        measured = f"{metric} = {used:.4f} (on the current test set, as the gate used it)"
    else:
        measured = f"{metric} = {info.metrics.get(metric, float('nan')):.4f} (recorded when it was registered)"
    lines = [f"champion: version {version} ({info.architecture}), test {measured}", f"top-{k} for user {user}:"]
    lines += [f"  {r.rank}. {r.item_id}  {r.title or ''}  (score {r.score:.3f})" for r in recs]
    return "\n".join(lines)
