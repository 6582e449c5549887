"""Transformer blocks shared by SASRec and BERT4Rec, over `scaled_dot_product_attention` (which picks a
fused kernel — flash / memory-efficient — on CUDA when it can).

Two residual arrangements (`residual`):
- "reference": SASRec's reference code (Kang & McAuley; kept by RecTools and SASRec.pytorch): the query is
  LN(x) while keys and values are the raw x, the attention residual adds LN(x), and the feed-forward
  residual adds its own normalised input: x ← LN₁(x) + Attn(LN₁(x), x);  x ← LN₂(x) + FFN(LN₂(x)).
  The ablation in benchmarks/RESULTS.md measured it ahead of pre-LN for SASRec.
- "pre_ln": the standard pre-LN transformer, x ← x + Attn(LN₁(x)); x ← x + FFN(LN₂(x)).
Either way the model ends with a final LayerNorm.

A block asked for some positions only (`queries`) computes their outputs alone — queries, attention rows,
feed-forward — from every position's keys and values: a final block owes scoring the newest position and
BERT4Rec's cloze loss its masked ones (~30 %: a 17 % shorter CPU step on ml-1m-half, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model_configs import check_residual
from recsys.models.dropout import Dropout, dropout


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float, attn_dropout: float | None = None):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout if attn_dropout is None else attn_dropout  # on the attention weights
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, kv: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """Queries from `x` (B, M, D), keys and values from `kv` (B, L, D), `attn_mask` (B, 1, M, L)
        → (B, M, D). One product when `x` is `kv` (every position queries, pre-LN); else the same
        parameters, split."""
        B, M, D = x.shape
        L = kv.shape[1]
        if x is kv:
            q, k, v = self.qkv(x).split(D, dim=-1)
        else:
            q = F.linear(x, self.qkv.weight[:D], self.qkv.bias[:D])
            k, v = F.linear(kv, self.qkv.weight[D:], self.qkv.bias[D:]).split(D, dim=-1)
        q = q.reshape(B, M, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, M, D/H)
        k, v = (t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (k, v))
        if self.training and self.dropout > 0 and q.device.type == "cpu":
            y = attend_with_dropout(q, k, v, attn_mask, self.dropout)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
            )  # (B, H, M, D/H)
        y = y.transpose(1, 2).reshape(B, M, D)
        return self.resid_dropout(self.proj(y))


def attend_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor,
                        p: float) -> torch.Tensor:
    """What `scaled_dot_product_attention` computes on a CPU with `dropout_p=p` (its math path: scores,
    softmax, dropout on the weights, weighted sum), with the weights' mask drawn by `dropout`
    (models/dropout.py: SDPA's own draws one Mersenne-Twister float per weight, B·H·L² of them)."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, Lq, L)
    # float32 even under CPU autocast (which leaves softmax in bf16; CUDA's runs it in float32): a no-op else
    weights = torch.softmax(scores.float().masked_fill(~attn_mask, float("-inf")), dim=-1)
    return dropout(weights, p, True).to(v.dtype) @ v


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(self.act(self.fc1(x)))))


class TransformerBlock(nn.Module):
    def __init__(
        self, dim: int, n_heads: int, dropout: float, ffn_dim: int, activation: str = "relu",
        residual: str = "pre_ln", attn_dropout: float | None = None,
    ):
        """`attn_dropout`: dropout on the attention weights (None: `dropout`); the projection's output and the
        feed-forward's take `dropout`."""
        super().__init__()
        check_residual(residual)
        self.residual = residual
        self.ln1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, n_heads, dropout, attn_dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_dim, dropout, activation)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor, queries: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L, D) → (B, L, D); with `queries` (B, M) positions, only theirs (B, M, D) — what a final block
        owes a loss or a score that reads those positions alone (`newest`: scoring; BERT4Rec's masked
        positions: its cloze loss). Keys and values still come from every position."""
        q = self.ln1(x)  # (B, L, D)
        kv, base = (x, q) if self.residual == "reference" else (q, x)  # base: the attention residual's
        if queries is not None:
            q, base, attn_mask = at(q, queries), at(base, queries), at(attn_mask, queries, dim=2)
        x = base + self.attn(q, kv, attn_mask)
        if self.residual == "reference":
            y = self.ln2(x)
            return y + self.ffn(y)
        return x + self.ffn(self.ln2(x))


def at(t: torch.Tensor, positions: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The (B, M) `positions` of `t` along `dim`: (B, L, D) → (B, M, D), or a mask (B, 1, L, L) → (B, 1, M, L)
    with dim=2."""
    index = positions[:, None, :, None] if dim == 2 else positions[..., None]
    return torch.take_along_dim(t, index, dim=dim)


def newest(items: torch.Tensor) -> torch.Tensor:
    """(B, 1) the newest position of each row of (B, L) left-padded items: the one a score reads."""
    return torch.full((items.shape[0], 1), items.shape[1] - 1, dtype=torch.long, device=items.device)


def attention_mask(items: torch.Tensor, causal: bool) -> torch.Tensor:
    """Boolean mask (B, 1, L, L), True = may attend. Queries at padding attend to themselves only, so no
    row is fully masked (which would make softmax NaN); their outputs are never read."""
    B, L = items.shape
    keys = (items > 0)[:, None, None, :]  # (B, 1, 1, L)
    mask = keys.expand(B, 1, L, L)
    if causal:
        mask = mask & torch.ones(L, L, dtype=torch.bool, device=items.device).tril()
    eye = torch.eye(L, dtype=torch.bool, device=items.device)
    return mask | eye
