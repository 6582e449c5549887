"""Batch-to-champion latency (issue 14.5): a file lands in `inbox/` → validated → retrained → gate decided.

A fresh copy of the repository with the demo params (`params.yaml` as committed: four models, the embedded
dataset), bootstrapped, runs the pipeline once so that a champion exists (not timed). The state is then
copied twice and the same new batch (`recsys data batch 1`) is dropped into each inbox; one copy keeps
`train.init: cold`, the other sets `train.init: warm` for the champion's model (the others stay cold: `warm`
refuses a model no champion of its architecture exists for). Each is timed as one `python -m flows.pipeline`
process against a running `prefect server`:

- `gate_seconds`: from the start of the process to the flow's `gate:` log line (the decision recorded);
- `wall_seconds`: the whole process, closing lines included (the champion's top-5 loads the model).

    python benchmarks/bench_latency.py          # writes benchmarks/results/latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_flow import timed_pipeline  # noqa: E402  (it puts the repository root on sys.path)
from flow_support import clone_repo, drop_batch, registry_for, remote_of, sh  # noqa: E402
from server_support import prefect_server  # noqa: E402

from recsys.atomic import write_text_atomic  # noqa: E402

GATE_LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| INFO .* - gate: ", re.MULTILINE)


def run_pipeline(repo: Path, env: dict) -> dict:
    started_wall = time.time()
    elapsed, cpu, summary, output = timed_pipeline(repo, env, timeout=3600,
                                                   log=repo.parent / f"{repo.name}-pipeline.log")
    gate = GATE_LINE.search(output)
    gate_seconds = None
    if gate:  # the log's clock is local time of day; the run starts and ends on the same day here
        day = datetime.fromtimestamp(started_wall)
        stamp = datetime.combine(day.date(), datetime.strptime(gate.group(1), "%H:%M:%S.%f").time())
        gate_seconds = stamp.timestamp() - started_wall
    return {"wall_seconds": round(elapsed, 1), "gate_seconds": round(gate_seconds, 1) if gate_seconds else None,
            "cpu_seconds": round(cpu, 1), "summary": summary}


def copy_state(source: Path, target: Path) -> Path:
    """The repository after the first run, with its own DVC remote (the copy's `--local` remote points there)."""
    shutil.copytree(source, target, symlinks=True)
    shutil.copytree(remote_of(source), remote_of(target), symlinks=True)
    sh(["dvc", "remote", "add", "-d", "-f", "--local", "local", str(remote_of(target))], target)
    return target


def set_init(repo: Path, model: str, init: str) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params.setdefault(model, {}).setdefault("train", {})["init"] = init
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def epochs_trained(repo: Path, models: list[str]) -> dict[str, int]:
    out = {}
    for m in models:
        curve = repo / "plots" / f"{m}.csv"
        out[m] = max(len(curve.read_text().strip().splitlines()) - 1, 0) if curve.is_file() else 0
    return out


def variant(result: dict, repo: Path, models: list[str]) -> dict:
    retrain = result["summary"]["retrain"]
    decision = retrain["decision"] or {}
    return {
        "wall_seconds": result["wall_seconds"],
        "gate_seconds": result["gate_seconds"],
        "cpu_seconds": result["cpu_seconds"],
        "stages_run": len(retrain["stages_run"]),
        "rows_accepted": result["summary"]["ingest"]["rows_accepted"],
        "epochs_trained": epochs_trained(repo, models),
        "test_ndcg@10": {m: round(v["test_ndcg@10"], 4) for m, v in retrain["models"].items()
                         if v["test_ndcg@10"] is not None},
        "candidate": retrain["candidate"],
        "decision": decision.get("decision"),
        "reason": decision.get("reason"),
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        tmp = Path(tmp)
        with prefect_server(tmp / "server") as (_, env):
            base = clone_repo(tmp / "base")  # the demo params, as committed
            sh(["recsys", "bootstrap", "--root", str(base)], base)
            models = yaml.safe_load((base / "params.yaml").read_text())["models"]
            initial = run_pipeline(base, env)
            with registry_for(base) as registry:
                champion = registry.champion_info().architecture
            if champion == "mostpop":
                raise RuntimeError("no model passed the gate on the seed data: nothing to warm-start from")
            results = {}
            for init in ("cold", "warm"):
                repo = copy_state(base, tmp / init)
                if init == "warm":
                    set_init(repo, champion, "warm")
                drop_batch(repo, index=1)
                load = os.getloadavg()[0]
                timed = run_pipeline(repo, env)
                results[init] = {**variant(timed, repo, models), "load_average_before": round(load, 2)}
    result = {
        "what": "batch-to-champion latency: a new batch in inbox/ → python -m flows.pipeline (ingest + validate, "
                "dvc repro, gate) against a running prefect server, demo params; gate_seconds = process start "
                "to the gate's log line, wall_seconds = the whole process",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "models": models,
        "initial_run_seconds": initial["wall_seconds"],
        "champion_before_the_batch": champion,
        "warm_model": champion,
        "cold": results["cold"],
        "warm": results["warm"],
        "cpu_count": os.cpu_count(),
    }
    out = ROOT / "benchmarks" / "results" / "latency.json"
    write_text_atomic(out, json.dumps(result, indent=2) + "\n", out.parent)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
