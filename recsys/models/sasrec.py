"""SASRec: Self-Attentive Sequential Recommendation (Kang & McAuley, ICDM 2018).

Causal self-attention over the item sequence with learnable positions and item embeddings shared between
input and output. Losses (`loss` config field):

- `bce`: one uniformly sampled negative per position, binary cross-entropy — the paper's objective.
- `sampled_ce`: softmax cross-entropy over the target and `n_negatives` shared uniform negatives.
- `ce`: full softmax cross-entropy over the catalogue (Klenitskiy & Vasilev, RecSys 2023: "SASRec+").
(gSASRec's gBCE was here until session 10; removed for its measured 0.64 × full CE: recsys/model_configs.py.)

Positions are counted from the newest event (the newest is position 0). With the reference code's
fixed-length left padding this is the same indexing, and it makes outputs invariant to extra padding.

Defaults follow the ablation in benchmarks/RESULTS.md (ml-100k and ml-1m-half, full ranking): the reference
code's residual arrangement (`residual="reference"`, see `blocks.py`), two heads. `weight_init` and `emb_scale`
select the initialisation ("normal": N(0, 1/d) embeddings and Xavier linears, with item embeddings scaled
by √d at the input; "xavier": Xavier-normal for every matrix, as RecTools) — measured there too.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model_configs import SASRecConfig
from recsys.models.base import Batch, SequentialModel
from recsys.models.blocks import TransformerBlock, attention_mask, newest
from recsys.models.dropout import Dropout, dropout
from recsys.models.losses import cross_entropy_at_positions, linear_cross_entropy


def positions_from_end(items: torch.Tensor) -> torch.Tensor:
    """(B, L) position ids with the newest (rightmost) event at 0."""
    L = items.shape[1]
    return torch.arange(L - 1, -1, -1, device=items.device).expand_as(items)


def sample_negatives(n_items: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.randint(1, n_items + 1, shape, device=device)


def sampled_logits(hidden: torch.Tensor, item_emb: torch.Tensor, targets: torch.Tensor, negatives: torch.Tensor):
    """Logits of the target (column 0) and of negatives; a negative equal to the target is masked out.

    hidden (N, D), targets (N,), negatives (N, K) or (K,) shared across rows.
    """
    pos = (hidden * item_emb[targets]).sum(-1, keepdim=True)  # (N, 1)
    if negatives.dim() == 1:
        neg = hidden @ item_emb[negatives].T  # (N, K)
        hit = negatives[None, :] == targets[:, None]
    else:
        neg = torch.einsum("nd,nkd->nk", hidden, item_emb[negatives])  # (N, K)
        hit = negatives == targets[:, None]
    neg = neg.masked_fill(hit, float("-inf"))
    return torch.cat([pos, neg], dim=1)  # (N, 1 + K)


class SASRec(SequentialModel):
    name = "sasrec"
    id_rows = {"item_emb.weight": "items"}
    warm_free_fields = frozenset({"dropout", "item_dropout", "n_negatives", "weight_init"})

    def __init__(self, config: SASRecConfig, n_items: int, n_users: int):
        super().__init__(n_items, n_users)
        self.config = config
        d = config.dim
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, d)
        self.emb_dropout = Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d, config.n_heads, config.dropout, ffn_dim=d, residual=config.residual)
            for _ in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(d)
        self.apply(_init_weights if config.weight_init == "normal" else _xavier_init)

    def item_table(self) -> torch.Tensor:
        """(I + 1, D) item embeddings as this step sees them: with `item_dropout` while training."""
        return dropout(self.item_emb.weight, self.config.item_dropout, self.training)

    def forward(self, batch: Batch, last_only: bool = False, table: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L, D) outputs; `table` is the item embedding table to look the inputs up in (default: this
        step's `item_table()`)."""
        items = batch.items[:, -self.config.max_len :]  # (B, L)
        x = F.embedding(items, self.item_table() if table is None else table, padding_idx=0)  # (B, L, D)
        if self.config.emb_scale:
            x = x * math.sqrt(self.config.dim)
        x = x + self.pos_emb(positions_from_end(items))
        x = self.emb_dropout(x) * (items > 0).unsqueeze(-1)
        mask = attention_mask(items, causal=True)  # (B, 1, L, L)
        for i, block in enumerate(self.blocks):  # `last_only`: the final block outputs position -1 only
            x = block(x, mask, newest(items) if last_only and i == len(self.blocks) - 1 else None)
        return self.final_norm(x)  # (B, L, D)

    def loss(self, batch: Batch) -> torch.Tensor:
        emb = self.item_table()  # (I + 1, D): one table for inputs and outputs
        hidden = self(batch, table=emb)  # (B, L, D)
        targets = batch.targets[:, -self.config.max_len :]
        keep = targets > 0
        cfg = self.config
        if batch.fixed_shape:  # every position, padding masked: no shape depends on the data
            if why := self.fixed_shape_refusal():
                raise ValueError(why)
            return cross_entropy_at_positions(hidden, emb[1:], targets, keep, batch.loss_rows)
        h, y = hidden[keep], targets[keep]  # (N, D), (N,)
        if cfg.loss == "ce":  # full softmax over the real items (padding column left out)
            return linear_cross_entropy(h, emb[1:], y - 1)
        if cfg.loss == "bce":
            neg = sample_negatives(self.n_items, (y.shape[0], 1), h.device)
            logits = sampled_logits(h, emb, y, neg)  # (N, 2)
            pos_loss = F.softplus(-logits[:, 0])
            neg_loss = F.softplus(logits[:, 1]).nan_to_num(0.0)
            return (pos_loss + neg_loss).mean()
        # sampled_ce
        neg = sample_negatives(self.n_items, (cfg.n_negatives,), h.device)
        logits = sampled_logits(h, emb, y, neg)
        return F.cross_entropy(logits.float(), torch.zeros_like(y))

    def sequence_scores(self, batch: Batch) -> torch.Tensor:
        """(B, L, I + 1) scores of every item after every position (tests, analysis); column 0 = -inf."""
        scores = self(batch) @ self.item_emb.weight.T
        scores[..., 0] = float("-inf")
        return scores

    def score(self, batch: Batch) -> torch.Tensor:
        last = self(batch, last_only=True)[:, -1]  # (B, D)
        scores = last @ self.item_emb.weight.T  # (B, I + 1)
        scores[:, 0] = float("-inf")
        return scores


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.xavier_normal_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()


def _xavier_init(module: nn.Module) -> None:
    """Xavier-normal for every matrix, embeddings included (RecTools' initialisation); zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.xavier_normal_(module.weight)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
        elif module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
