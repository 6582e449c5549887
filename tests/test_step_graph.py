"""The fixed-shape training step (`train.cuda_graph`, recsys/step_graph.py), on the CPU: the same code a CUDA
graph captures, run eagerly. It must take the step the eager trainer takes on the same rows."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from recsys.config import ConfigError
from recsys.model_configs import MODEL_CONFIGS, TrainConfig
from recsys.models import build_model
from recsys.models.bert4rec import full_sequences
from recsys.models.losses import kept_first
from recsys.sequences import SequenceData, TrainingTensors, random_batch_rows
from recsys.step_graph import FixedShapeStep
from recsys.train import optimiser_step, train_model, validation_inputs

# Nothing drawn at random: no dropout, no MOJITO attention noise, and its FISM sample is every history item
# while fism_items >= max_len (as in tests/test_train.py's micro-batch test).
# BERT4Rec masks every position.
NOTHING_DRAWN = {"sasrec": {}, "mojito": {"noise_init": 0.0, "fism_items": 20},
                 "bert4rec": {"mask_prob": 1.0, "last_item_share": 0.0}}


def _setup(tiny_prepared, batch_size: int, name: str = "sasrec"):
    config = MODEL_CONFIGS[name](dim=16, n_heads=2, n_layers=2, dropout=0.0, max_len=8, loss="ce",
                                 **NOTHING_DRAWN[name])
    data = SequenceData.from_prepared(tiny_prepared)
    tensors = TrainingTensors(data, data.train_spans(8, "all"))
    plan = random_batch_rows(tensors.lengths, batch_size, torch.Generator().manual_seed(0))
    return config, data, tensors, plan


def _model(config, data, name: str = "sasrec"):
    """SGD, not Adam: Adam turns the float noise of a gradient that is zero in exact arithmetic (the key
    projection's bias: softmax ignores it) into full-size steps, so two exact twins would part there."""
    torch.manual_seed(0)
    model = build_model(name, config, data.n_items, data.n_users)
    model.fit_statistics(data.train_items())
    model.train()
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


@pytest.mark.parametrize("name,grad_clip,planned", [("sasrec", 0.0, False), ("sasrec", 0.5, False),
                                                     ("mojito", 0.0, False), ("bert4rec", 0.0, False),
                                                     ("sasrec", 0.5, True), ("mojito", 0.0, True),
                                                     ("bert4rec", 0.0, True)])
def test_the_fixed_shape_step_moves_the_weights_as_the_eager_step(tiny_prepared, name, grad_clip, planned):
    """Three steps, the last one a short batch (padded to the fixed size): the weights after each equal
    the eager trainer's, which cuts every batch to its own width and selects the target positions — with the
    loss at every position, and (`planned`, as the trainer runs it) at the epoch plan's bound of them."""
    config, data, tensors, plan = _setup(tiny_prepared, 24, name)
    steps = [plan[0], plan[1], plan[2][:5]]  # the last one short: 19 padding rows
    assert len(set(tensors.lengths[plan[0]])) > 3  # mixed lengths: the eager widths differ from the fixed one
    eager, eager_opt = _model(config, data, name)
    fixed_model, fixed_opt = _model(config, data, name)
    step = FixedShapeStep(fixed_model, fixed_opt, tensors, 24, grad_clip=grad_clip, device=torch.device("cpu"))
    assert not step.graphed and step.width == tensors.items.shape[1] - 1
    if planned:
        step.plan_epoch(steps, fixed_model.loss_positions(tensors.lengths))
        most = max(int(fixed_model.loss_positions(tensors.lengths)[rows].sum()) for rows in steps)
        eighth = 24 * step.width // 8
        assert most <= step.loss_rows < most + eighth and step.loss_rows % eighth == 0
        assert step.loss_rows < 24 * step.width  # fewer loss rows than positions: the gather is exercised
    for rows in steps:
        batch_rows = torch.from_numpy(rows)
        width = int(tensors.lengths[rows].max()) - 1
        want = optimiser_step(eager, eager.loss, eager_opt, tensors, batch_rows, [(0, len(rows), width, 1.0)],
                              grad_clip=grad_clip)
        got = step(batch_rows)
        assert float(got) == pytest.approx(float(want), rel=1e-5)
        for (key, a), b in zip(eager.state_dict().items(), fixed_model.state_dict().values()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=key)
    assert step.padded == 19 and int(step.real.sum()) == 5


@pytest.mark.parametrize("name", ["sasrec", "mojito", "bert4rec"])
def test_loss_positions_bound_the_positions_each_models_loss_keeps(tiny_prepared, name, monkeypatch):
    """`loss_positions` is what the fixed-shape step's loss rows rest on: a kept position past the bound would
    be left out of the loss. Per span it equals what the loss keeps (BERT4Rec masking every token), so the
    bound is tight, never short."""
    config, data, tensors, plan = _setup(tiny_prepared, 24, name)
    model, _ = _model(config, data, name)
    kept = []

    def spy(h, weight, ids, keep, rows=0, **kwargs):
        kept.append(keep.sum(dim=1))
        return h.sum() * 0.0

    import recsys.models.bert4rec
    import recsys.models.mojito
    import recsys.models.sasrec

    module = {"sasrec": recsys.models.sasrec, "mojito": recsys.models.mojito,
              "bert4rec": recsys.models.bert4rec}
    monkeypatch.setattr(module[name], "cross_entropy_at_positions", spy)
    for rows in plan:
        batch = tensors.batch(torch.from_numpy(rows), int(tensors.items.shape[1]) - 1)
        model.loss(dataclasses.replace(batch, fixed_shape=True))
    got = torch.cat(kept).numpy()
    want = model.loss_positions(tensors.lengths[np.concatenate(plan)])
    assert (got == want).all() and got.max() == config.max_len


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_bert4rec_exact_masking_bounds_its_loss_at_a_share_of_the_tokens(tiny_prepared, share, monkeypatch):
    """`masking: exact`: the fixed-shape loss keeps exactly round(ρ·n) positions of a random-mask span (one
    of a last-item-only span: under the bound), so the plan's loss rows are ≈ ρ of Bernoulli's; and the loss
    computed on those gathered rows is cross-entropy at exactly the positions `cloze_mask` drew."""
    config, data, tensors, plan = _setup(tiny_prepared, 24, "bert4rec")
    config = dataclasses.replace(config, mask_prob=0.3, last_item_share=share, masking="exact")
    model, _ = _model(config, data, "bert4rec")
    rows = np.concatenate(plan)
    bound = model.loss_positions(tensors.lengths[rows])
    bernoulli = build_model("bert4rec", dataclasses.replace(config, masking="bernoulli"), data.n_items,
                            data.n_users)
    every = bernoulli.loss_positions(tensors.lengths[rows])
    assert bound.sum() < 0.45 * every.sum() and (bound >= 1).all()
    width = int(tensors.items.shape[1]) - 1
    drawn = []  # the mask each loss call draws
    original = model.cloze_mask
    monkeypatch.setattr(model, "cloze_mask", lambda seq: drawn.append(original(seq)) or drawn[-1])
    for batch_rows in plan:
        step_rows = int(model.loss_positions(tensors.lengths[batch_rows]).sum())
        batch = dataclasses.replace(tensors.batch(torch.from_numpy(batch_rows), width), fixed_shape=True,
                                    loss_rows=step_rows)
        loss = model.loss(batch)
        masked = drawn[-1]
        counts, want = masked.sum(1).numpy(), model.loss_positions(tensors.lengths[batch_rows])
        assert (counts <= want).all() and (share > 0 or (counts == want).all())
        seq = full_sequences(batch, config.max_len)
        with torch.no_grad():
            logits = model.output_logits(model(seq.masked_fill(masked, model.mask_id))[masked])
        torch.testing.assert_close(loss.detach(), torch.nn.functional.cross_entropy(logits, seq[masked]),
                                   rtol=1e-5, atol=1e-5)


def test_kept_first_gathers_the_kept_positions_in_order_into_fixed_slots():
    keep = torch.tensor([False, True, True, False, True, False])
    where, filled = kept_first(keep, 4)
    assert where[:3].tolist() == [1, 2, 4] and filled.tolist() == [True, True, True, False]
    where, filled = kept_first(torch.zeros(5, dtype=torch.bool), 2)
    assert not filled.any()


@pytest.mark.parametrize("extra", ["none", "bias", "table"])
def test_the_loss_on_gathered_rows_is_the_loss_on_every_position(extra):
    """The same mean and the same gradients whether the loss runs at every position or at a bound of the
    kept ones (`rows`), with a bias and with MOJITO's per-row table."""
    from recsys.models.losses import cross_entropy_at_positions

    torch.manual_seed(0)
    B, L, D, items = 4, 6, 8, 11
    keep = torch.rand(B, L) < 0.4
    ids = torch.randint(1, items + 1, (B, L))
    kwargs = {}
    if extra == "bias":
        kwargs["bias"] = torch.randn(items, requires_grad=True)
    if extra == "table":
        kwargs.update(table=torch.randn(B * 2, items, requires_grad=True),
                      index=torch.randint(0, B * 2, (B * L,)))
    h = torch.randn(B, L, D, requires_grad=True)
    w = torch.randn(items, D, requires_grad=True)
    results = []
    for rows in (0, int(keep.sum()) + 3):
        loss = cross_entropy_at_positions(h, w, ids, keep, rows, **kwargs)
        grads = torch.autograd.grad(loss, [h, w, *[v for v in kwargs.values() if v.requires_grad]])
        results.append((loss, grads))
    (a, ga), (b, gb) = results
    torch.testing.assert_close(b, a)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(y, x)


def test_a_full_batch_after_a_short_one_counts_every_row_again(tiny_prepared):
    config, data, tensors, plan = _setup(tiny_prepared, 24)
    model, opt = _model(config, data)
    step = FixedShapeStep(model, opt, tensors, 24, device=torch.device("cpu"))
    step(torch.from_numpy(plan[0][:3]))
    step(torch.from_numpy(plan[1]))
    assert step.padded == 0 and bool(step.real.all())


def test_more_rows_than_the_fixed_size_are_refused(tiny_prepared):
    config, data, tensors, plan = _setup(tiny_prepared, 24)
    model, opt = _model(config, data)
    step = FixedShapeStep(model, opt, tensors, 8, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="1 to 8 rows, got 24"):
        step(torch.from_numpy(plan[0]))


def test_the_trainer_with_cuda_graph_learns_what_it_learns_without(tiny_prepared, tiny_sasrec_config,
                                                                   fast_train_config, tmp_path, caplog):
    """Through the whole trainer (batch plans, warm-up, epoch loss, validation): `cuda_graph` on a CPU runs
    the fixed-shape step eagerly and gives the curve of the eager trainer with whole batches."""
    model_config = dataclasses.replace(tiny_sasrec_config, dropout=0.0)
    cfg = dataclasses.replace(fast_train_config, epochs=3, batching="random", warmup_steps=3, micro_batches=1)
    curves = {}
    for graph in (False, True):
        with caplog.at_level(logging.INFO, logger="recsys.train"):
            result = train_model("sasrec", model_config, dataclasses.replace(cfg, cuda_graph=graph), tiny_prepared,
                                 tmp_path / str(graph) / "model", resume_root=tmp_path / str(graph) / "resume")
        curves[graph] = result
    assert "the fixed-shape step runs eagerly" in caplog.text
    a, b = curves[False], curves[True]
    assert a.epochs_run == b.epochs_run == 3
    assert b.best_valid["ndcg@10"] == pytest.approx(a.best_valid["ndcg@10"], abs=1e-4)
    assert b.best_epoch == a.best_epoch


@pytest.mark.parametrize("name,overrides,train,why", [
    ("bert4rec", {"loss": "sampled_ce"}, {}, "samples negatives"),
    ("mojito", {"loss": "bce"}, {}, "samples negatives"),
    ("sasrec", {"loss": "bce"}, {}, "samples negatives"),
    ("sasrec", {}, {"micro_batches": 4}, "train.micro_batches is 4"),
])
def test_cuda_graph_is_refused_where_the_step_cannot_be_fixed(tiny_prepared, fast_train_config, tmp_path, name,
                                                              overrides, train, why):
    config = MODEL_CONFIGS[name](dim=16, n_heads=1, n_layers=1, max_len=8, **overrides)
    cfg = dataclasses.replace(fast_train_config, cuda_graph=True, **train)
    with pytest.raises(ConfigError, match=why) as err:
        train_model(name, config, cfg, tiny_prepared, tmp_path / "model", resume_root=tmp_path / "resume")
    assert "set train.cuda_graph: false" in str(err.value)
    assert not (tmp_path / "model").exists()


# Operators that make the host wait for a GPU, which a CUDA graph cannot hold.
WAITING_OPS = {"aten.nonzero.default", "aten._local_scalar_dense.default", "aten._unique2.default",
               "aten._unique.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
               "aten.masked_select.default", "aten.repeat_interleave.Tensor"}


class _WaitingOps(TorchDispatchMode):
    """Records the operators in WAITING_OPS, a tensor made from Python data (a list index: on CUDA a copy to
    the device the host waits for; a Python number, `x[i] = 0.0`, is a fill and harmless) and indexing by a
    boolean mask (a nonzero inside)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in WAITING_OPS:
            self.found.append(name)
        if name == "aten.lift_fresh.default" and args[0].dim() > 0:
            self.found.append(f"{name} of shape {tuple(args[0].shape)}")
        indexing = name in ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default")
        if indexing and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.found.append(f"{name} with a boolean mask")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["sasrec", "mojito", "bert4rec"])
def test_the_fixed_shape_step_has_no_operator_that_waits_for_the_device(tiny_prepared, name):
    """What a CUDA graph capture would refuse, found on the CPU: the whole fixed-shape step — gather, forward,
    loss, backward, clipping, the update — runs no operator that reads a value back to the host, copies
    Python data to the device or selects by a mask (MOJITO with its GPU time encoder), and neither does
    scoring. The eager loss, which selects its target positions by value, is caught by the same check."""
    config, data, tensors, plan = _setup(tiny_prepared, 24, name)
    model, opt = _model(config, data, name)
    if name == "mojito":
        model.time_enc.method = "table"  # what runs off the CPU
    step = FixedShapeStep(model, opt, tensors, 24, grad_clip=0.5, device=torch.device("cpu"))
    step.plan_epoch([plan[2][:5]], model.loss_positions(tensors.lengths))  # the loss's gathered rows too
    assert 0 < step.loss_rows < 24 * step.width
    step._fill(torch.from_numpy(plan[2][:5]))  # a short batch: its padding rows too
    opt.zero_grad(set_to_none=True)
    with _WaitingOps() as fixed:
        step._step()
    assert fixed.found == []
    rows = torch.from_numpy(plan[0])
    with _WaitingOps() as eager:
        model.loss(tensors.batch(rows, int(tensors.lengths[plan[0]].max()) - 1))
    assert eager.found  # the check can fail: the eager loss selects its targets by value
    # Validation ranks every user on the device without waiting either, until its ranks are read.
    inputs = validation_inputs(model, data, TrainConfig(eval_batch_size=16), torch.device("cpu"))
    assert len(inputs.batches) > 1
    with _WaitingOps() as scoring:
        inputs.ranks(model)
    assert scoring.found == []


def test_a_rate_held_as_a_tensor_steps_as_the_number_and_is_resumed_as_one(tiny_prepared, tmp_path):
    """A captured step reads its learning rate from a tensor (`hold_rate_as_tensor`), so that warm-up,
    lr_schedule and lr_decay change it by writing into it (`set_rate`) instead of recapturing. Here with fused
    Adam on the CPU (which takes a Tensor lr as CUDA's does): the same weights, step after step at changing
    rates, as with the rate as a number; the resume state saves the held rate as a number, and loading it
    gives back a working optimiser."""
    from recsys.step_graph import current_rate, hold_rate_as_tensor, set_rate
    from recsys.train_state import Resume

    config, data, tensors, plan = _setup(tiny_prepared, 24)
    models = {}
    for held in (False, True):
        torch.manual_seed(0)
        model = build_model("sasrec", config, data.n_items, data.n_users)
        model.fit_statistics(data.train_items())
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), fused=True)
        step = FixedShapeStep(model, optimizer, tensors, 24, device=torch.device("cpu"))
        if held:
            hold_rate_as_tensor(optimizer, torch.device("cpu"))
            lr = optimizer.param_groups[0]["lr"]
            assert isinstance(lr, torch.Tensor) and lr.dtype == torch.float32
        for rows, rate in zip(plan[:3], (1e-2, 3e-3, 0.0)):
            set_rate(optimizer, rate)
            step(torch.from_numpy(rows))
        assert current_rate(optimizer) == 0.0
        if held:
            assert optimizer.param_groups[0]["lr"] is lr  # written into, not replaced
        models[held] = (model, optimizer)
    for (name, a), b in zip(models[False][0].state_dict().items(), models[True][0].state_dict().values()):
        assert torch.equal(a, b), name

    model, optimizer = models[True]
    set_rate(optimizer, 2e-3)
    resume = Resume(tmp_path, "sasrec", "key")
    resume.save(model, optimizer, torch.Generator(), {"epoch": 3})
    fresh = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), fused=True)
    assert resume.load(model, fresh, torch.Generator(), torch.device("cpu"))["epoch"] == 3
    assert fresh.param_groups[0]["lr"] == pytest.approx(2e-3)
    step = FixedShapeStep(model, fresh, tensors, 24, device=torch.device("cpu"))
    before = model.item_emb.weight.detach().clone()
    step(torch.from_numpy(plan[0]))
    assert not torch.equal(before, model.item_emb.weight)
