"""The canonical form of an interaction: the one place that says what an id, a timestamp, a rating and an
event look like once they are in the store.

Every input path goes through `to_canonical`: ingest batches, `recsys data import table`, the MovieLens
readers and the generator (via `recsys.data.canonical`). So an integer id is "7" whether it arrived as the
integer 7, the float 7.0 (Parquet turns an int column with a null into floats) or the string "7"; a missing
event is null, never the string "nan".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from recsys.validation import PARSE_ERROR
from recsys.schema import (
    CANONICAL_COLUMNS, EVENT, ITEM, OPTIONAL_COLUMNS, RATING, REQUIRED_COLUMNS, TIMESTAMP, USER,
)

CANONICAL = list(CANONICAL_COLUMNS)
KEY = [USER, ITEM, TIMESTAMP]
# Timestamps beyond this are not seconds (milliseconds, garbage) and would overflow int64 arithmetic.
_MAX_SECONDS = 2**53


def to_canonical(raw: pd.DataFrame) -> pd.DataFrame:
    """Canonical columns and dtypes plus `_parse_error` (why a value could not be converted, else null).

    Unconvertible values become null, so they also fail the non-null expectations of the batch suite.
    """
    errors = pd.Series(pd.NA, index=raw.index, dtype="string")
    out: dict[str, pd.Series] = {}

    def note(mask: np.ndarray, message: pd.Series | str) -> None:
        nonlocal errors
        if not mask.any():
            return
        text = message if isinstance(message, str) else message[mask]
        errors = errors.mask(mask & errors.isna().to_numpy(), text)

    for name in (USER, ITEM):
        col, bad = _as_id(raw[name])
        note(bad, raw[name].astype("string").radd(f"{name} is not an integer or string: "))
        out[name] = col
    ts, bad = _as_seconds(raw[TIMESTAMP])
    note(bad, raw[TIMESTAMP].astype("string").radd("timestamp is neither UTC seconds nor ISO-8601: "))
    out[TIMESTAMP] = ts
    rating, bad = _as_rating(raw[RATING])
    note(bad, raw[RATING].astype("string").radd("rating is not a finite number: "))
    out[RATING] = rating
    event = raw[EVENT]
    out[EVENT] = event if isinstance(event.dtype, pd.StringDtype) else event.astype("string")
    frame = pd.DataFrame(out, index=raw.index)
    frame[PARSE_ERROR] = errors
    return frame


def _as_id(col: pd.Series) -> tuple[pd.Series, np.ndarray]:
    bad = np.zeros(len(col), dtype=bool)
    if pd.api.types.is_bool_dtype(col.dtype):
        return pd.Series(pd.NA, index=col.index, dtype="string"), col.notna().to_numpy()
    if pd.api.types.is_integer_dtype(col.dtype):
        out = col.astype("string")
    elif pd.api.types.is_float_dtype(col.dtype):
        values = col.to_numpy(dtype=float, na_value=np.nan)
        integral = np.isfinite(values) & (np.floor(values) == values) & (np.abs(values) < _MAX_SECONDS)
        bad = ~np.isnan(values) & ~integral
        out = pd.Series(pd.NA, index=col.index, dtype="string")
        out[integral] = pd.Series(values[integral].astype(np.int64), index=col.index[integral]).astype(
            "string"
        )
    else:
        out = col.astype("string")
    # An empty or blank id is a missing id.
    blank = out.str.strip().fillna("") == ""
    return out.mask(blank), bad


def _as_seconds(col: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """Integer UTC seconds from integers, integral floats, numeric strings or ISO-8601 strings."""
    n = len(col)
    seconds = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=bool)
    present = col.notna().to_numpy()
    if pd.api.types.is_datetime64_any_dtype(col.dtype):
        # A datetime column handed over by pandas (naive = UTC), truncated to whole seconds.
        utc = col.dt.tz_localize("UTC") if col.dt.tz is None else col.dt.tz_convert("UTC")
        seconds[present] = utc[present].astype("datetime64[s, UTC]").astype("int64").to_numpy()
        ok = present.copy()
    elif pd.api.types.is_integer_dtype(col.dtype):
        seconds[present] = col[present].to_numpy(dtype=np.int64)
        ok = present.copy()
    else:
        numeric = pd.to_numeric(col, errors="coerce") if not pd.api.types.is_float_dtype(col.dtype) else col
        values = numeric.to_numpy(dtype=float, na_value=np.nan)
        integral = np.isfinite(values) & (np.floor(values) == values) & (np.abs(values) < _MAX_SECONDS)
        seconds[integral] = values[integral].astype(np.int64)
        ok |= integral
        is_text = present & np.isnan(values)
        if is_text.any() and not pd.api.types.is_float_dtype(col.dtype):
            parsed = pd.to_datetime(col[is_text], utc=True, errors="coerce", format="ISO8601")
            good = parsed.notna().to_numpy()
            idx = np.flatnonzero(is_text)[good]
            seconds[idx] = parsed[good].astype("datetime64[s, UTC]").astype("int64").to_numpy()
            ok[idx] = True
    out = pd.Series(seconds, index=col.index, dtype="Int64").mask(~ok)
    return out, present & ~ok


def _as_rating(col: pd.Series) -> tuple[pd.Series, np.ndarray]:
    present = col.notna().to_numpy()
    numeric = (
        col
        if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype)
        else (pd.to_numeric(col.astype("string"), errors="coerce"))
    )
    values = numeric.to_numpy(dtype=float, na_value=np.nan)
    finite = np.isfinite(values)
    return pd.Series(np.where(finite, values, np.nan).astype(np.float32), index=col.index), present & ~finite
