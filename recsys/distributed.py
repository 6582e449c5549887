"""Data-parallel training under `torchrun` (DistributedDataParallel: gloo on CPU, NCCL on CUDA).

    torchrun --nproc_per_node 2 -m recsys.train --model sasrec

Outside torchrun every function here is a no-op and the trainer runs exactly as one process. Under it:

- **Batch semantics.** `train.batch_size` stays the *global* batch: every rank plans the same epoch (the
  batch-plan generator is seeded alike everywhere) and rank r takes rows r, r + N, … of each batch, so one
  optimiser step still sees `batch_size` sequences (≈ batch_size / N per process), an epoch has the same
  number of steps, and `lr`, `lr_scaling`, `warmup_steps` mean what they mean in one process. That is what
  keeps the metrics within seed noise of a single-process run; N processes cut the time of a step, not the
  number of steps. A batch with fewer rows than processes (the tail of a length bucket) lends a row twice,
  so no rank ever runs an empty step — DDP needs every rank in every step.
- **Gradients.** DDP averages them across ranks, so the weights stay identical on every rank. Each of a
  step's micro-batches (`train.micro_batches`) is all-reduced as it runs (the same number on every rank)
  and the results add up before the one optimiser step. The models' training entry is `loss(batch)`, not
  `forward`, so DDP wraps a small module whose `forward` is the loss.
- **Randomness.** Dropout, masking and sampled negatives draw from the global RNG, reseeded each epoch from
  (seed, epoch, rank): ranks draw differently, and a resumed run draws what an uninterrupted one would.
- **Validation and stopping.** Every rank ranks the full validation set (no extra wall time: each has its
  own core or GPU), then takes rank 0's metrics and clock, so the improvement, learning-rate decay, early
  stopping and time-limit decisions are the same on every rank by construction.
- **Files.** Only rank 0 writes the checkpoint, the curve, the resume state and logs at INFO; the others
  write nothing. Everyone meets at a barrier before leaving, then the process group is destroyed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from recsys.device import resolve_device

log = logging.getLogger(__name__)

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class DistributedError(ValueError):
    """A torchrun launch that cannot work as configured; the message names the setting to change."""


def shard_batches(plan: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Rank `rank`'s part of every batch of `plan`: rows rank, rank + N, … (the whole plan when N = 1).

    Rows within a batch are sorted by length, so striding gives every rank a similar padding width. A batch
    with fewer rows than ranks gives rank r its row r mod n: no rank ever has an empty step."""
    if world_size == 1:
        return plan
    return [rows[rank::world_size] if len(rows) >= world_size else rows[[rank % len(rows)]] for rows in plan]


class _Loss(nn.Module):
    """DDP synchronises the gradients of what runs through its `forward`; a model trains through `loss`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch):
        return self.model.loss(batch)


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank 0 of 1 outside torchrun."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    active: bool = False  # a process group is up (torchrun, even with one process)

    @property
    def is_main(self) -> bool:
        """The one rank that writes files and logs at INFO."""
        return self.rank == 0

    def device(self, setting: str) -> torch.device:
        """`train.device` resolved for this rank: CUDA rank r uses the node's GPU `LOCAL_RANK`."""
        if not self.active:
            return resolve_device(setting)
        if setting == "cuda" and not torch.cuda.is_available():
            raise DistributedError("train.device is 'cuda' but this machine has no CUDA device: set "
                                   "train.device to cpu or auto (data-parallel on CPU, over gloo)")
        device = resolve_device(setting)
        if device.type != "cuda":
            return device
        visible = torch.cuda.device_count()
        if self.local_rank >= visible:
            raise DistributedError(f"torchrun started more processes on this node than the {visible} visible "
                                   f"CUDA device(s) (LOCAL_RANK {self.local_rank}): use --nproc_per_node "
                                   f"{visible}, or train.device: cpu to train on CPU with gloo")
        return torch.device("cuda", self.local_rank)

    def shard(self, plan: list[np.ndarray]) -> list[np.ndarray]:
        return shard_batches(plan, self.rank, self.size) if self.active else plan

    def seed_epoch(self, seed: int, epoch: int) -> None:
        """Rank-specific global RNG for the epoch's dropout, masks and negatives (no-op in one process)."""
        if self.active:
            torch.manual_seed((seed * 1_000_003 + epoch) * 4096 + self.rank)

    def loss_fn(self, model: nn.Module, device: torch.device) -> Callable:
        """`batch → loss`: the model's own `loss`, or its DDP-wrapped twin whose backward averages gradients
        (hold on to it while training: the backward pass needs the wrapper alive)."""
        if not self.active:
            return model.loss
        # Buffers are constants (MostPop's counts never train, MOJITO's harmonics are fixed): synced once at
        # construction, not before every step. Some configurations leave parameters unused (MOJITO with
        # long_weight 0 never touches the user table); the set is fixed for a run, which static_graph
        # supports without find_unused_parameters' search of the graph at every step.
        return nn.parallel.DistributedDataParallel(
            _Loss(model), device_ids=[device.index] if device.type == "cuda" else None,
            forward_sync_buffers=False, static_graph=True,
        )

    def micro_batch_count(self, parts: int, batch_rows: int) -> int:
        """Micro-batches per rank for a step of `batch_rows` rows (all ranks): `parts`, capped so every rank
        has at least that many rows — each micro-batch's backward is a DDP all-reduce, so every rank must run
        the same number of them. (`no_sync` would save the extra all-reduces, but DDP's static graph does
        not support it.)"""
        if not self.active:
            return parts
        return min(parts, max(1, batch_rows // self.size))

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over ranks (the epoch loss the curve reports)."""
        if not self.active:
            return value
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.size

    def from_rank0(self, obj):
        """Rank 0's `obj` on every rank, so decisions taken from it are identical everywhere."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def current_world() -> World:
    """The running process group's world (set up by `torchrun_session`), or one process."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), active=True)


def launched_by_torchrun(environ=os.environ) -> bool:
    return all(name in environ for name in TORCHRUN_ENV)


@contextlib.contextmanager
def torchrun_session(environ=os.environ) -> Iterator[World]:
    """Join torchrun's process group for the duration (nothing happens outside torchrun).

    The backend is gloo, plus NCCL for CUDA tensors when CUDA is present ("cpu:gloo,cuda:nccl"), so the
    collectives follow `train.device`. Only a clean exit waits at the barrier: a rank that fails leaves at
    once, and torchrun stops the others."""
    if not launched_by_torchrun(environ):
        yield World()
        return
    if not dist.is_available():
        raise DistributedError("this PyTorch build has no torch.distributed: run without torchrun")
    local_rank = int(environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    if cuda and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo")
    world = current_world()
    if not world.is_main:  # one copy of every INFO line (`python -m` logs as __main__, hence the root)
        logging.getLogger().setLevel(logging.WARNING)
    log.info("data-parallel training: %d processes, backend %s", world.size, dist.get_backend())
    yield world
    world.barrier()
    dist.destroy_process_group()
