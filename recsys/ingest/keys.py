"""The key index: which (user_id, item_id, timestamp) events, users and items the store already holds.

Deduplication against the store and the unseen-user/item shares need to know what is stored; reading the
whole store for that makes every batch O(store). The index answers the same questions in O(batch log
store): a SQLite file (`.ingest/keys.sqlite`, local state, never versioned) with users and items as
integers and the event keys as a clustered primary key. Memory stays bounded by SQLite's page cache.

The index is derived from the store and can always be rebuilt from it: it records which parts it covers
(name; size, mtime and inode, and when those changed a hash of the file's last 64 KiB — its footer and the
end of its data — so a part rewritten under its own name at the same size, a re-imported seed, is noticed),
`sync` indexes parts it has not seen (the seed part, a part whose commit crashed before
the index was updated) and rebuilds from scratch when a covered part changed or vanished (a `dvc checkout`
of another data version). Keys of a new part are added after its manifest line, so the index never holds
keys of a part that a rollback could remove.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys import store as raw_store
from recsys.ingest.canonical import KEY
from recsys.ingest.errors import IngestError
from recsys.schema import ITEM, TIMESTAMP, USER

log = logging.getLogger(__name__)

INDEX_FILE = "keys.sqlite"
_SCHEMA_VERSION = "3"  # 2: parts recognised by `_fingerprint`, not by size alone; 3: and by `_stat` first
_TAIL_BYTES = 1 << 16
_CHUNK_ROWS = 500_000  # rows per read while indexing a part: bounds memory for a 10M-row seed part
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS parts(
    name TEXT PRIMARY KEY, stat TEXT NOT NULL, fingerprint TEXT NOT NULL, rows INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS users(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS items(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS events(
    user INTEGER NOT NULL, item INTEGER NOT NULL, ts INTEGER NOT NULL, PRIMARY KEY(user, item, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches(sha TEXT PRIMARY KEY, offset INTEGER NOT NULL) WITHOUT ROWID;
"""
_MARK_BYTES = 256  # the manifest bytes before the indexed end, hashed: a manifest replaced under it is noticed


class KeyIndex:
    """Open with `open_index(state_dir)`; every method runs in its own transaction."""

    def __init__(self, connection: sqlite3.Connection):
        self.db = connection

    # ------------------------------------------------------------------------------------------ queries

    def has_events(self) -> bool:
        return self.db.execute("SELECT EXISTS(SELECT 1 FROM events)").fetchone()[0] == 1

    def known(self, table: str, keys: pd.Series) -> np.ndarray:
        """Mask of `keys` (strings, nulls allowed) that are in `users` or `items`."""
        ids = self._ids(table, keys)
        return ids >= 0

    def seen(self, frame: pd.DataFrame) -> np.ndarray:
        """Mask of rows whose (user_id, item_id, timestamp) is already stored."""
        seen = np.zeros(len(frame), dtype=bool)
        if frame.empty:
            return seen
        users = self._ids("users", frame[USER])
        items = self._ids("items", frame[ITEM])
        candidates = np.flatnonzero((users >= 0) & (items >= 0))
        if not len(candidates):
            return seen
        timestamps = frame[TIMESTAMP].to_numpy(dtype=np.int64)
        rows = zip(candidates.tolist(), users[candidates].tolist(), items[candidates].tolist(),
                   timestamps[candidates].tolist())
        probe_table = "probe(i INTEGER PRIMARY KEY, user INTEGER, item INTEGER, ts INTEGER)"
        with self._transaction(), self._temp(probe_table) as probe:
            self.db.executemany(f"INSERT INTO {probe} VALUES (?, ?, ?, ?)", rows)
            hits = self.db.execute(
                f"SELECT p.i FROM {probe} p JOIN events e ON e.user = p.user AND e.item = p.item "
                "AND e.ts = p.ts"
            ).fetchall()
        seen[[h[0] for h in hits]] = True
        return seen

    def batch_record(self, manifest: Path, sha: str) -> dict | None:
        """The manifest's record of the batch whose file has sha256 `sha`, or None. The manifest is indexed
        by batch (`batches`: sha → byte offset of its line), reading only the lines appended since the last
        look, so a batch's check costs O(log batches), not a read of the whole history."""
        for rebuild in (False, True):
            self._sync_manifest(manifest, rebuild)
            found = self.db.execute("SELECT offset FROM batches WHERE sha = ?", (sha,)).fetchone()
            if found is None:
                return None
            record = _line_at(manifest, found[0])
            if record is not None and record.get("batch_sha256") == sha:
                return record
        return None  # (indexed from scratch, the line at its offset is another: not reached)

    def _sync_manifest(self, manifest: Path, rebuild: bool = False) -> None:
        size = manifest.stat().st_size if manifest.exists() else 0
        mark = self.db.execute("SELECT value FROM meta WHERE key = 'manifest'").fetchone()
        offset, tail = (int(mark[0].split(":")[0]), mark[0].split(":")[1]) if mark else (0, "")
        if rebuild or offset > size or _tail(manifest, offset) != tail:  # rewritten, replaced or shortened
            offset = 0
            self.db.execute("DELETE FROM batches")
        if offset == size:
            return
        with open(manifest, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]  # a torn last line waits for `repair_manifest`
        rows, position = [], offset
        for raw in complete.splitlines(keepends=True):
            if raw.strip():
                try:
                    rows.append((str(json.loads(raw)["batch_sha256"]), position))
                except (ValueError, KeyError, TypeError) as err:
                    raise IngestError(f"{manifest}: the line at byte {position} is not a batch record ({err}); "
                                      "fix it or restore the file from git") from err
            position += len(raw)
        with self._transaction():
            self.db.executemany("INSERT OR IGNORE INTO batches VALUES (?, ?)", rows)  # the first record wins
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('manifest', ?)",
                            (f"{position}:{_tail(manifest, position)}",))

    # ------------------------------------------------------------------------------------------ updates

    def add_part(self, path: Path) -> None:
        """Index one part's keys (idempotent: keys already present are ignored)."""
        rows = 0
        with self._transaction():
            try:
                parquet = pq.ParquetFile(path)
                for batch in parquet.iter_batches(batch_size=_CHUNK_ROWS, columns=KEY):
                    frame = batch.to_pandas()
                    rows += len(frame)
                    self._add_keys(frame)
            except (pa.ArrowException, OSError) as err:  # the transaction rolls back: nothing half-indexed
                raise IngestError(f"the store's part {path} cannot be read ({err}); put the data version "
                                  "back with `dvc checkout data.dvc` (or `dvc pull data.dvc`), then run "
                                  "again") from err
            self.db.execute("INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)",
                            (path.name, _stat(path), _fingerprint(path), rows))

    def sync(self, store_dir: Path) -> list[str]:
        """Bring the index in line with the parts on disk; returns the names of the parts it indexed."""
        on_disk = {p.name: p for p in raw_store.list_parts(store_dir)}
        covered = {name: (stat, fingerprint) for name, stat, fingerprint
                   in self.db.execute("SELECT name, stat, fingerprint FROM parts").fetchall()}
        changed = []
        for name, (stat, fingerprint) in covered.items():
            path = on_disk.get(name)
            now = _stat(path) if path is not None else None
            if now is None:
                changed.append(name)
            elif now != stat:  # replaced or touched (a `dvc checkout`): its bytes decide
                if _fingerprint(path) != fingerprint:
                    changed.append(name)
                else:
                    with self._transaction():
                        self.db.execute("UPDATE parts SET stat = ? WHERE name = ?", (now, name))
        if changed:
            log.warning("key index: %d indexed part(s) changed or vanished (e.g. %s); rebuilding it",
                        len(changed), changed[0])
            with self._transaction():
                for table in ("parts", "users", "items", "events"):
                    self.db.execute(f"DELETE FROM {table}")
            covered = {}
        missing = [name for name in sorted(on_disk) if name not in covered]
        for name in missing:
            self.add_part(on_disk[name])
        return missing

    # ---------------------------------------------------------------------------------------- internals

    def _add_keys(self, frame: pd.DataFrame) -> None:
        for table, column in (("users", USER), ("items", ITEM)):
            self.db.executemany(
                f"INSERT OR IGNORE INTO {table}(key) VALUES (?)", ((k,) for k in frame[column].unique())
            )
        users = self._ids("users", frame[USER])
        items = self._ids("items", frame[ITEM])
        keys = np.stack([users, items, frame[TIMESTAMP].to_numpy(dtype=np.int64)], axis=1)
        keys = keys[np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))]  # B-tree order: fewer page writes
        self.db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?)", keys.tolist())

    def _ids(self, table: str, keys: pd.Series) -> np.ndarray:
        """Integer id per key, -1 where unknown or null."""
        values = keys.astype("string")
        unique = pd.Index(values.dropna().unique())
        if unique.empty:
            return np.full(len(keys), -1, dtype=np.int64)
        with self._transaction(), self._temp("wanted(key TEXT PRIMARY KEY)") as wanted:
            self.db.executemany(f"INSERT INTO {wanted} VALUES (?)", ((k,) for k in unique))
            found = self.db.execute(f"SELECT w.key, t.id FROM {wanted} w JOIN {table} t ON t.key = w.key")
            mapping = pd.Series(dict(found.fetchall()), dtype="int64")
        codes = mapping.reindex(values.to_numpy(dtype=object, na_value=None)).to_numpy(dtype=float)
        return np.where(np.isnan(codes), -1, codes).astype(np.int64)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self.db.in_transaction:  # nested: the outer one commits
            yield
            return
        self.db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @contextmanager
    def _temp(self, definition: str) -> Iterator[str]:
        name = definition.split("(", 1)[0]
        self.db.execute(f"CREATE TEMP TABLE {definition}")
        try:
            yield f"temp.{name}"
        finally:
            self.db.execute(f"DROP TABLE temp.{name}")


def _tail(manifest: Path, end: int) -> str:
    """The sha256 of the manifest's last `_MARK_BYTES` before byte `end` ("" at 0)."""
    if end == 0:
        return ""
    with open(manifest, "rb") as handle:
        handle.seek(max(0, end - _MARK_BYTES))
        return hashlib.sha256(handle.read(min(end, _MARK_BYTES))).hexdigest()


def _line_at(manifest: Path, offset: int) -> dict | None:
    try:
        with open(manifest, "rb") as handle:
            handle.seek(offset)
            record = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _stat(path: Path) -> str:
    """Size, modification time and inode: unchanged, the part is taken as unchanged without reading it (a
    part is written once, under a temp name, then renamed: a rewrite is a new inode)."""
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _fingerprint(path: Path) -> str:
    """A part's size and the sha256 of its last 64 KiB (the end of its data and the Parquet footer: schema,
    row-group sizes and offsets; all of a small part): read only when `_stat` changed, so `sync` reads no
    part that no one touched."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        handle.seek(max(0, size - _TAIL_BYTES))
        return f"{size}:{hashlib.sha256(handle.read()).hexdigest()}"


@contextmanager
def open_index(state_dir: Path) -> Iterator[KeyIndex]:
    """The index in `state_dir` (created when missing). Call only while holding the workspace lock."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / INDEX_FILE
    try:
        db = _connect(path)
    except sqlite3.DatabaseError as err:  # not a database, or damaged: derived data, so start it again
        log.warning("key index: %s is unreadable (%s); rebuilding it from the store", path, err)
        for damaged in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            damaged.unlink(missing_ok=True)
        db = _connect(path)
    try:
        yield KeyIndex(db)
    finally:
        db.close()


def _connect(path: Path) -> sqlite3.Connection:
    """The index database at `path`, its schema in place (an older layout dropped: `sync` refills it)."""
    db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit (`KeyIndex._transaction`)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # a lost index update is re-derived by `sync`
        db.execute("PRAGMA cache_size=-32768")  # 32 MiB page cache: bounds memory at any store size
        db.execute("PRAGMA temp_store=MEMORY")
        db.executescript(_SCHEMA)
        found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if found is not None and found[0] != _SCHEMA_VERSION:  # an older layout: derived data, so rebuild it
            log.warning("key index: schema %s, this version reads %s; rebuilding it", found[0],
                        _SCHEMA_VERSION)
            db.executescript("DROP TABLE parts; DROP TABLE users; DROP TABLE items; DROP TABLE events; "
                             "DELETE FROM meta;" + _SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (_SCHEMA_VERSION,))
        db.execute("SELECT count(*) FROM parts").fetchone()  # a damaged page shows here, not mid-ingest
    except BaseException:
        db.close()
        raise
    return db
