"""Ingest interaction batches into the DVC-versioned raw store, exactly once.

One batch = one file (CSV, Parquet or JSON lines) in the inbox. Its identity is the sha256 of its bytes.
For each batch, under an exclusive lock on the repository:

1. read it (column mapping applied), validate the schema (GX suite `interactions_schema`) — reject on
   failure;
2. convert to the canonical types, validate the whole batch (GX `interactions_batch`: row count, per-row
   rules with a tolerance, unseen users/items) — reject on failure or when the bad-row share exceeds
   `ingest.max_bad_row_share`;
3. send failing rows to `quarantine/` (with a reason per row), drop duplicate events (within the batch and
   against the store), validate the rows to append strictly (GX `interactions_store`);
4. commit: journal → part file (atomic) → `dvc add data` → manifest line → remove journal → dvc push.

A rejected batch changes nothing in the store, the manifest or `data.dvc`; it only leaves a report.
A crash anywhere in step 4 is completed (or rolled back, if the part never appeared) by the next run,
because the journal in `.ingest/pending/` says what was being committed. `fault_point` lets tests kill the
process at each step (`RECSYS_FAULT=<name>`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from recsys import store as raw_store
from recsys import validation, workspace
from recsys.workspace import FAULT_ENV, STATE_DIR, fault_point, run_dvc, workspace_lock  # noqa: F401 (re-exported for tests)
from recsys.config import IngestConfig
from recsys.schema import EVENT, ITEM, OPTIONAL_COLUMNS, RATING, REQUIRED_COLUMNS, TIMESTAMP, USER

log = logging.getLogger(__name__)

CANONICAL = [*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS]
KEY = [USER, ITEM, TIMESTAMP]
FAULT_POINTS = ("after_journal", "after_part_write", "after_dvc_add", "after_manifest")
READERS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
# Timestamps beyond this are not seconds (milliseconds, garbage) and would overflow int64 arithmetic.
_MAX_SECONDS = 2**53

Status = Literal["ingested", "duplicate_batch", "rejected"]


class IngestError(Exception):
    """Ingest could not run (environment, DVC, configuration). The message says what and what to do."""


class BatchRejected(IngestError):
    """This batch is bad as a whole; nothing was changed."""

    def __init__(self, message: str, validations: Sequence[validation.SuiteResult] = (), **details: Any):
        super().__init__(message)
        self.validations = list(validations)
        self.details = details


@dataclass(frozen=True)
class IngestSummary:
    batch_sha256: str | None
    source: str
    status: Status
    rows_in: int
    rows_accepted: int
    rows_quarantined: int
    rows_duplicate: int
    part_file: str | None
    data_version: str | None
    report_json: str | None
    report_markdown: str | None
    message: str
    quarantine_file: str | None = None


# ---------------------------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class _Paths:
    root: Path
    inbox: Path
    store: Path
    quarantine: Path
    reports: Path
    manifest: Path
    state: Path

    @property
    def pending(self) -> Path:
        return self.state / "pending"

    @property
    def dvc_file(self) -> Path:
        return self.root / f"{self.store.relative_to(self.root)}.dvc"


def _paths(repo_root: Path, config: IngestConfig, inbox: Path | None = None) -> _Paths:
    root = Path(repo_root).resolve()
    return _Paths(
        root=root,
        inbox=Path(inbox).resolve() if inbox is not None else (root / config.inbox).resolve(),
        store=root / config.store,
        quarantine=root / config.quarantine,
        reports=root / config.reports,
        manifest=root / config.manifest,
        state=root / STATE_DIR,
    )


def _check_inside_inbox(path: Path, inbox: Path) -> Path:
    """Resolve symlinks and `..`; only regular files inside the inbox are accepted."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(inbox):
        raise BatchRejected(f"{path} is outside the inbox {inbox}; copy the file into the inbox first")
    if not resolved.is_file():
        raise BatchRejected(f"{path} does not exist or is not a regular file")
    return resolved


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -------------------------------------------------------------------------------------------- readers


def read_batch(path: Path, config: IngestConfig) -> pd.DataFrame:
    """The batch as read, column-mapped, with exactly the canonical columns (optional ones added as nulls).

    CSV values stay strings (ids like "007" keep their zeros); Parquet/JSON keep their own types and the
    schema suite decides whether those are acceptable. Parquet timestamps become UTC seconds here.
    """
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
    frame = _to_pandas(table)
    return _map_columns(frame, config, path.name)


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
    columns = []
    for column in table.columns:
        if pa.types.is_timestamp(column.type):
            # Naive timestamps are taken as UTC; sub-second precision is truncated to whole seconds.
            column = column.cast(pa.timestamp("s", tz="UTC"), safe=False).cast(pa.int64())
        elif pa.types.is_date(column.type):
            column = pc.multiply(column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64()), 86400)
        elif pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _read_jsonl(path: Path) -> pa.Table:
    data = _decode_utf8(path)
    if not data.strip():
        raise BatchRejected(f"{path.name} has no JSON lines")
    try:
        return pajson.read_json(io.BytesIO(data))
    except pa.ArrowException as err:
        raise BatchRejected(f"{path.name}: malformed JSON lines: {_arrow_message(err)}") from err


def _arrow_message(err: Exception) -> str:
    return str(err).strip().splitlines()[0][:300]


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    for name in frame.columns:
        if isinstance(frame[name].dtype, pd.StringDtype):
            frame[name] = frame[name].astype("string")
    return frame


def _map_columns(frame: pd.DataFrame, config: IngestConfig, source: str) -> pd.DataFrame:
    mapping = dict(config.column_mapping or {})
    unknown = sorted(set(mapping) - set(CANONICAL))
    if unknown:
        raise IngestError(f"ingest.column_mapping: {unknown} are not canonical columns {list(CANONICAL)}")
    missing_sources = {c: s for c, s in mapping.items() if s not in frame.columns}
    if missing_sources:
        raise BatchRejected(
            f"{source}: column mapping {missing_sources} names column(s) not in the file "
            f"(columns are {list(frame.columns)})"
        )
    renamed = frame.rename(columns={s: c for c, s in mapping.items()})
    if len(set(renamed.columns)) != len(renamed.columns):
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


# ---------------------------------------------------------------------------------- canonical typing


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
    frame[validation.PARSE_ERROR] = errors
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
    if pd.api.types.is_integer_dtype(col.dtype):
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


# ----------------------------------------------------------------------------------------- dedup


def dedup_within(frame: pd.DataFrame) -> np.ndarray:
    """Mask of rows to drop so that each (user, item, timestamp) key appears once.

    The survivor of a group is chosen by content (smallest rating, then event), not by position, so the
    kept rows do not depend on the batch's row order. Survivors keep their original relative order.
    """
    has_dup = frame.duplicated(subset=KEY, keep=False).to_numpy()
    drop = np.zeros(len(frame), dtype=bool)
    if not has_dup.any():
        return drop
    sub = frame.loc[has_dup, CANONICAL]
    ordered = sub.sort_values(CANONICAL, kind="stable", na_position="last")
    loser_labels = ordered.index[ordered.duplicated(subset=KEY, keep="first").to_numpy()]
    drop[frame.index.get_indexer(loser_labels)] = True
    return drop


def seen_in_history(frame: pd.DataFrame, history: pd.DataFrame) -> np.ndarray:
    """Rows whose (user, item, timestamp) already is in the store."""
    if history.empty or frame.empty:
        return np.zeros(len(frame), dtype=bool)
    keys = history[KEY].drop_duplicates()
    merged = frame[KEY].merge(keys.assign(_seen=True), on=KEY, how="left", sort=False)
    return merged["_seen"].fillna(False).to_numpy(dtype=bool)


# ------------------------------------------------------------------------------------ lock + manifest


def ingest_lock(paths: _Paths):
    """One writer per workspace (DVC allows no more) — the lock the retrain flow takes too."""
    return workspace_lock(paths.root)


def read_manifest(manifest: Path) -> list[dict[str, Any]]:
    if not manifest.exists():
        return []
    records = []
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise IngestError(
                f"{manifest}:{number} is not valid JSON ({err}); fix or restore it from git"
            ) from err
    return records


def _repair_manifest(manifest: Path) -> None:
    """Drop a torn last line (a crash in the middle of an append); its batch is re-recorded from the
    journal."""
    if not manifest.exists():
        return
    data = manifest.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with open(manifest, "r+b") as handle:
            handle.truncate(cut)
            handle.flush()
            os.fsync(handle.fileno())
        log.warning("removed a torn last line from %s", manifest)


def _append_manifest(manifest: Path, record: dict[str, Any]) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    with open(manifest, "ab") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    raw_store.fsync_dir(manifest.parent)


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    raw_store.fsync_dir(path.parent)


# ------------------------------------------------------------------------------------------------ DVC


def dvc_enabled(root: Path) -> bool:
    """DVC steps run when the repository has been `dvc init`-ed; unit tests without DVC skip them."""
    return (root / ".dvc").is_dir()


def _dvc(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_dvc(root, *args, check=False)


def data_version(paths: _Paths) -> str | None:
    """The md5 recorded in `data.dvc` (for a directory, DVC writes '<md5>.dir')."""
    return workspace.data_version(paths.root, paths.dvc_file.name)


def _dvc_add(paths: _Paths) -> str | None:
    if not dvc_enabled(paths.root):
        return None
    result = _dvc(paths.root, "add", str(paths.store.relative_to(paths.root)))
    if result.returncode != 0:
        raise IngestError(
            f"`dvc add {paths.store.name}` failed: {(result.stderr or result.stdout).strip()[-800:]}"
        )
    return data_version(paths)


def _dvc_push(paths: _Paths) -> str | None:
    """Push the store to the default remote; returns a warning instead of failing (the data is safe locally
    and the next push sends everything that is missing)."""
    if not dvc_enabled(paths.root):
        return None
    result = _dvc(paths.root, "push", paths.dvc_file.name)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()[-400:]
        return f"`dvc push {paths.dvc_file.name}` failed, run it again: {output}"
    return None


# ------------------------------------------------------------------------------------------- recovery


def recover(repo_root: Path, config: IngestConfig) -> list[str]:
    """Finish or roll back commits interrupted by a crash. Takes the ingest lock."""
    paths = _paths(repo_root, config)
    with ingest_lock(paths):
        return _recover(paths)


def _recover(paths: _Paths) -> list[str]:
    actions = []
    raw_store.remove_stale_temp_files(paths.store)
    _repair_manifest(paths.manifest)
    if not paths.pending.is_dir():
        return actions
    recorded = {r["batch_sha256"]: r for r in read_manifest(paths.manifest)}
    for journal in sorted(paths.pending.glob("*.json")):
        entry = json.loads(journal.read_text(encoding="utf-8"))
        record, part = entry["record"], entry["record"]["part_file"]
        sha = record["batch_sha256"]
        part_path = paths.store / raw_store.INTERACTIONS_DIR / part if part else None
        if sha in recorded:
            _write_final_report(entry, recorded[sha]["data_version"])
            action = f"batch {sha[:16]} was already recorded; cleared its journal"
        elif part_path is not None and not part_path.exists():
            action = f"batch {sha[:16]} crashed before its part was written; rolled back"
        else:
            record = _finish_commit(paths, entry)
            action = f"batch {sha[:16]} ({record['source']}) was written but not recorded; completed it"
        journal.unlink()
        raw_store.fsync_dir(paths.pending)
        log.warning("recovery: %s", action)
        actions.append(action)
    return actions


def _finish_commit(paths: _Paths, entry: dict[str, Any]) -> dict[str, Any]:
    """dvc add → manifest line → report. Idempotent, so recovery can re-run it from any point."""
    record = dict(entry["record"])
    record["data_version"] = _dvc_add(paths) if record["part_file"] else data_version(paths)
    fault_point("after_dvc_add")
    _append_manifest(paths.manifest, record)
    fault_point("after_manifest")
    _write_final_report(entry, record["data_version"])
    return record


def _write_final_report(entry: dict[str, Any], version: str | None) -> None:
    report = dict(entry["report"], data_version=version, status="ingested")
    report["message"] = _ingested_message(dict(entry["record"], data_version=version))
    validation.write_report(report, Path(entry["report_json"]), Path(entry["report_markdown"]))


# ---------------------------------------------------------------------------------------------- ingest


def ingest_batches(
    paths: Sequence[str | Path], repo_root: str | Path, config: IngestConfig, inbox: str | Path | None = None
) -> list[IngestSummary]:
    """Ingest each file in turn. A bad batch gives a `rejected` summary (with a report) and changes
    nothing; `IngestError` is raised only when ingest itself cannot run (DVC, configuration)."""
    where = _paths(Path(repo_root), config, Path(inbox) if inbox is not None else None)
    return [_ingest_one(Path(p), where, config) for p in paths]


def ingest_inbox(repo_root: str | Path, config: IngestConfig) -> list[IngestSummary]:
    """Ingest every file now in the inbox (sorted by name); move it to `processed/` or `rejected/`."""
    where = _paths(Path(repo_root), config)
    if not where.inbox.is_dir():
        return []
    files = sorted(
        p for p in where.inbox.iterdir() if not p.name.startswith(".") and (p.is_file() or p.is_symlink())
    )
    summaries = []
    for path in files:
        summary = _ingest_one(path, where, config)
        target = where.inbox / ("rejected" if summary.status == "rejected" else "processed")
        target.mkdir(exist_ok=True)
        os.replace(path, target / path.name)
        summaries.append(summary)
    return summaries


def _ingest_one(path: Path, where: _Paths, config: IngestConfig) -> IngestSummary:
    started = time.time()
    try:
        resolved = _check_inside_inbox(path, where.inbox)
    except BatchRejected as rejection:
        return _rejected(None, path.name, str(rejection), None, None)
    sha = file_sha256(resolved)
    with ingest_lock(where):
        recovered = _recover(where)
        if recovered:
            log.info("recovered %d interrupted commit(s) before ingesting %s", len(recovered), path.name)
        for record in read_manifest(where.manifest):
            if record["batch_sha256"] == sha:
                part = record.get("part_file") or "no new rows"
                message = (
                    f"{path.name}: already ingested as {part} from {record['source']} "
                    f"(data version {record.get('data_version')}); nothing to do"
                )
                return IngestSummary(
                    sha,
                    path.name,
                    "duplicate_batch",
                    record["rows_in"],
                    0,
                    0,
                    0,
                    record.get("part_file"),
                    record.get("data_version"),
                    None,
                    None,
                    message,
                )
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", resolved.stem)[:64]
        report_json = where.reports / f"{stem}-{sha[:16]}.json"
        report_md = where.reports / f"{stem}-{sha[:16]}.md"
        base = {"source": path.name, "batch_sha256": sha, "started_at": _iso(started)}
        try:
            plan = _plan(resolved, where, config)
        except BatchRejected as rejection:
            report = {
                **base,
                "status": "rejected",
                "message": str(rejection),
                **rejection.details,
                "validations": [v.to_dict() for v in rejection.validations],
            }
            validation.write_report(report, report_json, report_md)
            log.warning("rejected %s: %s", path.name, rejection)
            return _rejected(sha, path.name, str(rejection), report_json, report_md, rejection.details)
        return _commit(sha, path.name, plan, where, config, report_json, report_md, base)


@dataclass
class _Plan:
    rows_in: int
    accepted: pd.DataFrame
    quarantined: pd.DataFrame  # raw (mapped) rows + reason
    rows_duplicate: int
    reasons: dict[str, int]
    validations: list[validation.SuiteResult]


def _plan(path: Path, where: _Paths, config: IngestConfig) -> _Plan:
    """Everything up to the commit, with no side effects; raises BatchRejected."""
    raw = read_batch(path, config)
    now = int(time.time())
    history = raw_store.read_store(where.store, columns=KEY)
    parameters = validation.suite_parameters(config, now, has_history=not history.empty)
    schema = validation.run_suite(validation.SCHEMA_SUITE, raw, parameters)
    if not schema.success:
        raise BatchRejected(_schema_message(path.name, schema, config), [schema], rows_in=len(raw))

    typed = to_canonical(raw)
    known_users = pd.Index(history[USER].unique())
    known_items = pd.Index(history[ITEM].unique())
    typed[validation.UNSEEN_USER] = (typed[USER].notna() & ~typed[USER].isin(known_users)).astype(np.int8)
    typed[validation.UNSEEN_ITEM] = (typed[ITEM].notna() & ~typed[ITEM].isin(known_items)).astype(np.int8)
    batch = validation.run_suite(validation.BATCH_SUITE, typed, parameters)
    reasons = validation.row_failures(typed, parameters)
    bad = (reasons != "").to_numpy()
    counts = _group_reasons(reasons[bad])
    bad_share = float(bad.mean()) if len(bad) else 0.0
    details = {"rows_in": len(raw), "rows_bad": int(bad.sum()), "bad_row_share": bad_share, "reasons": counts}
    if not batch.success or bad_share > config.max_bad_row_share:
        raise BatchRejected(_batch_message(path.name, batch, details, config), [schema, batch], **details)

    good = typed.loc[~bad, list(CANONICAL)].astype({TIMESTAMP: "int64"})
    within = dedup_within(good)
    against = seen_in_history(good, history) & ~within
    accepted = good.loc[~(within | against)].reset_index(drop=True)
    store_check = validation.run_suite(validation.STORE_SUITE, accepted, parameters)
    if not store_check.success:
        failed = "; ".join(o.describe() for o in store_check.failures)
        raise BatchRejected(
            f"{path.name}: rows to append fail the store suite (a bug in row filtering): {failed}",
            [schema, batch, store_check],
            **details,
        )
    quarantined = raw.loc[bad].copy()
    quarantined["reason"] = reasons[bad].to_numpy()
    return _Plan(
        len(raw),
        accepted,
        quarantined,
        int(within.sum() + against.sum()),
        counts,
        [schema, batch, store_check],
    )


def _batch_message(
    source: str, batch: validation.SuiteResult, details: dict[str, Any], config: IngestConfig
) -> str:
    rows, bad = details["rows_in"], details["rows_bad"]
    if rows < config.min_rows:
        return f"{source}: batch rejected: it has {rows} data rows, at least {config.min_rows} required"
    parts = []
    if bad:
        top = ", ".join(f"{n} × {reason}" for reason, n in list(details["reasons"].items())[:3])
        parts.append(
            f"{bad} of {rows} rows ({details['bad_row_share']:.1%}) fail row checks "
            f"(limit {config.max_bad_row_share:.1%}): {top}"
        )
    # Row-rule failures are summarised by the reason counts above; table-level ones are listed as such.
    parts += [o.describe() for o in batch.failures if o.unexpected_count is None]
    return f"{source}: batch rejected: " + "; ".join(parts)


def _group_reasons(reasons: pd.Series) -> dict[str, int]:
    """Reason counts with the offending value stripped (so that they group)."""
    if reasons.empty:
        return {}
    parts = reasons.str.split("; ").explode()
    labels = parts.str.replace(r":\s.*$", "", regex=True)
    return {str(k): int(v) for k, v in labels.value_counts().head(20).items()}


def _schema_message(source: str, schema: validation.SuiteResult, config: IngestConfig) -> str:
    problems = []
    for outcome in schema.failures:
        if outcome.expectation == "expect_table_columns_to_match_set":
            observed = outcome.observed if isinstance(outcome.observed, dict) else {}
            mismatched = observed.get("mismatched", {})
            if mismatched.get("missing"):
                problems.append(f"missing column(s) {sorted(mismatched['missing'])}")
            if mismatched.get("unexpected"):
                problems.append(f"unexpected column(s) {sorted(mismatched['unexpected'])}")
        else:
            problems.append(
                f"column {outcome.column!r} has type {outcome.observed}, expected one of "
                f"{outcome.kwargs.get('type_list')}"
            )
    hint = (
        " (rename them with ingest.column_mapping, or set ingest.extra_columns: drop)"
        if any("column(s)" in p for p in problems)
        else ""
    )
    return f"{source}: wrong schema: {'; '.join(problems) or 'see report'}{hint}"


def _commit(
    sha: str,
    source: str,
    plan: _Plan,
    where: _Paths,
    config: IngestConfig,
    report_json: Path,
    report_md: Path,
    base: dict[str, Any],
) -> IngestSummary:
    quarantine_file = where.quarantine / f"{report_json.stem}.csv" if len(plan.quarantined) else None
    part = raw_store.part_name(sha) if len(plan.accepted) else None
    record = {
        "batch_sha256": sha,
        "source": source,
        "rows_in": plan.rows_in,
        "rows_accepted": len(plan.accepted),
        "rows_quarantined": len(plan.quarantined),
        "rows_duplicate": plan.rows_duplicate,
        "part_file": part,
        "data_version": None,
        "ingested_at": _iso(time.time()),
    }
    report = {
        **base,
        **{k: v for k, v in record.items() if k not in base},
        "quarantine_file": str(quarantine_file) if quarantine_file else None,
        "reasons": plan.reasons,
        "validations": [v.to_dict() for v in plan.validations],
    }
    report["message"] = _ingested_message(record)
    entry = {
        "record": record,
        "report": report,
        "report_json": str(report_json),
        "report_markdown": str(report_md),
    }
    journal = where.pending / f"{sha}.json"
    try:
        if quarantine_file is not None:
            where.quarantine.mkdir(parents=True, exist_ok=True)
            tmp = quarantine_file.with_name(f".tmp-{quarantine_file.name}")
            plan.quarantined.to_csv(tmp, index=False)
            os.replace(tmp, quarantine_file)
        _write_json_atomic(journal, entry)
        fault_point("after_journal")
        if part:
            raw_store.write_part(where.store, part, plan.accepted)
        fault_point("after_part_write")
        record = _finish_commit(where, entry)
    except (IngestError, OSError) as err:
        # dvc add failed or the disk is full: undo the append so that the store, data.dvc and the manifest
        # agree again (the manifest line is the last step, so it was not written).
        if part:
            (where.store / raw_store.INTERACTIONS_DIR / part).unlink(missing_ok=True)
        if quarantine_file is not None:
            quarantine_file.unlink(missing_ok=True)
        journal.unlink(missing_ok=True)
        if isinstance(err, IngestError):
            raise
        raise IngestError(
            f"{source}: could not write the store ({err.strerror or err}); nothing was changed"
        ) from err
    journal.unlink()
    raw_store.fsync_dir(where.pending)
    message = _ingested_message(record)
    warning = _dvc_push(where) if part and config.dvc_push else None
    if warning:
        message += f" — warning: {warning}"
    log.info(message)
    return IngestSummary(
        sha,
        source,
        "ingested",
        record["rows_in"],
        record["rows_accepted"],
        record["rows_quarantined"],
        record["rows_duplicate"],
        part,
        record["data_version"],
        str(report_json),
        str(report_md),
        message,
        str(quarantine_file) if quarantine_file else None,
    )


def _ingested_message(record: dict[str, Any]) -> str:
    extra = []
    if record["rows_quarantined"]:
        extra.append(f"{record['rows_quarantined']} quarantined")
    if record["rows_duplicate"]:
        extra.append(f"{record['rows_duplicate']} duplicates dropped")
    tail = f"; {', '.join(extra)}" if extra else ""
    return f"ingested {record['rows_accepted']} rows (data version {record['data_version']}){tail}"


def _rejected(
    sha: str | None,
    source: str,
    message: str,
    report_json: Path | None,
    report_md: Path | None,
    details: dict[str, Any] | None = None,
) -> IngestSummary:
    details = details or {}
    return IngestSummary(
        sha,
        source,
        "rejected",
        int(details.get("rows_in", 0)),
        0,
        0,
        0,
        None,
        None,
        str(report_json) if report_json else None,
        str(report_md) if report_md else None,
        message,
    )


def _iso(seconds: float) -> str:
    return pd.Timestamp(seconds, unit="s", tz="UTC").isoformat()
