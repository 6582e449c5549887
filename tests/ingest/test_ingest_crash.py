"""Crash safety and concurrency: real processes (forked, so GX is not re-imported) killed with os._exit at
each injected fault point, then a re-run; and two processes ingesting the same batch at once."""

from __future__ import annotations

import json
import multiprocessing
import os

import pandas as pd
import pytest

from recsys import ingest
from recsys.store import list_parts, read_store
from test_ingest_support import config, copy_repo, events, make_repo, snapshot, write_frame

pytestmark = pytest.mark.slow  # kill -9 fault injection in real processes (run in CI)

CFG = config()
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def seeded_template(tmp_path_factory):
    root = make_repo(tmp_path_factory.mktemp("template") / "repo")
    [summary] = ingest.ingest_batches([write_frame(root / "inbox" / "history.csv", events(30))], root, CFG)
    assert summary.status == "ingested"
    return root


def _child_ingest(repo, path, fault, queue=None, barrier=None):
    if fault:
        os.environ[ingest.FAULT_ENV] = fault
    if barrier is not None:
        barrier.wait()
    [summary] = ingest.ingest_batches([path], repo, CFG)
    if queue is not None:
        queue.put((summary.status, summary.message))


def _run_child(*args):
    process = SPAWN.Process(target=_child_ingest, args=args)
    process.start()
    process.join(300)
    return process.exitcode


def _records(repo):
    path = repo / "ingest_manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _comparable(records):
    return [{k: v for k, v in r.items() if k != "ingested_at"} for r in records]


@pytest.mark.parametrize("fault", ingest.FAULT_POINTS)
def test_crash_at_each_fault_point_leaves_before_or_after_and_rerun_completes(
    seeded_template, tmp_path, fault
):
    batch = pd.concat([events(12, start=100), events(2, start=100)], ignore_index=True)  # 2 duplicates
    batch.loc[0, "timestamp"] = -3  # one quarantined row

    reference = copy_repo(seeded_template, tmp_path / "reference")
    ref_path = write_frame(reference / "inbox" / "batch.csv", batch)
    [expected] = ingest.ingest_batches([ref_path], reference, CFG)
    assert (expected.rows_accepted, expected.rows_duplicate, expected.rows_quarantined) == (12, 1, 1)

    repo = copy_repo(seeded_template, tmp_path / "repo")
    path = write_frame(repo / "inbox" / "batch.csv", batch)
    history = read_store(repo / "data")
    assert _run_child(repo, path, fault) == 1  # the process really died at the fault point

    # Right after the crash the store is the old one or the complete new one, never a partial part.
    after_crash = read_store(repo / "data")
    # each point's one state
    assert len(after_crash) == len(history) + (0 if fault == "after_journal" else 12)
    stored = [p.name for p in (repo / "data" / "interactions").iterdir()]
    assert all(name.startswith("part-") for name in stored), stored  # temp files live in .ingest/tmp only

    summary = ingest.ingest_batches([path], repo, CFG)[0]
    # The re-run recognises the batch (completed by recovery, or committed before the crash) ...
    if fault == "after_journal":
        assert summary.status == "ingested"  # nothing had reached the store: a clean retry
    else:
        assert summary.status == "duplicate_batch", summary.message
    # ... and the end state is exactly the state of an uninterrupted run.
    pd.testing.assert_frame_equal(read_store(repo / "data"), read_store(reference / "data"))
    assert _comparable(_records(repo)) == _comparable(_records(reference))
    assert [p.name for p in list_parts(repo / "data")] == [p.name for p in list_parts(reference / "data")]
    assert list((repo / ".ingest" / "pending").iterdir()) == []
    scratch = repo / ".ingest" / "tmp"
    assert not scratch.exists() or list(scratch.iterdir()) == []  # the rerun emptied what the crash left
    assert (
        json.loads(open(expected.report_json.replace(str(reference), str(repo))).read())["status"]
        == "ingested"
    )


@pytest.mark.parametrize("fault", ["after_journal", "after_part_write"])
def test_a_batch_of_duplicates_and_bad_rows_killed_midway_keeps_its_quarantined_rows(
    seeded_template, tmp_path, fault
):
    """A batch whose good rows are all in the store already writes no part, only its quarantine file.
    Killed before that file was written (after_journal), recovery recorded the batch anyway — its report
    naming a quarantine file that did not exist, its bad rows gone, and the re-run saying "already
    ingested". Now it rolls back and the re-run ingests the batch as an uninterrupted run does."""
    batch = events(10)  # in the seeded history already
    bad = events(1, start=500)
    bad.loc[0, "timestamp"] = -3
    batch = pd.concat([batch, bad], ignore_index=True)

    reference = copy_repo(seeded_template, tmp_path / "reference")
    ref_path = write_frame(reference / "inbox" / "batch.csv", batch)
    [expected] = ingest.ingest_batches([ref_path], reference, CFG)
    assert (expected.rows_accepted, expected.rows_duplicate, expected.rows_quarantined) == (0, 10, 1)
    assert expected.quarantine_file and os.path.isfile(expected.quarantine_file)

    repo = copy_repo(seeded_template, tmp_path / "repo")
    path = write_frame(repo / "inbox" / "batch.csv", batch)
    assert _run_child(repo, path, fault) == 1
    [summary] = ingest.ingest_batches([path], repo, CFG)
    assert summary.status == ("ingested" if fault == "after_journal" else "duplicate_batch"), summary.message
    assert _comparable(_records(repo)) == _comparable(_records(reference))
    quarantined = expected.quarantine_file.replace(str(reference), str(repo))
    assert pd.read_csv(quarantined).equals(pd.read_csv(expected.quarantine_file))
    assert list((repo / ".ingest" / "pending").iterdir()) == []


def test_torn_manifest_line_is_repaired_and_batch_recorded_once(seeded_template, tmp_path):
    repo = copy_repo(seeded_template, tmp_path / "repo")
    path = write_frame(repo / "inbox" / "batch.csv", events(5, start=300))
    assert _run_child(repo, path, "after_part_write") == 1
    with open(repo / "ingest_manifest.jsonl", "ab") as handle:
        handle.write(b'{"batch_sha256": "trunc')  # a crash in the middle of an append
    actions = ingest.recover(repo, CFG)
    assert len(actions) == 1 and "completed it" in actions[0]
    records = _records(repo)
    assert [r["source"] for r in records] == ["history.csv", "batch.csv"]


def test_same_batch_from_two_processes_at_once_is_appended_exactly_once(seeded_template, tmp_path):
    repo = copy_repo(seeded_template, tmp_path / "repo")
    path = write_frame(repo / "inbox" / "race.csv", events(20, start=400))
    # Fresh interpreters (spawn), not forks: by now this test process may run other threads (e.g. a Prefect
    # test server), and two real writers are what the lock must survive.
    queue, barrier = SPAWN.Queue(), SPAWN.Barrier(2)
    processes = [
        SPAWN.Process(target=_child_ingest, args=(repo, path, None, queue, barrier)) for _ in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(300)
    assert [p.exitcode for p in processes] == [0, 0]
    statuses = sorted(queue.get(timeout=5)[0] for _ in processes)
    assert statuses == ["duplicate_batch", "ingested"]
    assert [r["source"] for r in _records(repo)] == ["history.csv", "race.csv"]
    assert len(read_store(repo / "data")) == 50


def test_snapshot_helper_sees_a_changed_store(seeded_template, tmp_path):
    """Guards the catalogue tests: the byte snapshot must notice an append."""
    repo = copy_repo(seeded_template, tmp_path / "repo")
    before = snapshot(repo)
    ingest.ingest_batches([write_frame(repo / "inbox" / "x.csv", events(3, start=500))], repo, CFG)
    assert snapshot(repo) != before
