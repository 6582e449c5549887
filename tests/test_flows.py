"""The Prefect flows end to end on a copy of the repository: ingest → dvc repro → gate → registry.

Real Prefect runs (a session-scoped `prefect_test_harness`), real `dvc`, real GX, a real SQLite registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dvc_support import tree
from flow_support import (
    NOT_AN_INBOX,
    drop_batch,
    flow_env,
    make_repo,
    registry_for,
    run_flow_process,
    run_python,
    sigint_as_in_a_terminal,
    subprocess_env,
)

from recsys.ingest.layout import file_sha256

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


BROKEN = "user_id,item_id\nu1\n"  # a ragged row and no timestamp column: rejected whole


def rejected_line(repo: Path, total: int, name: str = "broken.csv") -> str:
    """The one line a run that rejected `name` (of `total` batches) ends with, as `recsys ingest` says it."""
    sha = file_sha256(repo / "inbox" / "rejected" / name)
    report = repo / "reports" / "ingest" / f"{Path(name).stem}-{sha[:16]}.md"
    batches = "batch" if total == 1 else "batches"
    return (f"rejected 1 of {total} {batches}: {name}: malformed CSV: CSV parse error: Expected 2 columns, "
            f"got 1: u1 (moved to {repo}/inbox/rejected/, report: {report})")


@pytest.fixture(scope="module")
def pipeline_run(prefect_harness, tmp_path_factory):
    """A repository after one pipeline run that ingested a batch, rejected another, trained and promoted; and
    that run's final state (Failed, for the rejected batch)."""
    from flows.pipeline import pipeline

    repo = make_repo(tmp_path_factory.mktemp("pipeline") / "repo").resolve()
    drop_batch(repo)
    (repo / "inbox" / "broken.csv").write_text(BROKEN)
    return repo, pipeline(repo_root=str(repo), return_state=True)


def test_pipeline_ingests_trains_promotes_then_a_run_with_nothing_new_retrains_nothing(pipeline_run):
    """A rejected batch, moved aside, does not stop the run: it retrains and gates on the accepted batch, then
    fails — a Failed flow run for the schedule to show — with the ingest flow's line, not retried."""
    from flows.pipeline import pipeline
    from recsys.ingest.errors import BatchesRejected

    repo, state = pipeline_run
    rejected = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(rejected, BatchesRejected), state
    assert str(rejected) == rejected_line(repo, 2)
    first = rejected.result

    assert first["ingest"]["ingested"] == 1 and first["ingest"]["rejected"] == 1
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


def test_a_run_with_nothing_new_skips_ingest_and_loads_no_torch(pipeline_run, tmp_path):
    """The nightly run when nothing arrived, as its own process: no ingest subflow runs (an empty inbox, no
    unfinished commit or push), all-cold warm sources and the replayed gate need neither torch, scipy nor
    pandas, and the unchanged curves are not drawn again (matplotlib)."""
    repo, _ = pipeline_run
    champion = registry_for(repo).champion_version()
    loaded, output = run_python(f"from flows.pipeline import main; main(['--repo-root', {str(repo)!r}])", repo,
                                subprocess_env(tmp_path / "prefect-home"))
    summary = json.loads(output[output.index("{"): output.rindex("}") + 1])
    assert summary["ingest"]["batches"] == 0 and summary["retrain"]["stages_run"] == []
    assert summary["retrain"]["decision"]["replayed"] is True and summary["retrain"]["decision"]["promoted"]
    assert registry_for(repo).champion_version() == champion
    assert "nothing to ingest" in output and "for flow 'ingest'" not in output, output[-4000:]
    assert "Task run 'ingest-inbox" not in output, output[-4000:]
    assert "Task run 'warm-sources" in output and "Task run 'promote" in output, output[-4000:]
    assert "gate: sasrec promoted (already decided earlier; nothing changed) — " in output, output[-4000:]
    assert not {"torch", "recsys.models", "recsys.ingest.run", "great_expectations", "matplotlib",
                "scipy.stats", "pandas"} & loaded


def test_a_pipeline_run_that_rejects_a_batch_says_what_it_did_then_fails_with_one_line(
        pipeline_run, tmp_path):
    """As its own process: the run retrains and gates (here nothing changed: the decision is replayed),
    prints its summary and the champion, and ends with the ingest flow's line as its last, exit code 1."""
    repo, _ = pipeline_run
    champion = registry_for(repo).champion_version()
    (repo / "inbox" / "broken-again.csv").write_text(BROKEN + "u2\n")
    cmd = [sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)]
    env = subprocess_env(tmp_path / "prefect-home")
    code, output = run_flow_process(cmd, repo, env, tmp_path / "run.log")
    assert code == 1, output[-4000:]
    line = "error: " + rejected_line(repo, 1, "broken-again.csv")
    assert [text for text in output.splitlines() if text.startswith("error:")] == [line], output[-4000:]
    assert output.splitlines()[-1] == line and "Traceback" not in output and "Retry" not in output
    summary = json.loads(output[output.index("\n{") + 1: output.index("\n}\n") + 2])
    assert summary["ingest"]["rejected"] == 1 and summary["retrain"]["decision"]["replayed"] is True
    assert f"champion: version {champion} (" in output, output[-4000:]
    assert registry_for(repo).champion_version() == champion


def test_same_batch_twice_is_a_no_op_and_a_bad_batch_is_rejected_whole(prefect_harness, tmp_path):
    """The run deals with every batch, then fails (its flow run Failed) naming the rejected one."""
    from flows.ingest import ingest

    repo = make_repo(tmp_path / "repo").resolve()
    batch = drop_batch(repo)
    copy = repo / "inbox" / "copy-of-batch.csv"
    shutil.copy2(batch, copy)
    (repo / "inbox" / "broken.csv").write_text(BROKEN)
    data_dvc_before = None
    state = ingest(repo_root=str(repo), return_state=True)
    assert state.is_failed() and str(state.result(raise_on_failure=False)) == rejected_line(repo, 3)
    summary = state.result(raise_on_failure=False).result
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


def test_the_ingest_flow_deals_with_every_batch_then_fails_with_one_line_for_the_rejected_one(tmp_path):
    """`python -m flows.ingest` exited 0 when a batch was rejected (a WARNING, and "rejected": 1 in its JSON),
    while `recsys ingest` exited 1. Now the good batch is ingested and pushed, the run prints its summary,
    and its flow run ends Failed — not retried — with `recsys ingest`'s line as the process's last, exit 1."""
    repo = make_repo(tmp_path / "repo").resolve()
    drop_batch(repo)
    (repo / "inbox" / "broken.csv").write_text(BROKEN)
    cmd = [sys.executable, "-m", "flows.ingest", "--repo-root", str(repo)]
    env = subprocess_env(tmp_path / "prefect-home")
    code, output = run_flow_process(cmd, repo, env, tmp_path / "run.log")
    assert code == 1, output[-4000:]
    line = "error: " + rejected_line(repo, 2)
    assert [text for text in output.splitlines() if text.startswith("error:")] == [line], output[-4000:]
    assert output.splitlines()[-1] == line and "Traceback" not in output and "Retry" not in output
    failed = "Finished in state Failed('Flow run encountered an exception: BatchesRejected: rejected 1 of 2"
    assert failed in output, output[-4000:]
    summary = json.loads(output[output.index("\n{") + 1: output.index("\n}\n") + 2])
    assert (summary["ingested"], summary["rejected"]) == (1, 1)
    assert "pushed: data version" in output
    assert (repo / "inbox" / "processed" / "batch-0001.csv").is_file()


def test_an_unreachable_remote_is_retried_then_fails_with_one_line_and_the_next_run_pushes(tmp_path):
    """A remote may come back, so the ingest task retries a failed push (each retry pushes first); when it
    stays down the flow fails with the one line that says what to do, and the next run pushes. The batches
    the first attempt dealt with are still reported: a retry by Prefect had returned only its own (none), so
    a batch rejected before the push failed was said nowhere."""
    repo = make_repo(tmp_path / "repo")
    drop_batch(repo)
    (repo / "inbox" / "broken.csv").write_text(BROKEN)
    env = subprocess_env(tmp_path / "prefect-home")
    dvc = str(Path(sys.executable).parent / "dvc")
    remote = subprocess.run([dvc, "remote", "list"], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.split()[1]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote folder should be")
    subprocess.run([dvc, "remote", "modify", "--local", "local", "url", str(blocked)], cwd=repo, check=True)
    cmd = [sys.executable, "-m", "flows.ingest", "--repo-root", str(repo)]
    code, output = run_flow_process(cmd, repo, env, tmp_path / "blocked.log")
    assert code == 1, output[-4000:]
    assert "ingest attempt 1 of 3 failed" in output and "ingest attempt 2 of 3 failed" in output, output[-4000:]
    assert "ingest attempt 3 of 3" not in output and "Retry" not in output, output[-4000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the DVC remote does not have data version" in errors[0], output[-4000:]
    assert output.splitlines()[-1] == errors[0] and "Traceback" not in output
    assert "batch-0001.csv: ingested" in output, output[-4000:]  # the first attempt's batches, reported
    assert rejected_line(repo, 2) in output, output[-4000:]
    assert (repo / "inbox" / "processed" / "batch-0001.csv").is_file()  # ingested once, before the push
    assert (repo / "inbox" / "rejected" / "broken.csv").is_file()
    subprocess.run([dvc, "remote", "modify", "--local", "local", "url", remote], cwd=repo, check=True)
    code, output = run_flow_process(cmd, repo, env, tmp_path / "again.log")
    assert code == 0 and "completed an interrupted push" in output, output[-4000:]


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

    # Resume state of an interrupted run goes once the model's outputs are complete, also when DVC restored
    # them from its run-cache (the stage never ran, so the trainer could not clear it).
    assert "train@sasrec" in retrain(repo_root=str(repo), epochs=2, models=["sasrec"])["stages_run"]
    stale = repo / ".resume" / f"sasrec-{'0' * 20}"
    stale.mkdir(parents=True)
    (stale / "state.json").write_text("{}")
    restored = retrain(repo_root=str(repo), epochs=1, models=["sasrec"])
    assert "train@sasrec" not in restored["stages_run"]  # checked out from the run-cache
    assert len((repo / "plots" / "sasrec.csv").read_text().strip().splitlines()) == 2  # the 1-epoch curve
    assert not stale.exists()


def test_a_retrain_run_logs_where_training_is_while_dvc_repro_runs(prefect_harness, tmp_path, monkeypatch):
    """`dvc repro` keeps its stages' output until it ends; the run's log (the console of a manual run, the UI's
    log tab) says meanwhile which model is at which epoch, read off the curves the trainer writes."""
    import flows.retrain as retrain_flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    monkeypatch.setattr(retrain_flow, "PROGRESS_LOG_S", 0.0)  # every change, not one line in 30 s
    repo = make_repo(tmp_path / "repo")  # 12 epochs: the run's --epochs override is the budget it reports
    state = retrain_flow.retrain(repo_root=str(repo), models=["sasrec"], epochs=40, return_state=True)
    assert state.is_completed(), state
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    lines = [log.message for log in logs if log.message.startswith("training (")]
    progress = r"training \(\d+ s\): (mostpop counted \(valid_ndcg@10=0\.\d{4}\)(; )?)?"
    sasrec = r"sasrec epoch (\d+)/40 valid_ndcg@10=0\.\d{4} \(best 0\.\d{4} at epoch (\d+)\)"
    done = r"sasrec done after 40/40 epochs \(best valid_ndcg@10=0\.\d{4} at epoch \d+\)"
    assert lines and all(re.fullmatch(progress + f"({sasrec}|{done})?", line) for line in lines), lines
    epochs = [int(m.group(1)) for line in lines if (m := re.search(sasrec, line))]
    assert epochs and epochs == sorted(epochs) and epochs[-1] < 40, lines  # it moves forward, within budget
    assert all(int(m.group(2)) <= int(m.group(1)) for line in lines if (m := re.search(sasrec, line)))


def test_a_run_killed_after_an_epochs_override_repro_has_params_put_back_by_the_next_run(tmp_path):
    """Killed after `dvc repro --epochs 1` but before the override's exit: dvc.lock matches the rewritten
    params.yaml, so without a restore first the next run would find nothing stale and keep `epochs: 1`."""
    repo = make_repo(tmp_path / "repo")
    params_before = (repo / "params.yaml").read_bytes()
    env = subprocess_env(tmp_path / "prefect-home")
    cmd = [sys.executable, "-m", "flows.retrain", "--repo-root", str(repo), "--models", "sasrec"]
    code, output = run_flow_process([*cmd, "--epochs", "1"], repo, {**env, "RECSYS_FAULT": "after_repro"},
                                    tmp_path / "crash.log")
    assert code != 0 and "injected fault at after_repro" in output, output[-3000:]
    # What is stale under an override is only known under it: no list computed without it, no promise.
    assert "--epochs 1: DVC reruns each selected model whose last run had other epochs" in output
    assert "stale stages" not in output
    assert (repo / "params.yaml").read_bytes() != params_before  # what the kill left
    code, output = run_flow_process(cmd, repo, env, tmp_path / "rerun.log")
    assert code == 0, output[-4000:]
    assert "put back the original that an interrupted --epochs run left" in output
    assert (repo / "params.yaml").read_bytes() == params_before
    assert not (repo / ".ingest" / "params.yaml.orig").exists()
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert lock["stages"]["train@sasrec"]["params"]["params.yaml"]["train"]["epochs"] == 12  # retrained


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


# --- entry points on a fresh clone, and failures as one line -------------------------------------------------

def test_a_fresh_clone_runs_the_pipeline_flow_directly(tmp_path):
    """Nothing bootstrapped, no telemetry settings: `python -m flows.pipeline` works, prints no traceback and
    no telemetry error, and its closing line carries the NDCG@10 the gate used."""
    repo = make_repo(tmp_path / "repo", bootstrap=False)
    assert not (repo / "data").exists()
    code, output = run_flow_process([sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)], repo,
                                    flow_env(tmp_path), tmp_path / "pipeline.log", timeout=1500)
    assert code == 0, output[-4000:]
    assert "Traceback" not in output and "telemetry" not in output.lower(), output[-4000:]
    registry = registry_for(repo)
    # The baseline (MostPop) is registered first as the baseline champion; SASRec then passes the gate.
    decision = [e for e in registry.history() if e.decision == "promoted"][-1]
    champion = registry.champion_version()
    assert decision.candidate_version == champion
    closing = [line for line in output.splitlines() if line.startswith("champion: version ")]
    assert closing == [f"champion: version {champion} (sasrec), test ndcg@10 = {decision.candidate_metric:.4f} "
                       "(on the current test set, as the gate used it)"], output[-3000:]


def _one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-4000:]
    return errors[0]


def test_a_deterministic_stage_failure_ends_the_flow_in_one_line_without_a_retry(tmp_path):
    from recsys.store import read_store

    repo = make_repo(tmp_path / "repo", {"prepare": {"min_user_interactions": 1000,
                                                     "min_item_interactions": 1000}})
    n_events = len(read_store(repo / "data"))
    code, output = run_flow_process([sys.executable, "-m", "flows.retrain", "--repo-root", str(repo)], repo,
                                    flow_env(tmp_path), tmp_path / "retrain.log")
    assert code == 1, output[-4000:]
    assert _one_error_line(output) == (
        f"error: prepare: 1000-core filter kept 0 of {n_events:,} events; lower prepare.min_user_interactions "
        "/ min_item_interactions in params.yaml (now 1000/1000)")
    assert "Traceback" not in output, output[-4000:]
    # Deterministic: the repro task fails once and is not retried (Prefect logs "Retry n/m" before a retry).
    assert output.count("Task run 'dvc-repro") == 1 and "Retry " not in output, output[-4000:]
    assert output.rstrip().splitlines()[-1].startswith("error: "), output[-2000:]
    # The line is said once at the end, not also in Prefect's ERROR report of the flow's exception: only the
    # task's and the flow's "Finished in state Failed(…)" lines carry it besides.
    assert "Encountered exception" not in output, output[-4000:]
    assert output.count("1000-core filter kept 0") == 3, output[-4000:]


def test_a_rejection_is_not_lost_when_the_pipeline_then_fails_to_retrain(tmp_path):
    """The retrain's error is the run's last line; the batch rejected before it is said too (it was only in
    the ingest subflow's Failed state line)."""
    from recsys.store import read_store

    repo = make_repo(tmp_path / "repo", {"prepare": {"min_user_interactions": 1000,
                                                     "min_item_interactions": 1000}})
    (repo / "inbox").mkdir(exist_ok=True)
    (repo / "inbox" / "broken.csv").write_text(BROKEN)
    n_events = len(read_store(repo / "data"))
    code, output = run_flow_process([sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)], repo,
                                    flow_env(tmp_path), tmp_path / "pipeline.log")
    assert code == 1, output[-4000:]
    assert _one_error_line(output).startswith(f"error: prepare: 1000-core filter kept 0 of {n_events:,} events")
    said = [line for line in output.splitlines() if "ERROR" in line and rejected_line(repo, 1) in line]
    assert said, output[-4000:]


def test_bad_params_end_the_flow_in_one_line(tmp_path):
    repo = make_repo(tmp_path / "repo")
    params = (repo / "params.yaml").read_text()
    (repo / "params.yaml").write_text(params.replace("\ntrain:\n", "\ntrain:\n  epochz: 3\n", 1))
    code, output = run_flow_process([sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)], repo,
                                    flow_env(tmp_path), tmp_path / "pipeline.log")
    assert code == 1, output[-4000:]
    assert "epochz" in _one_error_line(output) and "Traceback" not in output, output[-4000:]


def _session(sid: int):
    import psutil

    out = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                out.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def _child_running(pid: int, fragment: str):
    """A process under `pid` whose command line holds `fragment` (dvc's short-lived children come and go)."""
    import psutil

    for process in psutil.Process(pid).children(recursive=True):
        try:
            if fragment in " ".join(process.cmdline()):
                return process
        except psutil.Error:
            continue
    return None


@pytest.mark.skipif(sys.platform != "linux", reason="the server leaves the run's session on Linux only")
def test_ctrl_c_stops_a_manual_flow_run_and_its_dvc_and_the_run_exits_in_one_line(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole foreground process group): it used to reach Prefect's
    temporary server too, which died at once, and the interrupted run hung retrying its reports against it
    until killed. The server now runs in a session of its own: the run reports the interruption, stops its
    `dvc repro` and training, and ends by the SIGINT (a shell's 130) after one line; nothing it started is
    left running."""
    import psutil

    # (params.yaml's sasrec.train.patience would end the training on its own: the interrupt must find it running)
    repo = make_repo(tmp_path / "repo", {"sasrec": {"train": {"patience": 100000}}})
    cmd = [sys.executable, "-m", "flows.retrain", "--repo-root", str(repo), "--models", "sasrec", "--epochs",
           "100000"]
    log = tmp_path / "retrain.log"
    with log.open("w") as out:
        flow = subprocess.Popen(cmd, cwd=repo, env=flow_env(tmp_path), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,  # (a terminal's foreground group, in miniature)
                                preexec_fn=sigint_as_in_a_terminal)  # noqa: PLW1509 (one signal call)
    try:
        deadline, trainer, server = time.monotonic() + 600, None, None
        while trainer is None and time.monotonic() < deadline and flow.poll() is None:
            time.sleep(0.5)
            trainer = _child_running(flow.pid, "recsys.train")
            server = _child_running(flow.pid, "uvicorn") or server
        assert trainer is not None and server is not None, log.read_text()[-4000:]
        assert os.getsid(server.pid) != flow.pid  # out of the terminal's reach
        time.sleep(3)
        os.killpg(flow.pid, signal.SIGINT)
        code = flow.wait(timeout=120)  # (it hung for minutes before)
        output = log.read_text()
        assert code == -signal.SIGINT, output[-4000:]  # ended by the interrupt: a shell loop stops too
        assert output.rstrip().splitlines()[-1].startswith("interrupted: "), output[-2000:]
        assert "Traceback" not in output and "Unable to connect" not in output, output[-4000:]
        psutil.wait_procs([trainer, server], timeout=30)
        assert not trainer.is_running() and not server.is_running()
        assert not _session(flow.pid)
    finally:
        for process in _session(flow.pid):
            process.kill()
        if flow.poll() is None:
            flow.kill()


def test_the_temporary_server_dies_with_a_run_killed_outright(tmp_path):
    """In its own session the temporary server is out of the reach of a kill of the run's process group
    too: bound to the run's process (Linux PR_SET_PDEATHSIG), it ends when a SIGKILL ends the run."""
    import psutil

    if sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    code = ("from flows.ephemeral import start_in_own_session\n"
            "print(start_in_own_session(), flush=True)\nimport time\ntime.sleep(600)\n")
    run = subprocess.Popen([sys.executable, "-c", code], env=flow_env(tmp_path), stdout=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        url = run.stdout.readline().strip()  # (pytest's per-test timeout bounds the wait)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api"), url
        (server,) = [p for p in psutil.Process(run.pid).children() if "uvicorn" in " ".join(p.cmdline())]
        assert os.getsid(server.pid) == server.pid
        run.kill()
        run.wait()
        psutil.wait_procs([server], timeout=30)
        assert not server.is_running()
    finally:
        run.kill()
        run.wait()


def test_an_inbox_that_is_the_repository_is_refused_with_one_line_and_nothing_moves(tmp_path):
    """`python -m flows.ingest --inbox .` took every file of the repository for a batch and moved it into
    `./rejected/` — README.md, params.yaml, dvc.yaml, data.dvc, pyproject.toml — with a report each."""
    repo = make_repo(tmp_path / "repo").resolve()
    drop_batch(repo)
    before = tree(repo)
    cmd = [sys.executable, "-m", "flows.ingest", "--repo-root", str(repo), "--inbox", "."]
    env = subprocess_env(tmp_path / "prefect-home")
    code, output = run_flow_process(cmd, repo, env, tmp_path / "run.log")
    assert code == 1, output[-4000:]
    line = f"error: inbox {repo} is the repository root: {NOT_AN_INBOX}"
    assert [text for text in output.splitlines() if text.startswith("error:")] == [line], output[-4000:]
    assert output.splitlines()[-1] == line and "Traceback" not in output
    assert tree(repo) == before  # nothing bootstrapped, locked, moved or written
