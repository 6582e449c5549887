#!/usr/bin/env python3
"""Operators per training step: how many leaf ATen operators (each one kernel launch, or more, on a GPU) one
optimiser step of a model runs, at a batch size and a loss chunk size, counted by `torch.profiler` on this
machine's CPU. A GPU that finishes each kernel in microseconds waits on the host to launch the next one, so
this count, not the arithmetic, bounds a small model's step there (benchmarks/RESULTS.md, GPU rows).

    python benchmarks/step_ops.py --model sasrec --batch-size 128 --loss-chunk-elements 0 67108864

The count does not depend on the device but for CUDA's bf16 autocast casts (not counted here), and on a
batch's rows (the loss's chunk loop runs once per `chunk / items` target positions): the steps are the
epoch's first `--steps` batches, as the trainer plans them. `target_positions_per_step` counts positions
with a next item: the loss rows of SASRec and MOJITO (BERT4Rec's are its masked positions, fewer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_models import READERS, prepare_dataset, trainable_run, zero_or  # noqa: E402
from benchmarks.bench_step import step_setup  # noqa: E402
from recsys.config import load_params  # noqa: E402
from recsys.entry import positive_int, run_entry  # noqa: E402
from recsys.models import losses  # noqa: E402
from recsys.sequences import SequenceData, micro_batches  # noqa: E402
from recsys.train import optimiser_step  # noqa: E402


def _in_optimizer(event) -> bool:
    while event is not None:
        if event.name.startswith("Optimizer.step"):
            return True
        event = event.cpu_parent
    return False


def leaf_ops(prof) -> tuple[int, int]:
    """ATen operators that call no other ATen operator (the ones that run kernels): (forward and backward,
    the optimiser's). On CUDA the trainer's Adam is the fused one, a few kernels; the CPU's per-parameter
    loop is not what a GPU runs, so the two are kept apart."""
    leaves = [e for e in prof.events() if e.name.startswith("aten::")
              and not any(c.name.startswith("aten::") for c in e.cpu_children)]
    optimizer = sum(1 for e in leaves if _in_optimizer(e))
    return len(leaves) - optimizer, optimizer


def count(name: str, data: SequenceData, params, batch_size: int, steps: int) -> dict:
    device = torch.device("cpu")
    train_config, model, optimizer, tensors, plan = step_setup(name, data, params, steps, device, batch_size)
    terms = model.loss_terms(tensors.lengths)
    model.train()
    ops = []
    for rows in plan:
        # one micro-batch per step, as on CUDA (train.micro_batches auto = 1 there)
        micro = micro_batches(tensors.lengths[rows], 1, terms[rows])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            optimiser_step(model, model.loss, optimizer, tensors, torch.from_numpy(rows), micro)
        ops.append(leaf_ops(prof))
    targets = [int((tensors.lengths[rows] - 1).sum()) for rows in plan]  # a span of n events: n - 1 targets
    model_ops = [o[0] for o in ops]
    return {"model": name, "batch_size": train_config.batch_size,
            "loss_chunk_elements": losses.chunk_elements(device),
            "steps": len(ops), "target_positions_per_step": round(sum(targets) / len(targets)),
            "forward_backward_ops_per_step": round(sum(model_ops) / len(ops), 1), "min": min(model_ops),
            "max": max(model_ops), "optimizer_ops_per_step_cpu": round(sum(o[1] for o in ops) / len(ops), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(READERS), default="ml-1m-half")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--model", default="sasrec", help="a model that trains, or a run string "
                        "(`sasrec@dim=128`, as bench_models.py --runs)")
    parser.add_argument("--batch-size", type=zero_or(positive_int, "the model's own"), nargs="+", default=[0],
                        help="0 = the model's own")
    parser.add_argument("--loss-chunk-elements", type=zero_or(positive_int, "the loss's default"), nargs="+",
                        default=[0], help="0 = the loss's default")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args()
    params = load_params(ROOT / "params.yaml")
    trainable_run(args.model, params)  # an unknown model or setting stops here, before the data is prepared
    torch.set_num_threads(args.threads)
    data = SequenceData.from_prepared(prepare_dataset(args.dataset, args.data_root, params))
    for batch_size in args.batch_size:
        for chunk in args.loss_chunk_elements:
            losses._CHUNK_ELEMENTS = chunk or None  # 0: the CPU's default
            row = count(args.model, data, params, batch_size, args.steps)
            print(json.dumps({"dataset": args.dataset, **row}), flush=True)


if __name__ == "__main__":
    run_entry(main)  # a missing dataset or a bad setting: one line, exit 1
