"""What a commit leaves behind: part names in arrival order, file modes, messages, reports, the inbox."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pandas as pd
import pytest
from typer.testing import CliRunner

from recsys import store as raw_store
from recsys.commands.ingest import app
from recsys.ingest import ingest_batches, ingest_inbox
from recsys.store import read_store
from test_ingest_support import T0, config, events, make_repo, write_csv, write_frame

CFG = config()


def _tie_batches(repo):
    """Two batches with an event each at the same (user, second), written so that the first to arrive has
    the larger content hash: a name-ordered store would put it second."""
    for salt in range(100):
        first = f"user_id,item_id,timestamp\nu1,first-{salt},{T0}\n"
        second = f"user_id,item_id,timestamp\nu1,second-{salt},{T0}\n"
        if hashlib.sha256(first.encode()).hexdigest() > hashlib.sha256(second.encode()).hexdigest():
            return write_csv(repo / "inbox" / "a.csv", first), write_csv(repo / "inbox" / "b.csv", second)
    raise AssertionError("no salt gave the wanted hash order")


def test_rows_that_tie_across_batches_are_read_in_arrival_order(tmp_path):
    repo = make_repo(tmp_path / "repo")
    first, second = _tie_batches(repo)
    assert [s.status for s in ingest_batches([first, second], repo, CFG)] == ["ingested", "ingested"]
    stored = read_store(repo / "data")
    assert stored["item_id"].str.split("-").str[0].tolist() == ["first", "second"]
    names = [p.name for p in raw_store.list_parts(repo / "data")]
    assert names[0].startswith("part-00000001-") and names[1].startswith("part-00000002-")


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_store_parts_follow_the_umask(tmp_path, umask):
    repo = make_repo(tmp_path / "repo")
    path = write_frame(repo / "inbox" / "b.csv", events(3))
    old = os.umask(umask)
    try:
        [summary] = ingest_batches([path], repo, CFG)
    finally:
        os.umask(old)
    part = repo / "data" / "interactions" / summary.part_file
    assert stat.S_IMODE(part.stat().st_mode) == 0o666 & ~umask


def test_already_ingested_message_names_the_file_once(tmp_path):
    repo = make_repo(tmp_path / "repo")
    params = repo / "params.yaml"
    params.write_text("ingest:\n  dvc_push: false\n")
    path = write_frame(repo / "inbox" / "once.csv", events(4))
    assert CliRunner().invoke(app, [str(path), "--params", str(params)]).exit_code == 0
    processed = repo / "inbox" / "processed" / "once.csv"
    result = CliRunner().invoke(app, [str(processed), "--params", str(params)])
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[0]
    assert line.startswith("once.csv: already ingested as part-00000001-") and line.count("once.csv") == 1
    copy = write_frame(repo / "inbox" / "copy.csv", events(4))  # same bytes, other name
    result = CliRunner().invoke(app, [str(copy), "--params", str(params)])
    assert "copy.csv: already ingested from once.csv as part-00000001-" in result.output


def test_quarantine_report_counts_each_problem_once(tmp_path):
    repo = make_repo(tmp_path / "repo")
    rows = events(20)
    rows["timestamp"] = rows["timestamp"].astype(str)
    rows.loc[3, "timestamp"] = "yesterday"  # unparseable: null after conversion, but one problem
    rows.loc[5, "user_id"] = None
    [summary] = ingest_batches([write_frame(repo / "inbox" / "q.csv", rows)], repo, CFG)
    assert summary.status == "ingested" and summary.rows_quarantined == 2
    report = json.loads(open(summary.report_json).read())
    assert report["reasons"] == {
        "timestamp is neither UTC seconds nor ISO-8601": 1,
        "user_id is missing or empty": 1,
    }
    quarantined = pd.read_csv(summary.quarantine_file)
    assert quarantined["reason"].tolist() == [
        "timestamp is neither UTC seconds nor ISO-8601: yesterday",
        "user_id is missing or empty",
    ]


def test_cli_and_flow_file_batches_away_the_same_way(tmp_path):
    repo = make_repo(tmp_path / "repo")
    params = repo / "params.yaml"
    params.write_text("ingest:\n  dvc_push: false\n  max_unseen_item_share: 1.0\n")
    good = write_frame(repo / "inbox" / "good.csv", events(4))
    bad = write_csv(repo / "inbox" / "bad.csv", "user_id,item_id\nu,i\n")
    result = CliRunner().invoke(app, [str(good), str(bad), "--params", str(params)])
    assert result.exit_code == 1
    assert sorted(p.relative_to(repo / "inbox").as_posix() for p in (repo / "inbox").rglob("*.csv")) == [
        "processed/good.csv",
        "rejected/bad.csv",
    ]
    # The library call the flow makes does the same with the inbox's own files.
    write_frame(repo / "inbox" / "good2.csv", events(4, start=10))
    write_frame(repo / "inbox" / "again.csv", events(4))  # same bytes as good.csv: already ingested
    statuses = [(s.source, s.status) for s in ingest_inbox(repo, CFG)]
    assert statuses == [("again.csv", "duplicate_batch"), ("good2.csv", "ingested")]
    processed = sorted(p.name for p in (repo / "inbox" / "processed").iterdir())
    assert processed == ["again.csv", "good.csv", "good2.csv"]
    assert [p.name for p in (repo / "inbox").iterdir() if p.is_file()] == []


def test_a_batch_named_like_a_filed_one_keeps_both(tmp_path):
    """Daily exports share a name: the second `export.csv` replaced the first in processed/ (and a rejected
    one its predecessor in rejected/), losing the only copy of what was ingested or refused."""
    repo = make_repo(tmp_path / "repo")
    inbox = repo / "inbox"
    first = write_frame(inbox / "export.csv", events(4)).read_bytes()
    bad_first = write_csv(inbox / "bad.csv", "user_id,item_id\nu,i\n").read_bytes()
    assert [s.status for s in ingest_inbox(repo, CFG)] == ["rejected", "ingested"]
    second = write_frame(inbox / "export.csv", events(4, start=10)).read_bytes()
    bad_second = write_csv(inbox / "bad.csv", "user_id\nu\n").read_bytes()
    assert [s.status for s in ingest_inbox(repo, CFG)] == ["rejected", "ingested"]
    filed = (("processed", first, second, "export"), ("rejected", bad_first, bad_second, "bad"))
    for folder, old, new, stem in filed:
        kept = {p.name: p.read_bytes() for p in (inbox / folder).iterdir()}
        assert kept[f"{stem}.csv"] == old and len(kept) == 2, sorted(kept)
        (renamed,) = [name for name in kept if name != f"{stem}.csv"]
        assert renamed.startswith(f"{stem}-") and renamed.endswith(".csv") and kept[renamed] == new
    write_frame(inbox / "export.csv", events(4))  # the first one's bytes again: already ingested, same file
    assert [s.status for s in ingest_inbox(repo, CFG)] == ["duplicate_batch"]
    assert len(list((inbox / "processed").iterdir())) == 2


def test_a_folder_in_the_inbox_is_refused_each_run_not_skipped_as_an_empty_inbox(tmp_path):
    """A Parquet dataset folder (`export.parquet/part-0.parquet`) was passed over: "nothing to ingest",
    exit 0, night after night."""
    from recsys.ingest.layout import has_work
    from recsys.ingest.layout import paths as ingest_paths

    repo = make_repo(tmp_path / "repo")
    params = repo / "params.yaml"
    params.write_text("ingest:\n  dvc_push: false\n")
    folder = repo / "inbox" / "export.parquet"
    write_frame(folder / "part-0.csv", events(3))
    assert has_work(ingest_paths(repo, CFG), CFG)
    for _ in range(2):
        result = CliRunner().invoke(app, ["--params", str(params)])
        assert result.exit_code == 1 and "nothing to ingest" not in result.output, result.output
        assert "export.parquet is a folder: ingest reads one file per batch" in result.output, result.output
        assert (folder / "part-0.csv").is_file()  # not moved, not read: the person decides
    write_frame(repo / "inbox" / "part-0.csv", events(3))
    (folder / "part-0.csv").unlink()
    folder.rmdir()
    result = CliRunner().invoke(app, ["--params", str(params)])
    assert result.exit_code == 0 and "part-0.csv: ingested 3 rows" in result.output, result.output


def test_cli_without_paths_ingests_the_inbox(tmp_path):
    repo = make_repo(tmp_path / "repo")
    params = repo / "params.yaml"
    params.write_text("ingest:\n  dvc_push: false\n")
    write_frame(repo / "inbox" / "new.csv", events(3))
    result = CliRunner().invoke(app, ["--params", str(params)])
    assert result.exit_code == 0 and "new.csv: ingested 3 rows" in result.output, result.output
    assert (repo / "inbox" / "processed" / "new.csv").exists()
