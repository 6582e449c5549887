"""Dropout, and attention with dropout on its weights, that are cheap on a CPU.

On a CPU, `torch.nn.functional.dropout` draws its mask with `bernoulli_`, one random number per element: in a
one-thread SASRec step on ML-100K it was the second most expensive operator after the matrix products (18–30 %
of the step, `benchmarks/bench_step.py --profile`), mostly on the (batch, heads, L, L) attention weights that
`scaled_dot_product_attention` drops out in its math kernel, the only one a CPU has for a masked attention with
dropout. Here the mask comes from 16 random bits per element (one `random_` over int64 words, viewed as int16:
four elements a draw), compared with a threshold; the kept elements are scaled by 1 / (1 − p̂), p̂ = p rounded
to a multiple of 2⁻¹⁶ (p = 0.2 drops 0.199997 of them). The backward pass multiplies by the same mask.

On CUDA both fall through to PyTorch's own: its dropout is fused and cheap there, and scaled_dot_product_attention
picks a fused kernel that drops out inside it (and a CUDA graph can hold either). Both draw from the default
generator, so a seeded run is reproducible on either device, and a resumed one too (the trainer saves that
generator's state).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16  # a mask element is 16 random bits


def _keep_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[torch.Tensor, float]:
    """A bool mask of `shape`, True with probability 1 − p̂, and the scale 1 / (1 − p̂) of what it keeps."""
    n = math.prod(shape)
    dropped = round(p * _LEVELS)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)
    bits = words.view(torch.int16)[:n].view(shape)  # uniform over [-2^15, 2^15)
    return bits >= dropped - _LEVELS // 2, _LEVELS / (_LEVELS - dropped)


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, scale = _keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the cheap mask on a CPU."""
    if not training or not 0.0 < p < 1.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)  # (p = 1 drops everything; outside [0, 1] it says so)
    return _MaskedScale.apply(x, p)


class Dropout(nn.Module):
    """`nn.Dropout`, with the cheap mask on a CPU (no parameters: a checkpoint is the same either way)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """softmax(q·kᵀ/√d, where `mask`) with dropout `p` on the weights, · v: `F.scaled_dot_product_attention`
    with a boolean mask (True = may attend; no row fully masked), written out on a CPU when p > 0 so that its
    dropout is this module's."""
    if p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return dropout(weights, p) @ v
