"""Fan-out (issue 15): wall time of the retrain flow with four models on one worker vs two, and serially.

Starts the setup of tests/test_fanout_e2e.py (a `prefect server` on 127.0.0.1, the S3 test server as the DVC
remote, a bare git repository, the `train-model/worker` deployment on a process pool), then times
`python -m flows.retrain` on fresh clones of the same commit and data:

1. serial (no fan-out, one `dvc repro`, the single-machine default, against the same server);
2. `--fan-out train-model/worker` with one worker (`--limit 1`);
3. the same with a second worker started.

Each run trains all four models from scratch (a new clone has no dvc.lock; the workers do not reuse the
run-cache, so nothing is skipped). One torch thread per process (`--threads`).

    python benchmarks/bench_fanout.py [--epochs 20] [--threads 1]   # writes benchmarks/results/fanout.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fanout_support import WORKER_DEPLOYMENT, cluster, run_retrain  # noqa: E402
from s3 import _start, _stop, S3Server  # noqa: E402

from recsys.entry import positive_int  # noqa: E402
from recsys.atomic import write_text_atomic  # noqa: E402

MODELS = ["mostpop", "sasrec", "bert4rec", "mojito"]


def params(epochs: int) -> dict:
    small = {"dim": 32, "n_layers": 2, "n_heads": 2, "max_len": 50}
    return {
        "models": MODELS,
        "generate": {"n_users": 300, "n_items": 200, "mean_events_per_user": 40, "seed": 0},
        "train": {"epochs": epochs, "patience": epochs},  # a fixed budget: every run trains `epochs` epochs
        "sasrec": {**small, "train": {"patience": epochs}},
        "bert4rec": {**small, "ffn_dim": 64, "train": {"epochs": epochs, "patience": epochs}},
        "mojito": {**small, "time_dim": 8},
    }


def timed(repo: Path, env: dict, *args: str) -> dict:
    load_before = os.getloadavg()
    seconds, summary, _ = run_retrain(repo, env, *args, timeout=3600)
    trained = sorted(s for s in summary["stages_run"] if s.startswith("train@"))
    assert trained == sorted(f"train@{m}" for m in MODELS), summary["stages_run"]
    return {"seconds": round(seconds, 1), "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "valid_ndcg@10": {m: r["valid_ndcg@10"] for m, r in summary["models"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=positive_int, default=20)
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch threads per process (OMP_NUM_THREADS)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fanout.json")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        base = Path(tmp)
        proc, url = _start(base / "s3.log")
        try:
            with cluster(base / "cluster", params(args.epochs), S3Server(url)) as the:
                runs = {"serial": timed(the.clone("serial"), the.env)}
                the.start_worker("worker-1")
                runs["fan_out_1_worker"] = timed(the.clone("one"), the.env, "--fan-out", WORKER_DEPLOYMENT)
                the.start_worker("worker-2")
                runs["fan_out_2_workers"] = timed(the.clone("two"), the.env, "--fan-out", WORKER_DEPLOYMENT)
        finally:
            _stop(proc)
    result = {
        "what": "python -m flows.retrain, four models trained from scratch: serial (one dvc repro), fanned out "
                "to one process worker, to two (each --limit 1); wall time of the whole flow process",
        "models": MODELS, "epochs": args.epochs, "threads_per_process": args.threads,
        "data": "generated default-size dataset (300 users, 200 items, ~40 events each)",
        "cpu_count": os.cpu_count(), "date": dt.date.today().isoformat(), "commit": commit,
        "runs": runs,
        "speedup_2_vs_1_worker": round(runs["fan_out_1_worker"]["seconds"] / runs["fan_out_2_workers"]["seconds"], 2),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n", args.out.parent)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
