"""Nothing-new run: how long a scheduled `pipeline` run takes when no data arrived (aim ≤ 10 s, issue 14).

Starts `prefect server start` on a free localhost port (a running server, as schedules need), makes a fresh
copy of the repository with small params, runs the pipeline once (ingest + train + promote), then times
`python -m flows.pipeline` again with nothing new: it must retrain nothing and replay the gate decision.

    python benchmarks/bench_flow.py          # writes benchmarks/results/flow.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from flow_support import drop_batch, make_repo, subprocess_env  # noqa: E402
from test_ui import free_port  # noqa: E402


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prefect server did not start")
            time.sleep(1)


def timed_pipeline(repo: Path, env: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    summary = json.loads(done.stdout[done.stdout.index("{"): done.stdout.rindex("}") + 1])
    return elapsed, summary


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-flow-") as tmp:
        tmp = Path(tmp)
        port = free_port()
        api = f"http://127.0.0.1:{port}/api"
        env = {**subprocess_env(tmp / "prefect-home"), "PREFECT_API_URL": api}
        server = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(api, server)
            repo = make_repo(tmp / "repo")
            drop_batch(repo)
            first_seconds, first = timed_pipeline(repo, env)
            load = os.getloadavg()[0]
            runs = [timed_pipeline(repo, env) for _ in range(3)]
        finally:
            server.terminate()
            server.wait(timeout=30)
    for _, summary in runs:
        assert summary["retrain"]["stages_run"] == [], summary
        assert summary["ingest"]["batches"] == 0, summary
    seconds = sorted(s for s, _ in runs)
    result = {
        "what": "python -m flows.pipeline with nothing new, against a running prefect server (wall time of the "
                "whole process: interpreter start, imports, flow run, dvc status, gate replay)",
        "first_run_seconds_with_training": round(first_seconds, 1),
        "nothing_new_seconds": [round(s, 2) for s in seconds],
        "nothing_new_median_seconds": round(seconds[1], 2),
        "aim_seconds": 10.0,
        "load_average_before": round(load, 2),
        "cpu_count": os.cpu_count(),
    }
    out = ROOT / "benchmarks" / "results" / "flow.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
