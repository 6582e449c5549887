"""Local servers for tests and benchmarks (no tests here): a free loopback port, JSON over HTTP, ending a
process tree, and `prefect server start` on 127.0.0.1 with its own PREFECT_HOME."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from flow_support import subprocess_env

SERVER_STARTUP_S = 180  # a loaded 2-core box takes a minute to import and migrate the server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, body: dict | None = None) -> dict | list:
    """GET (or POST `body`) `url` and decode the JSON answer; never through a proxy of this machine."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())


def stop_tree(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """End `proc` and everything it started (its process group and any descendant that left it)."""
    import psutil

    try:
        family = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc, signal.SIGKILL, timeout)
    for pid in family[1:]:  # SIGTERM'd children that outlived their parent
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def prefect_server(home: Path, keep_pythonpath: bool = True) -> Iterator[tuple[str, dict[str, str]]]:
    """`prefect server start` on a free loopback port, PREFECT_HOME under `home`, its log in
    `home/server.log`; yields (API URL, an env pointing flows, the CLI and the UI at it); stopped on exit.
    `keep_pythonpath=False` drops PYTHONPATH from that env (processes in other clones run their own code)."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    # The temp folders of the server, the CLI and a worker (Prefect's runner_storage) stay in the test's
    # folder, not /tmp.
    (home / "tmp").mkdir(exist_ok=True)
    env = {**subprocess_env(home / "prefect-home"), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_UI_API_URL": api, "TMPDIR": str(home / "tmp")}
    if not keep_pythonpath:
        env.pop("PYTHONPATH", None)
    with (home / "server.log").open("w") as log:
        proc = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_STARTUP_S
        while True:
            try:
                get_json(f"{api}/health")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"prefect server did not start:\n{(home / 'server.log').read_text()[-3000:]}")
                time.sleep(1)
        yield api, {**env, "PREFECT_API_URL": api}
    finally:
        stop_tree(proc)


def scheduled_runs(base: str, deployment_id: str, within_s: float = 120) -> list[dict]:
    """The deployment's SCHEDULED flow runs, once the server's scheduler has made any (or [] after
    `within_s`: its loop runs every few seconds for a deployment just created, every minute after)."""
    deadline = time.monotonic() + within_s
    while True:
        runs = get_json(f"{base}/api/flow_runs/filter", {
            "deployments": {"id": {"any_": [deployment_id]}},
            "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}})
        if runs or time.monotonic() > deadline:
            return runs
        time.sleep(2)
