"""SASRec-specific behaviour: every loss trains, a removed loss is refused with its reason, causality, padding invariance,
overfitting one batch. (The cross-model contract is parametrised in tests/test_models.py.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from recsys.metrics import target_rank
from recsys.models.base import Batch
from recsys.models.sasrec import SASRec, SASRecConfig, positions_from_end, sampled_logits

N_ITEMS = 20
LOSSES = ["ce", "bce", "sampled_ce"]


def make_model(seed: int = 0, **overrides) -> SASRec:
    torch.manual_seed(seed)
    cfg = {"dim": 16, "n_layers": 2, "n_heads": 2, "dropout": 0.0, "max_len": 12, "loss": "ce", "n_negatives": 8}
    return SASRec(SASRecConfig(**{**cfg, **overrides}), n_items=N_ITEMS, n_users=5)


def chain_batch() -> Batch:
    """Four left-padded sequences walking a chain (next = current + 1); targets are inputs shifted by one."""
    seqs = [[1, 2, 3, 4, 5, 6, 7], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [15, 16, 17, 18]]
    width = max(map(len, seqs)) - 1
    items = torch.zeros(len(seqs), width, dtype=torch.long)
    targets = torch.zeros_like(items)
    for r, s in enumerate(seqs):
        items[r, width - len(s) + 1 :] = torch.tensor(s[:-1])
        targets[r, width - len(s) + 1 :] = torch.tensor(s[1:])
    return Batch(items=items, times=torch.zeros_like(items), users=torch.arange(1, 5), targets=targets,
                 target_times=torch.zeros_like(items))


def eval_batch_of(items: list[list[int]]) -> Batch:
    t = torch.tensor(items)
    return Batch(items=t, times=torch.zeros_like(t), users=torch.ones(len(items), dtype=torch.long))


@pytest.mark.parametrize("loss", LOSSES)
def test_each_loss_is_finite_and_trains_down(loss):
    model = make_model(loss=loss)
    batch = chain_batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def fixed_loss() -> float:  # same sampled negatives before and after training
        torch.manual_seed(123)
        with torch.no_grad():
            return model.loss(batch).item()

    before = fixed_loss()
    assert math.isfinite(before) and before > 0
    for _ in range(40):
        value = model.loss(batch)
        assert torch.isfinite(value)
        opt.zero_grad()
        value.backward()
        opt.step()
    after = fixed_loss()
    assert after < 0.5 * before, (loss, before, after)


def test_ce_loss_is_full_softmax_over_items():
    model = make_model().eval()
    batch = chain_batch()
    hidden = model(batch)
    keep = batch.targets > 0
    logits = hidden[keep] @ model.item_emb.weight.T
    logits[:, 0] = float("-inf")  # padding is never a class
    expected = F.cross_entropy(logits, batch.targets[keep])
    assert model.loss(batch).item() == pytest.approx(expected.item(), rel=1e-5)


def test_sampled_logits_mask_negatives_equal_to_target():
    hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    emb = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, -1.0], [-1.0, 3.0]])
    shared = sampled_logits(hidden, emb, torch.tensor([1, 3]), torch.tensor([2, 3]))
    assert shared.tolist() == [[1.0, 2.0, -1.0], [6.0, -2.0, float("-inf")]]
    per_row = sampled_logits(hidden, emb, torch.tensor([1, 3]), torch.tensor([[1, 2], [1, 1]]))
    assert per_row.tolist() == [[1.0, float("-inf"), 2.0], [6.0, 2.0, 2.0]]


def test_the_removed_gbce_loss_is_refused_with_its_reason_and_old_checkpoints_still_load():
    """gBCE was removed (0.64 × full CE, benchmarks/RESULTS.md): params.yaml naming it stops with the reason;
    a checkpoint config saved before the removal (it carried gbce_t) still loads unless it was trained with
    gBCE."""
    from recsys.config import ConfigError, build_dataclass
    from recsys.models import config_from_dict

    with pytest.raises(ConfigError, match=r"sasrec.loss: 'gbce' no longer exists: .*0\.64 x"):
        build_dataclass(SASRecConfig, {"loss": "gbce"}, "sasrec")
    with pytest.raises(ConfigError, match=r"sasrec.gbce_t no longer exists: .*use loss ce"):
        build_dataclass(SASRecConfig, {"gbce_t": 0.75}, "sasrec")
    old = {"dim": 16, "n_heads": 2, "loss": "ce", "n_negatives": 256, "gbce_t": 0.75}
    assert config_from_dict("sasrec", old) == SASRecConfig(dim=16, n_heads=2)
    with pytest.raises(ValueError, match=r"trained with loss='gbce', which no longer exists .*train the model again"):
        config_from_dict("sasrec", {**old, "loss": "gbce"})


def test_positions_count_from_the_newest():
    assert positions_from_end(torch.zeros(2, 4, dtype=torch.long)).tolist() == [[3, 2, 1, 0]] * 2


ARRANGEMENTS = [{"residual": "reference"}, {"residual": "pre_ln"}, {"weight_init": "xavier", "emb_scale": False}]


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_causality(arrangement):
    """Changing a later item never changes an earlier output (eval mode)."""
    model = make_model(**arrangement).eval()
    items = torch.tensor([[3, 7, 1, 9, 4, 12, 5, 8]])
    base = model(eval_batch_of(items.tolist()))
    for pos in range(items.shape[1]):
        changed = items.clone()
        changed[0, pos] = 19
        out = model(eval_batch_of(changed.tolist()))
        torch.testing.assert_close(out[:, :pos], base[:, :pos], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, pos], base[:, pos])


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_padding_invariance(arrangement):
    model = make_model(**arrangement).eval()
    short = model.score(eval_batch_of([[3, 7, 1, 9]]))
    padded = model.score(eval_batch_of([[0, 0, 0, 0, 0, 3, 7, 1, 9]]))
    torch.testing.assert_close(padded, short, rtol=1e-5, atol=1e-5)
    # Also in a batch next to a longer sequence.
    mixed = model.score(eval_batch_of([[0, 0, 3, 7, 1, 9], [4, 5, 6, 7, 8, 9]]))
    torch.testing.assert_close(mixed[:1], short, rtol=1e-5, atol=1e-5)


def test_inputs_longer_than_max_len_use_the_newest_items():
    model = make_model(max_len=4).eval()
    long = model.score(eval_batch_of([[11, 12, 13, 3, 7, 1, 9]]))
    torch.testing.assert_close(long, model.score(eval_batch_of([[3, 7, 1, 9]])))


def test_score_shape_and_padding_column():
    model = make_model().eval()
    scores = model.score(eval_batch_of([[1, 2], [0, 3]]))
    assert scores.shape == (2, N_ITEMS + 1)
    assert torch.isneginf(scores[:, 0]).all() and torch.isfinite(scores[:, 1:]).all()


@pytest.mark.parametrize("loss,arrangement", [("ce", {}), ("sampled_ce", {}), ("ce", {"residual": "pre_ln"}),
                                               ("ce", {"weight_init": "xavier", "emb_scale": False})])
def test_overfits_one_batch(loss, arrangement):
    """After enough steps on one batch, each sequence's next item ranks first among all items."""
    model = make_model(loss=loss, n_negatives=19, **arrangement)
    batch = chain_batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        model.loss(batch).backward()
        opt.step()
    model.eval()
    # Predict the last target of each row from its full input.
    scores = model.score(Batch(items=batch.items, times=batch.times, users=batch.users))
    last_targets = batch.targets[:, -1]
    candidates = torch.ones_like(scores, dtype=torch.bool)
    candidates[:, 0] = False
    assert target_rank(scores, last_targets, candidates).tolist() == [1, 1, 1, 1]


def test_dropout_is_off_in_eval_mode():
    model = make_model(dropout=0.5).eval()
    batch = eval_batch_of([[3, 7, 1, 9]])
    torch.testing.assert_close(model.score(batch), model.score(batch), rtol=0, atol=0)


def test_reference_block_takes_keys_from_the_raw_input_and_adds_the_normalised_query():
    """x ← LN₁(x) + Attn(q=LN₁(x), k=v=x); x ← LN₂(x) + FFN(LN₂(x)), written out by hand."""
    from recsys.models.blocks import TransformerBlock, attention_mask, newest

    torch.manual_seed(0)
    block = TransformerBlock(8, 2, 0.0, ffn_dim=8, residual="reference").eval()
    with torch.no_grad():
        block.ln1.weight.uniform_(0.5, 1.5)  # non-trivial norms, so LN(x) ≠ x is visible
        block.ln1.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 8)
    items = torch.tensor([[1, 2, 3]])
    q = block.ln1(x)
    wq, wk, wv = block.attn.qkv.weight.split(8)
    bq, bk, bv = block.attn.qkv.bias.split(8)
    heads = lambda t: t.view(1, 3, 2, 4).transpose(1, 2)  # noqa: E731
    att = F.scaled_dot_product_attention(heads(q @ wq.T + bq), heads(x @ wk.T + bk), heads(x @ wv.T + bv),
                                         attn_mask=attention_mask(items, causal=True))
    h = q + block.attn.proj(att.transpose(1, 2).reshape(1, 3, 8))
    y = block.ln2(h)
    want = y + block.ffn(y)
    torch.testing.assert_close(block(x, attention_mask(items, causal=True)), want)
    torch.testing.assert_close(block(x, attention_mask(items, causal=True), newest(items)), want[:, -1:])


@pytest.mark.parametrize("residual", ["reference", "pre_ln"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_block_asked_for_some_positions_gives_exactly_their_outputs_and_gradients(residual, causal):
    """`queries` (any positions, any order, repeats, padding) computes those rows of the whole block's output,
    and the gradients reaching the input and every parameter are the whole block's read at those rows."""
    from recsys.models.blocks import TransformerBlock, attention_mask

    torch.manual_seed(4)
    block = TransformerBlock(8, 2, 0.0, ffn_dim=16, residual=residual).eval()
    items = torch.tensor([[0, 0, 3, 5, 2, 4], [4, 1, 2, 2, 7, 9]])
    mask = attention_mask(items, causal=causal)
    x = torch.randn(2, 6, 8, requires_grad=True)
    queries = torch.tensor([[5, 2, 4, 0], [1, 3, 3, 0]])
    part = block(x, mask, queries)
    full = block(x, mask).gather(1, queries[..., None].expand(-1, -1, 8))
    assert part.shape == (2, 4, 8)
    torch.testing.assert_close(part, full)
    weights = torch.randn(2, 4, 8)
    wrt = [x, *block.parameters()]
    for got, want in zip(torch.autograd.grad((part * weights).sum(), wrt),
                         torch.autograd.grad((full * weights).sum(), wrt)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_config_rejects_unknown_arrangements():
    with pytest.raises(ValueError, match="residual"):
        SASRecConfig(residual="post_ln")
    with pytest.raises(ValueError, match="weight_init"):
        SASRecConfig(weight_init="kaiming")
    with pytest.raises(ValueError, match=r"n_heads must be a divisor of dim \(10\), got 3"):
        SASRecConfig(dim=10, n_heads=3)


def test_item_dropout_drops_one_table_shared_by_inputs_and_outputs(monkeypatch):
    model = make_model(item_dropout=0.5)
    tables = []
    original = SASRec.item_table

    def spy(self):
        tables.append(original(self))
        return tables[-1]

    monkeypatch.setattr(SASRec, "item_table", spy)
    torch.manual_seed(0)
    loss = model.loss(chain_batch())
    assert torch.isfinite(loss) and len(tables) == 1  # one dropped table per step, inputs and outputs alike
    dropped = (tables[0] == 0).float().mean().item()
    assert 0.3 < dropped < 0.7  # about half the entries of the table are dropped while training
    model.eval()
    assert torch.equal(original(model), model.item_emb.weight)  # no dropout when scoring
    loss.backward()
    assert model.item_emb.weight.grad[0].abs().sum() == 0  # padding never learns


def test_item_dropout_is_validated():
    with pytest.raises(ValueError, match="item_dropout"):
        SASRecConfig(item_dropout=1.0)
