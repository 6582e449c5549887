"""Behaviour of every registered model: contract, overfitting, checkpoints, causality, padding, time."""

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from recsys.model_configs import MODEL_CONFIGS
from recsys.model_configs import TRAINABLE as TRAINABLE_FLAGS
from recsys.models import MODELS, build_model, config_from_dict
from recsys.models.base import Batch
from recsys.models.bert4rec import BERT4RecConfig, full_sequences
from recsys.models.blocks import newest

N_ITEMS, N_USERS, L = 30, 6, 12
ALL = sorted(MODELS)
TRAINABLE = [n for n in ALL if MODELS[n].trainable]
CAUSAL = [n for n in ("sasrec", "mojito") if n in MODELS]
DAY = 86_400
T0 = 1_000_000_000  # 2001-09-09


def test_the_torch_free_model_table_matches_the_models():
    """params.yaml is parsed from recsys.model_configs (no torch); it must name exactly the models there are,
    with the same `trainable` flag each class has."""
    assert MODEL_CONFIGS.keys() == MODELS.keys() == TRAINABLE_FLAGS.keys()
    assert {name: cls.trainable for name, cls in MODELS.items()} == TRAINABLE_FLAGS


def tiny_config(name: str, **overrides):
    cls = config_from_dict(name, {}).__class__
    known = {f.name for f in dataclasses.fields(cls)}
    small = {
        "dim": 16,
        "n_layers": 2,
        "n_heads": 2,
        "dropout": 0.1,
        "max_len": L,
        "ffn_dim": 32,
        "fism_items": 4,
    }
    small.update(overrides)
    return cls(**{k: v for k, v in small.items() if k in known})


def make_model(name: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = build_model(name, tiny_config(name, **overrides), n_items=N_ITEMS, n_users=N_USERS)
    if not model.trainable:
        model.fit_statistics(
            torch.randint(1, N_ITEMS + 1, (200,), generator=torch.Generator().manual_seed(seed))
        )
    return model


def sequences(B: int = 4, seed: int = 0, min_len: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L + 1) left-padded item sequences and their UTC times (irregular gaps, 0 at padding)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, L + 2, (B,), generator=g)
    lengths[0] = L + 1  # one full row
    items = torch.randint(1, N_ITEMS + 1, (B, L + 1), generator=g)
    live = torch.arange(L + 1)[None, :] >= (L + 1 - lengths[:, None])
    gaps = torch.randint(60, 3 * DAY, (B, L + 1), generator=g)
    times = T0 + gaps.cumsum(1)
    return items * live, times * live


def train_batch(seq: torch.Tensor, times: torch.Tensor) -> Batch:
    B = seq.shape[0]
    return Batch(
        items=seq[:, :-1],
        times=times[:, :-1],
        users=torch.arange(1, B + 1) % (N_USERS + 1),
        targets=seq[:, 1:],
        target_times=times[:, 1:],
    )


def eval_batch(seq: torch.Tensor, times: torch.Tensor, next_time: torch.Tensor | None = None) -> Batch:
    """Inputs = the whole `seq`; the event being predicted comes after it."""
    B = seq.shape[0]
    nt = times[:, -1] + 3600 if next_time is None else next_time
    return Batch(items=seq, times=times, users=torch.arange(1, B + 1) % (N_USERS + 1), next_time=nt)


def left_pad(t: torch.Tensor, extra: int) -> torch.Tensor:
    return torch.cat([torch.zeros(t.shape[0], extra, dtype=t.dtype), t], dim=1)


@pytest.mark.parametrize("name", ALL)
def test_score_contract(name):
    model = make_model(name).eval()
    seq, times = sequences()
    with torch.no_grad():
        scores = model.score(eval_batch(seq[:, 1:], times[:, 1:]))
    assert scores.shape == (4, N_ITEMS + 1)
    assert torch.isneginf(scores[:, 0]).all()
    assert torch.isfinite(scores[:, 1:]).all()


@pytest.mark.parametrize("name", TRAINABLE)
def test_overfits_one_batch(name):
    model = make_model(name, dropout=0.0, mask_prob=0.3, last_item_share=0.3)
    seq, times = sequences(B=4, seed=1, min_len=6)
    batch = train_batch(seq, times)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    first = model.loss(batch).item()
    for _ in range(200):
        loss = model.loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    assert loss.item() < 0.2 * first
    # The last training target is predicted, at rank 1, from the history before it.
    model.eval()
    with torch.no_grad():
        scores = model.score(eval_batch(seq[:, :-1], times[:, :-1], next_time=times[:, -1]))
    assert (scores.argmax(1) == seq[:, -1]).all()


@pytest.mark.parametrize("name", ALL)
def test_checkpoint_round_trip(name, tmp_path):
    model = make_model(name)
    if model.trainable:  # move away from the initialisation so that every tensor matters
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(3):
            loss = model.loss(train_batch(*sequences()))
            opt.zero_grad()
            loss.backward()
            opt.step()
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "model.json").write_text(
        json.dumps({"model": name, "config": dataclasses.asdict(model.config)})
    )

    meta = json.loads((tmp_path / "model.json").read_text())
    rebuilt = build_model(meta["model"], config_from_dict(meta["model"], meta["config"]), N_ITEMS, N_USERS)
    rebuilt.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    assert rebuilt.config == model.config
    batch = eval_batch(*sequences(seed=3))
    with torch.no_grad():
        assert torch.equal(model.eval().score(batch), rebuilt.eval().score(batch))


@pytest.mark.parametrize("name", ALL)
def test_extra_left_padding_changes_nothing(name):
    model = make_model(name).eval()
    seq, times = sequences(B=4, seed=4, min_len=2)
    short, short_t = seq[:, 5:], times[:, 5:]  # shorter than max_len, so padding fits
    padded = eval_batch(left_pad(short, 4), left_pad(short_t, 4), next_time=times[:, -1] + 60)
    with torch.no_grad():
        a = model.score(eval_batch(short, short_t, next_time=times[:, -1] + 60))
        b = model.score(padded)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _later_changed(seq: torch.Tensor, times: torch.Tensor, t: int):
    g = torch.Generator().manual_seed(9)
    seq2, times2 = seq.clone(), times.clone()
    live = seq2[:, t + 1 :] > 0
    seq2[:, t + 1 :] = torch.where(live, torch.randint(1, N_ITEMS + 1, live.shape, generator=g), 0)
    times2[:, t + 1 :] += live * 7 * 3600
    return seq2, times2


@pytest.mark.parametrize("name", CAUSAL)
def test_outputs_do_not_depend_on_later_items(name):
    model = make_model(name).eval()
    seq, times = sequences(B=4, seed=5)
    a, b = train_batch(seq, times), train_batch(*_later_changed(seq, times, t=6))
    # Same target times up to t, so per-position scores must match there too.
    b.target_times[:, :7] = a.target_times[:, :7]
    with torch.no_grad():
        ha, hb = model(a), model(b)
        torch.testing.assert_close(ha[:, :7], hb[:, :7])
        assert not torch.allclose(ha[:, 8:], hb[:, 8:])
        if name == "mojito":  # the long-term FISM part included
            sa, sb = model.sequence_scores(a), model.sequence_scores(b)
            torch.testing.assert_close(sa[:, :7], sb[:, :7])


@pytest.mark.parametrize("name", CAUSAL)
def test_full_softmax_loss_is_cross_entropy_of_the_ranked_scores(name):
    """The chunked training loss (losses.py) is exactly CE over the scores that evaluation ranks."""
    model = make_model(name).eval()  # eval: no dropout, MOJITO's deterministic FISM sample
    batch = train_batch(*sequences(B=4, seed=8))
    keep = batch.targets > 0
    loss = model.loss(batch)
    with torch.no_grad():
        ref = F.cross_entropy(model.sequence_scores(batch)[keep], batch.targets[keep])
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-5, atol=1e-5)
    loss.backward()
    assert model.item_emb.weight.grad[1:].abs().sum() > 0


@pytest.mark.parametrize("name,residual", [("sasrec", None), ("bert4rec", None), ("bert4rec", "reference"),
                                           ("mojito", "pre_ln"), ("mojito", "reference")])
def test_scoring_shortcut_equals_the_full_encoder(name, residual):
    """Scoring runs the final block for the newest position only; that must change nothing."""
    model = make_model(name, **({"residual": residual} if residual else {})).eval()
    batch = eval_batch(*sequences(B=4, seed=9))
    inputs = model.append_mask(batch.items) if name == "bert4rec" else batch
    with torch.no_grad():  # BERT4Rec names the positions (its loss computes the masked ones only)
        full = model(inputs)
        last = model(inputs, newest(inputs)) if name == "bert4rec" else model(inputs, last_only=True)
    assert last.shape == (4, 1, full.shape[-1])
    torch.testing.assert_close(last[:, 0], full[:, -1])


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                    reason="needs CUDA (run in a GPU session)"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("head_norm", [False, True])
def test_bert4rec_loss_is_cross_entropy_at_the_masked_positions(head_norm, device):
    """The loss runs the final block for the masked positions only (rows masking different counts, padding
    included); its value and every parameter's gradient are those of the whole encoder read there."""
    model = make_model("bert4rec", head_norm=head_norm).eval().to(device)
    batch = train_batch(*sequences(B=4, seed=8)).to(device)
    shapes = []
    model.blocks[-1].register_forward_hook(lambda module, args, out: shapes.append(out.shape))
    torch.manual_seed(3)
    loss = model.loss(batch)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    torch.manual_seed(3)
    seq = full_sequences(batch, L)
    masked = model.cloze_mask(seq)
    assert masked.sum(1).unique().numel() > 1  # the rows' masked counts differ: filler slots are exercised
    assert shapes[0][1] == masked.sum(1).max() < seq.shape[1]  # the final block ran the masked slots only
    logits = model.output_logits(model(seq.masked_fill(masked, model.mask_id))[masked])
    want = F.cross_entropy(logits, seq[masked])
    torch.testing.assert_close(loss.detach(), want.detach(), rtol=1e-5, atol=1e-5)
    for got, ref in zip(grads, torch.autograd.grad(want, list(model.parameters()), allow_unused=True)):
        if ref is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)


def test_bert4rec_head_norm_normalises_the_output_transform():
    """`head_norm` (Sun et al.'s LayerNorm after the head's GELU): every transformed row has mean 0, sd 1."""
    hidden = torch.randn(6, tiny_config("bert4rec").dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        normed = make_model("bert4rec", head_norm=True).eval().transform(hidden)
        plain = make_model("bert4rec").eval().transform(hidden)
    torch.testing.assert_close(normed.mean(-1), torch.zeros(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.var(-1, unbiased=False), torch.ones(6), atol=1e-3, rtol=0)
    assert plain.mean(-1).abs().min() > 1e-3  # GELU's outputs are not centred: the knob changes the head


def test_bert4rec_attn_dropout_sets_the_attention_weights_dropout_alone():
    """`attn_dropout` (-1: `dropout`) drops attention weights only; the blocks' other dropouts keep `dropout`. At
    0 a training step's attention is the evaluation one (the fused kernel's), at 0.5 it is not."""
    same, off = make_model("bert4rec", dropout=0.3), make_model("bert4rec", dropout=0.3, attn_dropout=0.0)
    assert [b.attn.dropout for b in same.blocks] == [0.3, 0.3]
    assert [b.attn.dropout for b in off.blocks] == [0.0, 0.0]
    assert [b.ffn.dropout.p for b in off.blocks] == [0.3, 0.3] == [b.attn.resid_dropout.p for b in off.blocks]
    from recsys.models.blocks import MultiHeadSelfAttention, attention_mask
    x = torch.randn(3, L, 16, generator=torch.Generator().manual_seed(0))
    mask = attention_mask(torch.ones(3, L, dtype=torch.long), causal=False)
    for attn_dropout, deterministic in ((0.0, True), (0.5, False)):
        attn = MultiHeadSelfAttention(16, 2, dropout=0.0, attn_dropout=attn_dropout)
        with torch.no_grad():
            trained, evaluated = attn.train()(x, x, mask), attn.eval()(x, x, mask)
        assert torch.allclose(trained, evaluated, atol=1e-6) == deterministic
    for bad in (1.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="attn_dropout must be in \\[0, 1\\), or -1 for `dropout`"):
            BERT4RecConfig(attn_dropout=bad)


def test_a_bert4rec_resume_state_saved_before_attn_dropout_keeps_its_run_key():
    """The run key hashes the model's settings: the default (-1, the attention weights take `dropout`) must key
    as the config without the field did, so a run interrupted before the upgrade resumes after it; 0 is
    another run."""
    from recsys.config import TrainConfig
    from recsys.train_state import run_key

    config = tiny_config("bert4rec")
    fields = [(f.name, f.type, f.default) for f in dataclasses.fields(config) if f.name != "attn_dropout"]
    before = dataclasses.make_dataclass("BERT4RecConfig", fields, frozen=True)(
        **{name: getattr(config, name) for name, _, _ in fields})
    key = run_key("bert4rec", config, TrainConfig(), "data")
    assert key == run_key("bert4rec", before, TrainConfig(), "data")
    assert run_key("bert4rec", dataclasses.replace(config, attn_dropout=0.0), TrainConfig(), "data") != key


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "mojito"])
def test_an_unknown_residual_arrangement_is_refused(name):
    with pytest.raises(ValueError, match="residual must be 'reference' or 'pre_ln', got 'post_ln'"):
        MODEL_CONFIGS[name](residual="post_ln")


def test_bert4rec_outputs_depend_on_later_items():
    model = make_model("bert4rec").eval()
    seq, times = sequences(B=4, seed=5)
    seq2, _ = _later_changed(seq, times, t=6)
    with torch.no_grad():
        ha, hb = model(seq), model(seq2)
    live = seq[:, :7] > 0
    assert not torch.allclose(ha[:, :7][live], hb[:, :7][live])


def test_bert4rec_scores_through_an_appended_mask():
    model = make_model("bert4rec").eval()
    seq, times = sequences(B=4, seed=6)
    batch = eval_batch(seq[:, 1:], times[:, 1:])  # row 0 is exactly max_len long
    with torch.no_grad():
        scores = model.score(batch)
        inputs = torch.cat([batch.items, torch.full((4, 1), model.mask_id)], dim=1)[:, -L:]
        assert (inputs[:, -1] == N_ITEMS + 1).all()
        torch.testing.assert_close(scores, model.output_logits(model(inputs)[:, -1]))
        # At max_len the oldest item is dropped to make room for the mask.
        changed = batch.items.clone()
        changed[0, 0] = changed[0, 0] % N_ITEMS + 1
        changed[1, -1] = changed[1, -1] % N_ITEMS + 1
        other = model.score(eval_batch(changed, batch.times))
    torch.testing.assert_close(scores[0], other[0])
    assert not torch.allclose(scores[1], other[1])
    # The [mask] token is never a candidate.
    assert scores.shape[1] == N_ITEMS + 1


@pytest.mark.parametrize("max_len", [10, 4])
def test_bert4rec_sees_every_event_of_a_trainer_batch(max_len):
    """The trainer zeroes a target whose input is padding; the cloze sequence must still hold each span's
    first event (it was dropped for every span shorter than its batch's longest until session 7), and
    only the newest `max_len` of a longer span."""
    from recsys.sequences import SequenceData, TrainingTensors

    lengths = [7, 3, 5]
    items = np.concatenate([np.arange(1, n + 1) + 10 * r for r, n in enumerate(lengths)]).astype(np.int64)
    offsets = np.r_[0, np.cumsum(lengths)]
    data = SequenceData(n_items=40, n_users=3, offsets=offsets, items=items, times=items * 60,
                        roles=np.zeros(len(items), np.int8))
    spans = data.train_spans(max_len=max_len, windows="last")
    tensors = TrainingTensors(data, spans)
    seq = full_sequences(tensors.batch(torch.arange(3), int(tensors.lengths.max()) - 1), max_len=max_len)
    for r, n in enumerate(lengths):
        row = seq[r][seq[r] > 0].tolist()
        assert row == (np.arange(1, n + 1) + 10 * r).tolist()[-max_len:]


@pytest.mark.parametrize("masking", ["bernoulli", "exact"])
@pytest.mark.parametrize("mask_prob,share", [(0.2, 0.1), (0.5, 0.0), (0.05, 0.3)])
def test_bert4rec_loss_terms_are_the_expected_masked_positions(mask_prob, share, masking):
    """`loss_terms` (the weights of a step's micro-batches) is the mean number of positions `cloze_mask`
    masks in a span of n events, n capped at max_len — the fallback mask of an all-unmasked row included."""
    model = make_model("bert4rec", mask_prob=mask_prob, last_item_share=share, masking=masking)
    lengths = np.array([2, 3, 5, 9, 12, 30])  # events per span; max_len is L
    seq = torch.zeros(len(lengths), L, dtype=torch.long)
    for r, n in enumerate(np.minimum(lengths, L)):
        seq[r, L - n :] = torch.arange(1, n + 1)
    torch.manual_seed(0)
    draws = torch.stack([model.cloze_mask(seq).sum(1) for _ in range(4000)]).float().mean(0)
    expected = torch.from_numpy(model.loss_terms(lengths)).float()
    assert lengths.max() > L  # the cap is exercised
    torch.testing.assert_close(draws, expected, rtol=0.03, atol=0.03)


def test_bert4rec_exact_masking_masks_round_p_n_tokens_drawn_uniformly():
    """`masking: exact`: a random-mask row of n tokens masks exactly round(ρ·n) ≥ 1 of them, never padding,
    each token equally likely; a last-item-only row masks its newest token alone."""
    model = make_model("bert4rec", mask_prob=0.3, last_item_share=0.0, masking="exact")
    tokens = torch.tensor([1, 2, 3, 5, 7, L])  # round(0.3·n): 0 → 1, 1, 1, 2 (1.5 rounds up), 2, ...
    seq = torch.zeros(len(tokens), L, dtype=torch.long)
    for r, n in enumerate(tokens.tolist()):
        seq[r, L - n :] = torch.arange(1, n + 1)
    want = torch.from_numpy(model.exact_counts(tokens.numpy()))
    assert want[:4].tolist() == [1, 1, 1, 2]
    torch.manual_seed(0)
    total = torch.zeros(seq.shape)
    draws = 3000
    for _ in range(draws):
        masked = model.cloze_mask(seq)
        assert torch.equal(masked.sum(1), want) and not (masked & (seq == 0)).any()
        total += masked
    share = total / draws  # each of a row's n tokens: masked with probability k / n
    expected = (want / tokens).float()[:, None].expand_as(share)
    real = seq > 0
    torch.testing.assert_close(share[real], expected[real], rtol=0, atol=0.04)
    only_last = make_model("bert4rec", mask_prob=0.3, last_item_share=1.0, masking="exact").cloze_mask(seq)
    assert only_last[:, -1].all() and not only_last[:, :-1].any()
    empty = model.cloze_mask(torch.zeros(2, L, dtype=torch.long))
    assert not empty.any() and model.exact_counts(np.array([0])).tolist() == [0]


def test_bert4rec_masking_never_selects_padding():
    model = make_model("bert4rec", mask_prob=0.5, last_item_share=0.2)
    seq, times = sequences(B=64, seed=7, min_len=1)
    full = full_sequences(train_batch(seq, times), max_len=L)
    torch.testing.assert_close(full, seq[:, -L:])
    total = torch.zeros_like(full, dtype=torch.float)
    for _ in range(50):
        masked = model.cloze_mask(full)
        assert not (masked & (full == 0)).any()
        assert masked.any(dim=1).all()  # every row teaches something
        total += masked
    share = total.sum() / (50 * (full > 0).sum())
    assert 0.35 < share < 0.6  # ≈ 0.8·0.5 random + last-item-only rows
    last_only = make_model("bert4rec", last_item_share=1.0).cloze_mask(full)
    assert last_only[:, -1].all() and not last_only[:, :-1].any()


def test_bert4rec_sampled_loss_trains():
    model = make_model("bert4rec", loss="sampled_ce", n_negatives=8)
    loss = model.loss(train_batch(*sequences()))
    loss.backward()
    assert torch.isfinite(loss) and model.item_emb.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        BERT4RecConfig(mask_prob=0.0)
    with pytest.raises(ValueError, match="masking must be 'bernoulli' or 'exact', got 'random'"):
        BERT4RecConfig(masking="random")


@pytest.mark.parametrize("name", [n for n in ALL if n != "mojito"])
def test_time_agnostic_models_ignore_timestamps(name):
    model = make_model(name).eval()
    seq, times = sequences(seed=8)
    with torch.no_grad():
        a = model.score(eval_batch(seq, times))
        b = model.score(eval_batch(seq, times + (seq > 0) * 5 * 3600, next_time=times[:, -1] + 99 * DAY))
    torch.testing.assert_close(a, b)


def test_mojito_scores_depend_on_timestamps():
    model = make_model("mojito").eval()
    seq, times = sequences(seed=8)
    with torch.no_grad():
        a = model.score(eval_batch(seq, times))
        # Only the hours of the input events change: the ranking itself changes, not just a shift.
        b = model.score(eval_batch(seq, times + (seq > 0) * 5 * 3600, next_time=times[:, -1] + 3600))
        c = model.score(eval_batch(seq, times, next_time=times[:, -1] + 40 * DAY))
    finite = torch.isfinite(a)
    assert not torch.allclose(a[finite] - a[finite].mean(), b[finite] - b[finite].mean())
    assert not torch.allclose(a, c)


def test_mojito_bce_loss_unknown_users_and_noise():
    model = make_model("mojito", loss="bce")
    seq, times = sequences()
    batch = train_batch(seq, times)
    batch.users = torch.tensor([0, 1, N_USERS, N_USERS + 5])  # unknown and out-of-range users
    loss = model.loss(batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.sigma_noise.grad is not None and model.sigma_noise.grad.abs().sum() > 0
    assert model.user_emb.weight.grad[0].abs().sum() == 0  # row 0 stays the zero padding row
    model.eval()
    with torch.no_grad():
        assert torch.equal(model.score(eval_batch(seq, times)), model.score(eval_batch(seq, times)))
    no_long = make_model("mojito", long_weight=0.0)
    assert torch.isfinite(no_long.loss(train_batch(seq, times)))


@pytest.mark.parametrize("n_queries", [7, 1])
def test_mojito_mixture_attention_is_the_papers_two_maps_mixed_per_pair(n_queries):
    """The folded products of `MixtureAttention` compute the admixture as written: the items and context
    score maps, Linear(2→H), ReLU, Linear(H→H), scaled by 1/√d, masked, softmax, H value heads — for every
    query and for the newest query alone (scoring)."""
    from recsys.models.blocks import attention_mask
    from recsys.models.mojito import MixtureAttention

    torch.manual_seed(0)
    B, Lk, d, H = 3, 7, 8, 2
    attn = MixtureAttention(d, H, dropout=0.0).eval()
    kv, k_ctx = torch.randn(B, Lk, 2 * d), torch.randn(B, Lk, d)
    q, q_ctx = kv[:, -n_queries:], k_ctx[:, -n_queries:]
    items = torch.arange(1, B * Lk + 1).view(B, Lk)
    items[0, :3] = 0  # a padded row: its first three keys are hidden
    mask = attention_mask(items, causal=True)[:, :, -n_queries:]  # (B, 1, Lq, Lk)
    with torch.no_grad():
        got = attn(q, kv, q_ctx, k_ctx, mask, torch.zeros(2))
        maps = torch.stack([attn.q_item(q) @ attn.k_item(kv).transpose(1, 2),
                            attn.q_ctx(q_ctx) @ attn.k_ctx(k_ctx).transpose(1, 2)], dim=-1)  # (B, Lq, Lk, 2)
        heads = attn.mix2(F.relu(attn.mix1(maps))).permute(0, 3, 1, 2) / d**0.5  # (B, H, Lq, Lk)
        p = heads.masked_fill(~mask, float("-inf")).softmax(-1)
        v = attn.value(kv).view(B, Lk, H, 2 * d // H).transpose(1, 2)
        want = (p @ v).transpose(1, 2).reshape(B, n_queries, 2 * d)
    torch.testing.assert_close(got, want)


def test_mojito_reference_residuals_are_causal_and_train():
    model = make_model("mojito", residual="reference")
    seq, times = sequences(B=4, seed=5)
    assert torch.isfinite(model.loss(train_batch(seq, times)))
    model.eval()
    with torch.no_grad():
        a = model(train_batch(seq, times))
        b = model(train_batch(*_later_changed(seq, times, t=6)))
    torch.testing.assert_close(a[:, :7], b[:, :7])


def test_a_bert4rec_checkpoint_from_before_residual_and_head_norm_loads_as_it_was_trained():
    """params.yaml trains `residual: reference` with `head_norm`, but a checkpoint config saved before those keys
    existed was a pre-LN model without the head LayerNorm: it must load as that, not as today's settings."""
    old = {"dim": 16, "n_layers": 1, "n_heads": 2, "dropout": 0.1, "max_len": 20, "ffn_dim": 32, "mask_prob": 0.3,
           "last_item_share": 0.25, "loss": "ce", "n_negatives": 8}
    config = config_from_dict("bert4rec", old)
    assert (config.residual, config.head_norm) == ("pre_ln", False)
    model = build_model("bert4rec", config, n_items=N_ITEMS, n_users=N_USERS)
    assert [block.attn.dropout for block in model.blocks] == [0.1]  # attention weights took `dropout` then
    assert not any(name.startswith("head_norm.") for name in model.state_dict())  # no weights it never had
    today = build_model("bert4rec", config_from_dict("bert4rec", {**old, "head_norm": True}), N_ITEMS, N_USERS)
    assert {"head_norm.weight", "head_norm.bias"} <= set(today.state_dict())
