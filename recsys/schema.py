"""The canonical interaction table every reader, the ingest path and `prepare` agree on.

One row per implicit event. `timestamp` is UTC seconds since the epoch. `rating` and `event` are optional
(readers fill them when the source has them). Original order within a source is kept by `seq`, which breaks
timestamp ties stably (77.5 % of MovieLens-1M rows share a (user, second) with another row).
"""

from __future__ import annotations

import pyarrow as pa

USER = "user_id"
ITEM = "item_id"
TIMESTAMP = "timestamp"
RATING = "rating"
EVENT = "event"

REQUIRED_COLUMNS = (USER, ITEM, TIMESTAMP)
OPTIONAL_COLUMNS = (RATING, EVENT)
CANONICAL_COLUMNS = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)  # every column a store part may hold

# Raw ids are strings so that any source (numeric MovieLens ids, UUIDs, SKUs) maps losslessly; `prepare`
# remaps them to dense integers with 0 reserved for padding.
ARROW_SCHEMA = pa.schema(
    [
        pa.field(USER, pa.string(), nullable=False),
        pa.field(ITEM, pa.string(), nullable=False),
        pa.field(TIMESTAMP, pa.int64(), nullable=False),
        pa.field(RATING, pa.float32(), nullable=True),
        pa.field(EVENT, pa.string(), nullable=True),
    ]
)
