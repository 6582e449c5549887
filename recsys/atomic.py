"""Durable, all-or-nothing file writes shared by the workspace's writers (ingest, the params override).

Standard library only, so a light entry point (the flows' nothing-new run) can use it without pandas."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

# A temp file is `.<name>.<token>.<host>.<pid>.tmp` (the token: two threads of one process writing one
# name, as Prefect's thread task runner can, never share a temp): its writer is judged by its PID only on the
# machine that wrote it. A folder on a file system several machines share (an inbox that producers on other
# hosts write into) holds other hosts' temp files, whose PIDs mean nothing here: those are removed once no
# write could still be in progress (a write takes seconds; a temp file left this long is a killed writer's
# on any machine).
log = logging.getLogger(__name__)
HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
FOREIGN_STALE_SECONDS = 24 * 3600


def write_text_atomic(path: str | Path, text: str, tmp_dir: str | Path) -> None:
    """Replace `path` with `text` in one step: a temp file in `tmp_dir` (the same file system), fsync, rename,
    fsync the folder. A failure leaves the old file whole and no temp file; a kill, at most a temp file in
    `tmp_dir` (a scratch folder that its next user empties), named with a leading dot: where `tmp_dir` is
    the file's own folder (`recsys data batch` into the inbox), no scan of it takes that for a file of it.
    The next write into `tmp_dir` removes what a killed writer left there (its process is gone; on another
    machine, a day later)."""
    with atomic_path(path, tmp_dir) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_path(path: str | Path, tmp_dir: str | Path) -> Iterator[Path]:
    """A temp path in `tmp_dir` for a writer that takes a path (`DataFrame.to_parquet`, `savefig`): what it
    wrote there replaces `path` in one rename when the block ends, fsynced; an exception (a kill signal's
    too) removes it and leaves the old `path` whole. As `write_text_atomic`, whose mechanism it is."""
    path, tmp_dir = Path(path), Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(tmp_dir)
    # (hidden: an inbox scan skips dot files)
    tmp = tmp_dir / f".{path.name}.{secrets.token_hex(4)}.{HOST}.{os.getpid()}.tmp"
    try:
        yield tmp
        fsync_path(tmp)  # what the writer wrote reaches the disk before the rename
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
            gone = not process_running(int(pid))
        else:
            try:
                gone = now - leftover.stat().st_mtime > FOREIGN_STALE_SECONDS
            except FileNotFoundError:
                continue
        if gone:
            leftover.unlink(missing_ok=True)


def process_running(pid: int) -> bool:
    """A process with this id runs on this machine (another user's counts; an id beyond the kernel's type
    cannot be checked and counts as running, so whatever it names is kept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; an id no process can have been given
        return True
    return True


class NotAFolderError(NotADirectoryError):
    """A file stands where an output folder (or a folder above it) goes: a person moves it; never replaced."""


def file_in_the_way(out: str | Path) -> Path | None:
    """The first of `out` and the folders above it that is a file (None: each is a folder or absent)."""
    out = Path(out)
    return next((path for path in (out, *out.parents) if path.exists() and not path.is_dir()), None)


def require_folder_path(out: str | Path) -> None:
    """Refuse an output folder `out` where it, or a folder above it, is a file (a save would have renamed that
    file aside and deleted it)."""
    out = Path(out)
    path = file_in_the_way(out)
    if path is not None:
        what = "" if path == out else f" (a folder above {out})"
        raise NotAFolderError(f"{path} is a file where the output folder{what} goes: move or remove it")


def remove_stale_temp_dirs(out: Path) -> list[Path]:
    """The `.<name>-*` folders a killed save left beside directory `out` (a checkpoint, the prepared dataset:
    its temp copy, or the previous one moved aside). One writer per output (DVC runs one stage per output),
    so any that exist when a save starts are leftovers — except a previous copy moved aside by a save killed
    between replace_dir's two renames where `out` is gone: that one is put back, the only copy there is."""
    out = Path(out)
    require_folder_path(out)
    old = out.with_name(f".{out.name}-old")
    if old.is_dir() and not out.exists():
        old.rename(out)
        log.info("put back %s, moved aside by an interrupted save", out)
    stale = sorted(p for p in out.parent.glob(f".{out.name}-*") if p.is_dir())
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s, left by an interrupted save", path)
    return stale


def replace_dir(tmp: Path, out: Path) -> None:
    """Put the finished directory `tmp` (a sibling of `out`) in place of `out` by renames: its files fsynced,
    `out` moved aside to `.<name>-old`, `tmp` renamed to `out`, the old copy removed. Where the second rename
    fails, the old copy is moved back; a kill between the two leaves `.<name>-old`, which the next save
    puts back first (remove_stale_temp_dirs). A file at `out` is refused, never moved aside."""
    require_folder_path(out)
    for file in tmp.iterdir():
        if file.is_file():
            fsync_path(file)
    if out.exists():
        old = out.with_name(f".{out.name}-old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        try:
            tmp.rename(out)
        except BaseException:
            old.rename(out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
    fsync_dir(out.parent)


def fsync_dir(directory: str | Path) -> None:
    """Make a rename durable: the directory entry itself has to reach the disk."""
    fsync_path(directory)


def fsync_path(path: str | Path) -> None:
    """Flush a file's (or a folder's) contents to the disk."""
    fd = os.open(path, os.O_RDONLY)
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
