"""Calendar features of UTC timestamps, computed with integer tensor ops (MOJITO's seven time contexts), and
their learnable periodic encoding (`MercerTimeEncoding`).

MOJITO (Tran et al., SIGIR 2023) describes every event by year, month, day of month, day of week, day of
year, ISO week and hour, all taken from the UTC timestamp (its reference code uses pandas' `dt.year`, ...,
`dt.week`, with the year rebased so the first year is 1 and the day of week shifted to 1..7). Computing them
here, on the (B, L) int64 tensors the model already receives, keeps them exact (no float rounding, no
timezone library) and vectorised, and needs no lookup table that a checkpoint would have to carry.

The Gregorian conversion is Howard Hinnant's `civil_from_days` (public-domain date algorithms), written
with floor division so timestamps before 1970 are right too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SECONDS_PER_DAY = 86_400
N_TIME_FEATURES = 7
FEATURE_NAMES = ("year", "month", "day", "dayofweek", "dayofyear", "week", "hour")
# The largest value of each feature (the year has none: it counts from `base_year`). Every feature is >= 0,
# padding's included (callers zero it), so a bounded feature indexes a table of max + 1 encodings.
FEATURE_MAX = (None, 12, 31, 7, 366, 53, 23)


def _floordiv(a: torch.Tensor, b: int) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


def _days_from_civil_jan1(year: torch.Tensor) -> torch.Tensor:
    """Days since 1970-01-01 of 1 January of `year` (Hinnant's days_from_civil with m=1, d=1)."""
    y = year - 1  # January counts in the previous March-based year
    era = _floordiv(y, 400)
    yoe = y - era * 400  # [0, 399]
    doe = yoe * 365 + _floordiv(yoe, 4) - _floordiv(yoe, 100) + 306  # 306 = day of 1 Jan in a March year
    return era * 146_097 + doe - 719_468


def _iso_weeks_in_year(year: torch.Tensor) -> torch.Tensor:
    """52 or 53: a year has 53 ISO weeks when it starts on a Thursday, or on a Wednesday in a leap year."""

    def p(y: torch.Tensor) -> torch.Tensor:
        return (y + _floordiv(y, 4) - _floordiv(y, 100) + _floordiv(y, 400)) % 7

    return 52 + ((p(year) == 4) | (p(year - 1) == 3)).long()


def time_features(timestamps: torch.Tensor, base_year: int = 2000) -> torch.Tensor:
    """(...,) int64 UTC seconds → (..., 7) int64 features, in the order of `FEATURE_NAMES`:

    year - base_year + 1, month 1..12, day 1..31, day of week 1..7 (Monday = 1), day of year 1..366,
    ISO-8601 week 1..53, hour 0..23. Callers zero the features of padding positions themselves.
    """
    ts = timestamps.long()
    days = _floordiv(ts, SECONDS_PER_DAY)
    hour = _floordiv(ts - days * SECONDS_PER_DAY, 3600)

    # civil_from_days: shift the epoch to 0000-03-01 so the leap day is the last day of the year.
    z = days + 719_468
    era = _floordiv(z, 146_097)
    doe = z - era * 146_097  # [0, 146096]
    yoe = _floordiv(doe - _floordiv(doe, 1460) + _floordiv(doe, 36_524) - _floordiv(doe, 146_096), 365)
    doy_march = doe - (365 * yoe + _floordiv(yoe, 4) - _floordiv(yoe, 100))  # [0, 365]
    mp = _floordiv(5 * doy_march + 2, 153)  # [0, 11], March = 0
    day = doy_march - _floordiv(153 * mp + 2, 5) + 1
    month = torch.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2).long()

    dayofweek = (days + 3) % 7 + 1  # 1970-01-01 was a Thursday (ISO 4)
    dayofyear = days - _days_from_civil_jan1(year) + 1

    # ISO week: the week holding the year's first Thursday is week 1.
    week = _floordiv(dayofyear - dayofweek + 10, 7)
    week = torch.where(week > _iso_weeks_in_year(year), torch.ones_like(week), week)
    week = torch.where(week < 1, _iso_weeks_in_year(year - 1), week)  # late December of the previous year

    return torch.stack([year - base_year + 1, month, day, dayofweek, dayofyear, week, hour], dim=-1)


class MercerTimeEncoding(nn.Module):
    """Learnable periodic encodings of F scalar features: (..., F) → (..., F * time_dim).

    For each feature and each of `time_dim` output units: Σ_k [sin, cos](x·k/10^p)·w + b, k = 1..expand.
    `bounds[f]`: feature f's largest value when its values are the integers 0..bound (calendar features),
    None when unbounded (the year).
    """

    def __init__(self, n_features: int, time_dim: int, expand: int, linspace: float,
                 bounds: tuple[int | None, ...] | None = None):
        super().__init__()
        bounds = tuple(bounds) if bounds is not None else (None,) * n_features
        if len(bounds) != n_features:
            raise ValueError(f"bounds has {len(bounds)} entries for {n_features} features")
        init = torch.linspace(0.0, linspace, time_dim).expand(n_features, time_dim)
        self.log_period = nn.Parameter(init.clone())  # (F, T)
        self.basis = nn.Parameter(torch.empty(n_features, time_dim, 2 * expand))  # (F, T, 2K)
        self.bias = nn.Parameter(torch.zeros(n_features, time_dim))  # (F, T)
        nn.init.xavier_uniform_(self.basis.view(-1, 2 * expand))
        self.register_buffer("harmonics", torch.arange(1, expand + 1, dtype=torch.float32), persistent=False)
        # Feature indices as buffers on the module's device, never Python lists: indexing a CUDA tensor with a
        # list copies the list to the device and waits for the copy (and a CUDA graph cannot hold that).
        bounded = [f for f, b in enumerate(bounds) if b is not None]
        direct = [f for f, b in enumerate(bounds) if b is None]
        self.register_buffer("features", torch.arange(n_features), persistent=False)
        self.register_buffer("bounded", torch.tensor(bounded, dtype=torch.long), persistent=False)
        self.register_buffer("direct", torch.tensor(direct, dtype=torch.long), persistent=False)
        size = max((b for b in bounds if b is not None), default=0) + 1
        # Row offsets of each bounded feature in the flattened (len(bounded) · size, T) table.
        self.register_buffer("table_offset", torch.arange(len(bounded)) * size, persistent=False)
        self.register_buffer("table_values", torch.arange(size, dtype=torch.float32), persistent=False)
        stacked = direct + bounded  # the table path's feature order, put back by `order`
        order = None if stacked == list(range(n_features)) else [stacked.index(f) for f in range(n_features)]
        self.register_buffer("order", None if order is None else torch.tensor(order), persistent=False)
        self.method = "auto"  # "unique" | "table" | "auto": unique on a CPU, table elsewhere (forward)

    def _encode(self, values: torch.Tensor, features: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
        """values (N, G) of the G features `features` → (N, G, T): each value encoded by its feature's basis."""
        angle = values[:, :, None, None] * freq.index_select(0, features)[:, :, None] * self.harmonics  # (N,G,T,K)
        enc = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)  # (N, G, T, 2K)
        return (enc * self.basis.index_select(0, features)).sum(-1) + self.bias.index_select(0, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A calendar feature takes few values (12 months, 24 hours, ...): each value is encoded once and
        # gathered, instead of sin/cos over every (event, feature, unit, harmonic). Which values: on a CPU the
        # batch's distinct ones (`unique`: the fewest sin/cos, 2–3 × faster there); elsewhere every value a
        # bounded feature can take (`table`: fixed shapes, so nothing waits for the device and a CUDA graph
        # can hold it), the unbounded year encoded directly. Same encodings either way (tested).
        method = self.method if self.method != "auto" else ("unique" if x.device.type == "cpu" else "table")
        n_features = x.shape[-1]
        flat = x.reshape(-1, n_features)
        freq = 10.0 ** (-self.log_period)  # (F, T)
        if method == "unique":
            columns = []
            for f in range(n_features):
                values, inverse = torch.unique(flat[:, f], return_inverse=True)  # (U,), (N,)
                columns.append(self._encode(values[:, None], self.features[f : f + 1], freq)[inverse, 0])  # (N, T)
            return torch.cat(columns, dim=-1).view(*x.shape[:-1], -1)  # (..., F * T)
        parts = []
        if len(self.direct):
            parts.append(self._encode(flat.index_select(1, self.direct), self.direct, freq))  # (N, G', T)
        if len(self.bounded):
            values = self.table_values[None, :].expand(len(self.bounded), -1)  # (G, V)
            table = self._encode(values.T, self.bounded, freq).transpose(0, 1)  # (G, V, T)
            index = flat.index_select(1, self.bounded).long() + self.table_offset  # (N, G)
            parts.append(F.embedding(index, table.flatten(0, 1)))  # (N, G, T)
        out = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]  # features in direct + bounded order
        if self.order is not None:
            out = out.index_select(1, self.order)
        return out.reshape(*x.shape[:-1], -1)  # (..., F * T)
