"""Content-addressed artifact store: `<root>/sha256/<hex>/` holds one checkpoint directory.

The address is the sha256 of a canonical listing of the directory: a JSON array of
`[relative posix path, size, sha256 of the file]` sorted by path. So the address changes if any file's
bytes, name, or the set of files changes, and two identical checkpoints share one copy.

Each stored directory also holds `MANIFEST.json` (the listing itself; not part of the digest) so that a
failed verification can say *which* file is wrong and how. `verify` re-hashes every file and is called
before every load; a tampered, truncated, missing or extra file raises `ArtifactIntegrityError`.

Copies are made in a scratch directory of their own under `<root>/tmp/`, held by an flock on its lock file
for as long as the operation runs; each operation first removes the scratch of operations whose process
died (a `kill -9` mid-copy), so a crash leaves nothing behind for longer than until the next `put`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from recsys.atomic import fsync_dir, fsync_path
from recsys.config import ConfigError
from recsys.digest import MANIFEST, DigestError, listing, listing_digest

log = logging.getLogger(__name__)

_HEX = re.compile(r"^[0-9a-f]{64}$")


class ArtifactError(Exception):
    """An artifact cannot be stored or found."""


class ArtifactIntegrityError(ArtifactError):
    """A stored artifact no longer matches its sha256: refuse to load it."""


@dataclass(frozen=True)
class StoredArtifact:
    sha256: str
    path: Path

    @property
    def uri(self) -> str:
        return f"sha256/{self.sha256}"


def _listing(directory: Path) -> list[list[object]]:
    """`recsys.digest.listing`, its refusals as this store's (a name tests replace to stop a copy mid-way)."""
    try:
        return listing(directory)
    except DigestError as err:
        raise ArtifactError(str(err)) from err


def directory_digest(directory: Path) -> str:
    return listing_digest(_listing(directory))


def check_hex(sha256: str) -> str:
    """Digests come from the database; never let one become a path traversal."""
    if not isinstance(sha256, str) or not _HEX.fullmatch(sha256):
        raise ArtifactError(f"invalid artifact sha256 {sha256!r}")
    return sha256


def artifact_root(setting: str, repo_root: Path) -> Path:
    """`registry.artifact_root` as a directory: relative settings live under the repository root. A setting
    that names a file, or a path under one, is refused here — every user of the store resolves it here first —
    rather than as `Not a directory: …/tmp` once a checkpoint is being stored."""
    path = Path(setting)
    root = path if path.is_absolute() else Path(repo_root) / path
    for existing in (root, *root.parents):  # the nearest part that exists must be a folder
        if existing.exists():
            if not existing.is_dir():
                raise ConfigError(f"registry.artifact_root {setting!r} is not a folder: {existing} is a "
                                  "file; point registry.artifact_root at a folder (or one to create) in "
                                  "params.yaml")
            break
    return root


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / check_hex(sha256)

    def put(self, source: Path) -> StoredArtifact:
        """Copy `source` into the store (idempotent) and return its address.

        The digest is computed from the *copy*, so what is addressed is exactly what was stored even if
        the source changes during the copy. The copy appears under its address by one atomic rename.
        """
        source = Path(source)
        if not source.is_dir():
            raise ArtifactError(f"checkpoint directory not found: {source}")
        with self.scratch() as scratch:
            tmp = scratch / "copy"
            shutil.copytree(source, tmp, symlinks=True, ignore=shutil.ignore_patterns(MANIFEST))
            listing = _listing(tmp)
            if not listing:
                raise ArtifactError(f"checkpoint directory is empty: {source}")
            sha256 = listing_digest(listing)
            (tmp / MANIFEST).write_text(json.dumps({"sha256": sha256, "files": listing}, indent=1))
            _make_read_only(tmp)
            # On the disk before it has an address: the registry commits a version row that names it next,
            # and a power cut must not leave that row pointing at empty or truncated files.
            _fsync_tree(tmp)
            final = self.path_for(sha256)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                self._reuse_or_replace(final, sha256)
            if not final.exists():
                try:
                    os.rename(tmp, final)
                except OSError:
                    if not final.exists():  # not a concurrent put of the same content: a real error
                        raise
                fsync_dir(final.parent)  # the rename itself
                fsync_dir(final.parent.parent)  # and `sha256/`, where this put created it
            self.verify(sha256)
            return StoredArtifact(sha256, final)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """A scratch directory private to this operation, removed when it ends — or, if the process is
        killed, by the next operation on this store (its lock is then free)."""
        tmp_root = self.root / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        remove_stale_scratch(tmp_root)
        name = uuid.uuid4().hex
        # Locked under a name the cleaner ignores, then renamed: a lock file it can see is always held.
        pending = tmp_root / f".{name}.pending"
        fd = os.open(pending, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            lock = tmp_root / f"{name}.lock"
            os.rename(pending, lock)
            work = tmp_root / name
            work.mkdir()
            try:
                yield work
            finally:
                _remove_tree(work)
                lock.unlink(missing_ok=True)
        finally:
            pending.unlink(missing_ok=True)
            os.close(fd)

    def _reuse_or_replace(self, final: Path, sha256: str) -> None:
        try:
            self.verify(sha256)
        except ArtifactIntegrityError as err:
            # A damaged copy is kept for inspection, never silently overwritten or reused.
            corrupt = self.root / "corrupt" / f"{sha256}-{uuid.uuid4().hex[:8]}"
            corrupt.parent.mkdir(parents=True, exist_ok=True)
            os.rename(final, corrupt)
            log.warning("artifact %s was damaged (%s); moved to %s and stored again", sha256, err, corrupt)

    def verify(self, sha256: str) -> Path:
        """Re-hash every file of a stored artifact; return its directory or raise ArtifactIntegrityError."""
        path = self.path_for(sha256)
        if not path.is_dir():
            raise ArtifactIntegrityError(f"artifact {sha256[:12]} is missing from the store ({path})")
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            expected = {str(rel): (int(size), str(digest)) for rel, size, digest in manifest["files"]}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ArtifactIntegrityError(
                f"artifact {sha256[:12]}: manifest missing or unreadable ({err}); refusing to load"
            ) from err
        problems: list[str] = []
        try:
            actual = {str(rel): (int(size), str(digest)) for rel, size, digest in _listing(path)}
        except ArtifactError as err:
            raise ArtifactIntegrityError(f"artifact {sha256[:12]}: {err}; refusing to load") from err
        for rel, (size, digest) in sorted(expected.items()):
            if rel not in actual:
                problems.append(f"{rel} is missing")
                continue
            got_size, got_digest = actual[rel]
            if got_size < size:
                problems.append(f"{rel} is truncated ({got_size} of {size} bytes)")
            elif got_size != size:
                problems.append(f"{rel} changed size ({got_size} bytes, expected {size})")
            elif got_digest != digest:
                problems.append(f"{rel} was modified (sha256 {got_digest[:12]}, expected {digest[:12]})")
        problems += [f"{rel} is not part of the artifact" for rel in sorted(set(actual) - set(expected))]
        if not problems and listing_digest(
            [[rel, size, digest] for rel, (size, digest) in sorted(actual.items())]
        ) != sha256:
            problems.append("the manifest does not match the artifact address")
        if problems:
            raise ArtifactIntegrityError(
                f"artifact {sha256[:12]} failed its integrity check: {'; '.join(problems)}; refusing to load"
            )
        return path


def remove_stale_scratch(tmp_root: Path) -> list[str]:
    """Remove scratch directories whose operation is over (its lock is free); returns their names."""
    removed: list[str] = []
    for entry in sorted(tmp_root.iterdir()):
        if entry.suffix == ".lock":
            try:
                fd = os.open(entry, os.O_RDWR)
            except FileNotFoundError:
                continue  # its operation just finished
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # still running
            try:
                _remove_tree(tmp_root / entry.stem)
                entry.unlink(missing_ok=True)
                removed.append(entry.stem)
            finally:
                os.close(fd)
        elif entry.is_dir() and not (tmp_root / f"{entry.name}.lock").exists():
            _remove_tree(entry)  # no lock at all: left by a killed run of an older version
            removed.append(entry.name)
    if removed:
        log.info("removed %d scratch director%s left by killed operations under %s", len(removed),
                 "y" if len(removed) == 1 else "ies", tmp_root)
    return removed


def _fsync_tree(directory: Path) -> None:
    """Flush every file below `directory`, then every folder (deepest first, `directory` last)."""
    paths = sorted(directory.rglob("*"), key=lambda path: len(path.parts), reverse=True)
    for path in paths:
        if path.is_file() and not path.is_symlink():
            fsync_path(path)
    for path in [*(p for p in paths if p.is_dir() and not p.is_symlink()), directory]:
        fsync_dir(path)


def _make_read_only(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def _remove_tree(path: Path) -> None:
    # Files are read-only but their directories are not, which is all that unlinking needs.
    shutil.rmtree(path, ignore_errors=True)
