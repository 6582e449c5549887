"""`python -m flows.serve`: its deployments, a schedule parsed before anything is served, and a Prefect server
that is missing or unreachable (for every flow's command line) as one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flow_support import REPO_ROOT


def test_the_served_deployments_and_their_schedule():
    from flows.serve import deployments

    served = deployments("30 3 * * 1")
    assert [(d.flow_name, d.name) for d in served] == [("pipeline", "nightly"), ("pipeline", "manual"),
                                                       ("retrain", "manual"), ("ingest", "manual")]
    nightly = served[0]
    assert [s.schedule.cron for s in nightly.schedules] == ["30 3 * * 1"]
    assert all(not d.schedules for d in served[1:])


@pytest.mark.parametrize("bad", ["every night", "0 2 * *", "61 2 * * *", "", "0 2 * * * *"])
def test_a_bad_schedule_is_one_usage_line_before_anything_is_served(bad, capsys):
    from flows.serve import main

    with pytest.raises(SystemExit) as done:
        main(["--cron", bad])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --cron: not a cron expression: {bad!r}" in err and "Traceback" not in err


def test_without_a_server_it_says_what_to_start_instead_of_serving_into_a_temporary_one(tmp_path):
    """(A subprocess: the flows' `run_main` prints its one line as the interpreter exits.)"""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path), DO_NOT_TRACK="1")  # no profile naming a server either
    done = subprocess.run([sys.executable, "-m", "flows.serve"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        ("error: flows.serve needs a running Prefect server, and PREFECT_API_URL is not set: run `prefect server "
         "start` in another terminal, then `export PREFECT_API_URL=http://127.0.0.1:4200/api` (or `prefect config "
         "set PREFECT_API_URL=...`)")]


def test_a_sigterm_before_the_runner_takes_over_leaves_no_temp_folder_and_orphans_are_removed(tmp_path,
                                                                                              monkeypatch):
    """SIGTERM while the deployments register (Python's default would end the process on the spot) exits
    through the private folder's cleanup, with the usual code; the signal's handler is restored after. A
    folder of a serve that was killed outright (its pid gone) goes at the next start; a live one's stays."""
    import signal
    import tempfile
    import time

    from flows.serve import private_temp_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, alive = tmp_path / "recsys-serve-999999999-abc", tmp_path / f"recsys-serve-{os.getpid()}-def"
    other = tmp_path / "recsys-serve-notapid-x"
    for folder in (dead, alive, other):
        (folder / "runner_storage").mkdir(parents=True)
    original = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        with private_temp_dir() as private:
            assert private.parent == tmp_path and tempfile.gettempdir() == str(private)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # (the handler raises before this ends)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is original and tempfile.gettempdir() == str(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_ctrl_c_is_a_keyboard_interrupt_until_the_runner_holds_sigterm_and_then_its_graceful_stop(tmp_path,
                                                                                                  monkeypatch):
    """Real signals to this process: Ctrl-C (SIGINT) while the deployments register is the usual
    KeyboardInterrupt; once Prefect's runner has put its SIGTERM handler in place (a recorder stands in for
    it), Ctrl-C calls that handler — the graceful stop a SIGTERM gets — instead of leaving asyncio to cancel a
    task. Both handlers are restored after."""
    import signal
    import tempfile
    import time

    from flows.serve import private_temp_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    original = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt):
        with private_temp_dir():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # (the handler raises before this ends)
    calls = []
    with private_temp_dir():
        signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))  # as Runner.start does
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
    assert calls == [signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in original} == original


def a_repository(root: Path) -> Path:
    """A folder a flow's command line takes for a repository (its precheck reads params.yaml first)."""
    root.mkdir(parents=True)
    (root / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    return root


@pytest.mark.parametrize("module", ["serve", "retrain", pytest.param("pipeline", marks=pytest.mark.slow),
                                    pytest.param("ingest", marks=pytest.mark.slow)])
@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_a_server_that_is_not_there_is_one_line(tmp_path, module):
    """PREFECT_API_URL names a port nothing listens on: one line naming the address, exit 1, no traceback —
    from every flow's command line, before it writes into the repository (the last two share retrain's
    `run_main`, so they run with the slow tests)."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago and that nothing listens on now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    if module == "retrain":  # without /api too: nothing answers, so it is not a matter of the path
        url = url.removesuffix("/api")
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path), "DO_NOT_TRACK": "1"}
    repo = [] if module == "serve" else ["--repo-root", str(a_repository(tmp_path / "repo"))]
    done = subprocess.run([sys.executable, "-m", f"flows.{module}", *repo], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot reach the Prefect server at {url} (")  # (the refusal, as httpx says it)
    assert line.endswith("): is `prefect server start` running, and is PREFECT_API_URL its address?")
    assert module == "serve" or sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["params.yaml"]


@pytest.mark.parametrize("module", ["serve", "retrain"])
@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_a_url_that_reaches_a_server_but_not_its_api_is_one_line_saying_so(tmp_path, module):
    """PREFECT_API_URL without its /api (`http://127.0.0.1:4200`, the UI's address): a server answers 404 to
    every API call; it was a 21-frame traceback (serve) or "RuntimeError: Failed to reach API" (the flows)."""
    import http.server
    import threading

    class NotTheApi(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the UI's server: pages, but no API under this path
            self.send_response(404)
            self.end_headers()

        do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotTheApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path), "DO_NOT_TRACK": "1"}
    repo = [] if module == "serve" else ["--repo-root", str(a_repository(tmp_path / "repo"))]
    try:
        done = subprocess.run([sys.executable, "-m", f"flows.{module}", *repo], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=180, check=False)
    finally:
        server.shutdown()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: PREFECT_API_URL={url} reaches a server but not its API (")
    assert line.endswith(f"): the API is under /api, e.g. PREFECT_API_URL={url}/api")
    assert module == "serve" or sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["params.yaml"]


@pytest.mark.slow  # Prefect's temporary API server starts: ~20 s
def test_a_user_error_in_a_flow_run_not_started_by_our_command_line_is_one_line_on_its_console(tmp_path):
    """A served deployment's run (or a worker's) runs the flow in a process `run_main` never wraps: its
    console printed two tracebacks for a ConfigError whose one line was already there."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RECSYS_VERBOSE")}
    env.update(PREFECT_HOME=str(tmp_path), DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    code = ("from flows.retrain import retrain\n"
            f"retrain(repo_root={str(tmp_path / 'repo')!r}, epochs=0, return_state=True)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output, output
    assert "epochs override must be a whole number from 1 to 1,000,000" in output, output
    env["RECSYS_VERBOSE"] = "1"  # asked for: the tracebacks are back
    verbose = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True,
                             text=True, timeout=300, check=False)
    assert "Traceback" in verbose.stdout + verbose.stderr



@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_served_deployments_get_their_nightly_runs_and_a_stop_leaves_no_runner_folder(tmp_path, stop):
    """README's schedule path on a real server: `python -m flows.serve` registers the four deployments, the
    server's scheduler puts the nightly one's runs on the calendar at the cron's time, and Ctrl-C (SIGINT) or
    a supervisor's SIGTERM ends the process without leaving Prefect's runner folder in the temp dir. The stop
    pauses the deployments (no run waits for a process that is gone); served again, the schedule resumes."""
    import signal
    import time

    from server_support import get_json, prefect_server, scheduled_runs, stop_tree

    with prefect_server(tmp_path / "server") as (api, env):
        temp = tmp_path / "temp"
        temp.mkdir()
        env = {**env, "TMPDIR": str(temp)}
        log = tmp_path / "serve.log"  # (a file, not a pipe: never a read that waits on a live process)

        def serve() -> subprocess.Popen:
            with log.open("w") as out:
                return subprocess.Popen([sys.executable, "-m", "flows.serve", "--cron", "15 4 * * *"],
                                        cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

        proc = serve()
        try:
            deadline = time.monotonic() + 300
            while len(served := get_json(f"{api}/deployments/filter", {})) < 4:  # registered one by one
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(1)
            flows = {f["id"]: f["name"] for f in get_json(f"{api}/flows/filter", {})}
            assert sorted(f"{flows[d['flow_id']]}/{d['name']}" for d in served) == [
                "ingest/manual", "pipeline/manual", "pipeline/nightly", "retrain/manual"]
            nightly = get_json(f"{api}/deployments/name/pipeline/nightly")
            scheduled = scheduled_runs(api.removesuffix("/api"), nightly["id"])
            assert scheduled and all(r["expected_start_time"][11:16] == "04:15" for r in scheduled), scheduled
            assert [p.name for p in temp.glob("recsys-serve-*/runner_storage/*")]  # Prefect's runner's folder
            proc.send_signal(getattr(signal, stop))
            proc.wait(timeout=120)
        finally:
            stop_tree(proc)
        output = log.read_text()
        assert "Traceback" not in output and "Warning" not in output, output
        assert ("Ctrl-C: stopping as on SIGTERM" in output) == (stop == "SIGINT"), output
        assert "SIGTERM received, initiating graceful shutdown" in output, output  # the runner's own stop
        assert list(temp.iterdir()) == [], output
        assert get_json(f"{api}/deployments/name/pipeline/nightly")["paused"] is True, output
        deadline = time.monotonic() + 60  # the pause drops the scheduled runs (a scheduler pass under way
        while scheduled_runs(api.removesuffix("/api"), nightly["id"], within_s=0):  # may add one first)
            assert time.monotonic() < deadline, "the paused deployment kept its scheduled runs"
            time.sleep(2)
        proc = serve()
        try:
            assert scheduled_runs(api.removesuffix("/api"), nightly["id"]), proc.poll()
            assert get_json(f"{api}/deployments/name/pipeline/nightly")["paused"] is False
        finally:
            stop_tree(proc)
