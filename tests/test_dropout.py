"""recsys/models/dropout.py: the CPU's cheap dropout mask is a dropout, and attention with it is the attention
`scaled_dot_product_attention` computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.models import dropout as d


def test_the_mask_keeps_one_minus_p_of_the_elements_and_scales_them_back():
    torch.manual_seed(0)
    x = torch.randn(64, 2, 100, 100)
    y = d.dropout(x, 0.2)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.8) < 0.002  # 1.28M draws: sd 0.00035
    assert torch.allclose(y[kept], x[kept] * (65536 / (65536 - 13107)))  # p̂ = 13107 / 2^16
    # every position of a word's four 16-bit draws is used: no stripe of the tensor is all kept or all dropped
    stripes = kept.view(-1, 4).float().mean(0)
    assert torch.all((stripes - 0.8).abs() < 0.005), stripes


def test_the_gradient_passes_through_exactly_the_kept_elements_with_their_scale():
    torch.manual_seed(1)
    x = torch.randn(3000, requires_grad=True)
    y = d.dropout(x, 0.3)
    y.backward(torch.ones_like(y))
    scale = 65536 / (65536 - round(0.3 * 65536))
    assert torch.equal(x.grad != 0, y != 0)
    assert torch.allclose(x.grad[y != 0], torch.full_like(x.grad[y != 0], scale))


def test_a_seed_gives_the_same_mask_and_eval_mode_or_p_0_is_the_identity():
    x = torch.randn(50, 40)
    torch.manual_seed(7)
    a = d.dropout(x, 0.5)
    torch.manual_seed(7)
    assert torch.equal(a, d.dropout(x, 0.5))
    assert not torch.equal(a, d.dropout(x, 0.5))  # the generator moved on
    layer = d.Dropout(0.5).eval()
    assert layer(x) is x or torch.equal(layer(x), x)
    assert torch.equal(d.dropout(x, 0.0), x)
    assert torch.equal(d.dropout(x, 1.0), torch.zeros_like(x))  # PyTorch's own answer at the bounds
    with pytest.raises(ValueError, match="between 0 and 1"):
        d.Dropout(1.5)


def _qkv_mask(seed: int = 3):
    torch.manual_seed(seed)
    q, k, v = (torch.randn(4, 2, 9, 8) for _ in range(3))
    mask = torch.ones(9, 9, dtype=torch.bool).tril().expand(4, 1, 9, 9).clone()
    mask[0, :, :, :3] = False  # left padding in row 0: its first queries attend to themselves only
    mask[0, :, :3, :3] = torch.eye(3, dtype=torch.bool)
    return q, k, v, mask


def test_attention_without_dropout_is_scaled_dot_product_attention():
    q, k, v, mask = _qkv_mask()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(d.attention(q, k, v, mask, 0.0), want, atol=1e-6)


def test_attention_with_dropout_drops_the_softmax_weights_with_the_cpu_mask():
    q, k, v, mask = _qkv_mask()
    torch.manual_seed(11)
    got = d.attention(q, k, v, mask, 0.25)
    weights = torch.softmax((q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~mask, float("-inf")), dim=-1)
    torch.manual_seed(11)
    keep, scale = d._keep_mask(weights.shape, 0.25, weights.device)
    want = (weights * keep * scale) @ v
    assert torch.allclose(got, want, atol=1e-6)
    # and it is a dropout of the weights: averaged over many draws, the attention without it
    torch.manual_seed(12)
    mean = torch.stack([d.attention(q, k, v, mask, 0.25) for _ in range(4000)]).mean(0)
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (mean - exact).abs().max() < 0.1  # sd of a mean of 4,000 draws here ≤ 0.02; an unscaled mask: 0.25
    assert (mean - 0.75 * exact).abs().max() > 0.2
