"""Ingest against a real temporary git + DVC repository with a local remote (never /work/main's data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from recsys import ingest
from recsys.store import read_store
from test_ingest_support import (
    VENV_BIN,
    config,
    events,
    run,
    snapshot,
    write_csv,
    write_frame,
)

pytestmark = pytest.mark.slow
CFG = config(dvc_push=True)


def dvc_md5(repo):
    return yaml.safe_load((repo / "data.dvc").read_text())["outs"][0]["md5"]


def records(repo):
    return [json.loads(line) for line in (repo / "ingest_manifest.jsonl").read_text().splitlines()]


def test_ingest_adds_pushes_records_version_and_old_versions_check_out(dvc_repo, tmp_path):
    repo = dvc_repo
    first = ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(20))], repo, CFG)[0]
    assert first.status == "ingested", first.message
    assert first.data_version == dvc_md5(repo) and first.data_version.endswith(".dir")
    assert first.message.startswith(f"ingested 20 rows (data version {first.data_version})")
    assert records(repo)[-1]["data_version"] == first.data_version
    assert any((tmp_path / "remote").rglob("*")), "dvc push sent nothing to the remote"
    run(["git", "add", "data.dvc", ".gitignore", "ingest_manifest.jsonl"], repo)
    run(["git", "commit", "-qm", "b1"], repo)

    second = ingest.ingest_batches([write_frame(repo / "inbox" / "b2.csv", events(5, start=50))], repo, CFG)[
        0
    ]
    assert second.data_version == dvc_md5(repo) != first.data_version
    before = snapshot(repo)
    again = ingest.ingest_batches([repo / "inbox" / "b1.csv"], repo, CFG)[0]
    assert again.status == "duplicate_batch" and first.data_version in again.message
    assert snapshot(repo) == before

    # The first dataset version can be checked out again.
    run(["git", "checkout", "-q", "HEAD", "--", "data.dvc"], repo)
    run([str(VENV_BIN / "dvc"), "checkout", "-q", "--force", "data.dvc"], repo)
    assert len(read_store(repo / "data")) == 20


def test_rejected_batches_leave_data_dvc_and_manifest_byte_identical(dvc_repo):
    repo = dvc_repo
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    before = snapshot(repo)
    assert {"data.dvc", "ingest_manifest.jsonl"} <= set(before)
    bad = [
        write_csv(repo / "inbox" / "ragged.csv", "user_id,item_id,timestamp\nu,i,1700000000,x\n"),
        write_csv(repo / "inbox" / "header.csv", "user_id,item_id,timestamp\n"),
        write_csv(repo / "inbox" / "renamed.csv", "user,item_id,timestamp\nu,i,1700000000\n"),
    ]
    summaries = ingest.ingest_batches(bad, repo, CFG)
    assert [s.status for s in summaries] == ["rejected"] * 3
    assert snapshot(repo) == before


def test_killed_subprocess_after_part_write_is_completed_by_the_next_run(dvc_repo):
    repo = dvc_repo
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    version_before = dvc_md5(repo)
    path = write_frame(repo / "inbox" / "b2.csv", events(10, start=100))
    result = _killed_at(repo, "after_part_write", path)
    assert result.returncode == 1, result.stderr
    # Crashed between the part and `dvc add`: part on disk, data.dvc and manifest still the old ones.
    assert dvc_md5(repo) == version_before and len(records(repo)) == 1
    assert len(read_store(repo / "data")) == 20

    summary = ingest.ingest_batches([path], repo, CFG)[0]
    assert summary.status == "duplicate_batch"
    assert records(repo)[-1]["data_version"] == dvc_md5(repo) != version_before
    status = run([str(VENV_BIN / "dvc"), "status", "data.dvc"], repo)
    assert "up to date" in status


def _killed_at(repo, fault, path):
    """Ingest `path` in a child process that dies (like kill -9) at `fault`."""
    code = (
        "from recsys.ingest import ingest_batches; from recsys.config import IngestConfig;"
        "cfg = IngestConfig(dvc_push=False, max_unseen_item_share=1.0);"
        f"ingest_batches([{str(path)!r}], {str(repo)!r}, cfg)"
    )
    env = dict(os.environ, RECSYS_FAULT=fault, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True,
                          check=False)


def _repro_a_reader(repo, *options):
    """`dvc repro` of a stage that depends on the store and recovers before it reads, as `prepare` does."""
    (repo / "reader.py").write_text(
        "from recsys.config import IngestConfig\nfrom recsys.entry import run_entry\n"
        "from recsys.ingest import recover\n\n"
        "run_entry(lambda: recover('.', IngestConfig(dvc_push=False)))\n")
    stage = {"cmd": f"{sys.executable} reader.py", "deps": ["data"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"reader": stage}}))
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop("RECSYS_FAULT", None)
    return subprocess.run([str(VENV_BIN / "dvc"), "repro", *options, "reader"], cwd=repo, env=env,
                          capture_output=True, text=True, check=False)


def test_a_stage_of_dvc_repro_records_a_commit_dvc_repro_has_versioned_without_dvc_add(dvc_repo):
    """A part written, not recorded: `dvc repro` saves the changed data.dvc itself before any stage runs,
    and the stage's recovery then ran `dvc add`, which DVC's lock on the stage's `data` always refuses ("is
    busy"): the run failed with data.dvc naming the part and the manifest without it. Now the stage records
    the batch under the version DVC wrote, and runs no `dvc add`."""
    repo = dvc_repo
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    path = write_frame(repo / "inbox" / "b2.csv", events(10, start=100))
    assert _killed_at(repo, "after_part_write", path).returncode == 1
    done = _repro_a_reader(repo)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [r["source"] for r in records(repo)] == ["b1.csv", "b2.csv"]
    assert records(repo)[-1]["data_version"] == dvc_md5(repo)
    assert not any((repo / ".ingest" / "pending").iterdir())
    assert "up to date" in run([str(VENV_BIN / "dvc"), "status", "data.dvc"], repo)


def test_a_stage_of_dvc_repro_refuses_a_commit_it_cannot_record_in_one_line(dvc_repo):
    """`dvc repro --single-item` leaves data.dvc as it was: the stage cannot record the batch, and says which
    command does, without touching data.dvc; `recsys ingest` then completes it."""
    repo = dvc_repo
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    path = write_frame(repo / "inbox" / "b2.csv", events(10, start=100))
    assert _killed_at(repo, "after_part_write", path).returncode == 1
    before = (repo / "data.dvc").read_bytes()
    done = _repro_a_reader(repo, "--single-item")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr[-2000:]
    assert errors[0].endswith("(b2.csv) was written but not recorded, and a stage of `dvc repro` cannot "
                              "record it (DVC holds the store locked); run `recsys ingest` (it completes "
                              "interrupted commits), then `dvc repro`"), errors[0]
    assert (repo / "data.dvc").read_bytes() == before and len(records(repo)) == 1
    assert ingest.ingest_batches([path], repo, CFG)[0].status == "duplicate_batch"
    assert records(repo)[-1]["data_version"] == dvc_md5(repo) and len(records(repo)) == 2


def test_recsys_ingest_says_the_recovered_commit_before_its_batch_is_found_ingested(dvc_repo):
    """The rerun after a kill printed "already ingested ... nothing to do" before the line saying that this
    very run had just recorded it: now in the order it happened."""
    repo = dvc_repo
    (repo / "params.yaml").write_text("ingest:\n  dvc_push: false\n  max_unseen_item_share: 1.0\n")
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    path = write_frame(repo / "inbox" / "b2.csv", events(10, start=100))
    assert _killed_at(repo, "after_part_write", path).returncode == 1
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop("RECSYS_FAULT", None)
    done = subprocess.run([sys.executable, "-m", "recsys.cli", "ingest"], cwd=repo, env=env,
                          capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines()  # (b1.csv, ingested above without `move`, is still in the inbox too)
    assert done.returncode == 0 and len(lines) == 3, done.stdout + done.stderr[-2000:]
    assert lines[0].endswith("(b2.csv) was written but not recorded; completed it"), lines
    assert lines[2].startswith("b2.csv: already ingested as part-"), lines
    assert lines[2].endswith("nothing to do"), lines


def test_killed_after_dvc_add_is_recorded_by_the_next_run_never_undone(dvc_repo):
    """The window the README's guarantee names (data.dvc has the part, the manifest has no line), with real
    DVC: the next run records the batch under the version data.dvc holds."""
    repo = dvc_repo
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    path = write_frame(repo / "inbox" / "b2.csv", events(10, start=100))
    killed = _killed_at(repo, "after_dvc_add", path)
    assert killed.returncode == 1 and "injected fault at after_dvc_add" in killed.stderr, killed.stderr
    assert len(records(repo)) == 1 and dvc_md5(repo) != records(repo)[0]["data_version"]
    summary = ingest.ingest_batches([path], repo, CFG)[0]
    assert summary.status == "duplicate_batch", summary.message
    assert [r["source"] for r in records(repo)] == ["b1.csv", "b2.csv"]
    assert records(repo)[-1]["data_version"] == dvc_md5(repo) and len(read_store(repo / "data")) == 20
    assert "up to date" in run([str(VENV_BIN / "dvc"), "status", "data.dvc"], repo)


def test_prepare_stops_before_reading_when_it_cannot_complete_an_interrupted_commit(dvc_repo):
    """A part written but not recorded, and a `dvc add` that fails when `prepare`'s recovery tries to
    complete it: one line saying to run `recsys ingest`, exit 1, nothing prepared; `recsys ingest` then
    completes it. (DVC's multi-line output, its support hint included, used to be pasted into that line.)"""
    import shutil

    repo = dvc_repo
    (repo / "params.yaml").write_text("ingest:\n  dvc_push: false\n  max_unseen_item_share: 1.0\n")
    ingest.ingest_batches([write_frame(repo / "inbox" / "b1.csv", events(10))], repo, CFG)
    path = write_frame(repo / "inbox" / "b2.csv", events(10, start=100))
    assert _killed_at(repo, "after_part_write", path).returncode == 1
    cache = repo / ".dvc" / "cache"
    moved = repo.parent / "cache-aside"
    shutil.move(cache, moved)
    cache.write_text("a file where DVC's cache folder should be")  # `dvc add` fails for real
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop("RECSYS_FAULT", None)
    stage = subprocess.run([sys.executable, "-m", "recsys.prepare"], cwd=repo, env=env, capture_output=True,
                           text=True, check=False)
    lines = [line for line in stage.stderr.splitlines() if line.startswith("error: ")]
    assert stage.returncode == 1 and "Traceback" not in stage.stderr, stage.stderr
    assert len(lines) == 1, stage.stderr
    assert "was written but not recorded, and completing it failed" in lines[0], stage.stderr
    assert "run `recsys ingest` (it completes interrupted commits), then retry" in lines[0], stage.stderr
    assert not (repo / "artifacts" / "prepared").exists()
    cache.unlink()
    shutil.move(moved, cache)
    result = subprocess.run([str(VENV_BIN / "recsys"), "ingest"], cwd=repo, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0 and "was written but not recorded; completed it" in result.stdout, (
        result.stdout + result.stderr)
    assert records(repo)[-1]["data_version"] == dvc_md5(repo) and len(read_store(repo / "data")) == 20

