"""The ingest manifest: one JSON line per committed batch, the record of what the store holds and why."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from recsys.atomic import fsync_dir, write_text_atomic
from recsys.ingest.errors import IngestError

log = logging.getLogger(__name__)


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


def repair_manifest(manifest: Path) -> None:
    """Drop a torn last line (a crash in the middle of an append); its batch is re-recorded from the
    journal. A last line that is a whole batch record without its newline (a file fixed or restored by an
    editor that drops the final newline) is no crash's leftover: it is kept and its newline written."""
    if not manifest.exists():
        return
    with open(manifest, "r+b") as handle:  # the end only: every run calls this, whatever the history's size
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        cut, block = size, 1 << 16
        while cut > 0:  # back to the last newline, a block at a time
            start = max(0, cut - block)
            handle.seek(start)
            newline = handle.read(cut - start).rfind(b"\n")
            if newline >= 0:
                cut = start + newline + 1
                break
            cut = start
        handle.seek(cut)
        whole = _batch_record(handle.read(size - cut))
        if whole:
            handle.seek(size)
            handle.write(b"\n")
        else:
            handle.truncate(cut)
        handle.flush()
        os.fsync(handle.fileno())
    if whole:
        log.info("ended the last line of %s (a whole record without its newline)", manifest)
    else:
        log.warning("removed a torn last line from %s", manifest)


def _batch_record(line: bytes) -> bool:
    """Whether `line` is a whole batch record (a JSON object with its batch's sha256), not a torn one."""
    try:
        record = json.loads(line)
    except ValueError:  # (UnicodeDecodeError too: a line cut inside a character)
        return False
    return isinstance(record, dict) and isinstance(record.get("batch_sha256"), str)


def append_manifest(manifest: Path, record: dict[str, Any]) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    with open(manifest, "ab") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(manifest.parent)


def write_json_atomic(path: Path, payload: dict[str, Any], scratch: Path) -> None:
    """Write via a temp file in `scratch` (same file system), fsync, rename, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(payload, sort_keys=True), scratch)
