"""Transformer blocks shared by SASRec and BERT4Rec, over `scaled_dot_product_attention` (which picks a
fused kernel — flash / memory-efficient — on CUDA when it can).

Two residual arrangements (`residual`):
- "reference": SASRec's reference code (Kang & McAuley; kept by RecTools and SASRec.pytorch): the query is
  LN(x) while keys and values are the raw x, the attention residual adds LN(x), and the feed-forward
  residual adds its own normalised input: x ← LN₁(x) + Attn(LN₁(x), x);  x ← LN₂(x) + FFN(LN₂(x)).
  The ablation in benchmarks/RESULTS.md measured it ahead of pre-LN for SASRec.
- "pre_ln": the standard pre-LN transformer, x ← x + Attn(LN₁(x)); x ← x + FFN(LN₂(x)).
Either way the model ends with a final LayerNorm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model_configs import check_residual
from recsys.models.dropout import Dropout, dropout


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout
        self.resid_dropout = Dropout(dropout)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor, last_only: bool = False, kv: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L, D) → (B, L, D), or (B, 1, D) for the newest query only with `last_only`. Keys and values
        come from `kv` when given (the reference arrangement: raw x), else from `x`."""
        B, L, D = x.shape
        if kv is None:
            q, k, v = self.qkv(x).split(D, dim=-1)
        else:  # same parameters, split: the query projection reads x, key/value projections read kv
            q = F.linear(x, self.qkv.weight[:D], self.qkv.bias[:D])
            k, v = F.linear(kv, self.qkv.weight[D:], self.qkv.bias[D:]).split(D, dim=-1)
        if last_only:
            q, attn_mask = q[:, -1:], attn_mask[:, :, -1:]
        Lq = q.shape[1]
        q = q.reshape(B, Lq, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, Lq, D/H)
        k, v = (t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (k, v))
        if self.training and self.dropout > 0 and q.device.type == "cpu":
            y = attend_with_dropout(q, k, v, attn_mask, self.dropout)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
            )  # (B, H, Lq, D/H)
        y = y.transpose(1, 2).reshape(B, Lq, D)
        return self.resid_dropout(self.proj(y))


def attend_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor,
                        p: float) -> torch.Tensor:
    """What `scaled_dot_product_attention` computes on a CPU with `dropout_p=p` (its math path: scores,
    softmax, dropout on the weights, weighted sum), with the weights' mask drawn by `dropout`
    (models/dropout.py: SDPA's own draws one Mersenne-Twister float per weight, B·H·L² of them)."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, Lq, L)
    weights = torch.softmax(scores.masked_fill(~attn_mask, float("-inf")), dim=-1)
    return dropout(weights, p, True) @ v


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
        residual: str = "pre_ln",
    ):
        super().__init__()
        check_residual(residual)
        self.residual = residual
        self.ln1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, n_heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_dim, dropout, activation)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """`last_only`: output the newest position only (B, 1, D) — all scoring needs from the final block;
        keys and values still come from every position."""
        q = self.ln1(x)  # (B, L, D)
        if self.residual == "reference":
            x = (q[:, -1:] if last_only else q) + self.attn(q, attn_mask, last_only, kv=x)
            y = self.ln2(x)
            return y + self.ffn(y)
        x = (x[:, -1:] if last_only else x) + self.attn(q, attn_mask, last_only)
        return x + self.ffn(self.ln2(x))


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
