"""Full-softmax cross-entropy over the catalogue without materialising the (N, I) logits.

`linear_cross_entropy(h, weight, y)` equals `F.cross_entropy(h @ weight.T + bias + extra, y)` but works
through the rows in chunks: each chunk's logits are turned into softmax probabilities in place, the
gradients for `h`, `weight`, `bias` and `extra` are accumulated right there, and the chunk is dropped. The
backward pass only scales those stored gradients. Same three matrix products as autograd would run, but the
(N, I) matrix is never written out whole, never log-softmaxed into a second copy, never read back for
backward, and no zero-filled gradient of it is allocated — on a CPU, where this loss is memory-bound, that
is most of the cost (see benchmarks/RESULTS.md).

`extra` is an optional per-row additive table (MOJITO's long-term self-term): row n adds `table[index[n]]`.
`mask` (optional, (N,) bool) keeps only its rows in the mean: a fixed-shape batch (every position of every
row, padding included: `train.cuda_graph`) then has no data-dependent shape and nothing to wait for.

Under autocast (CUDA or CPU, `train.precision`) the products run in the autocast dtype and the softmax in float32,
as autograd would.
"""

from __future__ import annotations

import torch

# Logits per chunk. On a CPU, where this loss is memory-bound, about 4M (16 MB in float32). On a GPU the
# chunk loop's ~50 operators per chunk are host time the device waits for: a SASRec step on ml-1m-half runs
# 1,314 operators at batch 128 with 4M-logit chunks and 756 with one 64M chunk; 5,395 and 1,022 at batch
# 1024 (`benchmarks/step_ops.py`), and an H200 took ~12.5 and ~65 ms for those steps, ~10 µs an operator
# (benchmarks/RESULTS.md) — so 64M there (256 MB of float32 logits at most).
_CHUNK_BY_DEVICE = {"cuda": 1 << 26}
_CHUNK_DEFAULT = 1 << 22
# One size for every device when set (tests; benchmarks/bench_step.py --loss-chunk-elements).
_CHUNK_ELEMENTS: int | None = None


def chunk_elements(device: torch.device) -> int:
    """Logits per chunk of `linear_cross_entropy` on `device`."""
    return _CHUNK_ELEMENTS or _CHUNK_BY_DEVICE.get(device.type, _CHUNK_DEFAULT)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    kind = t.device.type
    if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return t.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, table, index, y, mask):
        n, classes = h.shape[0], weight.shape[0]
        if n == 0:
            raise ValueError("linear_cross_entropy needs at least one row")
        keep = None if mask is None else mask.to(torch.bool)  # (N,) True = a term of the mean
        work = _compute_dtype(h)
        with torch.autocast(device_type=h.device.type, enabled=False):
            hw, ww = h.to(work), weight.to(work)
            grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
            grad_b = None if bias is None else torch.zeros(classes, dtype=torch.float32, device=h.device)
            grad_t = None if table is None else torch.zeros(table.shape, dtype=torch.float32, device=h.device)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            bias_f = None if bias is None else bias.float()
            table_f = None if table is None else table.float()
            step = max(1, chunk_elements(h.device) // max(classes, 1))
            for s in range(0, n, step):
                hc, yc = hw[s : s + step], y[s : s + step]
                kc = None if keep is None else keep[s : s + step, None]  # (c, 1)
                if kc is not None:  # masked rows are selected away, not multiplied by 0 (NaN · 0 is NaN)
                    hc = torch.where(kc, hc, 0.0)
                p = (hc @ ww.T).float()  # (c, I) logits
                if bias is not None:
                    p += bias_f
                if table is not None:
                    p += table_f.index_select(0, index[s : s + step])
                    if kc is not None:  # a masked row's table row may be anything (MOJITO: 0/0 at prefix 0)
                        p.masked_fill_(~kc, 0.0)
                rows = torch.arange(p.shape[0], device=p.device)
                lse = torch.logsumexp(p, dim=1)
                terms = lse - p[rows, yc]
                total += (terms if kc is None else torch.where(kc[:, 0], terms, 0.0)).sum()
                p.sub_(lse[:, None]).exp_()  # softmax, in place
                p[rows, yc] -= 1.0  # d(loss)/d(logits), before the 1/n
                if kc is not None and (grad_b is not None or grad_t is not None):
                    p.masked_fill_(~kc, 0.0)  # masked rows add nothing (else the zeroed hc rows see to it)
                pw = p.to(work)  # a no-op in float32; one cast per chunk under autocast
                gh = (pw @ ww).float()
                grad_h[s : s + step] = gh if kc is None else torch.where(kc, gh, 0.0)
                grad_w += (pw.T @ hc).float()
                if grad_b is not None:
                    grad_b += p.sum(0)
                if grad_t is not None:
                    grad_t.index_add_(0, index[s : s + step], p)
        ctx.save_for_backward(grad_h, grad_w, grad_b, grad_t)
        ctx.dtypes = (h.dtype, weight.dtype, None if bias is None else bias.dtype,
                      None if table is None else table.dtype)
        # The mean's count: a tensor under a mask (read on the device, never waited for), at least 1.
        ctx.n = n if keep is None else keep.sum().to(torch.float32).clamp_min(1.0)
        return total / ctx.n

    @staticmethod
    def backward(ctx, grad_out):
        scale = grad_out / ctx.n
        grads = []
        for g, dtype in zip(ctx.saved_tensors, ctx.dtypes):
            grads.append(None if g is None else (g * scale).to(dtype))
        return (*grads, None, None, None)


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    bias: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of logits `h @ weight.T (+ bias) (+ table[index])` against class ids `y`.

    h (N, D), weight (C, D), y (N,) long in [0, C), bias (C,), table (G, C) with index (N,) long in [0, G);
    mask (N,) bool: the mean over its rows only (0 when it keeps none), the others' `y` any valid class.
    """
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1]:
        raise ValueError(f"shapes do not match: h {tuple(h.shape)}, weight {tuple(weight.shape)}")
    if (table is None) != (index is None):
        raise ValueError("table and index go together")
    if mask is not None and mask.shape != y.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, not y's {tuple(y.shape)}")
    return _LinearCrossEntropy.apply(h, weight, bias, table, index, y, mask)


def kept_first(keep: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions `keep` (N,) marks, in order, in a fixed number of slots: (rows,) indices into the N
    positions and (rows,) bool, True for a slot that holds one. Slots past the kept count point at position 0
    (masked). No data-dependent shape and nothing the host waits for (a CUDA graph holds it): each kept
    position's slot is its rank among the kept, written by a scatter. Kept positions past `rows` would be
    left out, so `rows` must bound the count: the trainer's comes from the model's `loss_positions`, a bound
    tested per model (tests/test_step_graph.py)."""
    n = keep.shape[0]
    rank = torch.cumsum(keep, 0) - 1  # a kept position's slot
    slot = torch.where(keep, rank, rows).clamp_max(rows)  # the rest, and any overflow, to a spare slot
    where = torch.zeros(rows + 1, dtype=torch.long, device=keep.device)
    where.scatter_(0, slot, torch.arange(n, device=keep.device))  # the spare slot takes any of the rest
    count = rank[-1] + 1 if n else torch.zeros((), dtype=torch.long, device=keep.device)
    return where[:rows], torch.arange(rows, device=keep.device) < count


def cross_entropy_at_positions(h: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor,
                               rows: int = 0, **kwargs) -> torch.Tensor:
    """`linear_cross_entropy` at the positions of a fixed-shape batch (`train.cuda_graph`), its mean over the
    positions `keep` marks: h (B, L, D), ids (B, L) 1-based item ids (class = id - 1; any id where `keep` is
    False), keep (B, L) bool; `bias`, `table`, `index` (B·L,) as `linear_cross_entropy` takes them.

    `rows` (0: every position) < B·L computes the loss on that many rows only: the kept positions gathered
    first (`kept_first`), the rest of the slots masked. The same mean; `rows` must bound the kept count
    (`Batch.loss_rows`, from the epoch's plan: recsys/step_graph.py)."""
    flat_h, flat_ids, flat_keep = h.flatten(0, 1), (ids - 1).clamp_min(0).flatten(), keep.flatten()
    if 0 < rows < flat_keep.shape[0]:
        where, filled = kept_first(flat_keep, rows)
        flat_h, flat_ids = flat_h.index_select(0, where), flat_ids.index_select(0, where)
        flat_keep = filled & flat_keep.index_select(0, where)
        if kwargs.get("index") is not None:
            kwargs["index"] = kwargs["index"].index_select(0, where)
    return linear_cross_entropy(flat_h, weight, flat_ids, mask=flat_keep, **kwargs)
