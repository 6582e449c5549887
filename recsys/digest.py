"""Content digests, one home for both: a file's sha256 (ingested batches, checkpoint files) and a checkpoint
directory's — the sha256 of a canonical listing `[[relative posix path, size, sha256 of the file], ...]`
sorted by path. The directory digest is the registry's artifact address (`recsys.registry.store`) and what
the evaluate stage records of the checkpoint it scored (`checkpoint_sha256` in metrics/<model>.json), so a
promotion can refuse metrics of another checkpoint than the one it would register."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHECKPOINT_SHA256 = "checkpoint_sha256"  # metrics/<model>.json: the digest of the checkpoint it scored
MANIFEST = "MANIFEST.json"  # a stored artifact's own listing, beside its files: not part of its digest
_CHUNK = 1 << 20


class DigestError(ValueError):
    """A directory holds something a checkpoint may not: a link, a special file, a control character."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def listing(directory: Path) -> list[list[object]]:
    """[[relpath, size, sha256], ...] of the regular files under `directory`, sorted by path."""
    entries: list[list[object]] = []
    for path in sorted(Path(directory).rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST:
            continue
        if path.is_symlink():
            raise DigestError(f"{path}: symbolic links are not allowed in a checkpoint")
        if path.is_dir():
            continue
        if not path.is_file():
            raise DigestError(f"{path}: not a regular file")
        if any(ord(c) < 32 for c in rel):
            raise DigestError(f"{path!r}: control characters in a file name")
        entries.append([rel, path.stat().st_size, file_sha256(path)])
    entries.sort(key=lambda e: str(e[0]))
    return entries


def listing_digest(entries: list[list[object]]) -> str:
    canonical = json.dumps(entries, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def directory_digest(directory: Path) -> str:
    return listing_digest(listing(directory))
