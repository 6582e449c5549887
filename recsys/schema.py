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


def mapping_problem(mapping: dict) -> str | None:
    """What is wrong with a {canonical column: source column} mapping (`ingest.column_mapping`, `recsys data
    import table --column`), or None: each key a canonical column, each value a column name, no source
    column read as two canonical ones."""
    unknown = sorted(str(c) for c in mapping if c not in CANONICAL_COLUMNS)
    if unknown:
        return f"{unknown} are not canonical columns (those are {', '.join(CANONICAL_COLUMNS)})"
    nameless = sorted(c for c, source in mapping.items() if not isinstance(source, str) or not source.strip())
    if nameless:
        return f"{nameless} must each name a source column (a non-empty string)"
    sources = list(mapping.values())
    repeated = sorted({s for s in sources if sources.count(s) > 1})
    if repeated:
        shared = {s: sorted(c for c, source in mapping.items() if source == s) for s in repeated}
        return f"one source column cannot be two canonical ones: {shared}"
    return None


def mapping_misfit(columns: list[str], mapping: dict[str, str]) -> str | None:
    """What keeps a checked mapping from applying to a file with these columns, or None: a source column
    the file lacks, or a canonical name the file already has as a column of its own that the mapping does
    not rename away (`--column user_id=item_id` would leave two user_id columns and no item_id)."""
    absent = {c: s for c, s in mapping.items() if s not in columns}
    if absent:
        return f"column mapping {absent} names column(s) not in the file (columns are {columns})"
    kept = set(columns) - set(mapping.values())
    clashes = {c: s for c, s in mapping.items() if c in kept}
    if clashes:
        names = ", ".join(sorted(clashes))
        return (f"column mapping {clashes} renames a column to {names}, which the file already has as a "
                f"column of its own (columns are {columns}): map that column too, or name another source")
    return None

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
