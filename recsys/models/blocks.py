"""Transformer blocks shared by SASRec, BERT4Rec and MOJITO's item stream.

Pre-LN blocks (as in SASRec's reference code) over `scaled_dot_product_attention`, which picks a fused kernel
(flash / memory-efficient on CUDA) when it can.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """(B, L, D) → (B, L, D), or (B, 1, D) for the newest query only with `last_only`."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        if last_only:
            q, attn_mask = q[:, -1:], attn_mask[:, :, -1:]
        Lq = q.shape[1]
        q = q.reshape(B, Lq, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, Lq, D/H)
        k, v = (t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )  # (B, H, Lq, D/H)
        y = y.transpose(1, 2).reshape(B, Lq, D)
        return self.resid_dropout(self.proj(y))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(self.act(self.fc1(x)))))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float, ffn_dim: int, activation: str = "relu"):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, n_heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_dim, dropout, activation)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """`last_only`: output the newest position only (B, 1, D) — all scoring needs from the final block;
        keys and values still come from every position."""
        y = self.attn(self.ln1(x), attn_mask, last_only)
        x = (x[:, -1:] if last_only else x) + y
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
