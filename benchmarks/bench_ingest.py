"""Benchmarks of ingest in a temp git + DVC repo with a local remote.

    .venv/bin/python benchmarks/bench_ingest.py big [--rows 1000000]
        one large batch (validate + append + `dvc add`), per phase (writes results/ingest.json "big")
    .venv/bin/python benchmarks/bench_ingest.py scaling [--store-rows 100000 1000000 10000000]
        a 10,000-row batch into stores of each size: per-batch time (median of 3 batches, `dvc add` and
        `dvc push` included), peak RSS, the one-time key-index build, and a nothing-new run (what recovery,
        the index check and the push check cost when the inbox is empty) (writes "scaling")

Each store size is set up in a fresh interpreter (seed, `dvc add` + `dvc push`, index build) and its batches
run in another fresh one, the ingest process, whose peak RSS is what a batch into that store takes (the
setup's peak is recorded beside it). The GX import is paid once per process, before timing. Run it under `nice` on a shared machine and quote the load average.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recsys import ingest, store, validation  # noqa: E402
from recsys.config import IngestConfig  # noqa: E402
from recsys.entry import positive_int  # noqa: E402
from recsys.atomic import write_text_atomic  # noqa: E402
from recsys.ingest import keys  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "ingest.json"
N_USERS, N_ITEMS = 200_000, 50_000
T_END = 1_700_000_000
REPLAYS = 100  # stored events each timed batch replays (dropped as duplicates)


def at_least_replays(text: str) -> int:
    """argparse type of the store and batch sizes of `scaling`: each batch replays `REPLAYS` events of the
    store's first part, so both hold at least that many rows."""
    try:
        value = positive_int(text)
    except argparse.ArgumentTypeError:
        value = 0
    if value < REPLAYS:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least {REPLAYS} (each batch replays "
                                         f"{REPLAYS} stored events), got {text!r}")
    return value


def generate(n: int, seed: int, t_start: int = T_END - 365 * 86400, t_end: int = T_END) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "user_id": np.char.add("u", rng.integers(0, N_USERS, n).astype(str)),
            "item_id": np.char.add("i", rng.integers(0, N_ITEMS, n).astype(str)),
            "timestamp": rng.integers(t_start, t_end, n),
            "rating": rng.integers(1, 6, n).astype(np.float32),
            "event": rng.choice(np.array(["view", "click", "cart", "purchase"]), n),
        }
    )


def make_repo(base: Path) -> Path:
    repo, remote = base / "repo", base / "remote"
    (repo / "inbox").mkdir(parents=True)
    remote.mkdir()
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                ["dvc", "remote", "add", "-d", "local", str(remote)]):
        subprocess.run(cmd, cwd=repo, check=True)
    return repo


def peak_rss_mb() -> float:
    """This process's peak resident set. On Linux from /proc (VmHWM belongs to the process's own address
    space: `getrusage`'s ru_maxrss also carries the peak of the parent a subprocess was forked from)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # macOS: bytes; Linux and the BSDs: KiB


def measure_store(rows: int, batch_rows: int, batches: int) -> dict:
    """One store size, in this (fresh) process: seed the store, `dvc add` + `dvc push` it, build the key index;
    then the timed batches run in a fresh ingest process of their own (`_batches`), so that its peak RSS is
    what ingesting a batch into a store of this size takes — not the seeding's or the index build's."""
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        repo = make_repo(Path(tmp))
        start = time.perf_counter()
        for first in range(0, rows, 2_000_000):  # the seed, in parts of at most 2M rows
            chunk = generate(min(2_000_000, rows - first), seed=first)
            store.write_part(repo / "data", f"part-{first:016d}.parquet", chunk)
        seed_seconds = time.perf_counter() - start
        start = time.perf_counter()
        subprocess.run(["dvc", "add", "-q", "data"], cwd=repo, check=True)
        subprocess.run(["dvc", "push", "-q", "data.dvc"], cwd=repo, check=True)
        dvc_setup_seconds = time.perf_counter() - start
        start = time.perf_counter()
        with keys.open_index(repo / ".ingest") as index:
            index.sync(repo / "data")
        index_build_seconds = time.perf_counter() - start
        index_mb = (repo / ".ingest" / keys.INDEX_FILE).stat().st_size / 1e6
        first_part = store.list_parts(repo / "data")[0]
        replays = next(pq.ParquetFile(first_part).iter_batches(batch_size=REPLAYS)).to_pandas()
        replays.to_parquet(repo.parent / "replays.parquet", index=False)  # read here, not in the ingest process
        setup_peak = peak_rss_mb()
        done = subprocess.run([sys.executable, __file__, "_batches", str(repo), str(batch_rows), str(batches)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the batches into a store of {rows} rows failed:\n{done.stderr[-3000:]}")
        timed = json.loads(done.stdout.strip().splitlines()[-1])
        start = time.perf_counter()
        subprocess.run(["dvc", "status", "-c", "-q", "data.dvc"], cwd=repo, check=False)
        status_c_seconds = time.perf_counter() - start
    return {
        "store_rows": rows,
        "batch_rows": batch_rows,
        **timed,
        "setup_peak_rss_mb": round(setup_peak, 1),  # seeding + index build, in the parent
        "index_build_seconds_once": round(index_build_seconds, 1),
        "index_mb": round(index_mb, 1),
        "seed_write_seconds": round(seed_seconds, 1),
        "dvc_add_push_seed_seconds": round(dvc_setup_seconds, 1),
        "dvc_status_c_seconds_for_comparison": round(status_c_seconds, 2),
    }


def timed_batches(repo: Path, batch_rows: int, batches: int) -> dict:
    """The ingest process of one store size: `batches` batches of `batch_rows` rows (1 % replays of stored
    events), then three nothing-new runs and a recovery; its peak RSS is the per-batch memory."""
    logging.basicConfig(level=logging.WARNING)
    config = IngestConfig(max_unseen_item_share=1.0, max_unseen_user_share=1.0)
    validation._gx_context()  # once per process, not per batch
    rss_start = peak_rss_mb()
    replays = pd.read_parquet(repo.parent / "replays.parquet")
    per_batch = []
    for b in range(batches):
        frame = generate(batch_rows, seed=10_000 + b, t_start=T_END, t_end=T_END + 86400)
        frame.iloc[:REPLAYS] = replays.to_numpy()  # 1 % replays of stored events: dropped as duplicates
        path = repo / "inbox" / f"batch-{b}.csv"
        frame.to_csv(path, index=False)
        start = time.perf_counter()
        [summary] = ingest.ingest_inbox(repo, config)
        per_batch.append(time.perf_counter() - start)
        assert summary.status == "ingested" and summary.rows_duplicate >= REPLAYS, summary.message
    rss_after_batches = peak_rss_mb()
    nothing_new = []
    for _ in range(3):
        start = time.perf_counter()
        assert list(ingest.ingest_inbox(repo, config)) == []
        nothing_new.append(time.perf_counter() - start)
    start = time.perf_counter()
    ingest.recover(repo, config)
    recover_seconds = time.perf_counter() - start
    return {
        "per_batch_seconds": [round(s, 2) for s in per_batch],
        "per_batch_median_seconds": round(statistics.median(per_batch), 2),
        "peak_rss_mb_before_batches": round(rss_start, 1),  # interpreter + imports + GX context
        "peak_rss_mb": round(rss_after_batches, 1),  # the ingest process after its batches
        "nothing_new_run_seconds": round(statistics.median(nothing_new), 3),
        "recover_seconds": round(recover_seconds, 3),
    }


def scaling(args: argparse.Namespace) -> dict:
    results = []
    for rows in args.store_rows:
        load = os.getloadavg()
        done = subprocess.run(
            [sys.executable, __file__, "_one", str(rows), str(args.batch_rows), str(args.batches)],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"store of {rows} rows failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["load_average_1_5_15_before"] = [round(x, 2) for x in load]
        results.append(result)
        print(f"store {rows:>10,} rows: {result['per_batch_median_seconds']:6.2f} s per 10k batch, "
              f"ingest process peak RSS {result['peak_rss_mb']:7.1f} MB (setup's {result['setup_peak_rss_mb']} MB), "
              f"index built once in "
              f"{result['index_build_seconds_once']} s, nothing-new run "
              f"{result['nothing_new_run_seconds']} s",
              flush=True)
    return {"results": results, "ratio_largest_to_smallest": round(
        results[-1]["per_batch_median_seconds"] / results[0]["per_batch_median_seconds"], 2),
            "peak_rss_ratio_largest_to_smallest": round(results[-1]["peak_rss_mb"] / results[0]["peak_rss_mb"], 2)}


def big(args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.WARNING)
    validation._gx_context()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        repo = make_repo(Path(tmp))
        path = repo / "inbox" / "batch.csv"
        generate(args.rows, seed=0).to_csv(path, index=False)
        start = time.perf_counter()
        config = IngestConfig(dvc_push=False, max_unseen_item_share=1.0)
        [summary] = ingest.ingest_batches([path], repo, config)
        total = time.perf_counter() - start
    assert summary.status == "ingested", summary.message
    print(f"ingest of {args.rows:,} rows: {total:.2f} s")
    return {"rows": args.rows, "total_seconds": round(total, 2), "load_average_1_5_15_before": load}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        rows, batch_rows, batches = map(int, sys.argv[2:5])
        print(json.dumps(measure_store(rows, batch_rows, batches)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_batches":
        print(json.dumps(timed_batches(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    one = sub.add_parser("big")
    one.add_argument("--rows", type=positive_int, default=1_000_000)
    many = sub.add_parser("scaling")
    many.add_argument("--store-rows", type=at_least_replays, nargs="+",
                      default=[100_000, 1_000_000, 10_000_000])
    many.add_argument("--batch-rows", type=at_least_replays, default=10_000)
    many.add_argument("--batches", type=positive_int, default=3)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    result = big(args) if args.mode == "big" else scaling(args)
    result.update(
        command=" ".join(["benchmarks/bench_ingest.py", *sys.argv[1:]]),
        cpu_count=os.cpu_count(), python=platform.python_version(), machine=platform.platform(),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing = existing if "big" in existing or "scaling" in existing else {"big": existing}
    existing[args.mode] = result
    write_text_atomic(RESULTS, json.dumps(existing, indent=2, default=str) + "\n", RESULTS.parent)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
