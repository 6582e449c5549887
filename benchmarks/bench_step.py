"""Training and validation throughput per model, without training to convergence.

    python benchmarks/bench_step.py --dataset ml-1m-half --models sasrec bert4rec mojito --batches 12

Times `--batches` training steps (forward, backward, Adam) on the epoch's batches in their shuffled order, then
one full-ranking validation pass over every user, and merges the result into benchmarks/results/step.json
keyed by (dataset, model, commit), so the same command run at two commits compares implementations (for an
older commit: check it out in a worktree, copy this script there, and pass `--results` pointing here).
The model is freshly initialised: throughput does not depend on what it has learned. `--cuda-graph` times the
fixed-shape step of `train.cuda_graph` instead (recsys/step_graph.py: one CUDA graph replay per step on CUDA,
the same step run eagerly on a CPU).
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

from benchmarks.bench_models import READERS, git_commit, machine, prepare_dataset  # noqa: E402
from recsys.config import load_params  # noqa: E402
from recsys.models import build_model, losses  # noqa: E402
from recsys.sequences import (  # noqa: E402
    SequenceData, TrainingTensors, batch_rows, micro_batch_count, micro_batches,
)
from recsys.device import resolve_device  # noqa: E402
from recsys.step_graph import EAGER_BEFORE_CAPTURE, FixedShapeStep  # noqa: E402
from recsys.train import (  # noqa: E402
    fixed_shape_step, make_optimizer, optimiser_step, validate, validation_inputs,
)

RESULTS = ROOT / "benchmarks" / "results" / "step.json"


def train_steps(model, optimizer, tensors: TrainingTensors, batches: list, device: torch.device,
                micro_batches_setting: int = 0, fixed: FixedShapeStep | None = None) -> int:
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
                           micro_batches(tensors.lengths[rows], parts, terms[rows]))
        sequences += len(rows)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return sequences


def step_setup(name: str, data: SequenceData, params, n_batches: int | None, device: torch.device,
               batch_size: int = 0, cuda_graph: bool = False, batching: str | None = None):
    """A freshly initialised model `name` with the trainer's Adam, its training spans resident on `device` as
    the trainer keeps them, and the first `n_batches` (None: all) batches of the trainer's epoch plan;
    `batch_size` 0 and `batching` None: the model's own (params.yaml). Returns (train config, model, optimiser,
    tensors, batches)."""
    model_config, train_config = params.model_config(name), params.train_config(name)
    train_config = dataclasses.replace(train_config, batch_size=batch_size or train_config.batch_size,
                                       cuda_graph=cuda_graph, batching=batching or train_config.batching)
    torch.manual_seed(0)
    model = build_model(name, model_config, n_items=data.n_items, n_users=data.n_users).to(device)
    optimizer = make_optimizer(model, train_config, device)
    tensors = TrainingTensors(data, data.train_spans(int(model_config.max_len), train_config.windows), device)
    batches = batch_rows(tensors.lengths, train_config.batch_size, torch.Generator().manual_seed(0),
                         train_config.batching)[:n_batches]
    return train_config, model, optimizer, tensors, batches


def measure(name: str, data: SequenceData, params, n_batches: int, device: torch.device,
            batch_size: int = 0, cuda_graph: bool = False) -> dict:
    """`batch_size` 0: the model's own (params.yaml); `cuda_graph`: the fixed-shape step (a CUDA graph on
    CUDA, recsys/step_graph.py)."""
    train_config, model, optimizer, tensors, batches = step_setup(name, data, params, n_batches, device,
                                                                  batch_size, cuda_graph)
    fixed = fixed_shape_step(model, name, train_config, optimizer, tensors, device)
    # Untimed steps and one untimed validation first: a run pays kernel selection, allocator growth, (on a
    # GPU) library start-up and a graph's capture once, not per epoch.
    warm = 2 + (EAGER_BEFORE_CAPTURE if cuda_graph else 0)
    train_steps(model, optimizer, tensors, (batches * warm)[:warm], device, train_config.micro_batches, fixed)
    started = time.perf_counter()
    sequences = train_steps(model, optimizer, tensors, batches, device, train_config.micro_batches, fixed)
    train_seconds = time.perf_counter() - started
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
        "train_sequences_per_second": round(per_second, 1),
        "epoch_seconds_estimate": round(len(tensors.lengths) / per_second, 1),
        "validation_seconds": round(valid_seconds, 3),
        "first_validation_seconds": round(first_valid_seconds, 3),
        "batches": len(batches),
        "batch_size": train_config.batch_size,
        "loss_chunk_elements": losses.chunk_elements(device),
        "scoring_batch_size": inputs.batches[0].targets.shape[0] if inputs.batches else 0,
        "cuda_graph": bool(fixed is not None and fixed.graphed),
        "fixed_shape": cuda_graph,
    }


def step_key(row: dict) -> tuple[str, str, str, str, int, int, bool]:
    """One row per (dataset, model, commit, device, batch size, loss chunk, fixed shape): a GPU row does not
    replace the same commit's CPU row, nor one point of a sweep another (rows from before the fields: 0, 0,
    False)."""
    return (row["dataset"], row["model"], row["commit"], row.get("device", "cpu"), row.get("batch_size", 0),
            row.get("loss_chunk_elements", 0), row.get("fixed_shape", False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(READERS), required=True)
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--models", nargs="+", default=["sasrec", "bert4rec", "mojito"])
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--results", default=str(RESULTS), help="JSON file the rows are merged into")
    parser.add_argument("--batch-size", type=int, default=0, help="0 = each model's own (params.yaml)")
    parser.add_argument("--loss-chunk-elements", type=int, default=0,
                        help="logits per chunk of the full-softmax loss (recsys/models/losses.py); "
                             "0 = the device's default")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="the fixed-shape step of train.cuda_graph (captured as a CUDA graph on CUDA)")
    args = parser.parse_args()
    if args.batch_size < 0 or args.loss_chunk_elements < 0:
        parser.error("--batch-size and --loss-chunk-elements take 0 (the default) or a positive count")
    losses._CHUNK_ELEMENTS = args.loss_chunk_elements or None  # None: the device's own size
    results = Path(args.results)
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params(ROOT / "params.yaml")
    data = SequenceData.from_prepared(prepare_dataset(args.dataset, args.data_root, params))
    device = resolve_device(args.device)
    commit = git_commit()
    rows = []
    for name in args.models:
        load_before = os.getloadavg()[0]
        row = measure(name, data, params, args.batches, device, args.batch_size, args.cuda_graph)
        row.update(dataset=args.dataset, commit=commit, machine=machine(), device=device.type,
                   load_average_before_after=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                   command=" ".join([Path(sys.executable).name, *sys.argv]))
        print(json.dumps(row), flush=True)
        rows.append(row)
    existing = json.loads(results.read_text()) if results.is_file() else []
    keep = {step_key(r): r for r in existing}
    keep.update({step_key(r): r for r in rows})
    with tempfile.NamedTemporaryFile("w", dir=results.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(sorted(keep.values(), key=step_key), tmp, indent=1)
    Path(tmp.name).replace(results)


if __name__ == "__main__":
    main()
