"""Reading and decoding a batch file (CSV, Parquet, JSON lines) into a frame with the canonical column names.

Values are not converted here (that is `recsys.ingest.canonical`): CSV values stay strings (ids like "007"
keep their zeros); Parquet and JSON keep their own types, except that timestamps (Parquet's, or ISO strings in
JSON) become UTC seconds and integers of any width become int64.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from recsys.config import IngestConfig
from recsys.ingest.canonical import CANONICAL
from recsys.ingest.errors import BatchRejected
from recsys.schema import OPTIONAL_COLUMNS, RATING, mapping_misfit

READERS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def read_batch(path: Path, config: IngestConfig) -> pd.DataFrame:
    """The batch as read, column-mapped, with exactly the canonical columns (optional ones added as nulls).

    CSV values stay strings (ids like "007" keep their zeros); Parquet/JSON keep their own types and the
    schema suite decides whether those are acceptable. Parquet timestamps become UTC seconds here.
    """
    frame = map_columns(read_file(path), config, path.name)
    nested = nested_value(frame)
    if nested:
        raise BatchRejected(f"{path.name}: {nested}")
    return frame


def nested_value(frame: pd.DataFrame) -> str | None:
    """Where a canonical column holds a list or an object (JSON `[…]` or `{…}`, a Parquet list or struct)
    instead of one string or number; the schema suite could only call its type "None"."""
    for name in CANONICAL:
        if name not in frame.columns or frame[name].dtype != object:
            continue
        present = np.flatnonzero(frame[name].notna().to_numpy())
        if not len(present):
            continue
        # An Arrow column has one type, so its first value tells whether all of them are nested.
        value = frame[name].iloc[present[0]]
        if isinstance(value, (dict, list, tuple, np.ndarray)):
            kind = "an object" if isinstance(value, dict) else "a list"
            shown = repr(value.tolist() if isinstance(value, np.ndarray) else value)
            shown = shown if len(shown) <= 60 else shown[:59] + "…"
            return (f"column {name!r} holds {kind} ({shown}, data row {present[0] + 1}) where one string or "
                    "number is expected; write one value per field")
    return None


def read_file(path: Path) -> pd.DataFrame:
    """A CSV, Parquet or JSON-lines file decoded as it is (no renaming, no conversion); also what
    `recsys data import table` reads, so both paths see the same values."""
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise BatchRejected(
            f"{path.name}: unknown file type {path.suffix!r}; expected one of {sorted(READERS)}"
        )
    if path.stat().st_size == 0:
        raise BatchRejected(f"{path.name} is empty (0 bytes)")
    table = {"csv": _read_csv, "parquet": _read_parquet, "jsonl": _read_jsonl}[kind](path)
    names = table.column_names
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise BatchRejected(f"{path.name}: duplicate column name(s) {duplicated}")
    return _to_pandas(table)


def _decode_utf8(path: Path) -> bytes:
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        snippet = data[err.start : err.start + 4]
        raise BatchRejected(
            f"{path.name} is not valid UTF-8 (byte {err.start}, line {line}: {snippet!r}); "
            "re-export it as UTF-8"
        ) from err
    return data


def _read_csv(path: Path) -> pa.Table:
    data = _decode_utf8(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    header_line = data.split(b"\n", 1)[0].decode("utf-8").rstrip("\r")
    try:
        header = next(csv.reader([header_line]))
    except (csv.Error, StopIteration) as err:
        raise BatchRejected(f"{path.name}: malformed CSV header: {err}") from err
    if not header or all(not h.strip() for h in header):
        raise BatchRejected(f"{path.name}: the CSV header is empty")
    try:
        return pacsv.read_csv(
            io.BytesIO(data),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.string() for name in header},
                null_values=[""],
                strings_can_be_null=True,
            ),
        )
    except pa.ArrowException as err:
        raise BatchRejected(f"{path.name}: malformed CSV: {_arrow_message(err)}") from err


def _read_parquet(path: Path) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise BatchRejected(f"{path.name}: cannot read Parquet (truncated or corrupt?): {err}") from err
    return _uniform_types(table, path.name)


# What pandas' `to_parquet` writes for an index without a name that is not a plain range (a filtered or
# sorted frame): a column of its own, which `_uniform_types` drops as pandas' own reader would.
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")
_INT64_MAX = 2**63 - 1


def _uniform_types(table: pa.Table, source: str) -> pa.Table:
    """The Parquet and JSON readers' types made uniform, so every reader hands the same value to the
    canonicaliser and the schema suite sees the types it lists: timestamp and date columns (Parquet's own, or
    ISO strings pyarrow's JSON reader inferred) as UTC epoch seconds, integers of any width or sign as int64
    (a uint32 id is the same id as an int64 one; `recsys data import table` took them, ingest refused them),
    dictionary columns decoded, and pandas' unnamed index columns dropped."""
    index = (table.schema.pandas_metadata or {}).get("index_columns") or []
    dropped = {name for name in index if isinstance(name, str) and _PANDAS_INDEX.fullmatch(name)}
    names, columns = [], []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in dropped:
            continue
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_timestamp(column.type):
            # Naive timestamps are taken as UTC; sub-second precision is truncated to whole seconds.
            column = column.cast(pa.timestamp("s", tz="UTC"), safe=False).cast(pa.int64())
        elif pa.types.is_date(column.type):
            column = pc.multiply(column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64()), 86400)
        elif pa.types.is_integer(column.type) and column.type != pa.int64():
            largest = pc.max(column).as_py() if pa.types.is_uint64(column.type) else None
            if largest is not None and largest > _INT64_MAX:
                raise BatchRejected(
                    f"{source}: column {name!r} holds {largest}, above the largest integer ingest reads "
                    f"({_INT64_MAX}); write the column as strings (ids are kept as strings anyway)"
                )
            column = column.cast(pa.int64())
        names.append(name)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=names)


def _read_jsonl(path: Path) -> pa.Table:
    data = _decode_utf8(path)
    if not data.strip():
        raise BatchRejected(f"{path.name} has no JSON lines")
    try:
        table = pajson.read_json(io.BytesIO(data))
    except pa.ArrowException as err:
        raise BatchRejected(f"{path.name}: malformed JSON lines: {_arrow_message(err)}") from err
    return _uniform_types(table, path.name)


def _arrow_message(err: Exception) -> str:
    return str(err).strip().splitlines()[0][:300]


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    for name in frame.columns:
        if isinstance(frame[name].dtype, pd.StringDtype):
            frame[name] = frame[name].astype("string")
    return frame


def map_columns(frame: pd.DataFrame, config: IngestConfig, source: str) -> pd.DataFrame:
    mapping = dict(config.column_mapping or {})  # checked when params.yaml was read (IngestConfig)
    misfit = mapping_misfit(list(frame.columns), mapping)
    if misfit:
        raise BatchRejected(f"{source}: {misfit}")
    renamed = frame.rename(columns={s: c for c, s in mapping.items()})
    if len(set(renamed.columns)) != len(renamed.columns):  # a file with a repeated column name
        raise BatchRejected(f"{source}: after the column mapping, columns clash: {list(renamed.columns)}")
    if config.extra_columns == "drop":
        renamed = renamed[[c for c in renamed.columns if c in CANONICAL]]
    for name in OPTIONAL_COLUMNS:
        if name not in renamed.columns:
            dtype = "float32" if name == RATING else "string"
            renamed[name] = pd.Series(
                pd.NA if dtype == "string" else np.nan, index=renamed.index, dtype=dtype
            )
    ordered = [c for c in CANONICAL if c in renamed.columns] + [
        c for c in renamed.columns if c not in CANONICAL
    ]
    return renamed[ordered]

