"""Durable, all-or-nothing file writes shared by the workspace's writers (ingest, the params override).

Standard library only, so a light entry point (the flows' nothing-new run) can use it without pandas."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

# A temp file is `.<name>.<host>.<pid>.tmp`: its writer is judged by its PID only on the machine that wrote
# it. A folder on a file system several machines share (an inbox that producers on other hosts write into)
# holds other hosts' temp files, whose PIDs mean nothing here: those are removed once no write could still be
# in progress (a write takes seconds; a temp file left this long is a killed writer's on any machine).
HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
FOREIGN_STALE_SECONDS = 24 * 3600


def write_text_atomic(path: str | Path, text: str, tmp_dir: str | Path) -> None:
    """Replace `path` with `text` in one step: a temp file in `tmp_dir` (the same file system), fsync, rename,
    fsync the folder. A failure leaves the old file whole and no temp file; a kill, at most a temp file in
    `tmp_dir` (a scratch folder that its next user empties), named with a leading dot: where `tmp_dir` is
    the file's own folder (`recsys data batch` into the inbox), no scan of it takes that for a file of it.
    The next write into `tmp_dir` removes what a killed writer left there (its process is gone; on another
    machine, a day later)."""
    path, tmp_dir = Path(path), Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(tmp_dir)
    tmp = tmp_dir / f".{path.name}.{HOST}.{os.getpid()}.tmp"  # (hidden: an inbox scan skips dot files)
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
    would be overwritten anyway); another machine's (or an older version's `.<name>.<pid>.tmp`) stays until it
    is `FOREIGN_STALE_SECONDS` old."""
    now = time.time()
    for leftover in tmp_dir.glob(".*.tmp"):
        rest, _, pid = leftover.name[:-len(".tmp")].rpartition(".")
        if not pid.isdigit():
            continue
        if rest.rpartition(".")[2] == HOST:
            gone = not _running(int(pid))
        else:
            try:
                gone = now - leftover.stat().st_mtime > FOREIGN_STALE_SECONDS
            except FileNotFoundError:
                continue
        if gone:
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


def remove_if_there(path: str | Path) -> None:
    """Remove a file that may be absent — also where a file stands in the way of its folder (ENOTDIR), the
    state a rollback finds when a setting pointed a folder at a file: there is nothing of ours to remove."""
    try:
        Path(path).unlink()
    except (FileNotFoundError, NotADirectoryError):
        pass
