"""BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations from Transformer
(Sun et al., CIKM 2019).

A bidirectional transformer (GELU feed-forward) trained with the cloze objective: a share `mask_prob` of the
items of each training sequence is replaced by a `[mask]` token (id n_items + 1) and predicted from both
sides. The output head is `GELU(h W + b) Eᵀ + b_o`, with E tied to the input item embeddings; `head_norm`
(on in params.yaml) puts the paper's LayerNorm after the GELU. At test time a `[mask]` is appended after the
history and its output ranks the catalogue.

As in the paper, some training samples mask only the last item, which is exactly the test-time task: a share
`last_item_share` of the rows of every batch gets only its last item masked (the reference code produces
one such sample per user next to its ten random-mask copies, ≈ 1/11; params.yaml's 0.1 beat 0.25 and 0.5 on
ML-100K: such a row teaches one target where a random-mask row teaches ρ·n). Masking never selects padding,
and a row whose random draw masked nothing gets its last item masked so that every row teaches something.
`masking` says how many tokens a random-mask row of n tokens masks: "bernoulli" draws each with probability
ρ (from 1 to n); "exact" masks round(ρ·n) of them, at least one, drawn uniformly without replacement — the
reference code's `create_masked_lm_predictions`. An exact count is a bound a fixed-shape step
(`train.cuda_graph`) cuts its loss to (≈ ρ of the tokens), where Bernoulli's bound is every token.

Deviations, on purpose: the encoder's blocks are the SASRec reference code's arrangement (`residual:
reference`, the params.yaml default; `pre_ln` for pre-LN blocks; blocks.py) with a final LayerNorm instead
of BERT's post-LN — both train stably at the larger learning rate BERT4Rec needs (Petrov & Macdonald,
RecSys 2022 show the reference is badly under-trained); positions count from the newest event, so extra
left padding never changes an output. Loss: full softmax over the catalogue at the masked positions (`ce`)
or softmax over the target and `n_negatives` shared uniform negatives (`sampled_ce`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recsys.model_configs import BERT4RecConfig
from recsys.models.base import Batch, SequentialModel
from recsys.models.blocks import TransformerBlock, attention_mask, newest
from recsys.models.dropout import Dropout
from recsys.models.losses import cross_entropy_at_positions, linear_cross_entropy
from recsys.models.sasrec import _init_weights, positions_from_end, sample_negatives


def full_sequences(batch: Batch, max_len: int) -> torch.Tensor:
    """(B, ≤max_len) left-padded training sequences rebuilt from the next-item layout.

    Inputs hold every event but the newest, right-aligned, and targets[:, -1] is the newest, so the whole
    sequence is the inputs followed by the last target (the targets themselves start one event late in a
    span shorter than the batch: the trainer zeroes a target with padding as its input). The oldest event is
    dropped when that is longer than `max_len`.
    """
    if batch.targets is None:
        raise ValueError("BERT4Rec.loss needs batch.targets")
    seq = torch.cat([batch.items, batch.targets[:, -1:]], dim=1)  # (B, L + 1)
    return seq[:, -max_len:]


class BERT4Rec(SequentialModel):
    name = "bert4rec"
    id_rows = {"item_emb.weight": "items", "out_bias": "items"}  # item_emb's last row is [mask]
    warm_free_fields = frozenset({"dropout", "attn_dropout", "mask_prob", "last_item_share", "n_negatives",
                                  "masking"})

    def __init__(self, config: BERT4RecConfig, n_items: int, n_users: int):
        super().__init__(n_items, n_users)
        self.config = config
        d = config.dim
        self.mask_id = n_items + 1
        self.item_emb = nn.Embedding(n_items + 2, d, padding_idx=0)  # 0 = padding, n_items + 1 = [mask]
        self.pos_emb = nn.Embedding(config.max_len, d)
        self.emb_dropout = Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d, config.n_heads, config.dropout, ffn_dim=config.ffn_dim, activation="gelu",
                             residual=config.residual,
                             attn_dropout=None if config.attn_dropout == -1.0 else config.attn_dropout)
            for _ in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, d)  # W, b of GELU(h W + b) Eᵀ + b_o
        self.head_norm = nn.LayerNorm(d) if config.head_norm else nn.Identity()
        self.out_bias = nn.Parameter(torch.zeros(n_items + 1))  # b_o; [mask] is never a candidate
        # `masking: exact`'s count per row of n tokens (index n ≤ max_len): `exact_counts`, looked up on the
        # device by `cloze_mask`, so the mask and the loss bound come from one formula.
        self.register_buffer("exact_k", torch.from_numpy(self.exact_counts(np.arange(config.max_len + 1))),
                             persistent=False)
        self.apply(_init_weights)

    def forward(self, items: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) item ids, possibly holding [mask] → (B, L, D) bidirectional hidden states; with `queries`
        (B, M) positions, theirs only (B, M, D): the final block computes nothing else (blocks.py)."""
        items = items[:, -self.config.max_len :]
        x = self.item_emb(items) * math.sqrt(self.config.dim)  # (B, L, D)
        x = x + self.pos_emb(positions_from_end(items))
        x = self.emb_dropout(x) * (items > 0).unsqueeze(-1)
        mask = attention_mask(items, causal=False)  # (B, 1, L, L)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, queries if i == len(self.blocks) - 1 else None)
        return self.final_norm(x)

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) encoder outputs → (N, D) the head's GELU(h W + b), LayerNorm'd when `head_norm`."""
        return self.head_norm(F.gelu(self.head(hidden)))

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) → (N, n_items + 1) logits over padding + real items; column 0 is -inf."""
        h = self.transform(hidden)  # (N, D)
        logits = h @ self.item_emb.weight[: self.n_items + 1].T + self.out_bias  # (N, I + 1)
        logits[:, 0] = float("-inf")
        return logits

    def exact_counts(self, tokens: np.ndarray) -> np.ndarray:
        """Tokens a random-mask row of `tokens` tokens masks under `masking: exact`: round(ρ·n), at least one
        (none in an empty row); `cloze_mask` reads them from the `exact_k` table built from this."""
        n = np.asarray(tokens, dtype=np.float64)
        k = np.maximum(1.0, np.floor(n * self.config.mask_prob + 0.5))
        return np.where(n > 0, k, 0.0).astype(np.int64)

    def cloze_mask(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, L) bool: which positions to mask. Never padding; at least one per non-empty row."""
        valid = seq > 0
        draw = torch.rand(seq.shape, device=seq.device)
        if self.config.masking == "exact":  # the round(ρ·n) smallest draws of the row's tokens (no host sync)
            k = self.exact_k[valid.sum(1)]  # (B,)
            rank = draw.masked_fill(~valid, 2.0).argsort(dim=1).argsort(dim=1)  # padding ranks last
            masked = rank < k[:, None]
        else:
            masked = (draw < self.config.mask_prob) & valid
        last_only = torch.rand(seq.shape[0], device=seq.device) < self.config.last_item_share  # (B,)
        # Left padding puts the newest item at -1; rows with nothing masked fall back to it too.
        fallback = last_only | ~masked.any(dim=1)
        last = torch.zeros_like(masked)
        last[:, -1] = valid[:, -1]
        return torch.where(fallback[:, None], last, masked)

    def loss_terms(self, lengths: np.ndarray) -> np.ndarray:
        """Expected masked positions of a span of n events (n tokens up to max_len; `cloze_mask`): one with
        probability last_item_share, else p·n plus the fallback one when nothing was masked (bernoulli) or
        round(p·n) (exact) — the weights of a step's micro-batches, exact when mask_prob is 1."""
        n = np.minimum(lengths, self.config.max_len).astype(np.float64)
        p, share = self.config.mask_prob, self.config.last_item_share
        if self.config.masking == "exact":
            return share + (1 - share) * self.exact_counts(n)
        return share + (1 - share) * (p * n + (1 - p) ** n)

    def loss_positions(self, lengths: np.ndarray) -> np.ndarray:
        """Masked positions are tokens of the span (n up to max_len): at most all of them (bernoulli), exactly
        round(p·n) ≥ 1 (exact; a last-item-only row's one is no more)."""
        n = np.minimum(lengths, self.config.max_len)
        return self.exact_counts(n) if self.config.masking == "exact" else n

    def loss(self, batch: Batch) -> torch.Tensor:
        seq = full_sequences(batch, self.config.max_len)  # (B, L)
        masked = self.cloze_mask(seq)
        inputs = seq.masked_fill(masked, self.mask_id)
        cfg = self.config
        if batch.fixed_shape:  # masked positions gathered into `loss_rows` slots: no data-dependent shape
            if why := self.fixed_shape_refusal():
                raise ValueError(why)
            weight = self.item_emb.weight[1 : self.n_items + 1]
            h = self.transform(self(inputs))  # (B, L, D)
            return cross_entropy_at_positions(h, weight, seq, masked, batch.loss_rows, bias=self.out_bias[1:])
        # The loss reads the masked positions only, so the final block computes only theirs: each row's
        # masked positions in order, then its unmasked ones as filler up to the longest row's count.
        counts = masked.sum(1)  # (B,)
        slots = int(counts.max())
        queries = (~masked).to(torch.uint8).argsort(dim=1, stable=True)[:, :slots]  # (B, M) masked first
        filled = torch.arange(slots, device=seq.device) < counts[:, None]  # (B, M)
        hidden = self(inputs, queries)[filled]  # (N, D): seq[masked]'s order (row-major, ascending position)
        y = seq.gather(1, queries)[filled]  # (N,)
        h = self.transform(hidden)  # (N, D)
        if cfg.loss == "ce":  # full softmax over the real items: the head, chunked (losses.py)
            weight = self.item_emb.weight[1 : self.n_items + 1]
            return linear_cross_entropy(h, weight, y - 1, bias=self.out_bias[1:])
        neg = sample_negatives(self.n_items, (cfg.n_negatives,), h.device)  # (K,)
        emb, bias = self.item_emb.weight, self.out_bias
        pos = (h * emb[y]).sum(-1, keepdim=True) + bias[y, None]  # (N, 1)
        negs = h @ emb[neg].T + bias[neg]  # (N, K)
        negs = negs.masked_fill(neg[None, :] == y[:, None], float("-inf"))
        logits = torch.cat([pos, negs], dim=1)
        return F.cross_entropy(logits.float(), torch.zeros_like(y))

    def append_mask(self, items: torch.Tensor) -> torch.Tensor:
        """Append [mask] after the newest item, dropping the oldest column when at max_len."""
        mask_col = torch.full_like(items[:, :1], self.mask_id)
        return torch.cat([items, mask_col], dim=1)[:, -self.config.max_len :]

    def score(self, batch: Batch) -> torch.Tensor:
        items = self.append_mask(batch.items)
        hidden = self(items, newest(items))[:, -1]  # (B, D)
        return self.output_logits(hidden)  # (B, I + 1)
