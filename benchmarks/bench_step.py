"""Training and validation throughput per model, without training to convergence.

    python benchmarks/bench_step.py --dataset ml-1m-half --models sasrec bert4rec mojito --batches 12

Times `--batches` training steps (forward, backward, Adam) on the epoch's batches in their shuffled order, then
one full-ranking validation pass over every user, and merges the result into benchmarks/results/step.json
keyed by (dataset, model, commit), so the same command run at two commits compares implementations (for an
older commit: check it out in a worktree, copy this script there, and pass `--results` pointing here).
The model is freshly initialised: throughput does not depend on what it has learned. `--cuda-graph` times the
fixed-shape step of `train.cuda_graph` instead (recsys/step_graph.py: one CUDA graph replay per step on CUDA,
the same step run eagerly on a CPU). A model may be a run string as bench_models.py takes it
(`'sasrec@dim=128'`: params.yaml with those settings; its rows are keyed by the run).

`--profile N` then runs N more steps under `torch.profiler` and adds where a step's time goes to the row: the
operators by their own device time (CUDA kernels; on a CPU, CPU time), per step. The fixed-shape step is
profiled eagerly — the same kernels its graph replays, launched one by one so the profiler sees each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_models import (  # noqa: E402
    DEVICES, READERS, configs_for, git_commit, machine, prepare_dataset, trainable_run, zero_or,
)
from recsys.config import load_params  # noqa: E402
from recsys.models import build_model, losses  # noqa: E402
from recsys.sequences import (  # noqa: E402
    SequenceData, TrainingTensors, batch_rows, micro_batch_count, micro_batches,
)
from recsys.device import precision_name, resolve_device, retain_cpu_memory, training_autocast  # noqa: E402
from recsys.entry import positive_int, run_entry  # noqa: E402
from recsys.step_graph import EAGER_BEFORE_CAPTURE, FixedShapeStep  # noqa: E402
from recsys.train import (  # noqa: E402
    fixed_shape_step, make_optimizer, optimiser_step, validate, validation_inputs,
)

RESULTS = ROOT / "benchmarks" / "results" / "step.json"


def train_steps(model, optimizer, tensors: TrainingTensors, batches: list, device: torch.device,
                micro_batches_setting: int = 0, fixed: FixedShapeStep | None = None,
                autocast: torch.dtype | None = None) -> int:
    """One training step per batch of row indices, as the trainer takes it (`recsys.train.optimiser_step`,
    with `train.micro_batches` = `micro_batches_setting`, or `fixed`: `train.cuda_graph`'s step); returns the
    sequences seen (waits for the device before returning)."""
    model.train()
    parts = micro_batch_count(micro_batches_setting, device)
    terms = model.loss_terms(tensors.lengths)
    sequences = 0
    for rows in batches:
        on_device = torch.from_numpy(rows).to(device)
        if fixed is not None:
            fixed(on_device)
        else:
            optimiser_step(model, model.loss, optimizer, tensors, on_device,
                           micro_batches(tensors.lengths[rows], parts, terms[rows]), autocast=autocast)
        sequences += len(rows)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return sequences


def step_setup(run: str, data: SequenceData, params, n_batches: int | None, device: torch.device,
               batch_size: int = 0, cuda_graph: bool = False, batching: str | None = None):
    """A freshly initialised model `run` (a name, or a run string: `sasrec@dim=128`) with the trainer's Adam,
    its training spans resident on `device` as the trainer keeps them, and the first `n_batches` (None: all)
    batches of the trainer's epoch plan; `batch_size` 0 and `batching` None: the run's own. Returns (train
    config, model, optimiser, tensors, batches)."""
    name, model_config, train_config = configs_for(run, params)
    train_config = dataclasses.replace(train_config, batch_size=batch_size or train_config.batch_size,
                                       cuda_graph=cuda_graph, batching=batching or train_config.batching)
    torch.manual_seed(0)
    model = build_model(name, model_config, n_items=data.n_items, n_users=data.n_users).to(device)
    optimizer = make_optimizer(model, train_config, device)
    tensors = TrainingTensors(data, data.train_spans(int(model_config.max_len), train_config.windows), device)
    batches = batch_rows(tensors.lengths, train_config.batch_size, torch.Generator().manual_seed(0),
                         train_config.batching)[:n_batches]
    return train_config, model, optimizer, tensors, batches


def fixed_step(model, train_config, optimizer, tensors: TrainingTensors, batches: list, device: torch.device,
               all_positions: bool = False, autocast: torch.dtype | None = None) -> FixedShapeStep | None:
    """The trainer's fixed-shape step when `train_config.cuda_graph`, its loss rows planned for `batches` as
    an epoch's (`all_positions`: the loss at every position, as before the plan: a comparison), run under
    `autocast` (the run's `train.precision`, `recsys.device.training_autocast`)."""
    fixed = fixed_shape_step(model, model.name, model.config, train_config, optimizer, tensors, device,
                             autocast=autocast)
    if fixed is not None and not all_positions:
        fixed.plan_epoch(batches, model.loss_positions(tensors.lengths))
    return fixed


def measure(run: str, data: SequenceData, params, n_batches: int, device: torch.device,
            batch_size: int = 0, cuda_graph: bool = False, all_positions: bool = False) -> dict:
    """`batch_size` 0: the model's own (params.yaml); `cuda_graph`: the fixed-shape step (a CUDA graph on
    CUDA, recsys/step_graph.py), its loss at the positions the epoch plan bounds (`all_positions`: at all)."""
    train_config, model, optimizer, tensors, batches = step_setup(run, data, params, n_batches, device,
                                                                  batch_size, cuda_graph)
    name = model.name
    autocast = training_autocast(train_config.precision, device)  # `train.precision`, as the trainer
    # As the trainer does; process-wide, so a run string's `cpu_allocator=system` after a retaining run in the
    # same process still retains (the row says which it had).
    retained = retain_cpu_memory(train_config.cpu_allocator, device)
    fixed = fixed_step(model, train_config, optimizer, tensors, batches, device, all_positions, autocast)
    # Untimed steps and one untimed validation first: a run pays kernel selection, allocator growth, (on a
    # GPU) library start-up and a graph's capture once, not per epoch.
    warm = 2 + (EAGER_BEFORE_CAPTURE if cuda_graph else 0)
    train_steps(model, optimizer, tensors, (batches * warm)[:warm], device, train_config.micro_batches, fixed,
                autocast)
    started, cpu_started = time.perf_counter(), time.process_time()
    sequences = train_steps(model, optimizer, tensors, batches, device, train_config.micro_batches, fixed,
                            autocast)
    train_seconds = time.perf_counter() - started
    # This process's CPU time too: on a box shared with other jobs the wall clock measures the share of the
    # cores it got, the CPU time (with one torch thread) what the steps cost.
    train_cpu_seconds = time.process_time() - cpu_started
    inputs = validation_inputs(model, data, train_config, device)  # built once per run by the trainer
    started = time.perf_counter()
    validate(model, inputs)
    first_valid_seconds = time.perf_counter() - started
    started = time.perf_counter()
    validate(model, inputs)
    valid_seconds = time.perf_counter() - started
    per_second = sequences / train_seconds
    return {
        "model": name,
        **({"run": run} if run != name else {}),
        "train_sequences_per_second": round(per_second, 1),
        "epoch_seconds_estimate": round(len(tensors.lengths) / per_second, 1),
        **({"train_sequences_per_cpu_second": round(sequences / train_cpu_seconds, 1),
            "epoch_cpu_seconds_estimate": round(len(tensors.lengths) * train_cpu_seconds / sequences, 1)}
           if device.type == "cpu" and train_cpu_seconds > 0 else {}),
        "precision": precision_name(autocast),
        "validation_seconds": round(valid_seconds, 3),
        "first_validation_seconds": round(first_valid_seconds, 3),
        **({"cpu_allocator": "retain" if retained else "system"} if device.type == "cpu" else {}),
        "batches": len(batches),
        "batch_size": train_config.batch_size,
        "loss_chunk_elements": losses.chunk_elements(device),
        "scoring_batch_size": inputs.batches[0].targets.shape[0] if inputs.batches else 0,
        "cuda_graph": bool(fixed is not None and fixed.graphed),
        "fixed_shape": cuda_graph,
        **({"loss_rows": fixed.loss_rows or "all"} if fixed is not None else {}),
    }


def profile(run: str, data: SequenceData, params, steps: int, device: torch.device, batch_size: int = 0,
            cuda_graph: bool = False, all_positions: bool = False, top: int = 15) -> dict:
    """Where `steps` training steps spend their time: the `top` operators by their own device time (CPU time
    on a CPU), per step, and the total of all of them. The fixed-shape step runs without its graph (the
    graph's kernels, each launched by the host), so the profiler sees every kernel."""
    train_config, model, optimizer, tensors, batches = step_setup(run, data, params, 2 + steps, device,
                                                                  batch_size, cuda_graph)
    autocast = training_autocast(train_config.precision, device)
    fixed = fixed_step(model, train_config, optimizer, tensors, batches, device, all_positions, autocast)
    if fixed is not None:
        fixed.graphed = False
    train_steps(model, optimizer, tensors, batches[:2], device, train_config.micro_batches, fixed,
                autocast)  # untimed
    cuda = device.type == "cuda"
    kinds = torch.profiler.ProfilerActivity
    activities = [kinds.CPU, kinds.CUDA] if cuda else [kinds.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        n = train_steps(model, optimizer, tensors, batches[2:], device, train_config.micro_batches, fixed,
                        autocast)
    measured = max(1, len(batches) - 2)

    def own_us(event) -> float:  # an operator's own time: its kernels' on a GPU, its CPU time on a CPU
        if cuda:
            own = getattr(event, "self_device_time_total", None)  # self_cuda_time_total before torch 2.4
            return float(own if own is not None else getattr(event, "self_cuda_time_total", 0))
        return float(event.self_cpu_time_total)

    ops = [e for e in prof.key_averages() if e.key.startswith("aten::") and own_us(e) > 0]
    ops.sort(key=own_us, reverse=True)
    total = sum(own_us(e) for e in ops)
    return {
        "steps": measured,
        "sequences": n,
        "clock": "device" if cuda else "cpu",
        "ms_per_step": round(total / 1000 / measured, 3),
        "top": [{"op": e.key, "ms_per_step": round(own_us(e) / 1000 / measured, 3),
                 "share": round(own_us(e) / total, 3) if total else 0.0,
                 "calls_per_step": round(e.count / measured, 1)} for e in ops[:top]],
    }


def step_key(row: dict) -> tuple[str, str, str, str, int, int, bool, bool]:
    """One row per (dataset, run, commit, device, batch size, loss chunk, fixed shape, the fixed-shape loss at
    every position): a GPU row does not replace the same commit's CPU row, nor one point of a sweep another
    (rows from before the fields: 0, 0, False, False; a run is the model's name unless settings were given)."""
    return (row["dataset"], row.get("run", row["model"]), row["commit"], row.get("device", "cpu"),
            row.get("batch_size", 0), row.get("loss_chunk_elements", 0), row.get("fixed_shape", False),
            row.get("loss_rows") == "all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(READERS), required=True)
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--models", nargs="+", default=["sasrec", "bert4rec", "mojito"],
                        help="model names or run strings (`sasrec@dim=128`, as bench_models.py --runs)")
    parser.add_argument("--batches", type=positive_int, default=12)
    parser.add_argument("--threads", type=zero_or(positive_int, "torch's default"), default=0,
                        help="torch threads (0 = torch's default)")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--results", default=str(RESULTS), help="JSON file the rows are merged into")
    parser.add_argument("--batch-size", type=zero_or(positive_int, "each model's own"), default=0,
                        help="0 = each model's own (params.yaml)")
    parser.add_argument("--loss-chunk-elements", type=zero_or(positive_int, "the device's default"),
                        default=0,
                        help="logits per chunk of the full-softmax loss (recsys/models/losses.py); "
                             "0 = the device's default")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="the fixed-shape step of train.cuda_graph (captured as a CUDA graph on CUDA)")
    parser.add_argument("--all-positions", action="store_true",
                        help="with --cuda-graph: the loss at every position, not at the epoch plan's bound "
                             "of the ones with a target (the step before session 20: a comparison)")
    parser.add_argument("--profile", type=zero_or(positive_int, "no profile"), default=0, metavar="N",
                        help="also profile N steps: where a step's time goes, by operator (0 = no profile)")
    args = parser.parse_args()
    params = load_params(ROOT / "params.yaml")
    for run in args.models:  # a misspelt setting or a model with no training step stops here, before any data
        trainable_run(run, params)
    device = resolve_device(args.device)  # `cuda` where torch sees none: refused before the data is prepared
    losses._CHUNK_ELEMENTS = args.loss_chunk_elements or None  # None: the device's own size
    results = Path(args.results)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = SequenceData.from_prepared(prepare_dataset(args.dataset, args.data_root, params))
    commit = git_commit()
    rows = []
    for run in args.models:
        load_before = os.getloadavg()[0]
        row = measure(run, data, params, args.batches, device, args.batch_size, args.cuda_graph,
                      args.all_positions)
        if args.profile:
            row["profile"] = profile(run, data, params, args.profile, device, args.batch_size,
                                     args.cuda_graph, args.all_positions)
        row.update(dataset=args.dataset, commit=commit, machine=machine(), device=device.type,
                   load_average_before_after=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                   command=" ".join([Path(sys.executable).name, *sys.argv]))
        print(json.dumps(row), flush=True)
        if "profile" in row:
            prof = row["profile"]
            print(f"profile {run}: {prof['ms_per_step']} ms of {prof['clock']} time a step "
                  "(own time of its operators)")
            for op in prof["top"]:
                print(f"  {op['ms_per_step']:9.3f} ms {op['share']:6.1%} {op['calls_per_step']:7.1f} calls  "
                      f"{op['op']}")
        rows.append(row)
    existing = json.loads(results.read_text()) if results.is_file() else []
    keep = {step_key(r): r for r in existing}
    keep.update({step_key(r): r for r in rows})
    with tempfile.NamedTemporaryFile("w", dir=results.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(sorted(keep.values(), key=step_key), tmp, indent=1)
    Path(tmp.name).replace(results)


if __name__ == "__main__":
    run_entry(main)  # a missing dataset or a bad setting: one line, exit 1
