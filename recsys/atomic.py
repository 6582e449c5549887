"""Durable, all-or-nothing file writes shared by the workspace's writers (ingest, the params override).

Standard library only, so a light entry point (the flows' nothing-new run) can use it without pandas."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, tmp_dir: str | Path) -> None:
    """Replace `path` with `text` in one step: a temp file in `tmp_dir` (the same file system), fsync, rename,
    fsync the folder. A failure leaves the old file whole and no temp file; a kill, at most a temp file in
    `tmp_dir` (a scratch folder that its next user empties), named with a leading dot: where `tmp_dir` is
    the file's own folder (`recsys data batch` into the inbox), no scan of it takes that for a file of it.
    The next write into `tmp_dir` removes what a killed writer left there (its process is gone)."""
    path, tmp_dir = Path(path), Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(tmp_dir)
    tmp = tmp_dir / f".{path.name}.{os.getpid()}.tmp"  # (hidden: an inbox scan skips dot files)
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _remove_orphans(tmp_dir: Path) -> None:
    """Delete the temp files in `tmp_dir` whose writer no longer runs: a killed `recsys data batch 1` is
    followed by `data batch 2` as often as by itself. A writer that still runs keeps its own (this process's
    would be overwritten anyway)."""
    for leftover in tmp_dir.glob(".*.tmp"):
        pid = leftover.name[:-len(".tmp")].rpartition(".")[2]
        if pid.isdigit() and not _running(int(pid)):
            leftover.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def fsync_dir(directory: str | Path) -> None:
    """Make a rename durable: the directory entry itself has to reach the disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
