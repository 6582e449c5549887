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
    code = (
        "from recsys.ingest import ingest_batches; from recsys.config import IngestConfig;"
        f"cfg = IngestConfig(dvc_push=False, max_unseen_item_share=1.0);"
        f"ingest_batches([{str(path)!r}], {str(repo)!r}, cfg)"
    )
    env = dict(
        os.environ, RECSYS_FAULT="after_part_write", PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 1, result.stderr
    # Crashed between the part and `dvc add`: part on disk, data.dvc and manifest still the old ones.
    assert dvc_md5(repo) == version_before and len(records(repo)) == 1
    assert len(read_store(repo / "data")) == 20

    summary = ingest.ingest_batches([path], repo, CFG)[0]
    assert summary.status == "duplicate_batch"
    assert records(repo)[-1]["data_version"] == dvc_md5(repo) != version_before
    status = run([str(VENV_BIN / "dvc"), "status", "data.dvc"], repo)
    assert "up to date" in status
