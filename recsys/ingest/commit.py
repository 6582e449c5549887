"""Committing a planned batch: journal → quarantine file → part file (atomic) → `dvc add` → manifest line →
key index → remove journal; the run then pushes (`recovery.complete_push`).

The journal in `.ingest/pending/` says what is being committed, so a crash at any step is completed (or
rolled back, if the part never appeared) by `recsys.ingest.recovery`. The push marker, written before the
journal, stays until `dvc push` succeeded, so a crash before or during the push is finished by the next run
whatever it ingests. Temp files go to the scratch folder `.ingest/tmp/` only. `fault_point` lets tests kill
the process at each step (`RECSYS_FAULT=<name>`).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from recsys import store as raw_store
from recsys.atomic import fsync_dir, remove_if_there, write_text_atomic
from recsys.config import IngestConfig
from recsys.ingest.dvc import data_version, dvc_add, dvc_enabled
from recsys.ingest.errors import IngestError
from recsys.ingest.keys import KeyIndex
from recsys.ingest.layout import Paths
from recsys.ingest.manifest import append_manifest, write_json_atomic
from recsys.ingest.plan import Plan
from recsys.ingest.report import IngestSummary, ingested_message, iso, write_final_report
from recsys.faults import fault_point

log = logging.getLogger(__name__)

# The named boundaries of a commit (tests kill the process at each); `part_temp_written` (recsys.store),
# `before_push` and `after_push` (recsys.ingest.recovery) are the ones around them.
FAULT_POINTS = ("after_journal", "after_part_write", "after_dvc_add", "after_manifest")


def finish_commit(paths: Paths, entry: dict[str, Any], index: KeyIndex | None) -> dict[str, Any]:
    """dvc add → manifest line → key index → report. Idempotent, so recovery can re-run it from any point.

    `index` is None where the caller does not keep one (a reader's recovery); the next ingest's
    `KeyIndex.sync` then indexes the part."""
    return record_commit(paths, entry, add_version(paths, entry), index)


def add_version(paths: Paths, entry: dict[str, Any]) -> dict[str, Any]:
    """`dvc add` the store (the journal's part is in it): the record with its data version."""
    record = dict(entry["record"])
    record["data_version"] = dvc_add(paths) if record["part_file"] else data_version(paths)
    fault_point("after_dvc_add")
    return record


def record_commit(
    paths: Paths, entry: dict[str, Any], record: dict[str, Any], index: KeyIndex | None
) -> dict[str, Any]:
    """After `dvc add`: the manifest line, the key index, the report. From here on the batch is in the
    store and in data.dvc, so a failure is completed by recovery (the journal stays), never undone."""
    append_manifest(paths.manifest, record)
    fault_point("after_manifest")
    if index is not None and record["part_file"]:
        index.add_part(paths.store / raw_store.INTERACTIONS_DIR / record["part_file"])
    write_final_report(entry, record["data_version"])
    return record


def mark_push_pending(paths: Paths) -> None:
    """Before anything changes: the remote will lack the new data until a push succeeds — whatever
    `ingest.dvc_push` says here, so that the first run with pushes on pushes it (`layout.push_owed`)."""
    if dvc_enabled(paths.root) and not paths.push_marker.exists():
        write_json_atomic(paths.push_marker, {"since": iso(time.time())}, paths.scratch)


def commit(
    sha: str,
    source: str,
    plan: Plan,
    where: Paths,
    config: IngestConfig,
    report_json: Path,
    report_md: Path,
    base: dict[str, Any],
    index: KeyIndex,
) -> IngestSummary:
    """Append the planned rows, exactly once. On an expected failure before `dvc add` took the part, undo;
    after it, keep the part and the journal for recovery to record; raise `IngestError` either way."""
    quarantine_file = where.quarantine / f"{report_json.stem}.csv" if len(plan.quarantined) else None
    part = raw_store.part_name(sha, raw_store.next_arrival(where.store)) if len(plan.accepted) else None
    record = {
        "batch_sha256": sha,
        "source": source,
        "rows_in": plan.rows_in,
        "rows_accepted": len(plan.accepted),
        "rows_quarantined": len(plan.quarantined),
        "rows_duplicate": plan.rows_duplicate,
        "part_file": part,
        "data_version": None,
        "ingested_at": iso(time.time()),
    }
    report = {
        **base,
        **{k: v for k, v in record.items() if k not in base},
        "quarantine_file": str(quarantine_file) if quarantine_file else None,
        "reasons": plan.reasons,
        "validations": [v.to_dict() for v in plan.validations],
    }
    report["message"] = ingested_message(record)
    entry = {
        "record": record,
        "report": report,
        "report_json": str(report_json),
        "report_markdown": str(report_md),
    }
    journal = where.pending / f"{sha}.json"
    try:
        if part:
            mark_push_pending(where)
        write_json_atomic(journal, entry, where.scratch)
        fault_point("after_journal")
        if quarantine_file is not None:
            where.quarantine.mkdir(parents=True, exist_ok=True)
            write_text_atomic(quarantine_file, plan.quarantined.to_csv(index=False), where.scratch)
        if part:
            raw_store.write_part(where.store, part, plan.accepted, tmp_dir=where.scratch)
        fault_point("after_part_write")
        record = add_version(where, entry)
    except (IngestError, OSError) as err:
        # dvc add failed or the disk is full before data.dvc took the part: undo the append so that the
        # store, data.dvc and the manifest agree again (nothing has recorded the part yet).
        # Best effort, each step: a cleanup that fails (a path through a file) must not keep the journal,
        # which would hold every later run and reader on a commit that never happened.
        if part:
            remove_if_there(where.store / raw_store.INTERACTIONS_DIR / part)
        if quarantine_file is not None:
            remove_if_there(quarantine_file)
        remove_if_there(journal)
        if isinstance(err, IngestError):
            raise
        if err.errno == errno.EXDEV:  # a mount the file-system check cannot see (a bind mount: same device)
            raise IngestError(
                f"{source}: nothing was changed: ingest.quarantine or the raw store is on another mount than "
                f"{where.scratch.parent}, where ingest writes files before one rename puts them in place (a "
                "rename cannot cross mounts); keep both on the repository's mount (ingest.quarantine in "
                "params.yaml)"
            ) from err
        raise IngestError(
            f"{source}: could not write the store ({err.strerror or err}); nothing was changed"
        ) from err
    try:
        record = record_commit(where, entry, record, index)
    except (OSError, sqlite3.Error) as err:  # the key index is SQLite: a full disk is its OperationalError
        # data.dvc already names the part: undoing it now would leave data.dvc (and the push) pointing at a
        # version whose rows are gone. The journal stays, and the next run's recovery finishes the record.
        written = f"its rows are in the store as {part}" if part else "its quarantine file is written"
        raise IngestError(
            f"{source}: {written} (data version {record['data_version']}), but recording the batch failed "
            f"({getattr(err, 'strerror', None) or err}); free the space, then run `recsys ingest` again: it "
            "completes the record before anything else"
        ) from err
    journal.unlink()
    fsync_dir(where.pending)
    message = ingested_message(record)
    log.debug("%s: %s", source, message)  # the caller says it (the summary), once
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
