"""Durable, all-or-nothing file writes shared by the workspace's writers (ingest, the params override).

Standard library only, so a light entry point (the flows' nothing-new run) can use it without pandas."""

from __future__ import annotations

import glob
import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, tmp_dir: str | Path) -> None:
    """Replace `path` with `text` in one step: a temp file in `tmp_dir` (the same file system), fsync, rename,
    fsync the folder. A failure leaves the old file whole and no temp file; a kill, at most a temp file in
    `tmp_dir` (a scratch folder that its next user empties), named with a leading dot: where `tmp_dir` is
    the file's own folder (`recsys data batch` into the inbox), no scan of it takes that for a file of it.
    The next write of the same file removes what a killed writer left (its process is gone)."""
    path, tmp_dir = Path(path), Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(path.name, tmp_dir)
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


def _remove_orphans(name: str, tmp_dir: Path) -> None:
    """Delete the temp files of `name` whose writer no longer runs (a writer that is still running keeps its
    own; this process's name is about to be overwritten anyway)."""
    prefix = f".{name}."
    for leftover in tmp_dir.glob(f".{glob.escape(name)}.*.tmp"):
        pid = leftover.name[len(prefix):-len(".tmp")]
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
