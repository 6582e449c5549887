"""Whether a model may have learnt events today's split holds out — the one question a warm source
(recsys/warm_source.py, recsys/warm.py) and the gate's yardstick (recsys/promotion.py) both ask of a champion
before trusting it. Two ways it may have: it was trained under other split settings (`split_otherwise`: the
rule, the k-core thresholds, global_time's quantiles), or — same settings, global_time — events that arrived
late, with older times, moved today's quantile cut to or before its newest training event (`late_data_leak`).

No pandas, no torch: the train stage, the gate and the warm-source resolver all import it.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from recsys.config import PrepareConfig


def split_otherwise(version: Any, prepare: PrepareConfig | None) -> str | None:
    """How the split settings a registry version recorded (its params' "prepare", `model_params`) differ from
    `prepare`'s ("prepare.split loo, now global_time"), or None when they match or either is unknown. A
    version trained under other ones may have learnt events today's split validates and tests on: it is
    never a warm source (recsys/warm_source.py) nor the gate's yardstick (recsys/promotion.py)."""
    recorded = (version.params or {}).get("prepare")
    if prepare is None or not isinstance(recorded, dict):
        return None
    ours = _split_settings(prepare)
    try:
        theirs = _split_settings(PrepareConfig(**recorded))
    except (TypeError, ValueError):  # recorded by another recsys version: today's keys, as a split reads them
        known = {f.name for f in dataclasses.fields(prepare)}
        theirs = {k: v for k, v in recorded.items() if k in known}
        if theirs.get("split") == "loo":
            theirs = {k: v for k, v in theirs.items() if k in ours or k == "split"}
    changed = ["split"] if theirs.get("split") != ours.get("split") else sorted(
        k for k in ours.keys() | theirs.keys() if theirs.get(k) != ours.get(k))
    return "; ".join(f"prepare.{k} {theirs.get(k)}, now {ours.get(k)}" for k in changed) or None


def late_data_leak(train_until: Any, held_out_from: float | None) -> str | None:
    """Why weights trained on events up to `train_until` (a checkpoint's, Unix seconds) may have learnt today's
    held-out events — today's global_time cut `held_out_from` is at or before it: late-arriving events moved
    the quantile earlier — or None (no cut today, loo; or a checkpoint that did not record its events' end)."""
    if held_out_from is None or not isinstance(train_until, (int, float)) or train_until < held_out_from:
        return None
    return (f"trained on events up to {_utc(train_until)}, and today's split holds out every event from "
            f"{_utc(held_out_from)} (events that arrived late moved the prepare.valid_quantile cut earlier): it "
            "may have learnt today's validation and test events")


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _split_settings(prepare: PrepareConfig) -> dict[str, Any]:
    """The settings that decide which events a split puts in training (the quantiles only under global_time):
    runs with equal ones train on the same events of the same data."""
    settings = dataclasses.asdict(prepare)
    if prepare.split == "loo":
        del settings["valid_quantile"], settings["test_quantile"]
    return settings
