#!/usr/bin/env python3
"""CPU seconds (process time, one torch thread) of one full SASRec training epoch on ml-100k for each
(`train.batching`, `train.micro_batches`) pair, alternated: bucketed and random batches as whole batches
(micro_batches 1), and as 8 length-sorted micro-batches (the CPU's auto setting) — what uniform batches cost
on a CPU, where every batch is padded to its longest span, and how much of it micro-batches win back.
params.yaml's SASRec otherwise (windows all). Process time barely depends on other load on a shared box;
wall time does.

    python benchmarks/batching_cost.py [--rounds 2] [--dataset ml-100k]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_models import READERS, prepare_dataset  # noqa: E402
from benchmarks.bench_step import step_setup, train_steps  # noqa: E402
from recsys.config import load_params  # noqa: E402
from recsys.entry import run_entry  # noqa: E402
from recsys.sequences import MICRO_BATCHES_CPU, SequenceData, micro_batches  # noqa: E402


def epoch_cpu_seconds(data: SequenceData, params, batching: str, micro: int) -> tuple[float, float]:
    """(process seconds, share of padded positions) of one epoch from a fresh model (the trainer's set-up,
    `bench_step.step_setup`)."""
    _, model, optimizer, tensors, plan = step_setup("sasrec", data, params, None, torch.device("cpu"),
                                                    batching=batching)
    terms = model.loss_terms(tensors.lengths)
    slots = sum((stop - start) * width for rows in plan
                for start, stop, width, _ in micro_batches(tensors.lengths[rows], micro, terms[rows]))
    real = int(sum((tensors.lengths[rows] - 1).sum() for rows in plan))
    started = time.process_time()
    train_steps(model, optimizer, tensors, plan, torch.device("cpu"), micro)
    return time.process_time() - started, 1 - real / slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(READERS), default="ml-100k")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--rounds", type=int, choices=range(1, 11), default=2, metavar="1..10")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = load_params(ROOT / "params.yaml")
    data = SequenceData.from_prepared(prepare_dataset(args.dataset, args.data_root, params))
    print(f"{args.dataset}, load average {os.getloadavg()[0]:.2f} before, torch {torch.__version__}, one thread")
    settings = [(batching, micro) for micro in (1, MICRO_BATCHES_CPU) for batching in ("bucketed", "random")]
    seconds: dict[tuple[str, int], list[float]] = {setting: [] for setting in settings}
    for _ in range(args.rounds):
        for batching, micro in settings:
            cpu, padded = epoch_cpu_seconds(data, params, batching, micro)
            seconds[batching, micro].append(cpu)
            print(f"batching={batching} micro_batches={micro} epoch_cpu_s={cpu:.2f} "
                  f"padded_positions={padded:.1%}", flush=True)
    mean = {setting: float(np.mean(values)) for setting, values in seconds.items()}
    base = mean["bucketed", 1]
    for (batching, micro), value in mean.items():
        print(f"{batching} × {micro}: {value:.2f} s per epoch, {value / base:.2f} × bucketed whole batches")
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    run_entry(main)  # a missing dataset: one line, exit 1
