"""Dropout whose masks are cheap to draw on a CPU.

`torch.bernoulli_` on a CPU draws one Mersenne-Twister number per element and converts it to a float: on
BERT4Rec's ml-1m-half step (one thread) the masks of its nine dropouts took 28 % of the step, more than its
attention. Here a mask element is 16 random bits instead: one 64-bit draw (`random_` over the whole int64
range) gives four of them, and an element is kept when its 16 bits fall below round((1 − p) · 2¹⁶) — a
keep probability within 2⁻¹⁷ of 1 − p, with the kept values scaled by exactly its inverse, so the layer is
unbiased as `nn.Dropout` is. The layer is one multiply by that scale-or-zero tensor, forward and backward
(`nn.Dropout` keeps a boolean mask and converts it on each pass; this keeps the multiplier, 4 bytes an
element).

Only on a CPU: on CUDA it is `F.dropout`, whose Philox draws are fast and which CUDA graphs capture. The draws
come from the CPU generator, so `torch.manual_seed` and a resumed run's saved RNG state reproduce them exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_BITS = 16
CPU_MASKS = "16-bit lanes"  # how a CPU draws the masks (benchmark rows record it; before: torch's bernoulli_)


def keep_threshold(p: float) -> int:
    """Of the 2¹⁶ values of a mask element's 16 bits, how many keep it: round((1 − p) · 2¹⁶)."""
    return round((1.0 - p) * (1 << _BITS))


def cpu_noise(shape: torch.Size, threshold: int, dtype: torch.dtype) -> torch.Tensor:
    """The layer's multiplier of `shape`: 2¹⁶ / threshold where an element is kept (unbiased), 0 where not;
    `threshold` is `keep_threshold(p)`, in 1 … 2¹⁶ − 1."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)  # all 64 bits uniform
    halves = words.view(torch.int16)[:n]  # read as −2¹⁵ … 2¹⁵ − 1
    keep = halves < threshold - (1 << (_BITS - 1))  # `threshold` of the 2¹⁶ values are below −2¹⁵ + threshold
    return keep.to(dtype).mul_((1 << _BITS) / threshold).view(shape)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the CPU's masks drawn as above."""
    if not training or p == 0.0:
        return x
    threshold = keep_threshold(p)
    if x.device.type != "cpu" or threshold < 1:  # (p within 2⁻¹⁷ of 1)
        return F.dropout(x, p, training)
    if threshold >= 1 << _BITS:  # p under 2⁻¹⁷: every element kept, scale 1
        return x
    return x * cpu_noise(x.shape, threshold, x.dtype)  # (autograd keeps the multiplier for the backward pass)


class Dropout(nn.Dropout):
    """`nn.Dropout` over `dropout` (no parameters: checkpoints are the same either way)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
