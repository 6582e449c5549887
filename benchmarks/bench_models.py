"""Model benchmark: every model (and SASRec loss) on real MovieLens data, same protocol as the pipeline.

Protocol (../shared/PROTOCOL.md): 5-core, stable time order, leave-one-out, validation NDCG@10 selects the
epoch and early-stops (patience from params.yaml), the test split is scored once with full ranking.

    python benchmarks/bench_models.py --dataset ml-100k --runs mostpop sasrec:ce sasrec:bce
    python benchmarks/bench_models.py --dataset ml-1m-half --runs sasrec:ce --max-minutes 20

A run is `model`, `model:loss`, and either may end in `@key=value,...` to override a model or train setting
for that run only (ablations: `bert4rec@mask_prob=0.2,lr=0.001`). `--max-minutes` bounds one run's training (the best checkpoint so far is
kept and `stopped_by` says `time_limit`, so a cut-short run is visible in the table, never hidden).
`--seeds N` trains each run with N seeds (train.seed, train.seed + 1, ...), one row per seed; `--seed-offset K`
starts at train.seed + K (to spread one run's seeds over several processes). `--work-dir DIR` keeps the
prepared data, checkpoints and the trainer's per-epoch resume state in DIR instead of a temporary directory:
the same command run again after a kill resumes each unfinished run from its last finished epoch (time and
CPU seconds carry over), so a multi-hour CPU run survives an interrupted session; a run `--max-minutes`
stopped keeps its state there too, and the same command with a larger `--max-minutes` (or 0) trains it on
from its last epoch, ending where one uninterrupted run under that budget would (runs that had finished are
reused). Likewise a run that differs from one early stopping ended in this work dir only in its patience or
epoch floor (`bert4rec@...,patience=80` after `...,patience=40`, same seed) starts from that run's kept final
state and trains only the extra epochs, ending as one uninterrupted run would
(recsys.train_state.STOPPING_FIELDS).
Results are merged into benchmarks/results/models.json (one row per dataset, run and seed) and the tables in
benchmarks/RESULTS.md are rebuilt: every row, and each run's mean ± sd over its seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import get_args, get_type_hints

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results_md import claimed, mean_sd, row_key, row_seed, update_sections  # noqa: E402

from recsys.config import ConfigError, build_dataclass, load_params  # noqa: E402
from recsys.atomic import write_text_atomic  # noqa: E402
from recsys.data import DataError, read_movielens_1m, read_movielens_100k, read_movielens_titles  # noqa: E402
from recsys.device import cpu_flags, precision_name, resolve_device, training_autocast  # noqa: E402
from recsys.entry import positive_float, positive_int, run_entry  # noqa: E402
from recsys.evaluate import evaluate_checkpoint  # noqa: E402
from recsys.layout import prune_resume_state  # noqa: E402
from recsys.models.dropout import CPU_MASKS  # noqa: E402
from recsys.model_configs import SEED_MAX, TRAINABLE, TrainConfig  # noqa: E402
from recsys.prepare import prepare, save  # noqa: E402
from recsys.train import train_model  # noqa: E402

READERS = {"ml-1m-half": read_movielens_1m, "ml-100k": read_movielens_100k}
RESULTS = ROOT / "benchmarks" / "results" / "models.json"
DEVICES = get_args(get_type_hints(TrainConfig)["device"])  # what train.device takes: auto, cpu, cuda


def zero_or(positive, zero_means: str):
    """argparse type: 0 (`zero_means`) or a value `positive` takes (recsys.entry.positive_int or
    positive_float); anything else is refused with `positive`'s reason."""
    zero = positive("1") * 0  # 0 or 0.0

    def parse(text: str):
        try:
            return positive(text)
        except argparse.ArgumentTypeError as err:
            try:
                is_zero = text.isascii() and type(zero)(text) == 0
            except ValueError:
                is_zero = False
            if is_zero:
                return zero
            raise argparse.ArgumentTypeError(f"{err} (or 0: {zero_means})") from None

    return parse


# The widest vector unit a CPU lists, by /proc/cpuinfo flag, widest first. Two CPUs that share a model name
# ("AMD EPYC" in a VM) can differ here and train 2-3 x apart (session 45: a bench_step epoch of BERT4Rec took
# 2.3 x session 41's on an AVX2-only EPYC), so a time ratio must not pair them.
VECTOR_UNITS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE"), ("asimd", "NEON"))


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name with its widest vector unit: "AMD EPYC (AVX2)" (no unit named where none is listed)."""
    cpu = platform.processor() or "cpu"
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags(cpuinfo)
    unit = next((name for flag, name in VECTOR_UNITS if flag in flags), "")
    return f"{cpu} ({unit})" if unit else cpu


def machine() -> str:
    """What a row's time was measured on. A row's processor (curves.processor) is the part before the comma."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    return (f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads "
            f"(torch {torch.__version__})")


def prepare_dataset(dataset: str, data_root: str | Path, params):
    """Read a MovieLens folder and apply the protocol's preparation (k-core, stable order, LOO split)."""
    folder = Path(data_root) / dataset
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder: --data-root names the one that holds {dataset}/ "
                        f"(../shared/data/README.md describes the files)")
    return prepare(READERS[dataset](folder), params.prepare, read_movielens_titles(folder))


def git_commit() -> str:
    """HEAD's short hash, or BENCH_COMMIT where the checkout travelled without its git history (a GPU box)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def configs_for(run: str, params):
    """`model[:loss][@key=value,...]` → (model name, model config, train config). Keys of the model's config
    or of the train section override params.yaml for this run only (ablations: `bert4rec@mask_prob=0.2`).
    The run's settings are checked as params.yaml's are (`recsys.config.build_dataclass`: known keys, types,
    each config's own checks): a bad one is a `ConfigError` naming the run, before any data is read."""
    spec, _, overrides = run.partition("@")
    name, _, loss = spec.partition(":")
    try:
        model_config = params.model_config(name)
    except ConfigError as err:
        raise ConfigError(f"run {run!r}: {err}") from None
    train_config = params.train_config(name)
    model_raw = dataclasses.asdict(model_config)
    train_raw = dataclasses.asdict(train_config)
    if loss:
        model_raw["loss"] = loss  # a model without a loss setting is refused by its config below
    for item in filter(None, overrides.split(",")):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"run {run!r}: override {item!r} is not key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"run {run!r}: {key}={raw!r} is not a YAML value") from None
        if key in model_raw:
            model_raw[key] = value
        elif key in train_raw:
            train_raw[key] = value
        else:
            raise ConfigError(f"run {run!r}: {key!r} is neither a {name} nor a train setting")
    try:
        model_config = build_dataclass(type(model_config), model_raw, name)
        train_config = build_dataclass(TrainConfig, train_raw, f"{name}.train")
    except ConfigError as err:
        raise ConfigError(f"run {run!r}: {err}") from None
    return name, model_config, train_config


def trainable_run(run: str, params):
    """`configs_for` for the step benchmarks (bench_step, step_ops): a model that takes
    optimiser steps (MostPop only counts, so it has no step to time)."""
    configs = configs_for(run, params)
    if not TRAINABLE[configs[0]]:
        raise ConfigError(f"run {run!r}: {configs[0]} takes no training step (it only counts); name a model "
                          f"that trains: {sorted(name for name, learns in TRAINABLE.items() if learns)}")
    return configs


def run_configs(run: str, params, max_minutes: float, device: str, seed_offset: int):
    """`configs_for` with the benchmark's own train settings: the configuration a run of this process trains."""
    name, model_config, train_config = configs_for(run, params)
    seed = train_config.seed + seed_offset
    if not 0 <= seed <= SEED_MAX:  # said here: TrainConfig's own check would name train.seed, not the offset
        raise ConfigError(f"run {run!r} with --seed-offset {seed_offset} would train with seed {seed} (its "
                          f"seed setting plus the offset); a seed is a whole number from 0 to {SEED_MAX}")
    train_config = dataclasses.replace(train_config, max_minutes=max_minutes, device=device, progress="off",
                                       seed=seed)
    return name, model_config, train_config


def as_json(config) -> dict:
    """A config dataclass as a finished row stores it (JSON: tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def differing(stored: dict, now: dict, keys) -> list[tuple[str, object, object]]:
    """(key, stored value, value now) for each of `keys` whose value differs between the two (None where one
    side lacks the key)."""
    return [(k, stored.get(k), now.get(k)) for k in keys if stored.get(k) != now.get(k)]


def described(diffs: list[tuple[str, object, object]]) -> str:
    return ", ".join(f"{k}={old!r} (now {new!r})" for k, old, new in diffs)


def refuse_other_settings(row: dict, now: dict, path: Path, remedy: str, ignore: Iterable[str] = ()) -> None:
    """A finished row in a kept work dir is reused only when each part of `now` equals the row's (`ignore`: train
    keys that do not change what the row trained); anything else stops with one sentence naming the differing
    keys (never a silent mix of two configurations in one table)."""
    for part, value in now.items():
        stored = row.get(part)
        if part == "train" and isinstance(stored, dict) and isinstance(value, dict):
            stored = {**TRAIN_BEFORE_THE_KEY, **stored}  # a key added since the row trained, at its old behaviour
            stored, value = ({k: v for k, v in d.items() if k not in ignore} for d in (stored, value))
        if stored == value:
            continue
        if isinstance(value, dict) and isinstance(stored, dict):
            diff = described(differing(stored, value, sorted(stored.keys() | value.keys())))
        else:
            diff = f"{stored!r} (now {value!r})"
        raise SystemExit(f"{path} was trained with other settings — {part}: {diff}; {remedy}")


def planned_row(run: str, dataset: str, params, max_minutes: float, device: str, seed_offset: int) -> dict:
    """What a run of this process will record of itself before it trains: its key and its settings."""
    _, model_config, train_config = run_configs(run, params, max_minutes, device, seed_offset)
    return {"dataset": dataset, "run": run, "seed": train_config.seed, "config": as_json(model_config),
            "train": as_json(train_config)}


def check_finished(row: dict, path: Path, run: str, dataset: str, params, max_minutes: float, device: str,
                   seed_offset: int) -> None:
    planned = planned_row(run, dataset, params, max_minutes, device, seed_offset)
    refuse_other_settings(row, {part: planned[part] for part in ("dataset", "config", "train")},
                          path, "use a new --work-dir or delete that file to train this run again")


NAME_CHARS = 200  # a run's file name beyond this is cut and told apart by a hash (file systems stop at 255 bytes)


def safe_name(run: str) -> str:
    """A run as a file name: `sasrec:ce@patience=20` → `sasrec-ce-patience-20`; a longer name than NAME_CHARS
    keeps its first characters and ends in a hash of the whole run string, so that the work dir's temporary
    directories (`.<name>-seed<N>-<random>`) and files stay within a file name's 255 bytes."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", run)
    if len(name) <= NAME_CHARS:
        return name
    return f"{name[:NAME_CHARS - 17]}-{hashlib.sha256(run.encode()).hexdigest()[:16]}"


def run_dir_name(run: str, seed: int) -> str:
    return f"{safe_name(run)}-seed{seed}"


def resume_root(work: Path, run: str, seed: int) -> Path:
    """Each run and seed keeps its trainer state apart, so that clearing one never touches another's (a
    time-limited run's state stays for a longer rerun while the next run of the same model finishes)."""
    return work / "resume" / run_dir_name(run, seed)


def larger_budget(row: dict, max_minutes: float) -> bool:
    """Whether `max_minutes` (0: no limit) gives more time than the finished row was trained under."""
    stored = row["train"]["max_minutes"]
    return bool(stored) and (not max_minutes or max_minutes > stored)


def more_time(row: dict, max_minutes: float) -> bool:
    """Whether a finished row the clock stopped would train on under `max_minutes` (0: no limit)."""
    return row["stopped_by"] == "time_limit" and larger_budget(row, max_minutes)


def run_one(run: str, prepared, prepared_dir: Path, work: Path, params, max_minutes: float, device: str,
            seed_offset: int = 0) -> dict:
    name, model_config, train_config = run_configs(run, params, max_minutes, device, seed_offset)
    out = work / run_dir_name(run, train_config.seed)
    load_before = os.getloadavg()[0]
    # The finished run's state is kept until its row is written (main): a kill while the test split is scored
    # then costs the scoring, not the training.
    # A run that differs from a finished one in early stopping's settings only (a larger patience or epoch
    # floor) starts from that run's kept final state: only its extra epochs are trained.
    root = resume_root(work, run, train_config.seed)
    others = [path for path in sorted((work / "resume").glob("*")) if path.is_dir() and path != root]
    result = train_model(name, model_config, train_config, prepared, out, curve_path=work / f"{out.name}.csv",
                         resume_root=root, keep_final_state=True, adopt_from=others,
                         mask_seen=params.evaluate.mask_seen)
    resolved = resolve_device(device)
    ev = evaluate_checkpoint(out, prepared_dir, "test", params.evaluate, device=str(resolved))
    return {
        "run": run,
        "seed": train_config.seed,
        "model": name,
        "config": dataclasses.asdict(model_config),
        "train": dataclasses.asdict(train_config),
        "test_ndcg@10": ev.metrics["ndcg@10"],
        "test_hr@10": ev.metrics["hr@10"],
        "test": {k: v for k, v in ev.metrics.items()},
        # Per-user test NDCG@10 in user order: paired comparisons between runs (benchmarks/curves.py).
        "test_per_user_ndcg@10": [round(float(v), 5) for v in ev.per_user.sort_values("user")["ndcg@10"]],
        "valid_ndcg@10": result.best_valid.get("ndcg@10"),
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "seconds_to_best": round(result.seconds_to_best, 1),
        "cpu_seconds_to_best": round(result.cpu_seconds_to_best, 1),
        "seconds_total": round(result.seconds, 1),
        "train_sequences_per_second": round(result.sequences_per_second, 1),
        "eval_seconds_all_users": round(ev.seconds, 3),
        "stopped_by": result.stopped_by,
        # How dropout drew its masks, where that is this code's (a CPU; CUDA keeps torch's): it sets a CPU
        # epoch's cost (session 33: 11-18 % less than rows before, which lack the key), not what is learned.
        "dropout_masks": CPU_MASKS if resolved.type == "cpu" else "torch",
        # What the training step computed in (`train.precision` resolved on this device: "auto" is bf16 on
        # CUDA, fp32 on a CPU). Rows before the key: float32 on a CPU, bfloat16 on CUDA.
        "precision": precision_name(training_autocast(train_config.precision, resolved)),
        # Other work on the same cores inflates the times; the 1-minute load average says how much.
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "curve": [json.loads(json.dumps(r)) for r in _read_curve(work / f"{out.name}.csv")],
    }


def _read_curve(path: Path) -> list[dict]:
    import csv

    if not path.is_file():
        return []
    with path.open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


# Train settings a row may differ in from the stored rows of its run string: a longer budget trains a
# clock-stopped run on; where it ran and how it reported are not what it trained; the seed is its key's.
_RERUN_FREE = frozenset({"max_minutes", "device", "progress", "eval_batch_size", "cpu_allocator", "seed"})


# Train settings added after rows were stored, with the value that trains as before they existed: a stored
# row without the key is read at that value, so that a row of a new setting cannot join the old rows of its
# string unnoticed (the check below compares the keys both rows record). Add each new train key here.
TRAIN_BEFORE_THE_KEY = {"ema_warmup": False, "precision": "auto",  # auto: what ran before the key, either device
                        "warm_patience": 0}


def precision_ran(row: dict) -> str:
    """What a row's training step computed in, "bf16" or "fp32": its record of it where it has one, else its
    `train.precision` (or the value before the key) read on the device it trained on — auto is bf16 on CUDA,
    fp32 on a CPU (`recsys.device.training_autocast`) — so that `auto` and the precision it resolved to are
    one setting."""
    if row.get("precision") in ("bf16", "fp32"):
        return row["precision"]
    train = row.get("train") or {}
    setting = train.get("precision", TRAIN_BEFORE_THE_KEY["precision"])
    if setting != "auto":
        return setting
    device = train.get("device", "auto")
    if device == "auto":  # a finished row names its machine; a planned one runs on this one
        device = ("cuda" if "NVIDIA" in str(row["machine"]) else "cpu") if "machine" in row else (
            "cuda" if torch.cuda.is_available() else "cpu")
    return "bf16" if device == "cuda" else "fp32"


def changed_settings(stored: dict, new: dict) -> list[tuple[str, object, object]]:
    """`differing` over each model or train setting the two rows both record (a budget's aside; the precision
    as it ran, `precision_ran`)."""
    out = []
    for part in ("config", "train"):
        old, now = stored.get(part) or {}, new.get(part) or {}
        if part == "train":
            old = {**TRAIN_BEFORE_THE_KEY, **old, "precision": precision_ran(stored)}
            now = {**now, "precision": precision_ran(new)} if "precision" in now else now
        free = _RERUN_FREE if part == "train" else frozenset()
        out += differing(old, now, sorted((old.keys() & now.keys()) - free))
    return out


def conflicting_row(keep: dict, row: dict) -> tuple[dict | None, list[tuple[str, object, object]]]:
    """A stored row `row` may not join, and how their settings differ: a row of its run string that trained
    other settings, the seed aside (one string, one setting) — the row of its own key first."""
    key = row_key(row)
    for stored_key in sorted((k for k in keep if k[:2] == key[:2]), key=lambda k: k != key):
        diff = changed_settings(keep[stored_key], row)
        if diff:
            return keep[stored_key], diff
    return None, []


def stored_rows(path: Path) -> dict:
    """The rows of a results file by their (dataset, run, seed) key; none when it does not exist yet."""
    return {row_key(r): r for r in (json.loads(path.read_text()) if path.is_file() else [])}


def refuse_conflict(keep: dict, row: dict, path: Path) -> None:
    """Stop with one sentence when `row` may not join the rows `keep` of `path` (`conflicting_row`)."""
    stored, diff = conflicting_row(keep, row)
    if diff:
        dataset, run, seed = row_key(stored)
        raise SystemExit(
            f"error: {path} already holds {dataset} `{run}` seed {seed} trained with other settings — "
            f"{described(diff)}: params.yaml has changed since that row; spell the old value in the run "
            f"(`{run.partition('@')[0]}@...,{diff[0][0]}={diff[0][1]!r}`) to measure it again, or remove "
            "that row to replace it")


def check_mergeable(runs: list[str], offsets, dataset: str, params, max_minutes: float, device: str,
                    path: Path) -> None:
    """`merge`'s refusal before any training: each run and seed this process would train, built as its row
    will be, against the rows already in `path` — hours sooner than after the run, with the same sentence."""
    keep = stored_rows(path)
    for run in runs:
        for offset in offsets:
            refuse_conflict(keep, planned_row(run, dataset, params, max_minutes, device, offset), path)


def merge(results: list[dict], path: Path = RESULTS) -> list[dict]:
    """Read-modify-write under a lock: several benchmark processes may finish runs at the same time. The
    RESULTS.md tables are built from the default file only; another `path` (GPU rows, whose (dataset, run,
    seed) keys would replace the CPU rows') is merged alone. A row never replaces one of its key, nor joins
    the rows of its run string at other seeds, that trained other settings: a run string is read against
    params.yaml as it is, so after a default changes the same string trains something else (nothing is
    written then)."""
    with claimed(path):
        keep = stored_rows(path)
        for r in results:
            refuse_conflict(keep, r, path)
            keep[row_key(r)] = r
        merged = sorted(keep.values(), key=row_key)
        write_text_atomic(path, json.dumps(merged, indent=1) + "\n", path.parent)
        if path.resolve() == RESULTS.resolve():
            update_results_md(merged)
    return merged


def render_table(rows: list[dict]) -> str:
    lines = [
        "| dataset | run | seed | test NDCG@10 | test HR@10 | best epoch | epochs run | time to best (s) | train seq/s "
        "| eval all users (s) | stopped by | load avg before/after | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['run']} | {row_seed(r)} | {r['test_ndcg@10']:.4f} | {r['test_hr@10']:.4f} "
            f"| {r['best_epoch']} | {r['epochs_run']} | {r['seconds_to_best']} | {r['train_sequences_per_second']} "
            f"| {r['eval_seconds_all_users']} | {r['stopped_by']} | {r.get('load_average_before_after', '?')} "
            f"| {r['commit']} |"
        )
    return "\n".join(lines)


def render_summary(rows: list[dict]) -> str:
    """One line per (dataset, run): mean ± sample sd over its seeds."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["run"]), []).append(r)
    lines = [
        "| dataset | run | seeds | test NDCG@10 | test HR@10 | best epoch | time to best (s) | stopped by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (dataset, run), rs in groups.items():
        stops = sorted({r["stopped_by"] for r in rs})
        lines.append(
            f"| {dataset} | {run} | {len(rs)} | {mean_sd([r['test_ndcg@10'] for r in rs], one=' (1 seed)')} "
            f"| {mean_sd([r['test_hr@10'] for r in rs], one=' (1 seed)')} | {mean_sd([r['best_epoch'] for r in rs], 0, one=' (1 seed)')} "
            f"| {mean_sd([r['seconds_to_best'] for r in rs], 0, one=' (1 seed)')} | {', '.join(stops)} |"
        )
    return "\n".join(lines)


def update_results_md(rows: list[dict]) -> None:
    update_sections(ROOT / "benchmarks" / "RESULTS.md",
                    {"models-summary": render_summary(rows), "models": render_table(rows)})


@contextlib.contextmanager
def work_area(work_dir: str | None):
    """`work_dir` (created, kept) when given, else a temporary directory removed on exit."""
    if work_dir:
        path = Path(work_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        yield Path(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(READERS), required=True)
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--runs", nargs="+", default=["mostpop", "sasrec:ce"])
    parser.add_argument("--max-minutes", type=zero_or(positive_float, "no limit"), default=0.0,
                        help="cap on one run's training (0 = no limit)")
    parser.add_argument("--seeds", type=positive_int, default=1, help="seeds per run: train.seed, train.seed + 1, ...")
    parser.add_argument("--seed-offset", type=int, default=0,
                        help="start at train.seed + this (several processes sharing one run's seeds)")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--threads", type=zero_or(positive_int, "torch's default"), default=0,
                        help="torch threads (0 = torch's default)")
    parser.add_argument("--work-dir", default="",
                        help="keep work (and resume state) here; rerun the same command to resume after a kill")
    parser.add_argument("--shared-device", type=positive_int, default=1, metavar="N",
                        help="N benchmark processes train on this device at once (one GPU's lease measuring "
                             "quality in parallel): recorded in each row, whose wall times curves.py then "
                             "compares with no other row's")
    parser.add_argument("--results", default=str(RESULTS),
                        help="JSON file the rows are merged into (RESULTS.md is rebuilt from the default one only)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params(args.params)
    offsets = range(args.seed_offset, args.seed_offset + args.seeds)
    for run, offset in ((run, offset) for run in args.runs for offset in offsets):
        run_configs(run, params, args.max_minutes, args.device, offset)  # each seed in range, before any data
    check_mergeable(args.runs, offsets, args.dataset, params, args.max_minutes, args.device, Path(args.results))
    resolve_device(args.device)  # `cuda` where torch sees none: refused here, not after preparing the data
    commit = git_commit()  # the code this process loaded, not whatever HEAD is when a long run ends
    started = time.perf_counter()
    prepared = prepare_dataset(args.dataset, args.data_root, params)
    logging.info("prepared %s in %.1fs: %s", args.dataset, time.perf_counter() - started,
                 {k: v for k, v in prepared.fingerprint.items() if k.startswith("n_")})
    with work_area(args.work_dir) as work:
        save(prepared, work / "prepared")
        for run, offset in ((run, offset) for run in args.runs for offset in offsets):
            finished = work / "finished" / f"{safe_name(run)}-offset{offset}.json"
            row = json.loads(finished.read_text()) if finished.is_file() else None
            if row is not None:  # a kept work dir: this run ended before the process was stopped
                # Under a larger --max-minutes the row is checked against its own: a run that ended before its
                # limit ends the same under a larger one (reused), and one the clock stopped trains on.
                larger = larger_budget(row, args.max_minutes)
                budget = row["train"]["max_minutes"] if larger else args.max_minutes
                check_finished(row, finished, run, args.dataset, params, budget, args.device, offset)
                if more_time(row, args.max_minutes):
                    logging.info("%s seed=%d stopped by the time limit earlier in %s; training on", run,
                                 row_seed(row), work)
                    row = None
                else:
                    logging.info("%s seed=%d finished earlier in %s; not trained again", run, row_seed(row),
                                 work)
            if row is None:
                row = run_one(run, prepared, work / "prepared", work, params, args.max_minutes, args.device,
                              offset)
                row.update(dataset=args.dataset, machine=machine(), commit=commit,
                           shared_device=args.shared_device,
                           command=" ".join([Path(sys.executable).name, *sys.argv]),
                           n_users=prepared.n_users, n_items=prepared.n_items)
                finished.parent.mkdir(exist_ok=True)
                finished.with_suffix(".tmp").write_text(json.dumps(row))
                finished.with_suffix(".tmp").replace(finished)
            # The kept final state goes once the row is on disk (also after a kill between the two writes) —
            # unless the clock or early stopping ended the run: it stays for the same command with a larger
            # --max-minutes, and for a run with a larger patience or epoch floor (run_one), a few MB each.
            if row["stopped_by"] not in ("time_limit", "early_stopping"):
                prune_resume_state(resume_root(work, run, row_seed(row)), [row["model"]])
            merge([row], Path(args.results))
            logging.info("%s %s seed=%d test_ndcg@10=%.4f test_hr@10=%.4f best_epoch=%d time_to_best=%.0fs "
                         "stopped_by=%s", args.dataset, run, row_seed(row), row["test_ndcg@10"],
                         row["test_hr@10"], row["best_epoch"],
                         row["seconds_to_best"], row["stopped_by"])


if __name__ == "__main__":
    run_entry(main, log_format="%(asctime)s %(message)s")  # a missing dataset or a bad setting: one line, exit 1
