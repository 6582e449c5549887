"""Nothing-new run: how long a scheduled `pipeline` run takes when no data arrived (aim ≤ 10 s, issue 14).

Starts `prefect server start` on a free localhost port (a running server, as schedules need), makes a fresh
copy of the repository with small params, runs the pipeline once (ingest + train + promote), then times
`python -m flows.pipeline` again with nothing new: it must retrain nothing and replay the gate decision.

    python benchmarks/bench_flow.py [--runs 3]   # writes benchmarks/results/flow.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from flow_support import drop_batch, make_repo  # noqa: E402
from server_support import prefect_server  # noqa: E402

from recsys.entry import positive_int  # noqa: E402
from recsys.atomic import write_text_atomic  # noqa: E402


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_pipeline(repo: Path, env: dict, timeout: int = 1800,
                   log: Path | None = None) -> tuple[float, float, dict, str]:
    """Wall seconds and CPU seconds (the process and its children: dvc) of one `python -m flows.pipeline`, its
    JSON summary and its output (stderr, then stdout; also written to `log` when given, failed or not).
    The CPU figure moves less than the wall time when another job shares this machine's two cores."""
    cpu, started = children_cpu_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=timeout)
    elapsed, cpu = time.perf_counter() - started, children_cpu_seconds() - cpu
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    summary = json.loads(done.stdout[done.stdout.index("{"): done.stdout.rindex("}") + 1])
    return elapsed, cpu, summary, done.stderr + done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=3, help="timed nothing-new runs (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flow-") as tmp:
        tmp = Path(tmp)
        with prefect_server(tmp / "server") as (_, env):
            repo = make_repo(tmp / "repo")
            drop_batch(repo)
            first_seconds, _, first, _ = timed_pipeline(repo, env)
            loads, runs = [], []
            for _ in range(args.runs):
                loads.append(os.getloadavg()[0])
                runs.append(timed_pipeline(repo, env))
    for _, _, summary, _ in runs:
        assert summary["retrain"]["stages_run"] == [], summary
        assert summary["ingest"]["batches"] == 0, summary
        assert summary["retrain"]["decision"]["replayed"] is True, summary
    seconds = [run[0] for run in runs]
    cpu = [run[1] for run in runs]
    result = {
        "what": "python -m flows.pipeline with nothing new, against a running prefect server (wall time of the "
                "whole process: interpreter start, imports, flow run, dvc status, gate replay; CPU seconds of "
                "the process and its children), in run order",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "first_run_seconds_with_training": round(first_seconds, 1),
        "nothing_new_seconds": [round(s, 2) for s in seconds],
        "nothing_new_median_seconds": round(statistics.median(seconds), 2),
        "nothing_new_cpu_seconds": [round(c, 2) for c in cpu],
        "nothing_new_median_cpu_seconds": round(statistics.median(cpu), 2),
        "aim_seconds": 10.0,
        "load_average_before_each": [round(x, 2) for x in loads],
        "first_summary_ingested": first["ingest"]["ingested"],
        "cpu_count": os.cpu_count(),
    }
    out = ROOT / "benchmarks" / "results" / "flow.json"
    write_text_atomic(out, json.dumps(result, indent=2) + "\n", out.parent)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
