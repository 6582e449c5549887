"""The raw interaction store: `data/interactions/part-*.parquet`, tracked as a whole by `data.dvc`.

Parts are immutable once written. Readers see them in file-name order (then row order), which makes the
concatenation deterministic; the generated seed part is named so that it sorts first. A part only becomes
visible under its final name after it is fully on disk (`write_part` is atomic), so a reader never sees a
half-written file.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys.schema import ARROW_SCHEMA, REQUIRED_COLUMNS

log = logging.getLogger(__name__)

INTERACTIONS_DIR = "interactions"
PART_GLOB = "part-*.parquet"
TMP_PREFIX = ".tmp-"


class StoreError(RuntimeError):
    """The store on disk is unreadable or a part would be overwritten."""


def interactions_dir(store_dir: str | Path) -> Path:
    return Path(store_dir) / INTERACTIONS_DIR


def part_name(batch_sha256: str) -> str:
    """Parts are named after the batch content hash, so a re-run of the same batch targets the same file."""
    return f"part-{batch_sha256[:16]}.parquet"


def list_parts(store_dir: str | Path) -> list[Path]:
    """Final (non-temporary) part files, sorted by name."""
    directory = interactions_dir(store_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob(PART_GLOB) if p.is_file())


def to_arrow(frame: pd.DataFrame) -> pa.Table:
    """A canonical frame as an Arrow table with exactly `ARROW_SCHEMA` (missing optional columns are null)."""
    columns = {}
    for field in ARROW_SCHEMA:
        if field.name in frame.columns:
            columns[field.name] = pa.array(frame[field.name], type=field.type, from_pandas=True)
        else:
            columns[field.name] = pa.nulls(len(frame), type=field.type)
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)


def read_store(store_dir: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """All parts concatenated in a stable order (file name, then row order) with the canonical columns.

    `columns` restricts the read to some canonical columns (ingest only needs the event key). An empty or
    missing store gives an empty frame with the canonical columns and dtypes.
    """
    schema = ARROW_SCHEMA if columns is None else pa.schema([ARROW_SCHEMA.field(c) for c in columns])
    tables = []
    for path in list_parts(store_dir):
        try:
            present = set(pq.read_schema(path).names)
            table = pq.read_table(path, columns=[c for c in schema.names if c in present])
        except (OSError, pa.ArrowException) as err:
            raise StoreError(f"cannot read store part {path}: {err}") from err
        for name in schema.names:
            if name in present:
                continue
            # Parts written before an optional column existed get it as nulls.
            if name in REQUIRED_COLUMNS:
                raise StoreError(f"store part {path} lacks required column {name!r}")
            table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
        tables.append(table.select(schema.names).cast(schema))
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table.to_pandas().reset_index(drop=True)


def fsync_dir(directory: str | Path) -> None:
    """Make a rename durable: the directory entry itself has to reach the disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_part(store_dir: str | Path, name: str, frame: pd.DataFrame | pa.Table) -> Path:
    """Write one immutable part atomically: temp file in the same directory, fsync, rename, fsync dir.

    Refuses to overwrite an existing part (parts are immutable; the caller decides what an existing part
    means). The temp file is removed if anything fails, so a crash leaves at most a `.tmp-*` file, which
    `read_store` ignores and `remove_stale_temp_files` cleans.
    """
    directory = interactions_dir(store_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    if target.exists():
        raise StoreError(f"store part {target} already exists; parts are immutable")
    table = frame if isinstance(frame, pa.Table) else to_arrow(frame)
    fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".parquet", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    log.info("wrote store part %s (%d rows)", target, table.num_rows)
    return target


def remove_stale_temp_files(store_dir: str | Path) -> list[Path]:
    """Delete `.tmp-*` leftovers of a crashed write (call only while holding the ingest lock)."""
    directory = interactions_dir(store_dir)
    if not directory.is_dir():
        return []
    stale = sorted(directory.glob(f"{TMP_PREFIX}*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale
