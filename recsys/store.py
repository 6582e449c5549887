"""The raw interaction store: `data/interactions/part-*.parquet`, tracked as a whole by `data.dvc`.

Parts are immutable once written. Readers see them in file-name order (then row order), which makes the
concatenation deterministic; the generated seed part is named so that it sorts first, and ingested parts
carry their arrival number so that they sort in the order they were committed. A part only becomes
visible under its final name after it is fully on disk (`write_part` is atomic), so a reader never sees a
half-written file.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys.schema import ARROW_SCHEMA, REQUIRED_COLUMNS
from recsys.atomic import fsync_dir
from recsys.entry import first_line
from recsys.faults import fault_point

log = logging.getLogger(__name__)

INTERACTIONS_DIR = "interactions"
PART_GLOB = "part-*.parquet"
TMP_PREFIX = ".tmp-"
_ARRIVAL = re.compile(r"part-(\d{8})-[0-9a-f]{16}\.parquet$")


class StoreError(RuntimeError):
    """The store on disk is unreadable or a part would be overwritten."""


def interactions_dir(store_dir: str | Path) -> Path:
    return Path(store_dir) / INTERACTIONS_DIR


def part_name(batch_sha256: str, arrival: int) -> str:
    """`part-<arrival>-<batch hash>.parquet`: the file-name order readers use is the order batches were
    committed in (so events that tie on timestamp across batches keep their arrival order), and the hash
    ties the part to its batch."""
    return f"part-{arrival:08d}-{batch_sha256[:16]}.parquet"


def next_arrival(store_dir: str | Path) -> int:
    """One more than the highest arrival number among the parts (1 for a store with only a seed part)."""
    numbers = [int(m.group(1)) for p in list_parts(store_dir) if (m := _ARRIVAL.match(p.name))]
    return max(numbers, default=0) + 1


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
            raise StoreError(f"cannot read store part {path} ({first_line(err)}); put the data "
                             "version back with `dvc checkout data.dvc` (or `dvc pull data.dvc`), then run again"
                             ) from err
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


def write_part(
    store_dir: str | Path, name: str, frame: pd.DataFrame | pa.Table, tmp_dir: str | Path | None = None
) -> Path:
    """Write one immutable part atomically: temp file, fsync, rename, fsync dir.

    The temp file lives in `tmp_dir` (ingest passes its scratch folder, so a crash never leaves anything in
    the DVC-tracked store; it must be on the same file system) or else beside the part. It is created with
    mode 0666 minus the umask, like any file, and removed if anything fails. Refuses to overwrite an
    existing part (parts are immutable; the caller decides what an existing part means).
    """
    directory = interactions_dir(store_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    if target.exists():
        raise StoreError(f"store part {target} already exists; parts are immutable")
    table = frame if isinstance(frame, pa.Table) else to_arrow(frame)
    scratch = Path(tmp_dir) if tmp_dir is not None else directory
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = scratch / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{name}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            os.fsync(handle.fileno())
        fault_point("part_temp_written")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    log.debug("wrote store part %s (%d rows)", target, table.num_rows)  # callers say what they wrote
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
