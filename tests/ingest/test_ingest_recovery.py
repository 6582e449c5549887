"""Recovery before any read, and no leftovers: a crashed commit is finished (or rolled back) by whoever
touches the store next — the prepare stage included — and temp files live in one scratch folder only."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recsys import ingest, prepare
from recsys.config import PROJECT_ROOT
from recsys.ingest.layout import has_work, needs_recovery
from recsys.ingest.layout import paths as ingest_paths
from recsys.ingest.manifest import read_manifest
from recsys.store import list_parts, read_store
from test_ingest_support import config, events, make_repo, write_frame

CFG = config()
SPAWN = multiprocessing.get_context("spawn")


def _child_ingest(repo, path, fault):
    os.environ[ingest.FAULT_ENV] = fault
    ingest.ingest_batches([path], repo, CFG)


def crash(repo, path, fault):
    process = SPAWN.Process(target=_child_ingest, args=(repo, path, fault))
    process.start()
    process.join(300)
    assert process.exitcode == 1, "the child did not die at the fault point"


def params_for(repo):
    """The project's params with a store this small in mind (k-core of 2) and no push."""
    text = (PROJECT_ROOT / "params.yaml").read_text()
    text = text.replace("min_user_interactions: 5", "min_user_interactions: 2")
    text = text.replace("min_item_interactions: 5", "min_item_interactions: 2")
    text = text.replace("dvc_push: true", "dvc_push: false")
    text = text.replace("max_unseen_item_share: 0.5", "max_unseen_item_share: 1.0")
    (repo / "params.yaml").write_text(text)
    return repo / "params.yaml"


@pytest.mark.slow
def test_prepare_completes_an_interrupted_commit_before_it_reads(tmp_path):
    repo = make_repo(tmp_path / "repo")
    ingest.ingest_batches([write_frame(repo / "inbox" / "h.csv", events(40))], repo, CFG)
    path = write_frame(repo / "inbox" / "b.csv", events(20, start=100))
    crash(repo, path, "after_part_write")
    # The state a reader must never see: a part on disk without its manifest record.
    assert len(list_parts(repo / "data")) == 2 and len(read_manifest(repo / "ingest_manifest.jsonl")) == 1

    params = params_for(repo)
    # The stage as `dvc repro` runs it (its `__main__` recovers before it reads).
    done = subprocess.run([sys.executable, "-m", "recsys.prepare", "--params", str(params), "--store", "data",
                           "--out", str(tmp_path / "prepared")], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_manifest(repo / "ingest_manifest.jsonl")
    assert [r["source"] for r in records] == ["h.csv", "b.csv"]
    assert list((repo / ".ingest" / "pending").iterdir()) == []
    assert prepare.load(tmp_path / "prepared").fingerprint["n_events"] == 60


def test_has_work_sees_a_batch_a_push_or_a_crash_left_behind(tmp_path):
    """The stat-only check before a scheduled run loads the ingest code: anything a run would act on
    counts — a push marker only where `ingest.dvc_push` is on (with it off, no run pushes: the marker
    waits)."""
    repo = make_repo(tmp_path / "repo")
    where = ingest_paths(repo, CFG)
    pushing = config(dvc_push=True)
    assert not has_work(where, pushing)  # an empty inbox in a repository nothing was ever ingested into
    (repo / "inbox" / ".DS_Store").write_text("")
    (repo / "inbox" / "processed").mkdir()
    assert not has_work(where, pushing)  # hidden files and the filing folders are not batches
    for leftover in (repo / "inbox" / "b.csv", where.push_marker, where.pending / "abc.json",
                     where.scratch / ".tmp-part.parquet"):
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_text("{}")
        assert has_work(where, pushing), leftover
        assert has_work(where, CFG) == (leftover != where.push_marker), leftover
        leftover.unlink()
    where.scratch.mkdir(parents=True, exist_ok=True)  # empty, as every finished run leaves it
    assert not has_work(where, pushing) and not needs_recovery(where)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["after_journal", "part_temp_written", "after_part_write", "after_manifest"])
def test_a_crash_at_any_commit_step_leaves_work_that_recovery_clears(tmp_path, fault):
    repo = make_repo(tmp_path / "repo")
    where = ingest_paths(repo, CFG)
    ingest.ingest_batches([write_frame(repo / "inbox" / "h.csv", events(40))], repo, CFG)
    (repo / "inbox" / "h.csv").unlink()
    assert not has_work(where, CFG)  # what a nothing-new scheduled run finds: it skips the ingest task
    path = write_frame(repo / "inbox" / "b.csv", events(20, start=100))
    crash(repo, path, fault)
    path.unlink()  # even with the batch gone from the inbox, the crash's traces are work
    assert needs_recovery(where) and has_work(where, CFG)
    ingest.recover(repo, CFG)
    assert not needs_recovery(where) and not has_work(where, CFG)
    completed = fault in ("after_part_write", "after_manifest")  # the part was on disk: recorded, not undone
    assert len(read_store(repo / "data")) == (60 if completed else 40)
    assert [r["source"] for r in read_manifest(repo / "ingest_manifest.jsonl")] == (
        ["h.csv", "b.csv"] if completed else ["h.csv"])


@pytest.mark.slow
def test_recover_rolls_back_a_commit_whose_part_never_appeared(tmp_path):
    repo = make_repo(tmp_path / "repo")
    ingest.ingest_batches([write_frame(repo / "inbox" / "h.csv", events(40))], repo, CFG)
    batch = events(20, start=100)
    batch.loc[0, "user_id"] = None  # one quarantined row: its quarantine file goes with the rollback
    path = write_frame(repo / "inbox" / "b.csv", batch)
    crash(repo, path, "after_journal")
    actions = ingest.recover(repo, CFG)
    assert len(actions) == 1 and "rolled back" in actions[0]
    assert len(read_store(repo / "data")) == 40 and not any((repo / "quarantine").glob("*"))
    [summary] = ingest.ingest_batches([path], repo, CFG)  # the retry lands it, once
    assert summary.status == "ingested" and len(read_store(repo / "data")) == 59


@pytest.mark.slow
def test_a_rollback_whose_quarantine_folder_became_a_file_still_clears_its_journal(tmp_path):
    """Removing the quarantine file through a path whose folder is a file raised NotADirectoryError (unlink's
    missing_ok covers only a missing file): the journal stayed, and every later run and reader failed on it."""
    repo = make_repo(tmp_path / "repo")
    ingest.ingest_batches([write_frame(repo / "inbox" / "h.csv", events(40))], repo, CFG)
    batch = events(20, start=100)
    batch.loc[0, "user_id"] = None
    path = write_frame(repo / "inbox" / "b.csv", batch)
    crash(repo, path, "after_journal")
    quarantine = repo / "quarantine"
    shutil.rmtree(quarantine, ignore_errors=True)  # (a kill after the journal: its file may not be written)
    quarantine.write_text("a file where the folder was\n")
    actions = ingest.recover(repo, CFG)
    assert len(actions) == 1 and "rolled back" in actions[0]
    assert not needs_recovery(ingest_paths(repo, CFG)) and len(read_store(repo / "data")) == 40


@pytest.mark.slow
def test_temp_files_live_in_the_scratch_folder_and_the_next_run_removes_them(tmp_path):
    repo = make_repo(tmp_path / "repo")
    ingest.ingest_batches([write_frame(repo / "inbox" / "h.csv", events(10))], repo, CFG)
    scratch = repo / ".ingest" / "tmp"
    # What a kill in the middle of a write leaves: a temp part in the scratch folder, never in the store.
    crash(repo, write_frame(repo / "inbox" / "b.csv", events(10, start=50)), "part_temp_written")
    assert [p.name.startswith(".tmp-") for p in scratch.iterdir()] == [True]
    assert [p.name for p in (repo / "data" / "interactions").iterdir() if p.name.startswith(".")] == []
    legacy = repo / "data" / "interactions" / ".tmp-123.parquet"  # from a version that wrote temps there
    legacy.write_bytes(b"half")
    ingest.ingest_batches([repo / "inbox" / "b.csv"], repo, CFG)
    assert not legacy.exists() and list(scratch.iterdir()) == []
    assert len(read_store(repo / "data")) == 20


def test_a_rejected_batch_is_validated_before_anything_is_copied(tmp_path):
    repo = make_repo(tmp_path / "repo")
    bad = write_frame(repo / "inbox" / "bad.csv", events(10).drop(columns=["timestamp"]))
    [summary] = ingest.ingest_batches([bad], repo, CFG)
    assert summary.status == "rejected"
    assert not (repo / "data").exists() and not (repo / "quarantine").exists()
    for state in (repo / ".ingest" / "tmp", repo / ".ingest" / "pending"):
        assert not state.exists() or list(state.iterdir()) == []
