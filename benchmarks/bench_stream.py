"""Stream benchmark (issue 14.2): a MovieLens file replayed as a stream; warm vs cold retraining per batch.

    python benchmarks/bench_stream.py --dataset ml-100k --models sasrec --batches 2 --threads 1
    python benchmarks/bench_stream.py --dataset ml-1m-half --device cuda     # 5 batches, three models

The stream: events sorted by time; the first `--history-share` of the time span (first to last event) is the
initial history, the rest of the span is cut into `--batches` equal windows ("daily batches" in the issue;
on ml-100k a window is ~8.5 days, on ml-1m-half ~17 days). Step 0 prepares the history with params.yaml's
`prepare` section (5-core, stable time order, leave-one-out: ../shared/PROTOCOL.md) and trains every model
cold; that is each model's first champion. Step b = 1..N appends window b, prepares the cumulative data the
same way (so validation / test are each user's last events of the cumulative data) and trains, on that one
prepared dataset with the same configs and seed, (a) cold and (b) warm: `train.init: warm` from the model
of the same family the previous step deploys, installed as a warm source exactly as the pipeline's train
stage reads it (`recsys.warm.write_source` → `train_model(warm_dir=...)`: raw-id vocabulary mapping, fresh
optimiser, early stopping as for cold). `--warm-from deployed` (default): the previous step's warm model if
its validation NDCG@10 is ≥ the cold one's, else the cold one (validation selects; the test split is
never looked at); `--warm-from warm`: always the previous warm model (a pure warm line; cold at step 0).
`train.init: auto`'s policy (every 5th version cold, catalogue-growth limit) is not exercised: every warm
run here is warm. From step 1 each row also splits test and validation NDCG@10 by the users with events in
that step's window and the rest (`test_by_activity`, `valid_by_activity`; the summary's warm/cold ratio per
group): the rest keep the targets the previous step's model was selected on, which a warm start inherits.
Runs that differ only in warm settings (`sasrec` and `sasrec@warm_keep=0.7`) share one cold
run per step (trained once; the copy's row says `cold_trained_as`), so a warm variant costs its warm runs.

Per step and model: test NDCG@10 / HR@10 (full ranking, scored once), validation NDCG@10, best epoch, epochs
run, seconds to best and in total, and for warm runs the ids kept / new / dropped by the mapping. The summary
per model is the mean over batches 1..N of warm/cold test NDCG@10 and of warm/cold seconds to best, against
the issue's target (≥ 0.99 and ≤ 0.30). `--max-minutes` caps each training run (`stopped_by: time_limit`
then says so). Models may carry overrides as in bench_models.py's `--runs`: `sasrec@dim=32,epochs=5`.
`--work-dir DIR` keeps the prepared steps, checkpoints and per-epoch resume state: the same command run again
after a kill reads back the runs that finished (rows marked `resumed`) and continues the interrupted one from
its last finished epoch — a stream of hours on a CPU survives an interrupted session. The cold runs do not
depend on one another, so a second process can take half of them: the same command with `--cold-only` added
(and the same `--work-dir`) trains cold runs newest step first while the main process goes forward; each run
is claimed by one process (a lock file the kernel releases if its holder dies), and the other reads it back.

Results go to `--out` (default benchmarks/results/stream.json; one record per dataset / models / batches /
device, replaced when rerun; written after every training run so a stopped benchmark keeps its numbers),
a plot beside it (`stream-<dataset>-<runs>-seed<seed>.png`, when matplotlib is installed), and — for the default `--out` only —
the generated table in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_models import (  # noqa: E402
    DEVICES, READERS, TRAIN_BEFORE_THE_KEY, as_json, configs_for, git_commit, machine, refuse_other_settings,
    safe_name, work_area, zero_or)
from results_md import claimed, mean_sd, save_figure, update_sections  # noqa: E402

from recsys import schema  # noqa: E402
from recsys.checkpoint import read_meta  # noqa: E402
from recsys.config import load_params  # noqa: E402
from recsys.data import read_movielens_titles  # noqa: E402
from recsys.device import resolve_device  # noqa: E402
from recsys.entry import positive_float, positive_int, run_entry  # noqa: E402
from recsys.evaluate import evaluate_checkpoint  # noqa: E402
from recsys.prepare import prepare, save  # noqa: E402
from recsys.train import train_model  # noqa: E402
from recsys.warm import write_source  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "stream.json"
TARGET_NDCG_RATIO, TARGET_TIME_RATIO = 0.99, 0.30
log = logging.getLogger("bench_stream")


# --- the stream ---------------------------------------------------------------------------------------------


def stream_batches(timestamps, batches: int, history_share: float) -> tuple[np.ndarray, np.ndarray]:
    """Batch number of each event (0 = history, 1..`batches` = the windows) and the window edges.

    The span [first, last event] is cut at first + history_share × span; the rest is `batches` equal windows
    [edge b-1, edge b), the last one closed so the last event belongs to it. Every event gets exactly one
    number and the numbers never decrease with time."""
    if batches < 1 or not 0.0 < history_share < 1.0:
        raise ValueError(f"need batches ≥ 1 and 0 < history_share < 1 (got {batches}, {history_share})")
    ts = np.asarray(timestamps, dtype=np.float64)
    first, last = float(ts.min()), float(ts.max())
    cut = first + history_share * (last - first)
    edges = np.linspace(cut, last, batches + 1)
    # side="right": an event at an edge starts the later window; the last edge belongs to the last window.
    number = np.searchsorted(edges, ts, side="right")
    return np.minimum(number, batches).astype(np.int64), edges


def history_share(text: str) -> float:
    """argparse type of `--history-share`: a number strictly between 0 and 1."""
    try:
        value = positive_float(text)
    except argparse.ArgumentTypeError:
        value = 1.0
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1 (the share of the time span that "
                                         f"is history), got {text!r}")
    return value


def read_dataset(dataset: str, data_root: str | Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    folder = Path(data_root) / dataset
    return READERS[dataset](folder), read_movielens_titles(folder)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(float(ts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def _listing(directory: Path) -> list[list]:
    return [[p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()]
            for p in sorted(directory.iterdir()) if p.is_file()]


def install_warm_source(checkpoint: Path, warm_dir: Path, version: int) -> None:
    """`checkpoint` as the warm source the train stage reads (recsys/warm.py), standing for registry
    version `version` (the stream step that trained it)."""
    files = _listing(checkpoint)
    digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()
    shutil.rmtree(warm_dir, ignore_errors=True)
    write_source(warm_dir, version, digest, files, checkpoint)


# --- one training run ---------------------------------------------------------------------------------------


def by_activity(per_user: pd.DataFrame, active: set | None) -> dict | None:
    """NDCG@10 of the users with events in this step's window ("active": their validation / test targets are
    new) and of the rest ("inactive": the same targets as at the previous step, which that step's model was
    selected on — a warm start inherits that selection). None at step 0."""
    if active is None:
        return None
    is_active = per_user["user_id"].isin(active).to_numpy()
    out = {}
    for name, mask in (("active", is_active), ("inactive", ~is_active)):
        out[name] = {"users": int(mask.sum()),
                     "ndcg@10": round(float(per_user["ndcg@10"].to_numpy()[mask].mean()), 5) if mask.any() else None}
    return out


def prepare_step(step: int, interactions: pd.DataFrame, number: np.ndarray, params, titles, work: Path):
    """Step `step`'s cumulative data prepared and written to the work dir once (a process sharing the work dir
    may be reading it), and the users with events in the step's window (None at step 0)."""
    prepared = prepare(interactions[number <= step], params.prepare, titles)
    prepared_dir = work / f"step{step}" / "prepared"
    with claimed(prepared_dir):
        marker = prepared_dir / "fingerprint.json"
        if not (marker.is_file() and json.loads(marker.read_text()) == prepared.fingerprint):
            save(prepared, prepared_dir)
    window = interactions.loc[number == step, schema.USER] if step else None
    active = None if window is None else set(window.astype(str))
    return prepared, prepared_dir, active


def train_and_score(run: str, init: str, step: int, prepared, prepared_dir: Path, work: Path, params, args,
                    warm_dir: Path | None, active: set | None = None, wait: bool = True) -> tuple[dict | None, Path]:
    """One training run and its test score; in a kept `--work-dir`, a run that finished before the process
    was stopped — or that another process sharing the work dir trained — is read back (its row and
    checkpoint), not trained again. A run another process is training is waited for, or skipped (row None)
    when `wait` is off."""
    out = work / f"step{step}" / f"{safe_name(run)}-{init}"
    with claimed(out, wait) as mine:
        if not mine:
            log.info("step=%d %s init=%s: another process is training it; skipped", step, run, init)
            return None, out
        return _train_and_score(run, init, step, prepared, prepared_dir, work, params, args, warm_dir, active, out)


def _train_and_score(run: str, init: str, step: int, prepared, prepared_dir: Path, work: Path, params, args,
                     warm_dir: Path | None, active: set | None, out: Path) -> tuple[dict, Path]:
    finished = out.with_suffix(".row.json")
    name, model_config, train_config = configs_for(run, params)
    seed = train_config.seed if args.seed is None else args.seed
    train_config = dataclasses.replace(train_config, init=init, seed=seed, device=args.device, progress="off",
                                       max_minutes=args.max_minutes)
    settings = {"stream": {"dataset": args.dataset, "batches": args.batches, "history_share": args.history_share},
                "config": as_json(model_config), "train": as_json(train_config)}
    if finished.is_file():
        row = json.loads(finished.read_text())
        # A cold run is the same model whatever its warm-only settings (cold_key).
        refuse_other_settings(row, settings, finished, f"use a new --work-dir or delete {work} to run this stream",
                              ignore=WARM_ONLY_FIELDS if init == "cold" else ())
        log.info("step=%d %s init=%s finished earlier in %s; not trained again", step, run, init, work)
        return {**row, "resumed": True}, out
    load_before = os.getloadavg()[0]
    result = train_model(name, model_config, train_config, prepared, out, curve_path=out.with_suffix(".csv"),
                         resume_root=work / "resume" / f"{safe_name(run)}-{init}-{step}", warm_dir=warm_dir,
                         mask_seen=params.evaluate.mask_seen)
    device = str(resolve_device(args.device))
    ev = evaluate_checkpoint(out, prepared_dir, "test", params.evaluate, device=device)
    # Validation per user (the split that selected the epoch) for the by-activity diagnostic; seconds.
    valid_ev = evaluate_checkpoint(out, prepared_dir, "valid", params.evaluate, device=device) if active else None
    mapping = read_meta(out).get("init") or {}
    row = {
        "step": step,
        "run": run,
        "model": name,
        "init": init,
        "warm_from": mapping.get("from_version"),
        "test_ndcg@10": ev.metrics["ndcg@10"],
        "test_hr@10": ev.metrics["hr@10"],
        "valid_ndcg@10": result.best_valid.get("ndcg@10"),
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "seconds_to_best": round(result.seconds_to_best, 1),
        "seconds_total": round(result.seconds, 1),
        "cpu_seconds_to_best": round(result.cpu_seconds_to_best, 3),
        "cpu_seconds_total": round(result.cpu_seconds, 3),
        "stopped_by": result.stopped_by,
        "items": mapping.get("items"),  # kept / new / dropped by the raw-id mapping (warm runs)
        "users": mapping.get("users"),  # MOJITO's user rows
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "test_by_activity": by_activity(ev.per_user, active),
        "valid_by_activity": by_activity(valid_ev.per_user, active) if valid_ev else None,
        **settings,
    }
    log.info("step=%d %s init=%s test_ndcg@10=%.4f valid_ndcg@10=%.4f best_epoch=%d time_to_best=%.0fs "
             "total=%.0fs stopped_by=%s items=%s", step, run, init, row["test_ndcg@10"], row["valid_ndcg@10"],
             row["best_epoch"], row["seconds_to_best"], row["seconds_total"], row["stopped_by"], row["items"])
    finished.with_suffix(".tmp").write_text(json.dumps(row))
    finished.with_suffix(".tmp").replace(finished)
    return row, out


# TrainConfig fields only a warm start reads: runs that differ in these alone train the same cold model, so
# the stream trains it once per step (`--models sasrec 'sasrec@warm_keep=0.7'` costs one cold line).
WARM_ONLY_FIELDS = ("warm_cold_every", "warm_max_catalogue_growth", "warm_min_epochs", "warm_keep",
                    "warm_patience")


def cold_key(run: str, params) -> str:
    """What a run's cold training depends on: the model and its config, and the train config without the
    warm-only fields."""
    name, model_config, train_config = configs_for(run, params)
    defaults = {f.name: f.default for f in dataclasses.fields(train_config) if f.name in WARM_ONLY_FIELDS}
    train = dataclasses.replace(train_config, **defaults)
    return json.dumps([name, as_json(model_config), as_json(train)], sort_keys=True)


# --- summary, files, plot -----------------------------------------------------------------------------------


def meets_target(ndcg_ratio: float, time_ratio: float) -> bool:
    """The issue's aim for warm/cold: test NDCG@10 ≥ 0.99 × in ≤ 0.30 × the time to best."""
    return ndcg_ratio >= TARGET_NDCG_RATIO and time_ratio <= TARGET_TIME_RATIO


def summarise(rows: list[dict], runs: list[str]) -> dict[str, dict]:
    """Per run: warm/cold ratios at each batch (test NDCG@10, seconds to best, total seconds) and their means
    over the batches, against the issue's target."""
    out = {}
    for run in runs:
        by = {(r["step"], r["init"]): r for r in rows if r["run"] == run}
        steps = sorted(s for s, init in by if init == "warm" and (s, "cold") in by)
        if not steps:
            continue
        ndcg = [by[s, "warm"]["test_ndcg@10"] / max(by[s, "cold"]["test_ndcg@10"], 1e-12) for s in steps]
        best = [by[s, "warm"]["seconds_to_best"] / max(by[s, "cold"]["seconds_to_best"], 1e-9) for s in steps]
        total = [by[s, "warm"]["seconds_total"] / max(by[s, "cold"]["seconds_total"], 1e-9) for s in steps]
        capped = sorted({f"step {s} {i}" for (s, i), r in by.items() if r["stopped_by"] == "time_limit"})
        mean_ndcg, mean_best = statistics.mean(ndcg), statistics.mean(best)
        # Process CPU seconds (rows from session 7 on) do not grow with other load on the box, wall seconds
        # do: the time target is judged on them where every run of the pair has them.
        cpu = None
        if all("cpu_seconds_to_best" in by[s, i] for s in steps for i in ("warm", "cold")):
            cpu = [by[s, "warm"]["cpu_seconds_to_best"] / max(by[s, "cold"]["cpu_seconds_to_best"], 1e-9)
                   for s in steps]
        judged = statistics.mean(cpu) if cpu else mean_best

        def activity_ratio(split: str, group: str) -> float | None:
            """Mean over the batches of warm/cold NDCG@10 on one group of users (rows before session 10
            lack the split: None)."""
            ratios = []
            for s in steps:
                warm, cold = by[s, "warm"].get(split), by[s, "cold"].get(split)
                if not warm or not cold or warm[group]["ndcg@10"] is None or not cold[group]["ndcg@10"]:
                    return None
                ratios.append(warm[group]["ndcg@10"] / cold[group]["ndcg@10"])
            return round(statistics.mean(ratios), 4)
        out[run] = {
            "batches": steps,
            "ndcg_ratio": [round(x, 4) for x in ndcg],
            "time_to_best_ratio": [round(x, 4) for x in best],
            "total_time_ratio": [round(x, 4) for x in total],
            "mean_ndcg_ratio": round(mean_ndcg, 4),
            "mean_time_to_best_ratio": round(mean_best, 4),
            "mean_total_time_ratio": round(statistics.mean(total), 4),
            "cpu_time_to_best_ratio": [round(x, 4) for x in cpu] if cpu else None,
            "mean_cpu_time_to_best_ratio": round(statistics.mean(cpu), 4) if cpu else None,
            "meets_target": meets_target(mean_ndcg, judged),
            "capped_runs": capped,
            "ndcg_ratio_by_activity": {f"{split.split('_')[0]} {group}": activity_ratio(split, group)
                                       for split in ("test_by_activity", "valid_by_activity")
                                       for group in ("active", "inactive")},
        }
    return out


def record_seed(record: dict) -> int | None:
    """The train seed a record's runs used (records before session 11 kept only `--seed`, None = params')."""
    for row in record["rows"]:
        if "train" in row:
            return int(row["train"]["seed"])
    return record.get("seed")


def record_key(record: dict) -> tuple:
    """One record per stream setting and seed: a rerun replaces its own record, another seed adds one."""
    return (record["dataset"], tuple(record["runs"]), record["batches"], record["history_share"],
            record["machine"]["device"], record["warm_from"], record_seed(record))


def write_record(record: dict, out: Path) -> list[dict]:
    """Merge `record` into `out`, replacing the record of its key (a rerun of a seed) — but a record still in
    progress never replaces a complete one: a rerun stopped or refused half-way loses nothing measured."""
    out.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(out.read_text()) if out.is_file() else []
    if not record.get("complete") and any(r.get("complete") and record_key(r) == record_key(record)
                                          for r in existing):
        return existing
    kept = [r for r in existing if record_key(r) != record_key(record)] + [record]
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=1) + "\n")
    tmp.replace(out)
    return kept


def over_seeds(records: list[dict]) -> list[dict]:
    """Per stream setting and run with complete records for two or more seeds: the per-seed means of the
    warm/cold ratios, and their mean ± sd over the seeds. A seed counts once: where two records hold the same
    run at one seed (a command that read its rows back beside a new run), the later one."""
    groups: dict[tuple, dict[int | None, dict]] = {}
    for rec in records:
        if not rec.get("complete"):
            continue
        setting = (rec["dataset"], rec["batches"], rec["history_share"], rec["machine"]["device"],
                   rec["warm_from"])
        for run, summary in rec["summary"].items():
            warm = next((r for r in rec["rows"] if r["run"] == run and r["init"] == "warm" and "train" in r), None)
            if warm is None:
                continue
            # The settings the name stood for then: "sasrec" is params.yaml's SASRec, which changes over time.
            train = {**TRAIN_BEFORE_THE_KEY, **warm["train"]}  # a key added since, at its old behaviour
            trained = json.dumps([warm["config"], {k: v for k, v in train.items() if k != "seed"}], sort_keys=True)
            groups.setdefault((*setting, run, trained), {})[record_seed(rec)] = {**summary, "commit": rec.get("commit")}
    out = []
    for (dataset, batches, _, device, _, run, _), by_seed in groups.items():
        if len(by_seed) < 2:
            continue
        seeded = sorted(by_seed.items(), key=lambda pair: pair[0] if pair[0] is not None else -1)

        def spread(field: str) -> list[float] | None:
            values = [summary.get(field) for _, summary in seeded]
            return None if any(v is None for v in values) else values
        out.append({"dataset": dataset, "device": device, "run": run, "batches": batches,
                    "seeds": [seed for seed, _ in seeded],
                    # where the name's settings ran: one name (params.yaml's "bert4rec") can stand for several
                    "commits": sorted({summary["commit"] or "—" for _, summary in seeded}),
                    **{field: spread(field) for field in ("mean_ndcg_ratio", "mean_time_to_best_ratio",
                                                          "mean_cpu_time_to_best_ratio")}})
    return out


def _over_seeds_cell(values: list[float] | None) -> str:
    """mean ± sd, then each seed's value."""
    return f"{mean_sd(values)} ({', '.join(f'{v:.4f}' for v in values)})" if values else "—"


def render_table(records: list[dict]) -> str:
    lines = ["| dataset | device | run | seed | step | init | test NDCG@10 | test HR@10 | valid NDCG@10 "
             "| best epoch | epochs run | time to best (s) | total (s) | stopped by | items kept/new/dropped "
             "| load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in records:
        for r in rec["rows"]:
            items = r["items"] or {}
            mapped = f"{items['kept']}/{items['new']}/{items['dropped']}" if items else "—"
            seed = r["train"]["seed"] if "train" in r else "—"
            lines.append(
                f"| {rec['dataset']} | {rec['machine']['device']} | {r['run']} | {seed} | {r['step']} | {r['init']} "
                f"| {r['test_ndcg@10']:.4f} | {r['test_hr@10']:.4f} | {r['valid_ndcg@10']:.4f} "
                f"| {r['best_epoch']} | {r['epochs_run']} | {r['seconds_to_best']} | {r['seconds_total']} "
                f"| {r['stopped_by']} "
                f"| {mapped} | {r['load_average_before_after']} |")
    lines += ["", "| dataset | device | run | seed | commit | batches | warm/cold NDCG@10 (mean) "
              "| warm/cold time to best (mean; wall, and CPU where recorded: the target's judge) | warm/cold total time (mean) | target ≥ 0.99 and ≤ 0.30 "
              "| capped runs |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in records:
        seed = record_seed(rec)
        for run, s in rec["summary"].items():
            lines.append(
                f"| {rec['dataset']} | {rec['machine']['device']} | {run} | {seed if seed is not None else '—'} "
                f"| {rec.get('commit') or '—'} | {len(s['batches'])} "
                f"| {s['mean_ndcg_ratio']} ({', '.join(map(str, s['ndcg_ratio']))}) "
                f"| {s['mean_time_to_best_ratio']} ({', '.join(map(str, s['time_to_best_ratio']))})"
                + (f"; CPU s {s['mean_cpu_time_to_best_ratio']}" if s.get("mean_cpu_time_to_best_ratio") else "")
                + f" | {s['mean_total_time_ratio']} | {'met' if s['meets_target'] else 'not met'} "
                f"| {', '.join(s['capped_runs']) or 'none'} |")
    seeded = over_seeds(records)
    if seeded:
        lines += ["", "Over seeds (each seed's mean over its batches, then mean ± sd over the seeds):", "",
                  "| dataset | device | run | batches | seeds | warm/cold NDCG@10 | warm/cold time to best (wall) "
                  "| warm/cold CPU time to best | target ≥ 0.99 and ≤ 0.30 | commits |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for g in seeded:
            time_judge = g["mean_cpu_time_to_best_ratio"] or g["mean_time_to_best_ratio"]
            met = meets_target(statistics.mean(g["mean_ndcg_ratio"]), statistics.mean(time_judge))
            lines.append(
                f"| {g['dataset']} | {g['device']} | {g['run']} | {g['batches']} "
                f"| {', '.join(str(x) for x in g['seeds'])} | {_over_seeds_cell(g['mean_ndcg_ratio'])} "
                f"| {_over_seeds_cell(g['mean_time_to_best_ratio'])} | {_over_seeds_cell(g['mean_cpu_time_to_best_ratio'])} "
                f"| {'met' if met else 'not met'} | {', '.join(g['commits'])} |")
    return "\n".join(lines)


def update_results_md(records: list[dict]) -> None:
    update_sections(ROOT / "benchmarks" / "RESULTS.md", {"stream": render_table(records)})


def plot_path(record: dict, directory: Path) -> Path:
    """One picture per record (dataset, runs, seed): `stream-ml-100k-mojito-seed42.png`."""
    return directory / f"stream-{record['dataset']}-{safe_name('+'.join(record['runs']))}-seed{record_seed(record)}.png"


def plot(record: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (the JSON has every number)")
        return None
    runs = record["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(4.2 * len(runs), 6.4), squeeze=False)
    for col, run in enumerate(runs):
        for init, style in (("cold", "o-"), ("warm", "s--")):
            rows = sorted((r for r in record["rows"] if r["run"] == run and r["init"] == init),
                          key=lambda r: r["step"])
            steps = [r["step"] for r in rows]
            axes[0][col].plot(steps, [r["test_ndcg@10"] for r in rows], style, label=init)
            axes[1][col].plot(steps, [r["seconds_to_best"] for r in rows], style, label=init)
        axes[0][col].set_title("\n".join(textwrap.wrap(run, 40)), fontsize=9)
        axes[0][col].set_ylabel("test NDCG@10")
        axes[1][col].set_ylabel("seconds to best")
        axes[1][col].set_xlabel("step (0 = history, then batches)")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xticks(range(record["batches"] + 1))
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(f"{record['dataset']} as a stream: warm vs cold ({record['machine']['device']}, "
                 f"commit {record['commit']})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


# --- main ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(READERS), default="ml-1m-half")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--models", nargs="+", default=["sasrec", "bert4rec", "mojito"],
                        help="model[:loss][@key=value,...] as bench_models.py --runs")
    parser.add_argument("--batches", type=positive_int, default=5)
    parser.add_argument("--history-share", type=history_share, default=0.8)
    parser.add_argument("--warm-from", choices=["deployed", "warm"], default="deployed")
    parser.add_argument("--threads", type=zero_or(positive_int, "torch's default"), default=0,
                        help="torch threads (0 = torch's default)")
    parser.add_argument("--seed", type=zero_or(positive_int, "a seed like any other"), default=None,
                        help="train seed (default: params.yaml's)")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--max-minutes", type=zero_or(positive_float, "no cap"), default=0.0,
                        help="cap per training run (0 = none)")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--work-dir", default="",
                        help="keep prepared steps, checkpoints and resume state here; the same command run "
                             "again resumes (finished runs are read back, an interrupted one continues)")
    parser.add_argument("--cold-only", action="store_true",
                        help="a helper beside the main process on the same --work-dir (same other arguments): "
                             "trains the cold runs only, newest step first, skipping any run another process is "
                             "training; writes no results (the main process reads its runs back)")
    args = parser.parse_args(argv)
    if args.cold_only and not args.work_dir:
        parser.error("--cold-only needs the --work-dir of the main process it helps")
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    params = load_params(args.params)
    for run in args.models:
        configs_for(run, params)  # an unknown key stops here, not after hours of training
    resolve_device(args.device)  # `cuda` where torch sees none: refused before the data is read
    out = Path(args.out)
    started = time.perf_counter()
    interactions, titles = read_dataset(args.dataset, args.data_root)
    times = interactions[schema.TIMESTAMP].to_numpy()
    number, edges = stream_batches(times, args.batches, args.history_share)
    if args.cold_only:
        return cold_helper(args, params, interactions, titles, number)
    device = str(resolve_device(args.device))
    record = {
        "dataset": args.dataset,
        "runs": args.models,
        "batches": args.batches,
        "history_share": args.history_share,
        "warm_from": args.warm_from,
        "max_minutes": args.max_minutes,
        "seed": args.seed if args.seed is not None else configs_for(args.models[0], params)[2].seed,
        "command": " ".join([Path(sys.executable).name, "benchmarks/bench_stream.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),  # the code this process loaded
        "machine": {"description": machine(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "device": device, "torch": torch.__version__},
        "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "load_average_after": None,
        "windows": [{"batch": b, "from": _iso(edges[b - 1]), "to": _iso(edges[b]),
                     "events": int((number == b).sum())} for b in range(1, args.batches + 1)],
        "history": {"to": _iso(edges[0]), "events": int((number == 0).sum())},
        "steps": [],
        "rows": [],
        "summary": {},
        "complete": False,
        "seconds": None,
    }
    deployed: dict[str, Path] = {}  # run → checkpoint the previous step deploys
    with work_area(args.work_dir) as work:
        for step in range(args.batches + 1):
            prepared, prepared_dir, active = prepare_step(step, interactions, number, params, titles, work)
            fp = prepared.fingerprint
            record["steps"].append({"step": step, "raw_events": int((number <= step).sum()),
                                    **{k: fp[k] for k in ("n_users", "n_items", "n_events", "n_train",
                                                          "n_valid", "n_test")}})
            log.info("step=%d prepared %s", step, record["steps"][-1])
            colds: dict[str, tuple[str, dict, Path]] = {}  # cold_key → (the run that trained it, row, dir)
            for run in args.models:
                key = cold_key(run, params)
                if key in colds:  # the same cold model as an earlier run's: its row, under this run's name
                    first, row, cold_dir = colds[key]
                    cold = {**row, "run": run, "cold_trained_as": first}
                    log.info("step=%d %s init=cold: the same cold model as %s's, not trained again", step,
                             run, first)
                else:
                    cold, cold_dir = train_and_score(run, "cold", step, prepared, prepared_dir, work, params,
                                                     args, None, active)
                    colds[key] = (run, cold, cold_dir)
                record["rows"].append(cold)
                _save(record, out)
                if step == 0:
                    deployed[run] = cold_dir
                    continue
                warm_dir = work / "warm" / f"{safe_name(run)}-{step}"
                install_warm_source(deployed[run], warm_dir, step)  # "version" = the step it is used at
                warm, warm_ckpt = train_and_score(run, "warm", step, prepared, prepared_dir, work, params,
                                                  args, warm_dir, active)
                warm["warm_from_checkpoint"] = str(deployed[run].relative_to(work))
                record["rows"].append(warm)
                record["summary"] = summarise(record["rows"], args.models)
                _save(record, out)
                use_warm = args.warm_from == "warm" or warm["valid_ndcg@10"] >= cold["valid_ndcg@10"]
                deployed[run] = warm_ckpt if use_warm else cold_dir
    record.update(complete=True, seconds=round(time.perf_counter() - started, 1),
                  load_average_after=[round(x, 2) for x in os.getloadavg()])
    records = _save(record, out)
    if out.resolve() == RESULTS.resolve():
        update_results_md(records)
    picture = plot(record, plot_path(record, out.parent))
    for run, s in record["summary"].items():
        log.info("%s: warm/cold test NDCG@10 %.4f, time to best %.4f (target ≥ %.2f and ≤ %.2f: %s)", run,
                 s["mean_ndcg_ratio"], s["mean_time_to_best_ratio"], TARGET_NDCG_RATIO, TARGET_TIME_RATIO,
                 "met" if s["meets_target"] else "not met")
    if picture:
        log.info("plot: %s", picture)
    return record


def cold_helper(args, params, interactions: pd.DataFrame, titles, number: np.ndarray) -> dict:
    """`--cold-only`: every step's cold runs (one per distinct cold model), newest step first, so that a main
    process going forward from step 0 meets this one in the middle; cold runs do not depend on each other."""
    trained, skipped = [], []
    owners: dict[str, str] = {}  # cold_key → the first run with it: the main process trains it under that name
    for run in args.models:
        owners.setdefault(cold_key(run, params), run)
    with work_area(args.work_dir) as work:
        for step in range(args.batches, -1, -1):
            prepared, prepared_dir, active = prepare_step(step, interactions, number, params, titles, work)
            for run in owners.values():
                row, _ = train_and_score(run, "cold", step, prepared, prepared_dir, work, params, args, None,
                                         active, wait=False)
                (trained if row is not None else skipped).append({"step": step, "run": run})
    log.info("cold helper done: %d runs trained or read back, %d skipped (another process had them)",
             len(trained), len(skipped))
    return {"cold_only": True, "trained": trained, "skipped": skipped}


def _save(record: dict, out: Path) -> list[dict]:
    record["load_average_now"] = [round(x, 2) for x in os.getloadavg()]
    return write_record(record, out)


if __name__ == "__main__":
    run_entry(main, log_format="%(asctime)s %(message)s")  # a bad setting or missing data: one line
