"""The key index answers what the store holds without reading the store, and follows the store."""

from __future__ import annotations

import pandas as pd

from recsys import store as raw_store
from recsys.ingest import ingest_batches
from recsys.ingest.keys import INDEX_FILE, open_index
from recsys.store import read_store
from test_ingest_support import config, events, make_repo, write_frame

CFG = config()


def test_ingest_never_reads_the_whole_store(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    ingest_batches([write_frame(repo / "inbox" / "h.csv", events(30))], repo, CFG)

    def forbidden(*args, **kwargs):
        raise AssertionError("ingest read the whole store; it must use the key index (O(batch))")

    monkeypatch.setattr(raw_store, "read_store", forbidden)
    batch = pd.concat([events(5, start=25), events(5, start=100)], ignore_index=True)  # 5 already stored
    [summary] = ingest_batches([write_frame(repo / "inbox" / "b.csv", batch)], repo, CFG)
    assert (summary.status, summary.rows_accepted, summary.rows_duplicate) == ("ingested", 5, 5)
    monkeypatch.undo()
    assert len(read_store(repo / "data")) == 35


def test_index_matches_the_store_and_is_rebuilt_when_the_store_changes_under_it(tmp_path):
    repo = make_repo(tmp_path / "repo")
    first, second = events(10), events(10, start=50)
    ingest_batches([write_frame(repo / "inbox" / "1.csv", first)], repo, CFG)
    [summary] = ingest_batches([write_frame(repo / "inbox" / "2.csv", second)], repo, CFG)
    stored = read_store(repo / "data")
    unknown = events(3, start=500)
    with open_index(repo / ".ingest") as index:
        assert index.seen(stored).all() and not index.seen(unknown).any()
        assert index.known("users", pd.Series(["u1", "nobody", None])).tolist() == [True, False, False]

    # A part that vanished (a `dvc checkout` of an older data version): the index is rebuilt from disk.
    (repo / "data" / "interactions" / summary.part_file).unlink()
    with open_index(repo / ".ingest") as index:
        assert index.sync(repo / "data") == [raw_store.list_parts(repo / "data")[0].name]
        assert index.seen(first).all() and not index.seen(second).any()

    # A lost index file is rebuilt by the next run, and dedup still works.
    (repo / ".ingest" / INDEX_FILE).unlink()
    [again] = ingest_batches([write_frame(repo / "inbox" / "3.csv", first.iloc[::-1])], repo, CFG)
    assert (again.rows_accepted, again.rows_duplicate) == (0, 10)


def test_sync_reads_no_part_no_one_touched_and_a_touched_one_only_to_compare(tmp_path, monkeypatch):
    """The check that notices a rewritten part must not make every run O(store): it reads a part only when
    its size, mtime or inode changed (a `dvc checkout` touches it), and then without re-indexing it."""
    import os

    from recsys.ingest import keys

    repo = make_repo(tmp_path / "repo")
    [summary] = ingest_batches([write_frame(repo / "inbox" / "1.csv", events(10))], repo, CFG)
    part = repo / "data" / "interactions" / summary.part_file
    reads = []
    real = keys._fingerprint
    monkeypatch.setattr(keys, "_fingerprint", lambda path: reads.append(path.name) or real(path))
    with open_index(repo / ".ingest") as index:
        assert index.sync(repo / "data") == [] and reads == []  # untouched: not read
        os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 10**9))
        assert index.sync(repo / "data") == [] and reads == [part.name]  # touched: read, same bytes, kept
        assert index.sync(repo / "data") == [] and reads == [part.name]  # and remembered


def test_a_part_rewritten_at_the_same_size_is_noticed_and_an_older_index_is_rebuilt(tmp_path):
    """Parts were recognised by name and size: a re-imported seed of another dataset with the same byte count
    (here users u* renamed v*: 1,380 bytes both) kept the old seed's keys, so dedup and the unseen shares
    answered for data no longer stored."""
    import sqlite3

    from recsys.data import SEED_PART, write_table

    repo = make_repo(tmp_path / "repo")
    seed = repo / "data" / "interactions" / SEED_PART
    old, new = events(10), events(10).assign(user_id=lambda f: f.user_id.str.replace("u", "v"))
    write_table(old, seed)
    with open_index(repo / ".ingest") as index:
        assert index.sync(repo / "data") == [SEED_PART] and index.seen(old).all()
    size = seed.stat().st_size
    write_table(new, seed)
    assert seed.stat().st_size == size  # the case: same name, same size, other rows
    with open_index(repo / ".ingest") as index:
        assert index.sync(repo / "data") == [SEED_PART]
        assert index.seen(new).all() and not index.seen(old).any()
        assert index.sync(repo / "data") == []

    # An index written by the previous version (schema 1: parts by size) is rebuilt, not misread.
    db = sqlite3.connect(repo / ".ingest" / INDEX_FILE)
    db.executescript("DROP TABLE parts; CREATE TABLE parts(name TEXT PRIMARY KEY, bytes INTEGER NOT NULL, "
                     f"rows INTEGER NOT NULL); INSERT INTO parts VALUES ('{SEED_PART}', {size}, 10); "
                     "UPDATE meta SET value = '1' WHERE key = 'schema';")
    db.close()
    with open_index(repo / ".ingest") as index:
        assert index.sync(repo / "data") == [SEED_PART] and index.seen(new).all()



def test_a_damaged_index_is_rebuilt_from_the_store(tmp_path):
    """The README says the index may be deleted; one overwritten with garbage was a 64-line traceback on
    every run ("file is not a database")."""
    repo = make_repo(tmp_path / "repo")
    ingest_batches([write_frame(repo / "inbox" / "h.csv", events(30))], repo, CFG)
    (repo / ".ingest" / INDEX_FILE).write_bytes(b"garbage, not SQLite" * 64)
    batch = pd.concat([events(5, start=25), events(5, start=100)], ignore_index=True)  # 5 already stored
    [summary] = ingest_batches([write_frame(repo / "inbox" / "b.csv", batch)], repo, CFG)
    assert (summary.status, summary.rows_accepted, summary.rows_duplicate) == ("ingested", 5, 5)
    with open_index(repo / ".ingest") as index:
        assert index.seen(read_store(repo / "data")).all()


def test_an_unreadable_store_part_is_one_line_naming_it_and_what_puts_it_back(tmp_path):
    import pytest

    from recsys.ingest import IngestError

    repo = make_repo(tmp_path / "repo")
    ingest_batches([write_frame(repo / "inbox" / "h.csv", events(30))], repo, CFG)
    (repo / ".ingest" / INDEX_FILE).unlink()  # the index must read the part again
    [part] = raw_store.list_parts(repo / "data")
    part.chmod(0o644)
    part.write_bytes(part.read_bytes()[: len(part.read_bytes()) // 2])
    with pytest.raises(IngestError) as err:
        ingest_batches([write_frame(repo / "inbox" / "b.csv", events(5, start=100))], repo, CFG)
    said = str(err.value)
    assert f"the store's part {part} cannot be read" in said and "dvc checkout data.dvc" in said
    assert "\n" not in str(err.value) and not err.value.transient
    assert (repo / "inbox" / "b.csv").exists()  # the batch waits for the store to be put back


def test_a_batch_is_looked_up_in_the_index_not_by_reading_the_whole_manifest(tmp_path, monkeypatch):
    """Each batch read every manifest line to see whether it was ingested before: O(history) a batch."""
    import json

    from recsys.ingest import manifest as manifest_module
    from recsys.ingest import recovery

    repo = make_repo(tmp_path / "repo")
    first = write_frame(repo / "inbox" / "1.csv", events(10))
    ingest_batches([first], repo, CFG)
    copy = write_frame(repo / "inbox" / "again.csv", events(10))  # the same bytes under another name

    def forbidden(*args, **kwargs):
        raise AssertionError("read the whole manifest")

    monkeypatch.setattr(recovery, "read_manifest", forbidden)
    monkeypatch.setattr(manifest_module, "read_manifest", forbidden)
    [again] = ingest_batches([copy], repo, CFG)
    assert again.status == "duplicate_batch" and "already ingested from 1.csv" in again.message
    [new] = ingest_batches([write_frame(repo / "inbox" / "2.csv", events(10, start=50))], repo, CFG)
    assert new.status == "ingested"
    monkeypatch.undo()

    # A manifest replaced under the index (a `git checkout` of another one) is indexed again, not trusted.
    manifest = repo / "ingest_manifest.jsonl"
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(reversed(lines)))
    with open_index(repo / ".ingest") as index:
        for line in lines:
            record = json.loads(line)
            assert index.batch_record(manifest, record["batch_sha256"]) == record
        assert index.batch_record(manifest, "0" * 64) is None
    manifest.write_text(lines[0])  # shortened: the second batch is no longer recorded
    with open_index(repo / ".ingest") as index:
        assert index.batch_record(manifest, json.loads(lines[1])["batch_sha256"]) is None


def test_a_torn_last_manifest_line_is_cut_reading_only_the_end(tmp_path):
    from recsys.ingest.manifest import repair_manifest

    manifest = tmp_path / "m.jsonl"
    whole = "".join(f'{{"batch_sha256": "{i:064x}"}}\n' for i in range(2000))  # > one 64 KiB block
    manifest.write_text(whole + '{"batch_sha256": "ab')
    repair_manifest(manifest)
    assert manifest.read_text() == whole
    repair_manifest(manifest)
    assert manifest.read_text() == whole
    manifest.write_text('{"torn')  # no complete line at all
    repair_manifest(manifest)
    assert manifest.read_bytes() == b""



def test_a_whole_last_record_without_its_newline_is_kept_and_ended(tmp_path):
    """What an editor that drops the final newline leaves (the error for a broken manifest says to fix or
    restore it): no crash's torn line, so the record stays, and the next append starts a line of its own."""
    from recsys.ingest.manifest import append_manifest, read_manifest, repair_manifest

    manifest = tmp_path / "m.jsonl"
    lines = [f'{{"batch_sha256": "{i:064x}", "source": "b{i}.csv"}}' for i in range(3)]
    manifest.write_text("\n".join(lines))  # the last line has no newline
    repair_manifest(manifest)
    assert manifest.read_text() == "\n".join(lines) + "\n"
    append_manifest(manifest, {"batch_sha256": f"{3:064x}", "source": "b3.csv"})
    assert [r["source"] for r in read_manifest(manifest)] == ["b0.csv", "b1.csv", "b2.csv", "b3.csv"]
    for torn in ('{"batch_sha256": "ab"', '{"source": "x.csv"}', '[1, 2]', '{"batch_sha256": "\xc3'):
        manifest.write_text(lines[0] + "\n" + torn)  # torn, or JSON that is no batch record: cut
        repair_manifest(manifest)
        assert manifest.read_text() == lines[0] + "\n", torn
