"""A training step at one fixed shape, captured once as a CUDA graph and replayed (`train.cuda_graph`).

Why: on a GPU the eager step is bound by the host. A SASRec step on ml-1m-half runs ~750–1,300 operators
for about a millisecond of arithmetic, and an H200 took ~12.5 ms for it at batch 128 (benchmarks/RESULTS.md).
Replaying a graph costs one launch however many kernels it holds.

What it takes: every shape fixed, and nothing that waits for the device.
- Every step has `batch_size` rows at the full input width. A short last batch is padded with rows of
  padding only (no input, no target).
- The model's loss covers a fixed number of positions (`Batch.fixed_shape`, `Batch.loss_rows`); it never
  selects positions by a count the host would wait for. SASRec, MOJITO and BERT4Rec do this with loss ce.
  The positions with a loss term are gathered first into `loss_rows` slots, the rest masked
  (`losses.kept_first`); `loss_rows` is set before each epoch from its batch plan — the most loss positions
  any of its batches can hold (the model's `loss_positions` per span), rounded up to an eighth of the full
  width — so the softmax over the catalogue skips the padding positions (44 % of a full-width ml-1m-half batch
  at batch 128) and a run holds a graph or two, one per rounded size. BERT4Rec's bound is every token under
  `masking: bernoulli` (any number may be masked) and round(mask_prob·n) per span under `masking: exact`.
  MOJITO's time encoder uses fixed-size tables off the CPU (recsys/models/mojito.py).
- Gradient clipping and Adam (fused, `capturable`) run on the device.
- The learning rate is a tensor on the device that the captured optimiser step reads at every replay (fused
  Adam takes a Tensor `lr`): warm-up, `lr_schedule` and `lr_decay` write new values into it (`set_rate`), so a
  rate change neither runs eagerly nor recaptures. One capture per loss size.

The step gives the update the eager step would on the same rows: one batch and one mean over its real
targets (tests/test_step_graph.py). It does not give the eager step's micro-batches, so on a CPU it costs a
full-width batch; there it runs without a graph (the same code, so the CPU tests cover it).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import torch

from recsys.config import ConfigError
from recsys.device import step_autocast
from recsys.entry import first_line
from recsys.sequences import TrainingTensors

log = logging.getLogger(__name__)

# Eager steps before the first capture: lazy library set-up (cuBLAS handles and workspaces, the allocator's
# pools) must happen outside the capture (PyTorch's CUDA graph notes).
EAGER_BEFORE_CAPTURE = 3


class FixedShapeStep:
    """`step(rows) -> loss`: one optimiser step on the spans `rows` (a 1-D long tensor on the device, at most
    `batch_size` of them). Returns the step's mean loss on the device; it stays valid until the next call."""

    def __init__(self, model, optimizer: torch.optim.Optimizer, tensors: TrainingTensors, batch_size: int,
                 *, grad_clip: float = 0.0, device: torch.device, autocast: torch.dtype | None = None):
        self.model, self.optimizer, self.tensors = model, optimizer, tensors
        self.grad_clip, self.device = grad_clip, device
        self.autocast = autocast  # `train.precision` (recsys.device.training_autocast); None = float32
        self.width = int(tensors.items.shape[1]) - 1  # input positions: the longest span's, minus its target
        self.rows = torch.zeros(batch_size, dtype=torch.long, device=device)  # static inputs of the graph
        self.real = torch.ones(batch_size, dtype=torch.bool, device=device)  # False: a padding row
        self.padded = 0  # rows of the last call that were padding (host-side count of the buffers' state)
        self.loss = torch.zeros((), device=device)
        self.graphed = device.type == "cuda"
        self.loss_rows = 0  # positions the loss is computed at (0: all; plan_epoch sets it)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # one per loss_rows
        self.eager_steps = 0
        self.captures = 0  # graphs captured: one per loss_rows the run's epochs needed
        self.stream = torch.cuda.Stream(device) if self.graphed else None

    def plan_epoch(self, batches: list[np.ndarray], positions: np.ndarray) -> None:
        """Before an epoch of `batches` (host row indices): the loss's positions, the most loss positions any
        of them holds (`positions`: the model's `loss_positions` per span) rounded up to an eighth of
        `batch_size` × width, so that the sizes, and the graphs, a run needs are few."""
        most = max((int(positions[rows].sum()) for rows in batches), default=0)
        eighth = max(1, self.rows.shape[0] * self.width // 8)
        self.loss_rows = max(eighth, -(-most // eighth) * eighth)

    def _fill(self, rows: torch.Tensor) -> None:
        n, size = rows.shape[0], self.rows.shape[0]
        if not 0 < n <= size:
            raise ValueError(f"a fixed-shape step takes 1 to {size} rows, got {n}")
        self.rows[:n].copy_(rows, non_blocking=True)
        if n < size:  # a short batch: the padding slots repeat its first row, emptied in `_step`
            self.rows[n:].copy_(rows[:1].expand(size - n), non_blocking=True)
        if n < size or self.padded:
            self.real.fill_(True)
            self.real[n:].fill_(False)
        self.padded = size - n

    def _step(self) -> None:
        """The step itself, reading only the static buffers: run eagerly, or recorded by a capture."""
        model, optimizer, device = self.model, self.optimizer, self.device
        batch = self.tensors.batch(self.rows, self.width)
        real = self.real[:, None]  # a padding row becomes all padding: no input, no target, no masked position
        batch = replace(batch, items=batch.items * real, targets=batch.targets * real, fixed_shape=True,
                        loss_rows=self.loss_rows)
        with step_autocast(device, self.autocast, cache_enabled=False):  # no cache across a capture
            loss = model.loss(batch)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
        optimizer.step()
        self.loss.copy_(loss.detach())

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        self._fill(rows)
        if not self.graphed:
            self.optimizer.zero_grad(set_to_none=True)
            self._step()
            return self.loss
        graph = self.graphs.get(self.loss_rows)
        if graph is None:
            # Here, not at construction: a resumed run's optimiser state (loaded after this object exists)
            # brings its rate back as a number.
            hold_rate_as_tensor(self.optimizer, self.device)
            if self.eager_steps < EAGER_BEFORE_CAPTURE:
                self._eager()
                return self.loss
            graph = self._capture()
        graph.replay()
        return self.loss

    def _eager(self) -> None:
        """An eager step on the side stream a capture uses (its lazy set-up then happens there)."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.optimizer.zero_grad(set_to_none=True)
            self._step()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.eager_steps += 1

    def _capture(self) -> torch.cuda.CUDAGraph:
        # Gradients set to None before capture: backward then allocates them from the graph's private pool,
        # and each replay writes them afresh (PyTorch's whole-network capture recipe).
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                self._step()
        except RuntimeError as err:  # an operator that waits for the device (this torch's, or a new model's)
            # The operator's own error, when the capture's end then failed too and replaced it.
            cause = err.__context__ if isinstance(err.__context__, Exception) else err
            raise ConfigError(f"train.cuda_graph: the training step could not be captured as a CUDA graph "
                              f"({first_line(cause)}); set train.cuda_graph: false") from err
        self.graphs[self.loss_rows] = graph
        self.captures += 1
        log.info("cuda_graph: captured the training step (batch %d, width %d, loss rows %s; capture %d)",
                 self.rows.shape[0], self.width, self.loss_rows or "all", self.captures)
        return graph


def hold_rate_as_tensor(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each param group's learning rate as a 0-d float32 tensor on `device` (once; a tensor stays as it is),
    so that a captured step reads the rate at replay instead of baking in the number it was captured with."""
    for group in optimizer.param_groups:
        if not isinstance(group["lr"], torch.Tensor):
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)


def set_rate(optimizer: torch.optim.Optimizer, rate: float) -> None:
    """Every param group's learning rate: written into a rate held as a tensor (no host sync, and a captured
    step sees it), else assigned."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(rate)
        else:
            group["lr"] = rate


def current_rate(optimizer: torch.optim.Optimizer) -> float:
    """The first param group's learning rate as a number (a host sync when it is held as a CUDA tensor: call
    it once an epoch, not in the step loop)."""
    return float(optimizer.param_groups[0]["lr"])
