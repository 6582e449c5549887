"""Whether a model trained under today's split settings may still have learnt events today's global_time split
holds out: today's quantile cut moved to or before its newest training event (`late_data_leak`) — events that
arrived late with older times, or ones the k-core filter re-admitted, move it. The train stage asks it of a warm
source (against the validation cut: validation picks the epoch) and the gate of its yardstick (against the test
cut: only test events decide). The other way, other split settings, is `recsys.lineage.split_otherwise`, kept
apart so that editing it re-runs no `train@` stage (this module is one of their dependencies).

No pandas, no torch.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any


def late_data_leak(train_until: Any, cut: float | None, held_out: str = "validation and test") -> str | None:
    """Why weights trained on events up to `train_until` (a checkpoint's, Unix seconds) may have learnt today's
    `held_out` events — every event from today's global_time `cut` on is one, and `train_until` is at or after
    it — or None (no cut today: loo; a checkpoint that did not record its events' end; or it ends before)."""
    if cut is None or not isinstance(train_until, (int, float)) or train_until < cut:
        return None
    return (f"trained on events up to {_utc(train_until)}, and today's split holds out every event from "
            f"{_utc(math.ceil(cut))} (today's prepare quantile cut is earlier than the one it trained under: "
            f"events that arrived late, or that the k-core filter re-admitted, move it): it may have learnt "
            f"today's {held_out} events")


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def weights_until(own: int | None, init: dict[str, Any] | None) -> int | None:
    """The newest event a checkpoint's weights have seen, what it records as `train_until`: its own training
    data's newest event, or its warm source's when later (a warm start carries the source's knowledge; its
    `init` record holds the source's as `from_train_until`)."""
    times = [t for t in (own, (init or {}).get("from_train_until")) if isinstance(t, (int, float))]
    return int(max(times)) if times else None
