"""The CPU's dropout (recsys/models/dropout.py) and the attention that uses it (attend_with_dropout)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.models.blocks import attend_with_dropout, attention_mask
from recsys.models.dropout import Dropout, dropout, keep_threshold


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_each_of_the_four_16_bit_lanes_keeps_1_minus_p_and_the_kept_values_are_scaled_unbiased(p):
    """Every element reads its own 16 bits of a 64-bit draw; an int64 `random_()` leaves the top bit 0, which
    would keep every fourth element far more often than 1 − p: each lane is checked on its own."""
    torch.manual_seed(0)
    n = 1 << 20
    y = dropout(torch.ones(n), p, True)
    kept = (y != 0).float().view(-1, 4)
    sd = (p * (1 - p) / kept.shape[0]) ** 0.5
    for lane in range(4):
        assert abs(kept[:, lane].mean().item() - (1 - p)) < 5 * sd, lane
    assert y.unique().tolist() == [0.0, pytest.approx((1 << 16) / keep_threshold(p), rel=1e-7)]
    assert abs(y.mean().item() - 1.0) < 5 * (p / (1 - p) / n) ** 0.5  # E[y] = 1: unbiased as nn.Dropout


def test_keep_probability_is_within_2_to_the_minus_17_of_1_minus_p():
    for p in (0.05, 0.1, 0.2, 0.3, 1 / 3, 0.5, 0.9):
        assert abs(keep_threshold(p) / 65536 - (1 - p)) <= 2 ** -17


def test_the_same_seed_draws_the_same_masks_and_backward_uses_the_forward_mask():
    x = torch.randn(3, 50, 7, requires_grad=True)
    torch.manual_seed(5)
    a = dropout(x, 0.3, True)
    torch.manual_seed(5)
    b = dropout(x, 0.3, True)
    assert torch.equal(a, b)
    (a * 2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * a.detach() / x.detach(), rtol=1e-5, atol=1e-6)  # d(x·m)/dx = m
    assert not torch.equal(dropout(x, 0.3, True), a)  # and the generator moves on


def test_eval_mode_p_zero_and_tiny_p_are_the_identity_and_p_one_drops_everything():
    x = torch.randn(64, 8)
    layer = Dropout(0.5).eval()
    assert layer(x) is x
    assert dropout(x, 0.0, True) is x
    assert dropout(x, 1e-7, True) is x  # under 2⁻¹⁷: every element kept, with scale 1
    assert torch.count_nonzero(dropout(x, 1.0, True)) == 0
    assert Dropout(0.25).p == 0.25 and not list(Dropout(0.25).parameters())  # checkpoints unchanged


def test_dropout_keeps_the_input_dtype():
    x = torch.ones(1000, dtype=torch.bfloat16)
    assert dropout(x, 0.2, True).dtype == torch.bfloat16


@pytest.mark.parametrize("last_only", [False, True])
def test_attention_with_dropout_is_sdpa_when_nothing_is_dropped(last_only):
    """The training path's attention on a CPU is SDPA's math: at a rate that keeps everything (p under
    2⁻¹⁷) it must equal `scaled_dot_product_attention`, padding and causality included."""
    torch.manual_seed(1)
    items = torch.tensor([[0, 0, 3, 5, 2], [4, 1, 2, 2, 7]])
    mask = attention_mask(items, causal=True)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    if last_only:
        q, mask = q[:, :, -1:], mask[:, :, -1:]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(attend_with_dropout(q, k, v, mask, 1e-7), want, rtol=1e-5, atol=1e-6)


def test_attention_dropout_drops_weights_not_rows():
    """Dropping attention weights at rate p leaves each query's output a rescaled subset of the values:
    with v = 1 everywhere, each output is the kept weights' sum · scale, 1 on average."""
    torch.manual_seed(2)
    items = torch.arange(1, 65).repeat(256, 1)
    mask = attention_mask(items, causal=False)
    q, k = torch.randn(256, 1, 64, 8), torch.randn(256, 1, 64, 8)
    out = attend_with_dropout(q, k, torch.ones(256, 1, 64, 8), mask, 0.5)
    assert out.std().item() > 0.05  # weights were dropped
    assert abs(out.mean().item() - 1.0) < 0.02
