"""Ingest behaviour and the bad-input catalogue (without DVC; see test_ingest_dvc.py for the DVC steps)."""

from __future__ import annotations

import errno
import json
import os
import sqlite3

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recsys import ingest
from recsys import store as raw_store
from recsys.commands.ingest import app
from recsys.ingest import commit as commit_module
from recsys.ingest import report as ingest_report
from recsys.ingest.keys import KeyIndex
from recsys.store import read_store
from test_ingest_support import T0, config, copy_repo, events, make_repo, snapshot, write_csv, write_frame

CFG = config()


@pytest.fixture(scope="module")
def seeded_template(tmp_path_factory):
    """A repo whose store already holds 40 events from one ingested batch (the history)."""
    root = make_repo(tmp_path_factory.mktemp("template") / "repo")
    path = write_frame(root / "inbox" / "history.csv", events(40))
    [summary] = ingest.ingest_batches([path], root, CFG)
    assert summary.status == "ingested", summary.message
    return root


@pytest.fixture
def repo(seeded_template, tmp_path):
    return copy_repo(seeded_template, tmp_path / "repo")


def ingest_one(repo, path, cfg=CFG, **kwargs):
    [summary] = ingest.ingest_batches([path], repo, cfg, **kwargs)
    return summary


def manifest(repo):
    return [json.loads(line) for line in (repo / "ingest_manifest.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------ happy paths


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_each_format_lands_once_with_canonical_types(repo, suffix):
    batch = events(10, start=100)
    summary = ingest_one(repo, write_frame(repo / "inbox" / f"new{suffix}", batch))
    assert summary.status == "ingested", summary.message
    assert summary.message.startswith("ingested 10 rows (data version")
    assert (summary.rows_in, summary.rows_accepted, summary.rows_quarantined) == (10, 10, 0)
    stored = read_store(repo / "data")
    assert len(stored) == 50
    # Parts are read in arrival order: the new batch comes after the 40 events of the history.
    assert stored["user_id"].iloc[40:].tolist() == batch["user_id"].tolist()
    assert stored["timestamp"].dtype == "int64"
    record = manifest(repo)[-1]
    assert (
        record["batch_sha256"] == summary.batch_sha256 == ingest.file_sha256(repo / "inbox" / f"new{suffix}")
    )
    assert record["part_file"] == f"part-00000002-{summary.batch_sha256[:16]}.parquet"  # history was 1
    assert {
        "rows_in",
        "rows_accepted",
        "rows_quarantined",
        "rows_duplicate",
        "data_version",
        "ingested_at",
    } <= set(record)
    assert os.path.exists(summary.report_json) and os.path.exists(summary.report_markdown)


def test_column_mapping_iso_timestamps_and_integer_ids(repo):
    path = write_csv(
        repo / "inbox" / "mapped.csv",
        "uid,sku,when,stars\n007,12,2023-11-14T22:13:20Z,4.5\n8,13,2023-11-14T23:13:20+01:00,\n",
    )
    cfg = config(column_mapping={"user_id": "uid", "item_id": "sku", "timestamp": "when", "rating": "stars"})
    summary = ingest_one(repo, path, cfg)
    assert summary.status == "ingested", summary.message
    new = read_store(repo / "data").tail(2)
    assert new["user_id"].tolist() == ["007", "8"]  # ids are strings; leading zeros survive
    assert new["timestamp"].tolist() == [T0, T0]  # both are 2023-11-14T22:13:20Z
    assert new["rating"].iloc[0] == pytest.approx(4.5) and pd.isna(new["rating"].iloc[1])

    ints = pd.DataFrame({"user_id": [1, 2], "item_id": [3, 4], "timestamp": [T0 + 10**5, T0 + 10**5 + 1]})
    assert ingest_one(repo, write_frame(repo / "inbox" / "ints.parquet", ints)).status == "ingested"
    stored = read_store(repo / "data")
    assert stored.loc[stored["timestamp"] >= T0 + 10**5, "user_id"].tolist() == ["1", "2"]

    stamps = pa.table(
        {"user_id": ["p1"], "item_id": ["q1"], "timestamp": pa.array([T0 * 10**9 + 5], pa.timestamp("ns"))}
    )
    pq.write_table(stamps, repo / "inbox" / "stamps.parquet")
    assert ingest_one(repo, repo / "inbox" / "stamps.parquet").status == "ingested"
    stored = read_store(repo / "data")
    assert stored.loc[stored["user_id"] == "p1", "timestamp"].tolist() == [T0]  # Parquet timestamps → seconds


def test_parquet_integers_of_any_width_and_a_pandas_index_are_read_as_the_seed_import_reads_them(repo):
    """`recsys data import table` took these; ingest said "wrong schema: column 'user_id' has type uint32"
    and, for any `to_parquet()` of a filtered frame, "unexpected column(s) ['__index_level_0__']"."""
    from recsys.data import read_table

    widths = pa.table({
        "user_id": pa.array([1, 2**32 - 1], pa.uint32()), "item_id": pa.array([-3, 4], pa.int16()),
        "timestamp": pa.array([T0 + 10**6, T0 + 10**6 + 1], pa.uint32()),
        "rating": pa.array([4, 5], pa.int8()),
    })
    path = repo / "inbox" / "widths.parquet"
    pq.write_table(widths, path)
    summary = ingest_one(repo, path)
    assert summary.status == "ingested", summary.message
    stored = read_store(repo / "data").tail(2).reset_index(drop=True)
    assert stored["user_id"].tolist() == ["1", str(2**32 - 1)] and stored["item_id"].tolist() == ["-3", "4"]
    assert stored["timestamp"].tolist() == [T0 + 10**6, T0 + 10**6 + 1]
    assert stored["rating"].tolist() == [4.0, 5.0]
    seed = read_table(path)  # what the seed import makes of the same file
    assert seed[["user_id", "item_id", "timestamp"]].astype(str).values.tolist() == (
        stored[["user_id", "item_id", "timestamp"]].astype(str).values.tolist())

    filtered = events(8, start=1600).iloc[[6, 1, 3, 4]]  # not a range: pandas writes the index as a column
    filtered.to_parquet(repo / "inbox" / "filtered.parquet")
    assert "__index_level_0__" in pq.read_schema(repo / "inbox" / "filtered.parquet").names
    summary = ingest_one(repo, repo / "inbox" / "filtered.parquet")
    assert (summary.status, summary.rows_accepted) == ("ingested", 4), summary.message


@pytest.mark.parametrize("share, rows", [(0.18, 50), (0.42, 50), (0.7, 10), (0.84, 25)])
def test_a_batch_with_exactly_the_allowed_share_of_bad_rows_is_accepted(repo, share, rows):
    """9 bad rows of 50 with ingest.max_bad_row_share 0.18 said "batch rejected: 9 of 50 rows (18.0%) fail
    row checks (limit 18.0%)": GX's `mostly` was 1 - 0.18 = 0.8200000000000001, above 41/50."""
    bad = round(share * rows)
    frame = events(rows, start=1700)
    frame.loc[: bad - 1, "user_id"] = None
    cfg = config(max_bad_row_share=share)
    summary = ingest_one(repo, write_frame(repo / "inbox" / "at_limit.csv", frame), cfg)
    assert summary.status == "ingested", summary.message
    assert (summary.rows_accepted, summary.rows_quarantined) == (rows - bad, bad)

    frame.loc[bad, "user_id"] = None  # one more is over the limit, said in rows
    summary = ingest_one(repo, write_frame(repo / "inbox" / "over.csv", frame), cfg)
    assert summary.status == "rejected"
    assert summary.message.startswith(
        f"batch rejected: {bad + 1} of {rows} rows fail row checks, more than the {bad} that "
        f"ingest.max_bad_row_share = {share} allows (raise it, or fix the rows): "), summary.message


def test_a_rejection_by_a_hair_says_the_counts(repo):
    """1001 bad rows of 20000 with a limit of 0.05 said "(5.0%) … (limit 5.0%)"."""
    frame = events(20000, start=10**5, users=5, items=7)
    frame.loc[:1000, "user_id"] = None
    cfg = config(max_bad_row_share=0.05)
    summary = ingest_one(repo, write_frame(repo / "inbox" / "hair.csv", frame), cfg)
    assert summary.message == (
        "batch rejected: 1001 of 20000 rows fail row checks, more than the 1000 that "
        "ingest.max_bad_row_share = 0.05 allows (raise it, or fix the rows): 1001 × user_id is missing or "
        "empty"), summary.message


def test_a_batch_of_times_in_milliseconds_is_told_the_time_settings_not_to_raise_the_share(repo):
    """Every row out of the time range said only "(raise it, or fix the rows)": raising
    ingest.max_bad_row_share would quarantine the whole batch, and the reason named no setting."""
    frame = events(20, start=1900)
    frame["timestamp"] = frame["timestamp"] * 1000
    summary = ingest_one(repo, write_frame(repo / "inbox" / "ms.csv", frame), config(max_bad_row_share=0.05))
    assert summary.status == "rejected"
    assert summary.message == (
        "batch rejected: 20 of 20 rows fail row checks, more than the 1 that ingest.max_bad_row_share = 0.05 "
        "allows (fix the rows, or the setting their reason names): 20 × timestamp before the configured floor "
        "or too far in the future (ingest.timestamp_floor = 788918400, ingest.max_future_skew_seconds = 86400; "
        "a time in milliseconds lands in the future)"), summary.message


def test_too_few_rows_names_the_setting(repo):
    path = write_frame(repo / "inbox" / "one.csv", events(1, start=1800))
    summary = ingest_one(repo, path, config(min_rows=5))
    assert summary.message == ("batch rejected: it has 1 data row, at least 5 required (ingest.min_rows; "
                               "lower it to accept smaller batches)"), summary.message


def test_a_row_rule_gx_counts_over_the_set_values_says_so(repo):
    """GX's `mostly` counts only the rows where the column is set: 2 unknown events among 2 set ones fail it,
    although 2 of 10 rows is within 0.2. It said "2 of 10 rows (20.0%) fail row checks (limit 20.0%)"."""
    frame = events(10, start=1900)
    frame["event"] = [None] * 8 + ["bogus", "bogus"]
    summary = ingest_one(repo, write_frame(repo / "inbox" / "events.csv", frame))
    assert summary.message == (
        "batch rejected: 2 of the 2 rows whose event is set fail the check 'event is not one of "
        "ingest.allowed_events', more than the 0 that ingest.max_bad_row_share = 0.2 allows of them (rows "
        "whose event is empty are not counted)"), summary.message


def test_a_file_named_twice_is_one_batch(repo, monkeypatch):
    """`recsys ingest inbox/a.csv ./inbox/a.csv` ingested a.csv, then rejected it as missing (it had been
    moved to processed/) and exited 1."""
    write_frame(repo / "inbox" / "twice.csv", events(3, start=2000))
    params = repo / "params.yaml"
    params.write_text("ingest:\n  dvc_push: false\n  max_unseen_item_share: 1.0\n")
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(app, ["inbox/twice.csv", str(repo / "inbox" / "twice.csv"), "--params",
                                      str(params)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("twice.csv: ingested 3 rows (data version"), result.output
    assert result.output.count("twice.csv") == 1, result.output
    assert (repo / "inbox" / "processed" / "twice.csv").is_file()


def test_bad_rows_are_quarantined_with_a_reason_and_good_rows_land(repo):
    rows = events(20, start=200)
    rows.loc[3, "user_id"] = None
    rows.loc[7, "timestamp"] = -1
    path = write_frame(repo / "inbox" / "some_bad.csv", rows)
    summary = ingest_one(repo, path)
    assert summary.status == "ingested"
    assert (summary.rows_accepted, summary.rows_quarantined) == (18, 2)
    quarantined = pd.read_csv(summary.quarantine_file, dtype=str)
    assert quarantined["reason"].tolist() == [
        "user_id is missing or empty",
        "timestamp before the configured floor or too far in the future",
    ]
    assert "2 quarantined" in summary.message


def test_duplicates_within_batch_and_against_history_are_dropped(repo):
    history = events(40)
    batch = pd.concat([history.iloc[:5], events(3, start=300), events(3, start=300)], ignore_index=True)
    summary = ingest_one(repo, write_frame(repo / "inbox" / "dups.csv", batch))
    assert summary.status == "ingested"
    assert (summary.rows_accepted, summary.rows_duplicate) == (3, 8)
    stored = read_store(repo / "data")
    assert not stored.duplicated(["user_id", "item_id", "timestamp"]).any()
    assert len(stored) == 43


def test_all_duplicates_records_the_batch_without_a_part(repo):
    parts_before = raw_store.list_parts(repo / "data")
    summary = ingest_one(repo, write_frame(repo / "inbox" / "replay.csv", events(10)))
    assert summary.status == "ingested" and summary.rows_accepted == 0 and summary.part_file is None
    assert raw_store.list_parts(repo / "data") == parts_before
    again = ingest_one(repo, repo / "inbox" / "replay.csv")
    assert again.status == "duplicate_batch"


def test_same_batch_twice_is_a_no_op_that_says_so(repo):
    path = write_frame(repo / "inbox" / "twice.csv", events(5, start=500))
    first = ingest_one(repo, path)
    before = snapshot(repo)
    second = ingest_one(repo, path)
    assert second.status == "duplicate_batch"
    assert f"already ingested as {first.part_file}" in second.message
    assert "data version" in second.message
    assert snapshot(repo) == before
    # Same content under another name is the same batch.
    renamed = repo / "inbox" / "copy.csv"
    renamed.write_bytes(path.read_bytes())
    assert ingest_one(repo, renamed).status == "duplicate_batch"


def test_ingest_inbox_moves_files(repo):
    write_frame(repo / "inbox" / "b_good.csv", events(5, start=600))
    write_csv(repo / "inbox" / "a_bad.csv", "user_id,item_id\nu,i\n")
    (repo / "inbox" / "history.csv").unlink()
    summaries = ingest.ingest_inbox(repo, CFG)
    assert [(s.source, s.status) for s in summaries] == [
        ("a_bad.csv", "rejected"),
        ("b_good.csv", "ingested"),
    ]
    assert (repo / "inbox" / "processed" / "b_good.csv").exists()
    assert (repo / "inbox" / "rejected" / "a_bad.csv").exists()
    assert not (repo / "inbox" / "b_good.csv").exists()
    assert ingest.ingest_inbox(repo, CFG) == []


# ------------------------------------------------------------------------------- bad-input catalogue


def _truncated_parquet(path):
    write_frame(path, events(50, start=700))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _wrong_type_parquet(path):
    pq.write_table(pa.table({"user_id": [True, False], "item_id": ["a", "b"], "timestamp": [T0, T0]}), path)


def _mostly_null_ids(path):
    frame = events(10, start=800)
    frame.loc[:5, "user_id"] = None
    write_frame(path, frame)


def _mostly_bad_timestamps(path):
    frame = events(10, start=900)
    frame["timestamp"] = [-5, 0, 10**12, 4_102_444_800, T0, T0 + 1, -1, 5, 7, 4_102_444_800]
    write_frame(path, frame)


def _decimal_ids(path):
    from decimal import Decimal

    ids = pa.array([Decimal(1), Decimal(2)], pa.decimal128(10, 0))
    pq.write_table(pa.table({"user_id": ids, "item_id": ["a", "b"], "timestamp": [T0, T0]}), path)


def _huge_unsigned_ids(path):
    ids = pa.array([2, 2**64 - 1], pa.uint64())
    pq.write_table(pa.table({"user_id": ids, "item_id": ["a", "b"], "timestamp": [T0, T0]}), path)


def _csv(text):
    return lambda path: path.write_bytes(text if isinstance(text, bytes) else text.encode())


CATALOGUE = [
    (
        "ragged.csv",
        _csv(f"user_id,item_id,timestamp\nu1,i1,{T0}\nu2,i2,{T0},extra\n"),
        r"malformed CSV: .*Expected 3 columns, got 4",
    ),
    ("quoting.csv", _csv(f'user_id,item_id,timestamp\nu1,"i1,{T0}\nu2,i2,{T0}\n'), r"malformed CSV"),
    ("truncated.parquet", _truncated_parquet, r"cannot read Parquet \(truncated or corrupt\?\)"),
    ("wrong_type.parquet", _wrong_type_parquet, r"wrong schema: column 'user_id' has type bool"),
    (
        "text_timestamps.csv",
        _csv("user_id,item_id,timestamp\nu1,i1,yesterday\nu2,i2,soon\n"),
        (r"2 of 2 rows fail row checks, more than the 0 that ingest.max_bad_row_share = 0.2 allows "
         r".*timestamp is neither UTC seconds nor ISO-8601"),
    ),
    (
        "null_ids.csv",
        _mostly_null_ids,
        (r"6 of 10 rows fail row checks, more than the 2 that ingest.max_bad_row_share = 0.2 allows "
         r".*6 × user_id is missing or empty"),
    ),
    (
        "timestamps.csv",
        _mostly_bad_timestamps,
        r"8 of 10 rows .* 8 × timestamp before the configured floor or too far in the future",
    ),
    ("empty.csv", _csv(""), r"empty.csv is empty \(0 bytes\)"),
    ("header_only.csv", _csv("user_id,item_id,timestamp\n"), r"it has 0 data rows, at least 1 required"),
    (
        "latin1.csv",
        _csv(f"user_id,item_id,timestamp\nJos\xe9,i1,{T0}\n".encode("latin-1")),
        r"not valid UTF-8 \(byte 29, line 2",
    ),
    (
        "control.csv",
        _csv(f"user_id,item_id,timestamp\nu\x01,i1,{T0}\nu2,i\x1b,{T0}\n"),
        r"2 of 2 rows .* contains a control character",
    ),
    (
        "extra.csv",
        _csv(f"user_id,item_id,timestamp,session\nu1,i1,{T0},s\n"),
        r"unexpected column\(s\) \['session'\]",
    ),
    ("missing.csv", _csv("user_id,item_id\nu1,i1\n"), r"missing column\(s\) \['timestamp'\]"),
    (
        "renamed.csv",
        _csv(f"userId,item_id,timestamp\nu1,i1,{T0}\n"),
        r"missing column\(s\) \['user_id'\]; unexpected column\(s\) \['userId'\].*column_mapping",
    ),
    (
        "bad.jsonl",
        _csv('{"user_id": "u1", "item_id": "i1", "timestamp": 1}\n{"user_id": \n'),
        r"malformed JSON lines",
    ),
    (
        "types.jsonl",
        _csv(f'{{"user_id": "u1", "item_id": "i1", "timestamp": {T0}, "event": 3}}\n'),
        r"column 'event' has type int64",
    ),
    ("notes.txt", _csv("hello"), r"unknown file type '.txt'"),
    # These said "wrong schema: column 'user_id' has type None".
    (
        "object.jsonl",
        _csv(f'{{"user_id": {{"id": 1}}, "item_id": "i1", "timestamp": {T0}}}\n'),
        (r"^column 'user_id' holds an object \(\{'id': 1\}, data row 1\) where one string or number is "
         r"expected; write one value per field$"),
    ),
    (
        "list.jsonl",
        _csv(f'{{"user_id": "u1", "item_id": null, "timestamp": {T0}}}\n'
             f'{{"user_id": "u2", "item_id": ["i1", "i2"], "timestamp": {T0}}}\n'),
        r"^column 'item_id' holds a list \(\['i1', 'i2'\], data row 2\) where one string or number",
    ),
    ("decimal.parquet", _decimal_ids, r"column 'user_id' has type object \(values of type decimal.Decimal\)"),
    (
        "huge.parquet",
        _huge_unsigned_ids,
        (r"^column 'user_id' holds 18446744073709551615, above the largest integer ingest reads "
         r"\(9223372036854775807\); write the column as strings"),
    ),
]


@pytest.mark.parametrize("name,build,message", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_batch_is_rejected_whole_with_a_clear_message(repo, name, build, message):
    path = repo / "inbox" / name
    build(path)
    before = snapshot(repo)
    stored_before = read_store(repo / "data")
    summary = ingest_one(repo, path)
    assert summary.status == "rejected"
    assert pd.Series([summary.message]).str.contains(message, regex=True).all(), summary.message
    assert snapshot(repo) == before  # store, manifest, journal: byte-identical
    pd.testing.assert_frame_equal(read_store(repo / "data"), stored_before)
    report = json.loads(open(summary.report_json).read())
    assert report["status"] == "rejected" and report["message"] == summary.message
    assert "REJECTED" in open(summary.report_markdown).read()
    assert not (repo / "quarantine").exists() or not any((repo / "quarantine").iterdir())


def test_paths_outside_the_inbox_are_refused_before_anything_runs(repo, tmp_path):
    """A mistake on the command line, not a rejected batch (`recsys ingest` says it as one `error:` line)."""
    outside = write_frame(tmp_path / "elsewhere" / "outside.csv", events(3, start=1000))
    link = repo / "inbox" / "link.csv"
    link.symlink_to(outside)
    inbox = (repo / "inbox").resolve()
    by_dots = repo / "inbox" / ".." / "inbox" / ".." / "ingest_manifest.jsonl"
    before = snapshot(repo)
    for path, shown in ((outside, outside), (by_dots, by_dots), (link, f"{link} (a link to {outside})")):
        with pytest.raises(ingest.IngestError) as refused:
            ingest_one(repo, path)
        assert str(refused.value) == (f"{shown} is outside the inbox {inbox}: move the file into the inbox, "
                                      "then ingest it from there")
    assert snapshot(repo) == before
    # An explicit inbox (tests, the flow) widens what is accepted (not to a folder above the repository).
    assert ingest_one(repo, outside, inbox=outside.parent).status == "ingested"


def test_disk_full_during_the_part_write_changes_nothing(repo, monkeypatch):
    path = write_frame(
        repo / "inbox" / "big.csv", events(10, start=1100).assign(user_id=lambda f: f.user_id + "x")
    )
    before = snapshot(repo)

    def disk_full(*args, **kwargs):  # the only mocked fault: ENOSPC cannot be produced for real here
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(raw_store.pq, "write_table", disk_full)
    with pytest.raises(ingest.IngestError, match="could not write the store \\(No space left on device\\)"):
        ingest_one(repo, path)
    assert snapshot(repo) == before
    assert list((repo / "data" / "interactions").glob(".tmp-*")) == []
    scratch = repo / ".ingest" / "tmp"  # where ingest writes its temp files (not data/interactions)
    assert not scratch.exists() or list(scratch.iterdir()) == []
    assert list((repo / ".ingest" / "pending").iterdir()) == []
    monkeypatch.undo()
    assert ingest_one(repo, path).status == "ingested"  # a retry after freeing space works


def test_a_store_on_another_mount_is_said_as_such_and_changes_nothing(repo, monkeypatch):
    """A bind mount shares its device number, so the file-system check before the run cannot see it, but the
    rename from .ingest/tmp/ into the store fails with EXDEV: the one line says what is wrong and what to do."""
    path = write_frame(repo / "inbox" / "m.csv", events(10, start=1150).assign(user_id=lambda f: f.user_id + "m"))
    before = snapshot(repo)
    real = os.replace

    def across_mounts(source, target):  # the only mocked fault: no bind mount can be made here
        if "interactions" in str(target):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(source, target)

    monkeypatch.setattr(raw_store.os, "replace", across_mounts)
    with pytest.raises(ingest.IngestError, match="m.csv: nothing was changed: ingest.quarantine or the raw "
                       "store is on another mount than .*\\.ingest, .* keep both on the repository's mount"):
        ingest_one(repo, path)
    assert snapshot(repo) == before
    assert list((repo / ".ingest" / "pending").iterdir()) == []


@pytest.mark.parametrize("step", ["manifest", "index", "report"])
def test_disk_full_after_dvc_add_keeps_the_part_and_the_next_run_records_it(repo, monkeypatch, step):
    """Once data.dvc has the part, a failure is completed, never undone: the part and the journal stay."""
    batch = events(10, start=1200).assign(user_id=lambda f: f.user_id + "y")
    path = write_frame(repo / "inbox" / "late.csv", batch)
    rows_before = len(read_store(repo / "data"))

    def disk_full(*args, **kwargs):  # the only mocked fault: ENOSPC cannot be produced for real here
        raise OSError(errno.ENOSPC, "No space left on device")

    if step == "manifest":
        monkeypatch.setattr(commit_module, "append_manifest", disk_full)
    elif step == "index":  # SQLite's own error for a full disk, not an OSError
        def index_full(*args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(KeyIndex, "add_part", index_full)
    else:
        real = ingest_report.validation.write_report
        monkeypatch.setattr(ingest_report.validation, "write_report",
                            lambda rep, *a: disk_full() if rep["status"] == "ingested" else real(rep, *a))
    failed = ("rows are in the store as part-.*recording the batch failed "
              "\\((No space left on device|database or disk)")
    with pytest.raises(ingest.IngestError, match=failed):
        ingest_one(repo, path)
    parts = {p.name for p in (repo / "data" / "interactions").glob("part-*")}
    assert len(list((repo / ".ingest" / "pending").iterdir())) == 1  # the journal stays for recovery
    monkeypatch.undo()
    summary = ingest_one(repo, path)  # recovery records the batch first, so it is already ingested
    assert summary.status == "duplicate_batch", summary.message
    assert {p.name for p in (repo / "data" / "interactions").glob("part-*")} == parts
    assert {r["part_file"] for r in manifest(repo) if r["part_file"]} == parts
    assert [r["batch_sha256"] for r in manifest(repo)].count(summary.batch_sha256) == 1
    assert len(read_store(repo / "data")) == rows_before + 10
    assert list((repo / ".ingest" / "pending").iterdir()) == []


@pytest.mark.parametrize(("mapping", "says"), [
    ({"userid": "user_id"}, r"\['userid'\] are not canonical columns"),
    ({"user_id": "customer", "item_id": "customer"},
     r"one source column cannot be two canonical ones: \{'customer': \['item_id', 'user_id'\]\}"),
    ({"user_id": ""}, r"\['user_id'\] must each name a source column"),
])
def test_a_mapping_it_cannot_follow_is_a_configuration_error_not_a_bad_batch(repo, mapping, says):
    """Caught where params.yaml is read: `{user_id: customer, item_id: customer}` reached the batch, which was
    moved to rejected/ as "missing column(s) ['user_id']" though the file was fine."""
    from recsys.config import ConfigError, parse_params

    with pytest.raises(ValueError, match=rf"ingest.column_mapping: {says}"):
        config(column_mapping=mapping)
    with pytest.raises(ConfigError, match=says):
        parse_params({"ingest": {"column_mapping": mapping}})
    path = write_frame(repo / "inbox" / "m.csv", events(2, start=1200))
    summary = ingest_one(repo, path, config(column_mapping={"user_id": "uid"}))
    assert summary.status == "rejected" and "names column(s) not in the file" in summary.message


def test_extra_columns_can_be_dropped_by_config(repo):
    path = write_csv(repo / "inbox" / "extra_ok.csv", f"user_id,item_id,timestamp,session\nz1,i1,{T0},s\n")
    summary = ingest_one(repo, path, config(extra_columns="drop"))
    assert summary.status == "ingested"
    part = pq.read_table(repo / "data" / "interactions" / summary.part_file).to_pandas()
    assert "session" not in part.columns and list(part["user_id"]) == ["z1"]  # the row landed, without it


def test_unseen_item_share_bound(repo):
    frame = events(10, start=1300).assign(item_id=lambda f: "new-" + f.item_id)
    summary = ingest_one(
        repo, write_frame(repo / "inbox" / "new_items.csv", frame), config(max_unseen_item_share=0.5)
    )
    assert summary.status == "rejected"
    assert summary.message == (
        "batch rejected: 100.0% of its events name items the store has never seen (limit "
        "ingest.max_unseen_item_share = 0.5; raise it if that many new items are expected)"), summary.message


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_success_and_rejection(repo):
    params = repo / "params.yaml"
    params.write_text("ingest:\n  dvc_push: false\n  max_unseen_item_share: 1.0\n")
    good = write_frame(repo / "inbox" / "cli_good.csv", events(4, start=1400))
    result = CliRunner().invoke(app, [str(good), "--params", str(params)])
    assert result.exit_code == 0, result.output
    assert "cli_good.csv: ingested 4 rows (data version" in result.output

    bad = write_csv(repo / "inbox" / "cli_bad.csv", "user_id,item_id\nu,i\n")
    report = repo.resolve() / "reports" / "ingest" / f"cli_bad-{ingest.file_sha256(bad)[:16]}.md"
    result = CliRunner().invoke(app, [str(bad), "--params", str(params)])
    assert result.exit_code == 1
    rejection = [line for line in result.output.splitlines() if "wrong schema" in line]
    assert rejection == [
        "error: rejected 1 of 1 batch: cli_bad.csv: wrong schema: missing column(s) ['timestamp'] (rename "
        "them with ingest.column_mapping, or set ingest.extra_columns: drop) (moved to "
        f"{repo.resolve()}/inbox/rejected/, report: {report})"], result.output
    assert report.is_file() and "Traceback" not in result.output

    # As the `recsys` command line wires it (recsys/cli.py): `recsys ingest PATH... --params FILE`.
    from recsys.cli import app as recsys_app

    again = write_frame(repo / "inbox" / "cli_again.csv", events(2, start=1500))
    result = CliRunner().invoke(recsys_app, ["ingest", str(again), "--params", str(params)])
    assert result.exit_code == 0 and "cli_again.csv: ingested 2 rows" in result.output, result.output

    params.write_text("ingest:\n  max_bad_row_shar: 0.1\n")
    result = CliRunner().invoke(app, [str(good), "--params", str(params)])
    assert result.exit_code == 1 and "error: ingest: unknown key(s) ['max_bad_row_shar']" in result.output


def test_cli_with_nothing_to_do_says_so_and_creates_nothing(tmp_path):
    from recsys.ingest.layout import NOTHING_TO_INGEST

    (tmp_path / "params.yaml").write_text("ingest:\n  inbox: inbox\n")
    result = CliRunner().invoke(app, ["--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 0 and result.output.strip() == NOTHING_TO_INGEST, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no lock, no key index


def _append_rows(path, frame) -> None:
    """What a producer still writing the file does: more rows at its end."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(frame.to_csv(index=False, header=False))


def test_a_batch_written_to_while_it_is_read_is_not_committed_and_stays_in_the_inbox(tmp_path, monkeypatch):
    """A file still being copied in was ingested in part and moved to processed/: its later rows were lost.
    (A writer racing the run is simulated: the rows arrive while the batch is planned.)"""
    from recsys.ingest import run as run_module

    repo = make_repo(tmp_path / "repo")
    path = write_frame(repo / "inbox" / "export.csv", events(20))
    real_plan = run_module.plan

    def plan_while_written(resolved, *args, **kwargs):
        planned = real_plan(resolved, *args, **kwargs)
        _append_rows(resolved, events(10, start=20))
        return planned

    monkeypatch.setattr(run_module, "plan", plan_while_written)
    [refused] = ingest.ingest_inbox(repo, CFG)
    assert refused.status == "rejected" and refused.message.startswith(
        "export.csv changed while it was read (still being written?); it stays in the inbox for the next run: "
        "write a batch elsewhere"), refused.message
    assert path.exists() and not (repo / "data").exists()  # nothing stored, nothing moved
    monkeypatch.undo()
    [summary] = ingest.ingest_inbox(repo, CFG)
    assert (summary.status, summary.rows_accepted) == ("ingested", 30) and not path.exists()


def test_a_batch_written_to_after_its_rows_were_stored_stays_and_the_rest_lands_next_run(tmp_path,
                                                                                          monkeypatch):
    from recsys.ingest import run as run_module

    repo = make_repo(tmp_path / "repo")
    path = write_frame(repo / "inbox" / "export.csv", events(20))
    real_commit = run_module.commit

    def commit_then_written(*args, **kwargs):
        summary = real_commit(*args, **kwargs)
        _append_rows(path, events(10, start=20))
        return summary

    monkeypatch.setattr(run_module, "commit", commit_then_written)
    [first] = ingest.ingest_inbox(repo, CFG)
    assert first.rows_accepted == 20 and path.exists()  # not moved: the file is not what was stored
    monkeypatch.undo()
    [second] = ingest.ingest_inbox(repo, CFG)
    assert (second.rows_accepted, second.rows_duplicate) == (10, 20) and not path.exists()
    assert len(read_store(repo / "data")) == 30
