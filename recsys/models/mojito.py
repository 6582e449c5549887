"""MOJITO: Attention Mixtures for Time-Aware Sequential Recommendation (Tran et al., SIGIR 2023).

Reference: github.com/deezer/sigir23-mojito (TensorFlow). This is a PyTorch port of its `Mojito` model (one
file over 400 lines on purpose: the model's four parts are read against the reference side by side):

- **Time context.** Seven calendar features of every event's UTC timestamp are each encoded by a learnable
  Mercer/Fourier basis (both in `time_features.py`; `MercerTimeEncoding` is the reference `basis_time_encode`:
  periods 10^p with p initialised on linspace(0, `time_linspace`, `time_dim`), `time_expand` harmonics),
  concatenated, projected to `dim`, and (scaled by √dim) added to the position embedding. This context
  stream is concatenated with the item stream (item embedding·√dim + position): width 2·dim.
- **Attention mixture** (`MixtureAttention`, the reference `fish.multihead_attention`, after Nguyen et al.,
  NeurIPS 2022 "admixture of attention heads"): two global score maps — items Q·Kᵀ on the 2·dim stream and
  context Q·Kᵀ on the context stream — get Gaussian noise σ_g²·ε during training (σ learned, one per
  global map, shared by the blocks), and a small per-position network (Linear(2→H), ReLU, Linear(H→H)) mixes
  them into the H heads' scores. Causal and key-padding masks, softmax, value heads from the 2·dim stream.
  ReLU feed-forward of width 2·dim; the next block's context stream is the second half of the output.
- **Short-term score** of item j: last output · [e_j ; c(target time)].
- **Long-term score** (attentive FISM): with w_x = (1 - β) + β·a_x, where a_x attends from x over the user
  embedding and `fism_items` items sampled from the user's history (β = `fism_attention`, reference
  `lambda_trans_seq`),  long(j) = e_j·(e_j ⊙ w_j) + e_j·mean_l(s_l ⊙ w_l)  over the history items s_l.
  The final score is `short + long_weight·long` (reference λ = 0.1).

Deviations from the reference, each for a reason:
- The reference trains the long-term part on the target's self-term only but scores with the history sum
  added (divided by the fixed sequence length); here the same expression (history *mean*) is used in both,
  and, to stay causal, position t only sees history items — and FISM samples — at positions ≤ t (the
  reference samples FISM items from the whole training history, targets included). Training draws the FISM
  sample at random each step; evaluation takes an evenly spaced one, so scores are deterministic.
- `loss="ce"` (default): full softmax cross-entropy over the catalogue on the final score
  `short + λ·long` at every position. `loss="bce"` is the reference objective: one uniform negative per
  position and BCE(short) + λ·BCE(long). Full CE trains much better for the same wall time, as for SASRec
  (Klenitskiy & Vasilev, RecSys 2023), and it optimises the quantity that is ranked.
- Residuals (`residual`): "pre_ln" (default) is x + f(LN(x)) as in the project's SASRec blocks;
  "reference" is the TF code's (the residual adds the layer-normalised input, keys and values are not
  normalised). Pre-LN trained faster here (generated data, 12 epochs: validation NDCG@10 0.44 vs 0.38).
- The Gaussian noise is off in eval mode (the reference also adds it at test time), so scores are
  deterministic. Positions count from the newest event (padding invariance, as in `sasrec.py`).

Note: the target-time context term h_ctx·c(t) is the same for every candidate item, so in a full ranking it
shifts all scores equally; time reaches the ranking through the input events' context stream.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model_configs import MojitoConfig
from recsys.models.base import Batch, SequentialModel
from recsys.models.blocks import attention_mask
from recsys.models.dropout import Dropout
from recsys.models.losses import cross_entropy_at_positions, linear_cross_entropy
from recsys.models.sasrec import _init_weights, positions_from_end, sample_negatives
from recsys.models.time_features import FEATURE_MAX, N_TIME_FEATURES, MercerTimeEncoding, time_features


class MixtureAttention(nn.Module):
    """Admixture attention over an item stream (B, L, 2d) and a context stream (B, L, d)."""

    N_GLOBAL = 2  # items, context

    def __init__(self, dim: int, n_heads: int, dropout: float):
        super().__init__()
        self.dim, self.n_heads = dim, n_heads
        self.q_item = nn.Linear(2 * dim, dim)
        self.k_item = nn.Linear(2 * dim, dim)
        self.q_ctx = nn.Linear(dim, dim)
        self.k_ctx = nn.Linear(dim, dim)
        self.value = nn.Linear(2 * dim, 2 * dim)
        # Reference `hdp_net`: per (query, key) pair, the 2 global scores → H head scores.
        self.mix1 = nn.Linear(self.N_GLOBAL, n_heads)
        self.mix2 = nn.Linear(n_heads, n_heads)
        self.attn_dropout = Dropout(dropout)

    def forward(
        self,
        q_seq: torch.Tensor,
        kv_seq: torch.Tensor,
        q_ctx: torch.Tensor,
        k_ctx: torch.Tensor,
        mask: torch.Tensor,
        sigma: torch.Tensor,
    ) -> torch.Tensor:
        """Queries (B, Lq, ·) over keys (B, Lk, ·) → (B, Lq, 2d); Lq < Lk when only the newest outputs
        are needed (evaluation). `mask` (B, 1, Lq, Lk) is True where a query may attend."""
        B, Lk, D2 = kv_seq.shape
        Lq, H = q_seq.shape[1], self.n_heads
        qi, qc = self.q_item(q_seq), self.q_ctx(q_ctx)  # (B, Lq, d)
        ki, kc = self.k_item(kv_seq), self.k_ctx(k_ctx)  # (B, Lk, d)
        # The first mixing layer is linear in the two global maps, so it folds into one product per head:
        # b_h + w_h0·(qi·ki) + w_h1·(qc·kc) = [w_h0·qi ; w_h1·qc ; b_h] · [ki ; kc ; 1]. Same function as
        # computing the (B, 2, L, L) maps and mixing them, without four passes over them.
        w1, b1 = self.mix1.weight, self.mix1.bias  # (H, 2), (H,)
        q = torch.cat(
            [
                w1[None, :, None, 0:1] * qi[:, None],
                w1[None, :, None, 1:2] * qc[:, None],
                b1[None, :, None, None].expand(B, H, Lq, 1),
            ],
            dim=-1,
        )  # (B, H, Lq, 2d + 1)
        k = torch.cat([ki, kc, ki.new_ones(B, Lk, 1)], dim=-1)  # (B, Lk, 2d + 1)
        # (B, H·Lq, 2d+1) @ (B, 2d+1, Lk): one batched product per row, without broadcasting k over the
        # heads (which copies it H times: 6 % of scoring on ml-1m-half).
        s = (q.reshape(B, H * Lq, -1) @ k.transpose(1, 2)).view(B, H, Lq, Lk)
        if self.training:
            # Noise σ_g²·ε_g on each global map, mixed like the maps ((H, 2) × (B, 2, Lq·Lk);
            # einsum is the fastest of matmul / conv1d / scaled adds for these few channels on CPU).
            eps = torch.randn(B, self.N_GLOBAL, Lq * Lk, dtype=s.dtype, device=s.device)
            mixed = torch.einsum("hg,bgn->bhn", (w1 * sigma.pow(2)[None, :]).to(s.dtype), eps)
            s = s + mixed.view(B, H, Lq, Lk)
        # Second mixing layer (H → H) as one small product, the 1/√d scale folded into it.
        scale = 1.0 / math.sqrt(self.dim)
        w2, b2 = self.mix2.weight * scale, self.mix2.bias * scale
        s = torch.einsum("hg,bgn->bhn", w2.to(s.dtype), F.relu(s).view(B, H, Lq * Lk)) + b2.to(s.dtype)[:, None]
        s = s.view(B, H, Lq, Lk).masked_fill(~mask, float("-inf"))
        p = self.attn_dropout(torch.softmax(s.float(), dim=-1)).to(s.dtype)  # float32 as on CUDA (a no-op else)
        v = self.value(kv_seq).view(B, Lk, H, D2 // H).transpose(1, 2)  # (B, H, Lk, 2d/H)
        return (p @ v).transpose(1, 2).reshape(B, Lq, D2)


class MojitoBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float, residual: str = "pre_ln"):
        super().__init__()
        self.dim, self.residual = dim, residual
        self.ln_seq = nn.LayerNorm(2 * dim)
        self.ln_ctx = nn.LayerNorm(dim)
        self.attn = MixtureAttention(dim, n_heads, dropout)
        self.ln_ffn = nn.LayerNorm(2 * dim)
        self.ffn = nn.Sequential(
            nn.Linear(2 * dim, 2 * dim),
            nn.ReLU(),
            Dropout(dropout),
            nn.Linear(2 * dim, 2 * dim),
            Dropout(dropout),
        )

    def forward(self, x, ctx, mask, valid, sigma, last_only: bool = False):
        """`last_only`: compute the newest position's output only (B, 1, ·) — all a score needs from the
        final block, since keys and values still come from every position."""
        q = self.ln_seq(x)  # (B, L, 2d)
        if last_only:
            mask, valid = mask[:, :, -1:], valid[:, -1:]
        if self.residual == "reference":  # residuals add the *normalised* inputs; keys are not normalised
            c = self.ln_ctx(ctx)
            q_out, c_out = (q[:, -1:], c[:, -1:]) if last_only else (q, c)
            x = q_out + self.attn(q_out, x, c_out, ctx, mask, sigma)
            y = self.ln_ffn(x)
            x = (y + self.ffn(y)) * valid
        else:  # standard pre-LN, as the project's SASRec blocks
            c = self.ln_ctx(ctx)
            q_out, c_out, x = (q[:, -1:], c[:, -1:], x[:, -1:]) if last_only else (q, c, x)
            x = x + self.attn(q_out, q, c_out, c, mask, sigma)
            x = (x + self.ffn(self.ln_ffn(x))) * valid  # (B, L, 2d)
        return x, x[..., self.dim :]


class Mojito(SequentialModel):
    name = "mojito"
    id_rows = {"item_emb.weight": "items", "user_emb.weight": "users"}
    # time_dim / time_expand change only the time encoder's and the context projection's shapes: a warm
    # start carries those tensors when their shapes match and leaves them fresh otherwise.
    warm_free_fields = frozenset({"dropout", "noise_init", "time_linspace", "time_dim", "time_expand"})

    def __init__(self, config: MojitoConfig, n_items: int, n_users: int):
        super().__init__(n_items, n_users)
        self.config = config
        d = config.dim
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.user_emb = nn.Embedding(n_users + 1, d, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, d)
        self.time_enc = MercerTimeEncoding(
            N_TIME_FEATURES, config.time_dim, config.time_expand, config.time_linspace, FEATURE_MAX
        )
        self.ctx_proj = nn.Linear(N_TIME_FEATURES * config.time_dim, d)
        self.dropout = Dropout(config.dropout)
        self.sigma_noise = nn.Parameter(torch.full((MixtureAttention.N_GLOBAL,), config.noise_init))
        self.blocks = nn.ModuleList(
            MojitoBlock(d, config.n_heads, config.dropout, config.residual) for _ in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(2 * d)
        self.apply(_init_weights)
        nn.init.normal_(self.ctx_proj.weight, std=0.01)  # as the reference's context projection

    # ----- encoder -----------------------------------------------------------------------------------------

    def context(self, times: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(...) UTC seconds, (...) bool validity → (..., d) context embeddings (zero features at padding)."""
        feats = time_features(times, self.config.base_year) * valid.unsqueeze(-1)  # (B, L, 7)
        return self.dropout(self.ctx_proj(self.time_enc(feats.float())))

    def forward(self, batch: Batch, last_only: bool = False) -> torch.Tensor:
        """(B, L, 2d) causal outputs — (B, 1, 2d) for the newest position only with `last_only`;
        [..., :d] pairs with item embeddings, [..., d:] with contexts."""
        L = self.config.max_len
        items, times = batch.items[:, -L:], batch.times[:, -L:]
        valid = (items > 0).unsqueeze(-1)  # (B, L, 1)
        scale = math.sqrt(self.config.dim)
        pos = self.pos_emb(positions_from_end(items))  # (B, L, d)
        ctx = self.context(times, items > 0) * valid  # (B, L, d)
        x = torch.cat([self.item_emb(items) * scale + pos, ctx * scale + pos], dim=-1)  # (B, L, 2d)
        x = self.dropout(x) * valid
        mask = attention_mask(items, causal=True)  # (B, 1, L, L)
        for i, block in enumerate(self.blocks):
            x, ctx = block(x, ctx, mask, valid, self.sigma_noise, last_only and i == len(self.blocks) - 1)
        return self.final_norm(x)

    # ----- long-term attentive FISM -------------------------------------------------------------------------

    def fism_sample(self, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pick up to `fism_items` history positions per row: random in training, evenly spaced in eval.

        Returns item ids (B, F), their positions (B, F) sorted ascending (L for unused slots), validity (B, F).
        """
        B, L = items.shape
        k = min(self.config.fism_items, L)
        valid = items > 0
        if self.training:
            key = torch.rand(B, L, device=items.device).masked_fill(~valid, -1.0)
        else:
            n = valid.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
            rank = valid.long().cumsum(1) - 1  # (B, L), 0 = oldest real item
            bucket = torch.div(rank * k, n, rounding_mode="floor")
            prev = torch.div((rank - 1) * k, n, rounding_mode="floor")
            first = valid & ((rank == 0) | (bucket != prev))  # first position of each of k even buckets
            key = first.float() - (~first).float()  # 1 chosen, -1 not
        top, idx = key.topk(k, dim=1)  # (B, F)
        ok = top > 0 if not self.training else top >= 0
        pos = torch.where(ok, idx, torch.full_like(idx, L))
        pos, order = pos.sort(dim=1)
        ok = ok.gather(1, order)
        fism = items.gather(1, pos.clamp(max=L - 1)) * ok
        return fism, pos, ok

    def fism_context(self, batch: Batch, items: torch.Tensor):
        """Attention pool P = [user ; FISM items] (B, 1+F, d), its validity (B, 1+F), and FISM positions."""
        fism, fpos, fok = self.fism_sample(items)
        users = batch.users.where(batch.users <= self.n_users, torch.zeros_like(batch.users))
        pool = torch.cat([self.user_emb(users)[:, None], self.item_emb(fism)], dim=1)  # (B, 1+F, d)
        pool_ok = torch.cat([torch.ones_like(fok[:, :1]), fok], dim=1)  # (B, 1+F)
        return pool, pool_ok, fpos

    def self_term_table(self, pool: torch.Tensor, pool_ok: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """(B, 1+F, I+1): for every item j and prefix size k (user + first k FISM items),
        Σ_f softmax_f(e_j·P_f) · (e_j ⊙ e_j)·P_f — the attentive part of e_j·(e_j ⊙ w_j).
        `last_only`: the whole pool only, (B, 1, I+1) — what scoring the newest position needs."""
        B, P, d = pool.shape
        emb = self.item_emb.weight  # (I+1, d)
        flat = pool.reshape(B * P, d)
        # (B, 1+F, I+1) straight from one product each (no permute); float32 even under autocast: the
        # prefix sums below would lose too much in bfloat16.
        logits = (flat @ emb.T).view(B, P, -1).float().masked_fill(~pool_ok[:, :, None], float("-inf"))
        g = (flat @ (emb * emb).T).view(B, P, -1).float()
        w = torch.exp(logits - logits.max(dim=1, keepdim=True).values)  # stable; row 0 (user) is finite
        if last_only:
            return ((w * g).sum(1) / w.sum(1))[:, None]
        return (w * g).cumsum(1) / w.cumsum(1)

    def history_term(
        self, items: torch.Tensor, pool: torch.Tensor, pool_ok: torch.Tensor, fpos: torch.Tensor
    ):
        """(B, L, d): mean over history items s_l, l ≤ t, of s_l ⊙ w_l (w_l attends over FISM items at ≤ l)."""
        L = items.shape[1]
        beta = self.config.fism_attention
        s = self.item_emb(items)  # (B, L, d)
        t = torch.arange(L, device=items.device)
        visible = (
            torch.cat(
                [
                    torch.ones_like(pool_ok[:, None, :1]).expand(-1, L, 1),
                    fpos[:, None, :] <= t[None, :, None],
                ],
                dim=2,
            )
            & pool_ok[:, None, :]
        )  # (B, L, 1+F)
        att = (s @ pool.transpose(1, 2)).masked_fill(~visible, float("-inf")).softmax(-1)  # (B, L, 1+F)
        w = (1 - beta) + beta * (att @ pool)  # (B, L, d)
        valid = (items > 0).unsqueeze(-1)
        n = valid.cumsum(1).clamp(min=1)  # (B, L, 1)
        return (s * w * valid).cumsum(1) / n

    def visible_prefix(self, fpos: torch.Tensor, L: int) -> torch.Tensor:
        """(B, L): how many FISM items position t may see (their positions are ≤ t)."""
        t = torch.arange(L, device=fpos.device)
        return (fpos[:, None, :] <= t[None, :, None]).sum(-1)

    def long_bias(self, emb: torch.Tensor) -> torch.Tensor:
        """λ(1 - β)|e_j|² for the rows of `emb`: the non-attentive part of λ·e_j·(e_j ⊙ w_j)."""
        return (self.config.long_weight * (1 - self.config.fism_attention)) * emb.pow(2).sum(-1)

    def all_item_logits(self, q: torch.Tensor, long_rows: torch.Tensor | None) -> torch.Tensor:
        """q (N, d) → (N, I+1) logits q·e_j + λ·e_j·(e_j ⊙ w_j), where
        e_j·(e_j ⊙ w_j) = (1 - β)|e_j|² + β·(self-term table row); `long_rows` (N, I+1) are the
        gathered table rows, already scaled by λβ."""
        emb = self.item_emb.weight  # (I+1, d)
        if long_rows is None:
            return q @ emb.T
        return torch.addmm(self.long_bias(emb), q, emb.T) + long_rows

    # ----- objective and scores ----------------------------------------------------------------------------

    def _parts(self, batch: Batch, last_only: bool = False):
        """Encoder outputs and long-term pieces for every position: h_item (B, L, d), h_ctx (B, L, d), the
        history term (B, L, d), the self-term table (B, 1+F, I+1) and FISM prefix sizes (B, L); the last
        three are None when `long_weight` is 0. `last_only`: encoder outputs for the newest position only."""
        items = batch.items[:, -self.config.max_len :]
        hidden = self(batch, last_only)  # (B, L or 1, 2d)
        d = self.config.dim
        h_item, h_ctx = hidden[..., :d], hidden[..., d:]
        if self.config.long_weight == 0:
            return h_item, h_ctx, None, None, None
        pool, pool_ok, fpos = self.fism_context(batch, items)
        history = self.history_term(items, pool, pool_ok, fpos)  # (B, L, d)
        # Scaled here, on the small (B, 1+F, I+1) table, rather than on (N, I+1) gathered rows.
        table = (self.config.long_weight * self.config.fism_attention) * self.self_term_table(
            pool, pool_ok, last_only
        )
        if last_only:  # the newest position sees every FISM item: row 0 of the one-row table
            return h_item, h_ctx, history, table, torch.zeros_like(items[:, -1:])
        prefix = self.visible_prefix(fpos, items.shape[1])  # (B, L)
        return h_item, h_ctx, history, table, prefix

    def target_context(self, h_ctx: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """h_ctx (..., d) · c(times) (...,): the short-term score's context half."""
        c = self.context(times, torch.ones_like(times, dtype=torch.bool))
        return (h_ctx * c).sum(-1)

    def sequence_scores(self, batch: Batch) -> torch.Tensor:
        """(B, L, I+1) final scores at every position for the training targets' times (tests, analysis)."""
        q, h_ctx, history, table, prefix = self._parts(batch)
        ctx_term = self.target_context(h_ctx, batch.target_times[:, -self.config.max_len :])  # (B, L)
        B, L, _ = q.shape
        rows = None
        if table is not None:
            q = q + self.config.long_weight * history
            rows = table[torch.arange(B, device=q.device)[:, None], prefix].flatten(0, 1)  # (B·L, I+1)
        scores = self.all_item_logits(q.flatten(0, 1), rows).view(B, L, -1) + ctx_term[..., None]
        scores[..., 0] = float("-inf")
        return scores

    def loss(self, batch: Batch) -> torch.Tensor:
        if batch.targets is None or batch.target_times is None:
            raise ValueError("Mojito.loss needs batch.targets and batch.target_times")
        L = self.config.max_len
        targets = batch.targets[:, -L:]
        keep = targets > 0
        if batch.fixed_shape:
            return self._fixed_shape_loss(batch, targets, keep)
        y = targets[keep]  # (N,)
        q, h_ctx, history, table, prefix = self._parts(batch)
        lam = self.config.long_weight
        rows_b = keep.nonzero()[:, 0]  # batch row of each kept position
        if self.config.loss == "ce":
            # The target-time context term h_ctx·c(t) is the same for every candidate, and softmax is
            # shift-invariant: it has no gradient under CE, so it is left out here.
            # Padding (column 0) is left out of the softmax by slicing, not by writing -inf into (N, I+1).
            emb = self.item_emb.weight[1:]  # (I, d)
            if table is None:
                return linear_cross_entropy(q[keep], emb, y - 1)
            qk = q[keep] + lam * history[keep]  # (N, d)
            groups = table.shape[1]
            flat = table[:, :, 1:].reshape(-1, self.n_items)  # (B·(1+F), I): one row per (row, prefix)
            return linear_cross_entropy(qk, emb, y - 1, bias=self.long_bias(emb), table=flat,
                                        index=rows_b * groups + prefix[keep])
        # Reference objective: BCE with one uniform negative, on the short- and long-term logits apart.
        ctx_term = self.target_context(h_ctx[keep], batch.target_times[:, -L:][keep])  # (N,)
        emb = self.item_emb.weight
        neg = sample_negatives(self.n_items, y.shape, y.device)  # (N,)
        cand = torch.stack([y, neg], dim=1)  # (N, 2)
        e = emb[cand]  # (N, 2, d)
        short = (q[keep][:, None] * e).sum(-1) + ctx_term[:, None]  # (N, 2)
        hit = neg == y
        loss = _bce(short, hit)
        if table is not None:
            beta = self.config.fism_attention
            attentive = table[rows_b[:, None], prefix[keep][:, None], cand] / lam  # (N, 2): β·table
            long = (history[keep][:, None] * e).sum(-1) + (1 - beta) * e.pow(2).sum(-1) + attentive
            loss = loss + lam * _bce(long, hit)
        return loss

    def scoring_elements_per_row(self) -> int:
        """The self-term table's (1 + F, I + 1) per row (a few float32 copies of it while scoring)."""
        if self.config.long_weight == 0:
            return self.n_items + 1
        return (1 + min(self.config.fism_items, self.config.max_len)) * (self.n_items + 1)

    def _fixed_shape_loss(self, batch: Batch, targets: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """`loss` (ce) over every position, padding masked: the same mean, no data-dependent shape."""
        if why := self.fixed_shape_refusal():
            raise ValueError(why)
        q, _, history, table, prefix = self._parts(batch)
        B, L = targets.shape
        emb = self.item_emb.weight[1:]  # (I, d)
        if table is None:
            return cross_entropy_at_positions(q, emb, targets, keep, batch.loss_rows)
        groups = table.shape[1]
        rows_b = torch.arange(B, device=targets.device)[:, None].expand(B, L)  # batch row of every position
        flat = table[:, :, 1:].reshape(-1, self.n_items)  # (B·(1+F), I): one row per (row, prefix)
        index = (rows_b * groups + prefix).flatten()
        return cross_entropy_at_positions(q + self.config.long_weight * history, emb, targets, keep,
                                          batch.loss_rows, bias=self.long_bias(emb), table=flat, index=index)

    def score(self, batch: Batch) -> torch.Tensor:
        items = batch.items[:, -self.config.max_len :]
        # The target time shifts every candidate equally; without it (serving), use the last event's time.
        next_time = batch.next_time if batch.next_time is not None else batch.times[:, -1]
        q, h_ctx, history, table, prefix = self._parts(batch, last_only=True)
        qk, rows = q[:, -1], None  # (B, d)
        if table is not None:
            qk = qk + self.config.long_weight * history[:, -1]
            rows = table[torch.arange(items.shape[0], device=items.device), prefix[:, -1]]  # (B, I+1)
        ctx_term = self.target_context(h_ctx[:, -1], next_time)  # (B,)
        scores = self.all_item_logits(qk, rows) + ctx_term[:, None]  # (B, I+1)
        scores[:, 0] = float("-inf")
        return scores


def _bce(logits: torch.Tensor, neg_is_target: torch.Tensor) -> torch.Tensor:
    """Mean BCE for (N, 2) [positive, negative] logits; a negative equal to the target is ignored."""
    pos = F.softplus(-logits[:, 0])
    neg = F.softplus(logits[:, 1]) * (~neg_is_target)
    return (pos + neg).mean()
