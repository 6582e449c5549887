"""The Prefect flows end to end on a copy of the repository: ingest → dvc repro → gate → registry.

Real Prefect runs (a session-scoped `prefect_test_harness`), real `dvc`, real GX, a real SQLite registry.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flow_support import drop_batch, make_repo, registry_for, subprocess_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_pipeline_ingests_trains_promotes_then_a_run_with_nothing_new_retrains_nothing(
    prefect_harness, tmp_path
):
    from flows.pipeline import pipeline

    repo = make_repo(tmp_path / "repo")
    drop_batch(repo)
    first = pipeline(repo_root=str(repo))

    assert first["ingest"]["ingested"] == 1 and first["ingest"]["rejected"] == 0
    assert first["ingest"]["rows_accepted"] > 0
    ran = set(first["retrain"]["stages_run"])
    assert {"prepare", "train@sasrec", "evaluate@sasrec", "evaluate@mostpop"} <= ran
    decision = first["retrain"]["decision"]
    assert decision["model"] == "sasrec" and decision["promoted"], decision
    # MostPop on the same data was installed as the baseline champion first; sasrec was gated against it.
    assert decision["baseline_kind"] == "champion" and decision["baseline_version"] is not None
    assert registry_for(repo).get_version(decision["baseline_version"]).is_baseline
    assert decision["champion_rescored_metric"] == decision["baseline_metric"] is not None
    assert (repo / "inbox" / "processed" / "batch-0001.csv").is_file()
    registry = registry_for(repo)
    assert registry.champion_version() == decision["version"]

    started = time.perf_counter()
    second = pipeline(repo_root=str(repo))
    elapsed = time.perf_counter() - started
    assert second["ingest"]["batches"] == 0
    assert second["retrain"]["stages_run"] == []
    assert second["retrain"]["decision"]["replayed"] is True
    assert registry_for(repo).champion_version() == decision["version"]
    print(f"nothing-new pipeline run: {elapsed:.1f}s")  # the benchmark records this figure properly


def test_same_batch_twice_is_a_no_op_and_a_bad_batch_is_rejected_whole(prefect_harness, tmp_path):
    from flows.ingest import ingest

    repo = make_repo(tmp_path / "repo")
    batch = drop_batch(repo)
    copy = repo / "inbox" / "copy-of-batch.csv"
    shutil.copy2(batch, copy)
    (repo / "inbox" / "broken.csv").write_text("user_id,item_id\nu1\n")  # ragged row, no timestamp column
    data_dvc_before = None
    summary = ingest(repo_root=str(repo))
    statuses = {s["source"]: s["status"] for s in summary["summaries"]}
    assert statuses == {"batch-0001.csv": "ingested", "copy-of-batch.csv": "duplicate_batch",
                        "broken.csv": "rejected"}, statuses
    assert (repo / "inbox" / "rejected" / "broken.csv").is_file()
    data_dvc_before = (repo / "data.dvc").read_text()
    (repo / "inbox" / "again.csv").write_bytes(batch.read_bytes() if batch.exists() else
                                              (repo / "inbox" / "processed" / "batch-0001.csv").read_bytes())
    again = ingest(repo_root=str(repo))
    assert [s["status"] for s in again["summaries"]] == ["duplicate_batch"]
    assert (repo / "data.dvc").read_text() == data_dvc_before


def test_epochs_override_is_recorded_by_dvc_and_params_file_restored(prefect_harness, tmp_path):
    from flows.retrain import retrain

    repo = make_repo(tmp_path / "repo")
    params_before = (repo / "params.yaml").read_bytes()
    summary = retrain(repo_root=str(repo), epochs=1, models=["sasrec"])
    assert (repo / "params.yaml").read_bytes() == params_before
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert lock["stages"]["train@sasrec"]["params"]["params.yaml"]["train"]["epochs"] == 1
    curve = (repo / "plots" / "sasrec.csv").read_text().strip().splitlines()
    assert len(curve) == 2  # header + exactly one epoch
    assert "train@sasrec" in summary["stages_run"]


def run_flow_process(cmd: list[str], cwd: Path, env: dict, log: Path, timeout: int = 900) -> tuple[int, str]:
    """Run a flow in its own process group, output to a file (not a pipe: a process killed at a fault point
    leaves its ephemeral API server orphaned, holding any pipe open), then end whatever it left behind."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return code, log.read_text()


def test_flow_killed_between_evaluation_and_promotion_promotes_exactly_once_after_rerun(tmp_path):
    """Kill the flow process at the fault point just before promotion, re-run it twice: one promotion."""
    repo = make_repo(tmp_path / "repo")
    env = subprocess_env(tmp_path / "prefect-home")
    cmd = [sys.executable, "-m", "flows.retrain", "--repo-root", str(repo)]
    code, output = run_flow_process(cmd, repo, {**env, "RECSYS_FAULT": "before_promote"}, tmp_path / "crash.log")
    assert code != 0, output[-3000:]
    assert "injected fault at before_promote" in output
    assert (repo / "metrics" / "sasrec.json").is_file()  # evaluation finished before the crash
    assert registry_for(repo).champion_version() is None

    for attempt in range(2):
        code, output = run_flow_process(cmd, repo, env, tmp_path / f"rerun-{attempt}.log")
        assert code == 0, output[-4000:]
    registry = registry_for(repo)
    events = registry.history()
    baseline = [v for v in registry.list_versions() if v.is_baseline]
    promotions = [e for e in events if e.decision == "promoted" and e.candidate_version != baseline[0].version]
    assert len(promotions) == 1, events
    assert registry.champion_version() == promotions[0].candidate_version
    assert len(registry.list_versions()) == 2 and len(baseline) == 1  # the candidate and the baseline
