"""The chunked full-softmax loss equals autograd's cross-entropy, in value and in every gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.models import losses
from recsys.models.losses import linear_cross_entropy


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_table", [False, True])
def test_matches_autograd_cross_entropy(monkeypatch, with_bias: bool, with_table: bool) -> None:
    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", 7 * 13)  # 7 rows per chunk: several chunks, a ragged last
    g = torch.Generator().manual_seed(0)
    n, d, c, groups = 40, 8, 13, 5
    h = torch.randn(n, d, generator=g, dtype=torch.float64).float().requires_grad_()
    w = torch.randn(c, d, generator=g).requires_grad_()
    b = torch.randn(c, generator=g).requires_grad_() if with_bias else None
    t = torch.randn(groups, c, generator=g).requires_grad_() if with_table else None
    idx = torch.randint(0, groups, (n,), generator=g) if with_table else None
    y = torch.randint(0, c, (n,), generator=g)

    ours = linear_cross_entropy(h, w, y, bias=b, table=t, index=idx)
    (ours * 3.0).backward()  # a non-unit upstream gradient must scale every gradient
    got = [x.grad.clone() for x in (h, w, b, t) if x is not None]
    for x in (h, w, b, t):
        if x is not None:
            x.grad = None

    logits = h @ w.T + (b if b is not None else 0) + (t[idx] if t is not None else 0)
    ref = F.cross_entropy(logits, y)
    (ref * 3.0).backward()
    want = [x.grad for x in (h, w, b, t) if x is not None]

    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)


def test_rejects_mismatched_shapes_and_empty_input() -> None:
    with pytest.raises(ValueError, match="shapes"):
        linear_cross_entropy(torch.zeros(3, 4), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="table and index"):
        linear_cross_entropy(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long),
                             table=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="at least one row"):
        linear_cross_entropy(torch.zeros(0, 4), torch.zeros(5, 4), torch.zeros(0, dtype=torch.long))


def test_the_chunk_is_sized_per_device_and_an_override_wins(monkeypatch) -> None:
    """4M logits on a CPU (memory-bound there), 64M on CUDA (each chunk is ~50 operator launches the GPU
    waits for: benchmarks/step_ops.py); `_CHUNK_ELEMENTS` (tests, bench_step.py) sizes it on every device."""
    assert losses.chunk_elements(torch.device("cpu")) == 1 << 22
    assert losses.chunk_elements(torch.device("cuda")) == 1 << 26
    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", 91)
    assert losses.chunk_elements(torch.device("cpu")) == losses.chunk_elements(torch.device("cuda")) == 91


def test_one_chunk_and_many_give_the_same_loss_and_gradients(monkeypatch) -> None:
    """The device's chunk size changes how many rows a chunk holds, never the result."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(50, 8, generator=g).requires_grad_()
    w = torch.randn(11, 8, generator=g).requires_grad_()
    y = torch.randint(0, 11, (50,), generator=g)
    results = []
    for elements in (11 * 3, 11 * 50):  # 17 chunks; one chunk
        monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", elements)
        h.grad = w.grad = None
        loss = linear_cross_entropy(h, w, y)
        loss.backward()
        results.append((loss.detach(), h.grad.clone(), w.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_table", [False, True])
def test_a_mask_gives_the_loss_and_gradients_of_its_rows_alone(monkeypatch, with_bias: bool,
                                                                with_table: bool) -> None:
    """`mask` (the fixed-shape batch of `train.cuda_graph`): the loss over every row with some masked out is
    the loss over the kept rows selected first, in value and in every gradient; masked rows get none."""
    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", 7 * 13)
    g = torch.Generator().manual_seed(1)
    n, d, c, groups = 40, 8, 13, 5
    h = torch.randn(n, d, generator=g).requires_grad_()
    w = torch.randn(c, d, generator=g).requires_grad_()
    b = torch.randn(c, generator=g).requires_grad_() if with_bias else None
    t = torch.randn(groups, c, generator=g).requires_grad_() if with_table else None
    idx = torch.randint(0, groups, (n,), generator=g) if with_table else None
    y = torch.randint(0, c, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.6
    assert 0 < int(keep.sum()) < n

    masked = linear_cross_entropy(h, w, y, bias=b, table=t, index=idx, mask=keep)
    (masked * 2.0).backward()
    got = [x.grad.clone() for x in (h, w, b, t) if x is not None]
    for x in (h, w, b, t):
        if x is not None:
            x.grad = None
    selected = linear_cross_entropy(h[keep], w, y[keep], bias=b, table=t,
                                    index=None if idx is None else idx[keep])
    (selected * 2.0).backward()
    want = [x.grad for x in (h, w, b, t) if x is not None]

    torch.testing.assert_close(masked, selected, rtol=1e-5, atol=1e-6)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)
    assert torch.all(got[0][~keep] == 0)


def test_a_mask_that_keeps_nothing_gives_zero_not_nan() -> None:
    h = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(5, 3, requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.zeros(4, dtype=torch.long), mask=torch.zeros(4, dtype=torch.bool))
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.all(h.grad == 0) and torch.all(w.grad == 0)


def test_a_mask_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="mask has shape"):
        linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long),
                             mask=torch.ones(3, dtype=torch.bool))


def test_a_masked_row_that_is_not_finite_changes_nothing() -> None:
    """A fixed-shape batch reads rows the selected one never does (padding, MOJITO's prefix-0 table rows); a
    NaN or inf there must not reach the loss or any gradient (NaN · 0 is NaN: masking selects, not scales)."""
    g = torch.Generator().manual_seed(2)
    n, d, c, groups = 12, 4, 7, 4
    h = torch.randn(n, d, generator=g)
    w = torch.randn(c, d, generator=g, requires_grad=True)
    b = torch.randn(c, generator=g, requires_grad=True)
    t = torch.randn(groups, c, generator=g)
    idx = torch.randint(0, groups - 1, (n,), generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    keep = torch.ones(n, dtype=torch.bool)
    keep[[0, 5]] = False
    idx[[0, 5]] = groups - 1  # the last table row is read by masked rows only
    results = []
    for poison in (False, True):
        hp, tp = h.clone(), t.clone()
        if poison:
            hp[5] = float("nan")
            tp[groups - 1] = float("inf")
        hp.requires_grad_()
        tp.requires_grad_()
        loss = linear_cross_entropy(hp, w, y, bias=b, table=tp, index=idx, mask=keep)
        loss.backward()
        results.append((loss.detach(), hp.grad, tp.grad, w.grad.clone(), b.grad.clone()))
        w.grad, b.grad = None, None
    clean, poisoned = results
    assert torch.isfinite(poisoned[0]) and all(torch.isfinite(x).all() for x in poisoned[1:])
    for a, e in zip(poisoned, clean):
        torch.testing.assert_close(a, e)
    assert torch.all(poisoned[1][[0, 5]] == 0) and torch.all(poisoned[2][groups - 1] == 0)
