"""The one DVC runner, how its failures are classified (a stage's own error vs transient), and the
raw-store bootstrap — with real `dvc` in throw-away repositories."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from dvc_support import point_remote

from recsys.bootstrap import PRESENT, BootstrapError, ensure_raw_store, store_has_data
from recsys.ingest import IngestError
from recsys.ingest.dvc import data_version
from recsys.workspace import DvcError, StageError, run_dvc

# Each `dvc` call takes seconds (minutes on a loaded box): these run with the slow end-to-end tests.
dvc_slow = pytest.mark.slow
pytestmark = pytest.mark.timeout(1800)


def write_stages(repo, **scripts: str) -> None:
    """A dvc.yaml whose stages run the given Python snippets (each from a file: no YAML quoting games)."""
    stages = {}
    for name, code in scripts.items():
        (repo / f"{name}.py").write_text(code)
        stages[name] = {"cmd": f"{sys.executable} {name}.py"}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))


@dvc_slow
def test_a_stage_error_line_becomes_the_one_message_and_is_not_transient(dvc_repo):
    write_stages(dvc_repo, fails="import sys\nprint('error: 5-core filter kept 0 of 9 events', file=sys.stderr)\n"
                               "sys.exit(1)\n", crashes="raise SystemExit(3)\n")
    with pytest.raises(StageError) as caught:
        run_dvc(dvc_repo, "repro", "fails")
    assert str(caught.value) == "fails: 5-core filter kept 0 of 9 events"
    assert caught.value.transient is False

    with pytest.raises(StageError) as crashed:  # no error line of its own: DVC's sentence, deterministic
        run_dvc(dvc_repo, "repro", "crashes")
    assert "failed to reproduce 'crashes'" in str(crashed.value) and crashed.value.transient is False
    assert "\n" not in str(crashed.value) and "Having any troubles" not in str(crashed.value)
    write_stages(dvc_repo, raises="raise KeyError('no such column')\n")
    with pytest.raises(StageError) as bug:  # a stage's bug: its exception, and where the traceback is
        run_dvc(dvc_repo, "repro", "raises")
    assert "\n" not in str(bug.value) and "(KeyError: 'no such column')" in str(bug.value), str(bug.value)
    assert "run with --verbose" in str(bug.value)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended


@contextlib.contextmanager
def _caller_running_a_stage(repo, tmp_path, caller_code: str):
    """A process running `caller_code` in `repo` (which runs `dvc repro slow`), once the stage is running:
    yields (caller, the pids under it: dvc, a shell, the stage). Whatever the test did, nothing it started
    is left running afterwards."""
    import subprocess
    import time

    import psutil

    started = tmp_path / "stage.pid"
    write_stages(repo, slow=f"import os, pathlib, time\npathlib.Path({str(started)!r}).write_text("
                            "str(os.getpid()))\ntime.sleep(600)\n")
    caller = subprocess.Popen([sys.executable, "-c", caller_code], cwd=repo)
    tracked = [psutil.Process(caller.pid)]
    try:
        deadline = time.monotonic() + 300
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        stage = int(started.read_text())
        tracked += psutil.Process(caller.pid).children(recursive=True)
        dvc_pids = [p.pid for p in tracked[1:]]
        assert stage in dvc_pids and len(dvc_pids) >= 2  # dvc, and the stage (and a shell between them)
        yield caller, dvc_pids
    finally:  # (only what it started: not a worker's server)
        with contextlib.suppress(psutil.NoSuchProcess):
            tracked += psutil.Process(caller.pid).children(recursive=True)
        for leftover in tracked:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()


@dvc_slow
@pytest.mark.parametrize(("sig", "watch"), [("SIGTERM", True), ("SIGINT", False)])
def test_an_interrupted_caller_leaves_neither_dvc_nor_its_stage_running(dvc_repo, tmp_path, sig, watch):
    """A cancelled Prefect run (SIGTERM, which Prefect's flow engine raises as an exception) or Ctrl-C: the
    `dvc repro` it started and the stage that one runs went on training after the run ended, holding DVC's
    lock, so the next run failed on it. (SIGINT here reaches the caller alone, as a cancel's SIGTERM does.)"""
    import signal
    import time

    code = ("import signal, sys\n"
            "from pathlib import Path\n"
            "def terminated(*_): raise SystemExit(143)  # as Prefect's bridge raises TerminationSignal\n"
            "signal.signal(signal.SIGTERM, terminated)\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal\n"
            "from recsys.workspace import run_dvc\n"
            f"run_dvc(Path('.'), 'repro', 'slow'{', watch=lambda: None, interval=0.2' if watch else ''})\n")
    with _caller_running_a_stage(dvc_repo, tmp_path, code) as (caller, dvc_pids):
        assert {os.getpgid(pid) for pid in dvc_pids} == {os.getpgid(caller.pid)}  # a group kill reaches them
        os.kill(caller.pid, getattr(signal, sig))
        caller.wait(timeout=120)
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in dvc_pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in dvc_pids if _alive(pid)]
        # (Whether the stage got to remove its temp file is not asserted: on a loaded box it did not, twice
        # in one run — SIGINT comes first, but nothing guarantees the stage its cleanup before the SIGKILL.)
    done = run_dvc(dvc_repo, "status")  # and DVC's lock is free for the next run
    assert done.returncode == 0


@dvc_slow
def test_dvc_left_running_by_a_killed_caller_is_stopped_by_the_next_lock_holder(dvc_repo, tmp_path):
    """A caller killed outright (SIGKILL, the OOM killer) cannot stop the `dvc repro` it started: DVC and its
    stage trained on for nobody, holding DVC's lock, and the next run failed on it. The next holder of the
    workspace lock stops them first; a living caller's DVC is never touched."""
    import signal
    import time

    from recsys.workspace import RUNNING, STATE_DIR, stop_orphaned_dvc, workspace_lock

    code = "from pathlib import Path\nfrom recsys.workspace import run_dvc\nrun_dvc(Path('.'), 'repro', 'slow')\n"
    with _caller_running_a_stage(dvc_repo, tmp_path, code) as (caller, dvc_pids):
        records = list((dvc_repo / STATE_DIR / RUNNING).glob("*.json"))
        assert len(records) == 1  # the dvc process, noted while it runs
        assert stop_orphaned_dvc(dvc_repo) == [] and all(_alive(pid) for pid in dvc_pids)  # its caller lives
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait(timeout=60)
        time.sleep(1)
        assert all(_alive(pid) for pid in dvc_pids)  # what a SIGKILL leaves: DVC and the stage, running on
        with workspace_lock(dvc_repo):
            assert not [pid for pid in dvc_pids if _alive(pid)]
            assert not records[0].exists()
            done = run_dvc(dvc_repo, "status")  # DVC's lock is free for the next run
            assert done.returncode == 0


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads other processes' environments (/proc)")


@dvc_slow
@linux_only
@pytest.mark.parametrize("watch", [False, True])
def test_a_stage_left_running_by_a_dvc_that_died_first_is_stopped(dvc_repo, tmp_path, watch):
    """DVC killed (or crashed) before the stage it runs: the stage, handed to init, is out of DVC's process
    tree, and trained on for nobody — and, holding DVC's output open, kept `run_dvc` waiting for it. Every
    process DVC starts carries the call's mark, so `run_dvc` stops it once DVC has ended."""
    import time

    pid_file = tmp_path / "stage.pid"
    write_stages(dvc_repo, orphan=(
        "import os, pathlib, time\nimport psutil\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "dvc = next(p for p in psutil.Process().parents() if 'repro' in p.cmdline())\n"
        "dvc.kill()\ntime.sleep(600)\n"))
    started = time.monotonic()
    done = run_dvc(dvc_repo, "repro", "orphan", check=False,
                   **({"watch": lambda: None, "interval": 0.2} if watch else {}))
    assert done.returncode != 0 and time.monotonic() - started < 300  # not the stage's 600 s
    stage = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(stage) and time.monotonic() < deadline:  # (init reaps it)
        time.sleep(0.2)
    assert not _alive(stage)
    assert run_dvc(dvc_repo, "status").returncode == 0


@dvc_slow
@linux_only
def test_dvcs_own_daemons_are_not_taken_for_leftovers(tmp_path, caplog):
    """`dvc version` starts DVC's updater daemon through a fork of itself that waits on it (analytics and
    the updater check are on in a repository that does not turn them off): neither is stopped or reported."""
    import logging
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    run_dvc(tmp_path, "init", "-q")
    with caplog.at_level(logging.WARNING, logger="recsys.workspace"):
        for _ in range(4):  # (the fork lives for a moment: a scan that finds it is a matter of timing)
            assert run_dvc(tmp_path, "version").returncode == 0
    assert "left running" not in caplog.text


@dvc_slow
def test_run_dvc_does_not_wait_forever_on_an_unmarked_holder_of_its_output(dvc_repo, tmp_path, monkeypatch,
                                                                          caplog):
    """A stage that leaves a process running whose environment no longer carries the mark (started with a
    clean environment, as `env -i` or sudo do) keeps DVC's output open after DVC ended: `run_dvc` goes on
    after OUTPUT_GRACE_S with the output it has and one error line (it waited as long as that process ran)."""
    import logging
    import time

    from recsys import workspace

    monkeypatch.setattr(workspace, "OUTPUT_GRACE_S", 1.0)
    pid_file = tmp_path / "holder.pid"
    write_stages(dvc_repo, leaves=(
        "import subprocess, sys, pathlib\nprint('stage said this', flush=True)\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env={{}})\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))\n"))
    started = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR, logger="recsys.workspace"):
            done = run_dvc(dvc_repo, "repro", "leaves", interval=0.5)
        assert time.monotonic() - started < 300 and done.returncode == 0
        assert "stage said this" in done.stdout
        assert "holds its output open" in caplog.text
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), 9)


@dvc_slow
def test_run_dvc_streams_with_a_watch_callback(dvc_repo):
    write_stages(dvc_repo, slow="import time\ntime.sleep(1.5)\nprint('done here')\n")
    calls = []
    done = run_dvc(dvc_repo, "repro", "slow", watch=lambda: calls.append(1), interval=0.2)
    assert done.returncode == 0 and "Running stage 'slow'" in done.stdout and "done here" in done.stdout
    assert len(calls) >= 3

    def api_hiccup() -> None:  # the flow's progress report is an API call
        calls.append(1)
        raise RuntimeError("Prefect API: 503")

    again = run_dvc(dvc_repo, "repro", "--force", "slow", watch=api_hiccup, interval=0.2)
    assert again.returncode == 0 and "done here" in again.stdout and len(calls) >= 6  # went on to the end


def test_a_dvc_sentence_continued_on_its_next_lines_is_quoted_whole():
    """DVC's "'data' is busy, it is being blocked by:" names the holder on the next line: the one-line error
    ended at "by:". Now the holder is in it; the advice after the blank line stays out."""
    from recsys.workspace import dvc_error_line

    busy = ("ERROR: '/tmp/r/data' is busy, it is being blocked by:\n"
            "  (PID 4242): /venv/bin/dvc repro prepare\n\n"
            "If there are no processes with such PIDs, you can manually remove '/tmp/r/.dvc/tmp/rwlock' and "
            "try again.\n")
    assert dvc_error_line(busy) == ("ERROR: '/tmp/r/data' is busy, it is being blocked by: (PID 4242): "
                                    "/venv/bin/dvc repro prepare")
    assert dvc_error_line("ERROR: failed to push data to the cloud - x\nHaving any troubles? Hit us up") == \
        "ERROR: failed to push data to the cloud - x"


@dvc_slow
def test_other_dvc_failures_are_transient(dvc_repo):
    with pytest.raises(DvcError) as caught:
        run_dvc(dvc_repo, "pull", "nothing.dvc")
    assert not isinstance(caught.value, StageError) and caught.value.transient is True
    message = str(caught.value)
    assert message.startswith("`dvc pull nothing.dvc` failed: ERROR: ") and "\n" not in message


@dvc_slow
def test_a_dvc_configuration_error_is_not_transient(dvc_repo, tmp_path):
    """No such remote, or not a DVC repository: the same command fails the same way, so no retry."""
    with pytest.raises(DvcError) as caught:
        run_dvc(dvc_repo, "push", "-r", "nosuch")
    assert "remote 'nosuch' doesn't exist" in str(caught.value) and caught.value.transient is False
    with pytest.raises(DvcError) as outside:
        run_dvc(tmp_path, "status")
    assert "not inside of a DVC repository" in str(outside.value) and outside.value.transient is False


@dvc_slow
def test_bootstrap_generates_and_versions_the_seed_then_finds_it_present(dvc_repo, write_params):
    write_params(path=dvc_repo / "params.yaml")
    assert not store_has_data(dvc_repo)
    assert ensure_raw_store(dvc_repo).startswith("generated the default dataset")
    assert store_has_data(dvc_repo)
    recorded = yaml.safe_load((dvc_repo / "data.dvc").read_text())["outs"][0]
    assert recorded["nfiles"] == 2
    assert ensure_raw_store(dvc_repo) == "raw store present"

    shutil.rmtree(dvc_repo / "data")  # a fresh clone: data.dvc committed, the data in the remote
    assert ensure_raw_store(dvc_repo) == "raw store pulled from the DVC remote"
    assert store_has_data(dvc_repo)


@dvc_slow
def test_a_seed_whose_push_failed_is_pushed_by_the_next_ingest_run(dvc_repo, write_params, tmp_path):
    """The bootstrap's push failing must not leave the remote short with nothing to say so: ingest's push
    marker stays, so the next ingest run (the nightly one too: it is work) pushes the seed first."""
    from recsys.config import IngestConfig
    from recsys.ingest import ingest_inbox
    from recsys.ingest.layout import has_work
    from recsys.ingest.layout import paths as ingest_paths

    write_params(path=dvc_repo / "params.yaml")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote folder should be")
    (dvc_repo / ".dvc" / "config.local").write_text(f"['remote \"local\"']\n    url = {blocked}\n")
    with pytest.raises(IngestError, match=r"^the DVC remote does not have data version \S+ yet: `dvc push "
                                          r"data.dvc` failed \(ERROR: .*\); the data is committed locally — run "
                                          r"`recsys ingest`") as failed:  # ingest's sentence, with DVC's reason
        ensure_raw_store(dvc_repo)  # (--quiet hid it, leaving only DVC's "Having any troubles?" hint)
    assert "\n" not in str(failed.value)
    where = ingest_paths(dvc_repo, IngestConfig())
    assert store_has_data(dvc_repo) and where.push_marker.is_file() and has_work(where, IngestConfig())
    point_remote(dvc_repo, tmp_path / "remote")
    run = ingest_inbox(dvc_repo, IngestConfig())
    assert any("completed an interrupted push" in action for action in run.actions), run.actions
    assert not where.push_marker.exists()
    shutil.rmtree(dvc_repo / "data")  # the remote has it now: a fresh clone pulls it
    assert ensure_raw_store(dvc_repo) == "raw store pulled from the DVC remote"


@dvc_slow
def test_bootstrap_pushes_only_as_ingest_dvc_push_says(dvc_repo, write_params, tmp_path):
    """Bootstrap pushed the seed whatever params.yaml said: with `ingest.dvc_push: false` and a remote it
    cannot write, it stopped with DVC's error. Now the seed is versioned and not pushed, and the line says
    so; the push marker records that the remote lacks it, which is no work while pushes are off (a
    nothing-new run stays a few stats) and is pushed by the first run that has them on — a staging params
    file must not make the remote's debt forgotten."""
    from recsys.config import load_params
    from recsys.ingest.layout import has_work
    from recsys.ingest.layout import paths as ingest_paths

    write_params({"ingest": {"dvc_push": False}}, path=dvc_repo / "params.yaml")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote folder should be")
    (dvc_repo / ".dvc" / "config.local").write_text(f"['remote \"local\"']\n    url = {blocked}\n")
    said = ensure_raw_store(dvc_repo)
    assert said == "generated the default dataset into data/ and versioned it with DVC (not pushed: " \
                   "ingest.dvc_push is false)"
    off = load_params(dvc_repo / "params.yaml").ingest
    where = ingest_paths(dvc_repo, off)
    assert _seed_recorded(dvc_repo) and where.push_marker.is_file() and not has_work(where, off)
    assert ensure_raw_store(dvc_repo) == PRESENT  # pushes off: nothing undone, the marker kept
    assert where.push_marker.is_file()
    point_remote(dvc_repo, tmp_path / "remote")
    write_params(path=dvc_repo / "params.yaml")  # pushes on again
    on = load_params(dvc_repo / "params.yaml").ingest
    assert has_work(where, on)
    assert ensure_raw_store(dvc_repo) == f"{PRESENT}; completed an interrupted push: data version " \
                                         f"{data_version(where)} is on the DVC remote"
    assert not where.push_marker.exists() and not has_work(where, on)
    shutil.rmtree(dvc_repo / "data")  # the remote has it: a fresh clone pulls it
    assert ensure_raw_store(dvc_repo) == "raw store pulled from the DVC remote"


def _seed_recorded(repo) -> bool:
    """data.dvc records the generated seed and `dvc status` finds the store as recorded."""
    recorded = yaml.safe_load((repo / "data.dvc").read_text())["outs"][0]
    return recorded["nfiles"] == 2 and "up to date" in run_dvc(repo, "status", "data.dvc").stdout


@dvc_slow
def test_a_failed_dvc_add_leaves_its_seed_marked_and_the_next_run_versions_it(dvc_repo, write_params):
    """`dvc add` failing after the seed was written: the next run said "raw store present" over a store
    data.dvc never recorded. Now the marker stays, and the next run versions and pushes the seed."""
    from recsys.layout import Layout

    write_params(path=dvc_repo / "params.yaml")
    cache = dvc_repo / ".dvc" / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.write_text("a file where DVC's cache folder should be")  # a real `dvc add` failure
    with pytest.raises(DvcError, match="`dvc add data` failed: ERROR: "):
        ensure_raw_store(dvc_repo)
    assert store_has_data(dvc_repo) and Layout(dvc_repo).seeding.read_text().startswith("{")
    cache.unlink()
    said = ensure_raw_store(dvc_repo)
    assert said == "versioned and pushed the default dataset an interrupted bootstrap had generated"
    assert _seed_recorded(dvc_repo) and not Layout(dvc_repo).seeding.exists()
    assert not (dvc_repo / ".ingest" / "push-pending.json").exists()
    shutil.rmtree(dvc_repo / "data")  # and the remote has it
    assert ensure_raw_store(dvc_repo) == "raw store pulled from the DVC remote"


def _bootstrap_killed_at(repo, fault: str) -> None:
    import subprocess

    env = {**os.environ, "RECSYS_FAULT": fault}
    code = "from recsys.bootstrap import ensure_raw_store; ensure_raw_store()"
    killed = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True,
                            text=True, check=False)
    assert killed.returncode == 1 and f"injected fault at {fault}" in killed.stderr, killed.stderr


@dvc_slow
def test_a_bootstrap_killed_at_any_point_is_settled_by_the_next_run(dvc_repo, write_params, tmp_path):
    """Real kills: before the seed's files are whole (removed, generated again), before `dvc add` (versioned
    as it is), and — the marker must not cost anyone data — before `dvc add` with the user's own import
    written over the seed since (theirs: left as it is)."""
    import subprocess

    from recsys.layout import Layout
    from recsys.store import read_store

    write_params(path=dvc_repo / "params.yaml")
    _bootstrap_killed_at(dvc_repo, "seed_writing")
    assert Layout(dvc_repo).seeding.read_text() == ""
    assert ensure_raw_store(dvc_repo).startswith("generated the default dataset")
    assert _seed_recorded(dvc_repo) and not Layout(dvc_repo).seeding.exists()

    shutil.rmtree(dvc_repo / "data")
    (dvc_repo / "data.dvc").unlink()
    _bootstrap_killed_at(dvc_repo, "seed_written")
    assert store_has_data(dvc_repo) and Layout(dvc_repo).seeding.exists()
    assert ensure_raw_store(dvc_repo).startswith("versioned and pushed the default dataset")
    assert _seed_recorded(dvc_repo) and not Layout(dvc_repo).seeding.exists()
    assert ensure_raw_store(dvc_repo) == "raw store present"

    shutil.rmtree(dvc_repo / "data")
    (dvc_repo / "data.dvc").unlink()
    _bootstrap_killed_at(dvc_repo, "seed_written")
    own = tmp_path / "own.csv"
    own.write_text("user_id,item_id,timestamp\nu1,i1,1704067200\nu1,i2,1704067260\n")
    done = subprocess.run([sys.executable, "-m", "recsys.cli", "data", "import", "table", str(own)],
                          cwd=dvc_repo, capture_output=True, text=True, check=False)  # the user's own seed
    assert done.returncode == 0, done.stderr
    assert ensure_raw_store(dvc_repo) == "raw store present" and not Layout(dvc_repo).seeding.exists()
    assert read_store(dvc_repo / "data")["item_id"].tolist() == ["i1", "i2"]  # theirs, untouched


@dvc_slow
def test_a_bootstrap_killed_before_its_push_ends_is_pushed_by_the_next_bootstrap(dvc_repo, write_params):
    """A bootstrap killed during its `dvc push` left the seed versioned, its push marked and the remote
    without it; the next bootstrap said "raw store present" and pushed nothing (only a later ingest did).
    Now it completes the push first, as ingest does, and says so in its one line."""
    write_params(path=dvc_repo / "params.yaml")
    _bootstrap_killed_at(dvc_repo, "before_push")  # (the push marker written, nothing pushed)
    marker = dvc_repo / ".ingest" / "push-pending.json"
    assert marker.is_file() and "new:" in run_dvc(dvc_repo, "status", "-c", "data.dvc").stdout
    config_local = dvc_repo / ".dvc" / "config.local"
    reachable = config_local.read_text() if config_local.exists() else None
    blocked = dvc_repo.parent / "blocked-remote"
    blocked.write_text("a file where the remote folder should be")
    config_local.write_text(f"['remote \"local\"']\n    url = {blocked}\n")
    said = ensure_raw_store(dvc_repo)  # the remote is down: a reader (a retrain) still gets its store
    assert said.startswith("raw store present; push not completed: the DVC remote does not have data "), said
    assert marker.is_file() and "\n" not in said
    if reachable is None:
        config_local.unlink()
    else:
        config_local.write_text(reachable)
    said = ensure_raw_store(dvc_repo)
    assert said.startswith("raw store present; completed an interrupted push: data version ") and \
        said.endswith(" is on the DVC remote") and "\n" not in said, said
    assert not marker.exists() and "new:" not in run_dvc(dvc_repo, "status", "-c", "data.dvc").stdout
    assert ensure_raw_store(dvc_repo) == "raw store present"
    shutil.rmtree(dvc_repo / "data")  # the remote has it: a fresh clone pulls it
    assert ensure_raw_store(dvc_repo) == "raw store pulled from the DVC remote"


@dvc_slow
def test_bootstrap_completes_a_killed_ingests_commit_before_it_pushes(dvc_repo, write_params):
    """An ingest killed between its part and `dvc add` left a journal and its push marker: the bootstrap's
    push must come after recovery, so that the version it pushes is the one the completed commit records
    (pushing first would remove the marker and leave the completed commit's version unpushed)."""
    import subprocess

    import pandas as pd

    write_params(path=dvc_repo / "params.yaml")
    ensure_raw_store(dvc_repo)
    seed = pd.read_parquet(next((dvc_repo / "data" / "interactions").glob("*.parquet"))).head(50)
    seed.assign(timestamp=seed["timestamp"] + 86400).to_csv(dvc_repo / "inbox" / "b.csv", index=False)
    killed = subprocess.run([sys.executable, "-m", "recsys.cli", "ingest"], cwd=dvc_repo, capture_output=True,
                            text=True, env={**os.environ, "RECSYS_FAULT": "after_part_write"}, check=False)
    assert killed.returncode == 1 and "injected fault at after_part_write" in killed.stderr, killed.stderr
    said = ensure_raw_store(dvc_repo)
    assert said.startswith("raw store present; batch ") and "(b.csv) was written but not recorded; " \
        "completed it; completed an interrupted push: data version " in said, said
    recorded = yaml.safe_load((dvc_repo / "data.dvc").read_text())["outs"][0]
    manifest = (dvc_repo / "ingest_manifest.jsonl").read_text().splitlines()
    assert len(manifest) == 1 and f'"data_version": "{recorded["md5"]}"' in manifest[0]
    assert recorded["md5"] in said and "new:" not in run_dvc(dvc_repo, "status", "-c", "data.dvc").stdout


@dvc_slow
def test_an_interrupted_bootstrap_says_so_in_one_line_and_ends_by_the_interrupt(dvc_repo, write_params):
    """Ctrl-C while `recsys bootstrap` runs DVC: it exited 130 without a word (Typer's way); now the one line
    every command says, and the end by SIGINT that a shell loop stops on. The next bootstrap finishes."""
    from flow_support import interrupt_when

    write_params(path=dvc_repo / "params.yaml")
    running = dvc_repo / ".ingest" / "dvc-running"
    # (until it runs `dvc`: the interrupt must find it working)
    interrupt_when([sys.executable, "-m", "recsys.cli", "bootstrap"], lambda: any(running.glob("*.json")),
                   seconds=120, poll=0.05, cwd=dvc_repo)
    assert ensure_raw_store(dvc_repo).startswith(("generated", "versioned", "raw store present"))
    assert store_has_data(dvc_repo) and _seed_recorded(dvc_repo)
    assert not (dvc_repo / ".ingest" / "push-pending.json").exists()


@dvc_slow
def test_bootstrap_never_replaces_ingested_data_with_the_generated_seed(dvc_repo, write_params):
    write_params(path=dvc_repo / "params.yaml")
    (dvc_repo / "data.dvc").write_text(yaml.safe_dump({"outs": [
        {"md5": "0" * 32 + ".dir", "size": 999, "nfiles": 5, "hash": "md5", "path": "data"}]}))
    before = (dvc_repo / "data.dvc").read_bytes()
    with pytest.raises(BootstrapError, match=r"data.dvc records 5 files of ingested data .* run `dvc pull`"):
        ensure_raw_store(dvc_repo)
    assert (dvc_repo / "data.dvc").read_bytes() == before
    assert not store_has_data(dvc_repo)


PARAMS_TEXT = "# comments a person wrote\nmodels: [mostpop, sasrec]\ntrain:\n  epochs: 200\n  lr: 0.002\n"


def test_an_epochs_override_restores_the_params_bytes_and_leaves_no_temp_file(tmp_path):
    from recsys.layout import Layout
    from recsys.retraining import epochs_override

    params = tmp_path / "params.yaml"
    params.write_text(PARAMS_TEXT)
    with epochs_override(params, 1, ["sasrec"]):
        assert yaml.safe_load(params.read_text())["train"]["epochs"] == 1
        assert (tmp_path / ".ingest" / "params.yaml.orig").read_text() == PARAMS_TEXT
    assert params.read_text() == PARAMS_TEXT
    assert not (tmp_path / ".ingest" / "params.yaml.orig").exists()
    assert list(Layout(tmp_path).scratch.iterdir()) == []


@pytest.mark.parametrize("failing_write", [1, 2, 3])  # fsync: the backup, its folder, params.yaml
def test_a_full_disk_while_the_override_writes_leaves_params_whole(tmp_path, monkeypatch, failing_write):
    """Each file is replaced in one step, so no failure can leave a torn backup that a retry would restore."""
    import errno
    import os

    from recsys import atomic
    from recsys.layout import Layout
    from recsys.retraining import epochs_override

    params = tmp_path / "params.yaml"
    params.write_text(PARAMS_TEXT)
    real_fsync, calls = os.fsync, []

    def fsync(fd):  # the only mocked fault: a full disk cannot be produced for real here
        calls.append(fd)
        if len(calls) == failing_write:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(OSError, match="No space left"), epochs_override(params, 1, ["sasrec"]):
        pass
    monkeypatch.undo()
    assert params.read_text() == PARAMS_TEXT
    assert list(Layout(tmp_path).scratch.iterdir()) == []
    with epochs_override(params, None, ["sasrec"]):  # the retry puts back whatever was left, whole
        pass
    assert params.read_text() == PARAMS_TEXT
    assert not (tmp_path / ".ingest" / "params.yaml.orig").exists()


def _note(repo, pid: int, started: float, caller: int, caller_started: float, args=("repro",), mark=None):
    import json

    from recsys.workspace import RUNNING, STATE_DIR

    folder = repo / STATE_DIR / RUNNING
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    path.write_text(json.dumps({"pid": pid, "started": started, "caller": caller, "caller_started": caller_started,
                                "args": list(args), **({"mark": mark} if mark else {})}))
    return path


@linux_only
def test_what_a_killed_callers_dvc_left_behind_after_dvc_ended_is_stopped_by_its_mark(tmp_path):
    """A caller killed outright, and its DVC ended too (killed with it, or crashed) while a stage ran on,
    handed to init: the next lock holder finds the stage by the mark in its environment. A living caller's
    marked processes, and processes of another mark, are left alone."""
    import subprocess
    import time
    import uuid

    import psutil

    from recsys.workspace import RUN_MARK_ENV, stop_orphaned_dvc

    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    mark = uuid.uuid4().hex  # (the scan sees every process on the host: another test run's too)
    stage = subprocess.Popen(sleep, env={**os.environ, RUN_MARK_ENV: mark})
    other = subprocess.Popen(sleep, env={**os.environ, RUN_MARK_ENV: uuid.uuid4().hex})
    caller = subprocess.Popen(sleep)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # the note's DVC, ended
    gone.wait()
    try:
        caller_started = psutil.Process(caller.pid).create_time()
        note = _note(tmp_path, gone.pid, time.time() - 60, caller.pid, caller_started, ("repro", "x"),
                     mark=mark)
        assert stop_orphaned_dvc(tmp_path) == [] and stage.poll() is None and note.exists()  # caller lives
        caller.kill()
        caller.wait()
        assert stop_orphaned_dvc(tmp_path, grace=5) == [f"what `dvc repro x` (pid {gone.pid}) left running"]
        assert stage.wait(timeout=30) is not None and not note.exists()
        assert other.poll() is None  # another run's
    finally:
        for process in (stage, other, caller):
            process.kill()
            process.wait()


@linux_only
def test_the_mark_scan_leaves_this_process_its_ancestors_and_dvcs_own_daemons_alone(monkeypatch):
    """`marked`: a marked process DVC started is found; this process and its ancestors (a stage that carries
    the mark itself), DVC's daemons (DVC_DAEMON) and the forks of DVC that wait on them (DVC's command line)
    are not — nor anything once it has ended."""
    import subprocess
    import uuid

    from recsys.workspace import RUN_MARK_ENV, marked

    mark = uuid.uuid4().hex
    monkeypatch.setenv(RUN_MARK_ENV, mark)  # (for the processes this test starts)
    code = "import time; time.sleep(600)"
    stage = subprocess.Popen([sys.executable, "-c", code])
    daemon = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "DVC_DAEMON": "1"})
    fork = subprocess.Popen([sys.executable, "-c", code, "dvc-fork"])
    try:
        scan = f"from recsys.workspace import marked; print(sorted(p.pid for p in marked({mark!r})))"
        outer = ("import os, subprocess, sys; print(os.getpid()); sys.stdout.flush(); "
                 f"subprocess.run([sys.executable, '-c', {scan!r}])")
        pids = subprocess.run([sys.executable, "-c", outer], capture_output=True, text=True,
                              check=True).stdout
        ancestor, seen = pids.splitlines()  # a marked process's scan, from under a marked parent
        assert seen == str(sorted([stage.pid, fork.pid])) and ancestor not in seen
        found = {p.pid for p in marked(mark, ["-c", code, "dvc-fork"])}  # (argv after the interpreter)
        assert found == {stage.pid}
        assert {p.pid for p in marked(mark)} == {stage.pid, fork.pid}
        stage.kill()
        stage.wait()
        assert {p.pid for p in marked(mark)} == {fork.pid}
    finally:
        for process in (stage, daemon, fork):
            process.kill()
            process.wait()


def test_orphan_notes_judge_callers_and_processes_by_pid_and_start_time(tmp_path):
    """`stop_orphaned_dvc` on notes written by hand, with real processes: a killed caller not yet reaped (a
    zombie) is dead; a pid now held by another process (start time differs) is never signalled; a note
    that does not parse is removed only once it is older than a writer could still be writing it."""
    import subprocess
    import time

    import psutil

    from recsys.workspace import TORN_AFTER_S, stop_orphaned_dvc

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    caller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = psutil.Process(sleeper.pid).create_time()
        caller_started = psutil.Process(caller.pid).create_time()
        reused = _note(tmp_path, sleeper.pid, started - 5.0, caller.pid, caller_started - 5.0)
        living = _note(tmp_path, os.getpid(), psutil.Process().create_time(), caller.pid, caller_started)
        assert stop_orphaned_dvc(tmp_path) == []  # the caller lives: the second note is left alone
        assert sleeper.poll() is None and not reused.exists() and living.exists()  # the first: another process
        living.unlink()
        orphan = _note(tmp_path, sleeper.pid, started, caller.pid, caller_started, args=("repro", "slow"))
        caller.kill()
        time.sleep(0.5)
        assert psutil.Process(caller.pid).status() == psutil.STATUS_ZOMBIE  # killed, not reaped by its parent
        assert stop_orphaned_dvc(tmp_path, grace=5) == [f"`dvc repro slow` (pid {sleeper.pid})"]
        assert sleeper.wait(timeout=30) is not None and not orphan.exists()
        torn = orphan.parent / "123.json"
        torn.write_text('{"pid": 12')
        assert stop_orphaned_dvc(tmp_path) == [] and torn.exists()  # maybe still being written
        os.utime(torn, (time.time() - TORN_AFTER_S - 1,) * 2)
        assert stop_orphaned_dvc(tmp_path) == [] and not torn.exists()
    finally:
        for process in (sleeper, caller):
            process.kill()
            process.wait()
