"""Training (recsys/train.py) and its checkpoints (recsys/checkpoint.py): outputs, determinism, resume after an
interruption, early stopping, and safetensors-only checkpoints that rebuild a model from its files alone."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import pickle
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from recsys.checkpoint import CheckpointError, load_model, save_checkpoint
from recsys.config import EvaluateConfig, PrepareConfig
from recsys.evaluate import evaluate_model
from recsys.model_configs import TrainConfig
from recsys.models.base import Batch
from recsys.models.mostpop import MostPopConfig
from recsys.models.sasrec import SASRec
from recsys.train import optimiser_step, train_model

CHECKPOINT_FILES = {"model.safetensors", "model.json", "items.json", "users.json"}


def read_curve(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def weights(checkpoint_dir) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint_dir / "model.safetensors"))


def assert_same_weights(got_dir, want_dir, atol: float = 1e-6) -> None:
    """Two checkpoints hold the same tensors (to `atol`): a resumed or extended run against a straight one."""
    got, want = weights(got_dir), weights(want_dir)
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=atol)


def run(prepared, model_config, train_config, root, **kwargs):
    return train_model("sasrec", model_config, train_config, prepared, root / "model", curve_path=root / "curve.csv",
                       resume_root=root / "resume", **kwargs)


# --- training outputs ---------------------------------------------------------------------------------------


def test_short_training_writes_checkpoint_and_curve(trained_sasrec, tiny_prepared, fast_train_config):
    result, ckpt = trained_sasrec
    assert {p.name for p in ckpt.iterdir()} == CHECKPOINT_FILES
    curve = read_curve(ckpt.parent / "curve.csv")
    assert [int(r["epoch"]) for r in curve] == [1, 2, 3]
    assert set(curve[0]) == {"epoch", "loss", "valid_ndcg@10", "valid_hr@10", "seconds", "lr"}
    assert result.epochs_run == 3 and result.stopped_by == "max_epochs"
    scores = [float(r["valid_ndcg@10"]) for r in curve]
    assert result.best_epoch == 1 + scores.index(max(scores))  # the first epoch reaching the best score
    assert result.best_valid["ndcg@10"] == pytest.approx(max(scores))
    meta = json.loads((ckpt / "model.json").read_text())
    assert meta["best_epoch"] == result.best_epoch
    assert meta["dataset_fingerprint"] == tiny_prepared.fingerprint["fingerprint"]
    assert meta["train_config"] == dataclasses.asdict(fast_train_config)
    assert meta["prepare"] == tiny_prepared.fingerprint["config"]  # its split (warm_source.py)
    # The checkpoint is the selected epoch's model: it reproduces the best validation score.
    model, _ = load_model(ckpt)
    valid = evaluate_model(model, tiny_prepared, "valid", EvaluateConfig(ks=(10,)))
    assert valid.metrics["ndcg@10"] == pytest.approx(result.best_valid["ndcg@10"], abs=1e-9)
    assert not (ckpt.parent / "resume").exists() or not any((ckpt.parent / "resume").iterdir())


def test_training_learns_the_planted_chains(trained_sasrec, tiny_prepared, tmp_path):
    """3 short epochs already beat popularity on data with sequential structure."""
    result, _ = trained_sasrec
    pop = train_model("mostpop", MostPopConfig(), TrainConfig(device="cpu", progress="off"), tiny_prepared,
                      tmp_path / "mostpop")
    assert result.best_valid["ndcg@10"] > pop.best_valid["ndcg@10"] + 0.05


def test_mostpop_is_counted_not_trained(tiny_prepared, tmp_path):
    result = train_model("mostpop", MostPopConfig(), TrainConfig(device="cpu", progress="off"), tiny_prepared,
                         tmp_path / "m", curve_path=tmp_path / "c.csv")
    assert (result.best_epoch, result.epochs_run, result.stopped_by) == (0, 0, "not_trainable")
    assert [int(r["epoch"]) for r in read_curve(tmp_path / "c.csv")] == [0]
    model, meta = load_model(tmp_path / "m")
    train_counts = tiny_prepared.events.query("role == 0")["item"].value_counts()
    assert model.counts[1:].tolist() == [float(train_counts.get(i, 0)) for i in range(1, tiny_prepared.n_items + 1)]
    assert meta["model"] == "mostpop"


def test_same_seed_same_result(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    cfg = dataclasses.replace(fast_train_config, epochs=2)
    a = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "a")
    b = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "b")
    assert (a.best_epoch, a.best_valid) == (b.best_epoch, b.best_valid)
    curve_a, curve_b = read_curve(tmp_path / "a" / "curve.csv"), read_curve(tmp_path / "b" / "curve.csv")
    assert [r["loss"] for r in curve_a] == [r["loss"] for r in curve_b]
    wa, wb = weights(tmp_path / "a" / "model"), weights(tmp_path / "b" / "model")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, seed=1), tmp_path / "c")
    assert [r["loss"] for r in read_curve(tmp_path / "c" / "curve.csv")] != [r["loss"] for r in curve_a]
    del c


# --- resume -------------------------------------------------------------------------------------------------


class Interrupt:
    """on_epoch hook: records epochs, raises KeyboardInterrupt after `at` (like Ctrl-C or a killed worker)."""

    def __init__(self, at: int | None = None):
        self.at, self.seen = at, []

    def __call__(self, epoch, row):
        self.seen.append(epoch)
        if epoch == self.at:
            raise KeyboardInterrupt


@pytest.mark.parametrize(("ema", "warmup"), [(0.0, False), (0.9, False), (0.9, True)])
def test_resume_after_interruption_equals_uninterrupted_run(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                             tmp_path, caplog, ema, warmup):
    """(With `train.ema` the weights' average is part of the saved state: the resumed run's averaged
    checkpoint equals the uninterrupted run's; with `ema_warmup` its decay goes on from the saved step
    count.)"""
    cfg = dataclasses.replace(fast_train_config, epochs=4, ema=ema, ema_warmup=warmup)
    straight = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "straight")

    interrupted = Interrupt(at=2)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "resumed", on_epoch=interrupted)
    assert interrupted.seen == [1, 2]
    assert any((tmp_path / "resumed" / "resume").iterdir())  # state saved after epoch 2

    continued = Interrupt()
    with caplog.at_level(logging.INFO, logger="recsys.train"):
        result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "resumed", on_epoch=continued)
    assert continued.seen == [3, 4]
    assert "resumed model=sasrec from epoch=2" in caplog.text
    curve = read_curve(tmp_path / "resumed" / "curve.csv")
    assert [int(r["epoch"]) for r in curve] == [1, 2, 3, 4]

    assert (result.best_epoch, result.epochs_run) == (straight.best_epoch, straight.epochs_run)
    assert result.best_valid == pytest.approx(straight.best_valid, abs=1e-12)
    expected_curve = read_curve(tmp_path / "straight" / "curve.csv")
    assert [float(r["loss"]) for r in curve] == pytest.approx([float(r["loss"]) for r in expected_curve], rel=1e-9)
    assert_same_weights(tmp_path / "resumed" / "model", tmp_path / "straight" / "model")
    assert not any((tmp_path / "resumed" / "resume").iterdir())  # cleared once finished


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run in a GPU session)")
def test_a_run_resumed_on_cuda_draws_its_dropout_as_the_uninterrupted_run_did(tiny_prepared, tiny_sasrec_config,
                                                                             fast_train_config, tmp_path):
    """Only the CPU generator was saved: on CUDA, dropout (and BERT4Rec's masks, sampled negatives) draw from
    the device's generator, which a resumed run re-seeded from the start of the run."""
    cfg = dataclasses.replace(fast_train_config, epochs=3, device="cuda")
    config = dataclasses.replace(tiny_sasrec_config, dropout=0.3)
    straight = run(tiny_prepared, config, cfg, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, config, cfg, tmp_path / "resumed", on_epoch=Interrupt(at=1))
    continued = Interrupt()
    result = run(tiny_prepared, config, cfg, tmp_path / "resumed", on_epoch=continued)
    assert continued.seen == [2, 3]  # resumed after epoch 1, not trained again from the start
    assert result.best_valid == pytest.approx(straight.best_valid, abs=1e-6)
    curve, expected = read_curve(tmp_path / "resumed" / "curve.csv"), read_curve(tmp_path / "straight" / "curve.csv")
    assert [float(r["loss"]) for r in curve] == pytest.approx([float(r["loss"]) for r in expected], rel=1e-6)


def test_the_weight_average_follows_the_trained_weights_by_its_decay():
    from recsys.train_state import WeightAverage

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
    average = WeightAverage(model, 0.75)
    assert not any(p.requires_grad for p in average.module.parameters())
    expected = 1.0
    for live in (3.0, -1.0, 5.0):
        with torch.no_grad():
            model.weight.fill_(live)
        average.update(step=10_000)  # (no warm-up: the step does not matter)
        expected = 0.75 * expected + 0.25 * live
        assert torch.allclose(average.module.weight, torch.full((1, 2), expected))
    assert torch.equal(model.weight, torch.full((1, 2), 5.0))  # the trained weights are untouched


def test_with_ema_warmup_the_average_follows_early_steps_and_reaches_its_decay_later():
    """`train.ema_warmup`: step t's decay is min(ema, (1 + t) / (10 + t)) — 2/11 at the first step, so the
    average starts near the trained weights instead of the initial ones; ema itself from t = (10·ema − 1) / (1 − ema)."""
    from recsys.train_state import WeightAverage

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(0.0)
    average = WeightAverage(model, 0.9, warmup=True)
    assert [average.decay_at(t) for t in (1, 2, 79, 80, 1000)] == pytest.approx([2 / 11, 3 / 12, 80 / 89, 0.9, 0.9])
    assert WeightAverage(model, 0.9).decay_at(1) == 0.9
    with torch.no_grad():
        model.weight.fill_(1.0)
    average.update(step=1)
    assert torch.allclose(average.module.weight, torch.full((1, 2), 9 / 11))  # 2/11 · 0 + 9/11 · 1


def test_with_ema_validation_and_the_checkpoint_are_the_averaged_weights(tiny_prepared, tiny_sasrec_config,
                                                                        fast_train_config, tmp_path):
    """The best checkpoint is the average (the kept final state holds both: raw `model.*`, averaged `ema.*`),
    and the validation score recorded for it is the checkpoint's own."""
    cfg = dataclasses.replace(fast_train_config, epochs=3, ema=0.9)
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, keep_final_state=True)
    assert result.best_epoch == 3  # still improving on this data: the last state is the best epoch's
    (state_dir,) = (tmp_path / "resume").iterdir()
    state = load_file(str(state_dir / "state.safetensors"))
    saved = weights(tmp_path / "model")
    raw_differs = False
    for key, value in saved.items():
        torch.testing.assert_close(value, state[f"ema.{key}"], rtol=0, atol=0)
        raw_differs |= not torch.equal(value, state[f"model.{key}"])
    assert raw_differs
    model, _ = load_model(tmp_path / "model")
    valid = evaluate_model(model, tiny_prepared, "valid", EvaluateConfig(ks=(10,)))
    assert valid.metrics["ndcg@10"] == pytest.approx(result.best_valid["ndcg@10"], abs=1e-6)
    plain = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, ema=0.0), tmp_path / "plain")
    assert plain.best_valid["ndcg@10"] != result.best_valid["ndcg@10"]
    with pytest.raises(ValueError, match=r"train.ema must be in \[0, 1\)"):
        dataclasses.replace(cfg, ema=1.0)


def test_a_kept_final_state_returns_the_finished_run_without_training_again(tiny_prepared, tiny_sasrec_config,
                                                                             fast_train_config, tmp_path):
    """`keep_final_state` (the benchmarks): a caller killed after training but before its own last write reruns
    and gets the same result at once; the state stays until the caller clears it."""
    from recsys.layout import prune_resume_state

    cfg = dataclasses.replace(fast_train_config, epochs=3)
    first_epochs = Interrupt()
    first = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=first_epochs, keep_final_state=True)
    assert first_epochs.seen == [1, 2, 3] and any((tmp_path / "resume").iterdir())
    best = weights(tmp_path / "model")
    again_epochs = Interrupt()
    again = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=again_epochs, keep_final_state=True)
    assert again_epochs.seen == []  # nothing trained
    assert (again.best_epoch, again.epochs_run, again.stopped_by) == (first.best_epoch, first.epochs_run,
                                                                     first.stopped_by)
    assert again.best_valid == first.best_valid and again.seconds_to_best == first.seconds_to_best
    assert again.seconds == pytest.approx(first.seconds, abs=0.5)
    for key, value in weights(tmp_path / "model").items():
        assert torch.equal(value, best[key])
    prune_resume_state(tmp_path / "resume", ["sasrec"])
    retrained = Interrupt()
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=retrained)
    assert retrained.seen == [1, 2, 3] and not any((tmp_path / "resume").iterdir())


def test_a_time_limited_run_goes_on_when_given_more_time(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                         tmp_path, caplog):
    """The time budget is not part of the resume key: a kept final state the clock stopped trains on from its
    last epoch's weights (not from the best checkpoint on disk) under a larger `max_minutes` (or none) and
    ends where an unlimited run ends; rerun under the same budget it returns at once."""
    from safetensors.torch import save_file

    cfg = dataclasses.replace(fast_train_config, epochs=4)
    straight = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "straight")

    limited = dataclasses.replace(cfg, max_minutes=1e-9)
    first = Interrupt()
    ext = tmp_path / "ext"
    result = run(tiny_prepared, tiny_sasrec_config, limited, ext, on_epoch=first, keep_final_state=True)
    assert (first.seen, result.stopped_by) == ([1], "time_limit")
    same = Interrupt()
    again = run(tiny_prepared, tiny_sasrec_config, limited, ext, on_epoch=same, keep_final_state=True)
    assert (same.seen, again.stopped_by, again.epochs_run) == ([], "time_limit", 1)  # same budget: no more

    # Were training to go on from the checkpoint, this would change every later epoch.
    on_disk = tmp_path / "ext" / "model" / "model.safetensors"
    save_file({k: v + 1.0 for k, v in weights(tmp_path / "ext" / "model").items()}, str(on_disk))
    more = Interrupt()
    with caplog.at_level(logging.INFO, logger="recsys.train"):
        extended = run(tiny_prepared, tiny_sasrec_config, cfg, ext, on_epoch=more, keep_final_state=True)
    assert more.seen == [2, 3, 4]
    assert "stopped by train.max_minutes" in caplog.text
    assert (extended.stopped_by, extended.epochs_run, extended.best_epoch) == (straight.stopped_by, 4,
                                                                               straight.best_epoch)
    assert straight.best_epoch > 1  # so the checkpoint written above was replaced by training, not kept
    assert extended.seconds > result.seconds  # the first epoch's time carries over
    assert extended.best_valid == pytest.approx(straight.best_valid, abs=1e-12)
    curve = read_curve(tmp_path / "ext" / "curve.csv")
    expected = read_curve(tmp_path / "straight" / "curve.csv")
    assert [float(r["loss"]) for r in curve] == pytest.approx([float(r["loss"]) for r in expected], rel=1e-9)
    assert_same_weights(tmp_path / "ext" / "model", tmp_path / "straight" / "model")


class ScriptedValidation:
    """`recsys.train.validate` replaced by a fixed validation curve, NDCG@10 of epoch e = SCRIPT[e - 1]
    (training itself is real); `epoch` is where the next run starts (set it to a resumed run's epoch)."""

    # patience 2 stops at epoch 4 (best 2), patience 3 at 5 (best 2), patience 4 at 10 (best 6)
    SCRIPT = (0.1, 0.3, 0.2, 0.25, 0.28, 0.4, 0.35, 0.3, 0.2, 0.1, 0.1, 0.1)

    def __init__(self, monkeypatch):
        import recsys.train as train_module

        self.epoch = 0
        monkeypatch.setattr(train_module, "validate", self)

    def __call__(self, model, inputs):
        value = self.SCRIPT[self.epoch]
        self.epoch += 1
        return {"ndcg@10": value, "hr@10": value, "mrr": value}


def test_early_stop_epoch_replays_the_loop_s_rule():
    from recsys.layout import VALID_COLUMN
    from recsys.train_state import early_stop_epoch

    curve = [{"epoch": e, VALID_COLUMN: v} for e, v in enumerate(ScriptedValidation.SCRIPT, start=1)]
    assert [early_stop_epoch(curve, p, 0, VALID_COLUMN) for p in (1, 2, 3, 4, 20)] == [3, 4, 5, 10, None]
    assert early_stop_epoch(curve, 2, 7, VALID_COLUMN) == 8
    assert early_stop_epoch(curve[:3], 2, 0, VALID_COLUMN) is None


@pytest.mark.parametrize("patience,floor", [(2, 0), (4, 0), (2, 7), (20, 0)])
def test_the_training_loop_stops_where_the_replayed_rule_says(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                              tmp_path, monkeypatch, patience, floor):
    """The loop and `early_stop_epoch` share one rule (`train_state.improves`, `stops`): a real run with the
    scripted validation ends at the replayed epoch (or the epoch cap where the rule never fires) and keeps
    the best epoch of the curve it wrote."""
    from recsys.layout import VALID_COLUMN
    from recsys.train_state import early_stop_epoch

    ScriptedValidation(monkeypatch)
    cap = len(ScriptedValidation.SCRIPT)
    cfg = dataclasses.replace(fast_train_config, epochs=cap, patience=patience, min_epochs=floor)
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path)
    curve = [{"epoch": int(r["epoch"]), VALID_COLUMN: float(r[VALID_COLUMN])}
             for r in read_curve(tmp_path / "curve.csv")]
    expected = early_stop_epoch(curve, patience, floor, VALID_COLUMN)
    assert (result.epochs_run, result.stopped_by) == ((expected, "early_stopping") if expected else (cap, "max_epochs"))
    assert result.best_epoch == max(curve, key=lambda r: r[VALID_COLUMN])["epoch"]


def test_a_run_early_stopping_ended_goes_on_under_a_larger_patience(tiny_prepared, tiny_sasrec_config,
                                                                    fast_train_config, tmp_path, monkeypatch,
                                                                    caplog):
    """Patience and the epoch floor are not part of the resume key: a kept final state that patience 2
    stopped at epoch 4 trains on under patience 4 from its last epoch and ends where a straight patience-4
    run ends, weights and curve alike — a longer patience costs its extra epochs, not a new run."""
    script = ScriptedValidation(monkeypatch)
    cfg = dataclasses.replace(fast_train_config, epochs=12, patience=4)
    straight = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "straight")
    assert (straight.best_epoch, straight.epochs_run, straight.stopped_by) == (6, 10, "early_stopping")
    script.epoch, short = 0, Interrupt()
    ext = tmp_path / "ext"
    first = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, patience=2), ext, on_epoch=short,
                keep_final_state=True)
    assert (short.seen, first.best_epoch, first.stopped_by) == ([1, 2, 3, 4], 2, "early_stopping")
    script.epoch, more = 4, Interrupt()
    with caplog.at_level(logging.INFO, logger="recsys.train"):
        extended = run(tiny_prepared, tiny_sasrec_config, cfg, ext, on_epoch=more, keep_final_state=True)
    assert more.seen == [5, 6, 7, 8, 9, 10]
    assert "was stopped early at epoch 4; going on under patience=4" in caplog.text
    assert (extended.best_epoch, extended.epochs_run, extended.stopped_by) == (6, 10, "early_stopping")
    curve, expected = read_curve(ext / "curve.csv"), read_curve(tmp_path / "straight" / "curve.csv")
    assert [float(r["loss"]) for r in curve] == pytest.approx([float(r["loss"]) for r in expected], rel=1e-9)
    assert_same_weights(ext / "model", tmp_path / "straight" / "model")


def test_another_runs_kept_state_is_adopted_only_with_its_best_checkpoint_and_as_a_beginning(
        tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path, monkeypatch):
    """`adopt_from` (the benchmarks' patience sweeps): a larger patience starts from the other run's kept
    final state, and the best checkpoint it keeps, and ends as a straight run; from a state without that
    checkpoint, or one a larger patience carried past this run's stop, it trains from epoch 1 (and the
    other run's state stays)."""
    import shutil

    script = ScriptedValidation(monkeypatch)
    cfg = dataclasses.replace(fast_train_config, epochs=12, patience=3)
    straight = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "straight")
    script.epoch = 0
    run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, patience=2), tmp_path / "p2",
        keep_final_state=True)
    kept = sorted((tmp_path / "p2" / "resume").iterdir())
    shutil.copytree(tmp_path / "p2" / "resume", tmp_path / "bare")
    (state_dir,) = (tmp_path / "bare").iterdir()
    shutil.rmtree(state_dir / "best")  # as a state saved before states kept their best checkpoint
    for root, first_epoch in ((tmp_path / "p2" / "resume", 5), (tmp_path / "bare", 1)):
        script.epoch, seen = first_epoch - 1, Interrupt()
        out = tmp_path / f"from-{root.name}"
        result = run(tiny_prepared, tiny_sasrec_config, cfg, out, on_epoch=seen, adopt_from=[root])
        assert seen.seen == list(range(first_epoch, 6)), root
        assert (result.best_epoch, result.epochs_run) == (straight.best_epoch, straight.epochs_run) == (2, 5)
        assert_same_weights(out / "model", tmp_path / "straight" / "model")
        assert json.loads((out / "model" / "model.json").read_text())["train_config"]["patience"] == 3
    assert sorted((tmp_path / "p2" / "resume").iterdir()) == kept
    script.epoch, seen = 0, Interrupt()
    run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, patience=1), tmp_path / "p1",
        on_epoch=seen, adopt_from=[tmp_path / "p2" / "resume"])
    assert seen.seen == [1, 2, 3]  # patience 1 stops at epoch 3, before the kept state's epoch 4


def test_a_resumed_run_gets_its_best_checkpoint_back_from_the_state(tiny_prepared, tiny_sasrec_config,
                                                                     fast_train_config, tmp_path, monkeypatch):
    """`dvc repro` removes a stage's outputs before it runs it: a training stage killed after its best epoch
    resumed without its checkpoint and, finding no better epoch, ended with none (evaluation then failed).
    The saved state keeps the best checkpoint; the resumed run puts it back, recording its own settings."""
    import shutil

    script = ScriptedValidation(monkeypatch)
    cfg = dataclasses.replace(fast_train_config, epochs=12, patience=2)
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "straight")
    script.epoch = 0
    with pytest.raises(KeyboardInterrupt):  # killed under patience 20 at epoch 4 (best epoch 2)
        run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, patience=20), tmp_path,
            on_epoch=Interrupt(at=4))
    shutil.rmtree(tmp_path / "model")
    script.epoch, again = 4, Interrupt()
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=again)  # patience 2: ends there
    assert again.seen == [] and (result.best_epoch, result.epochs_run) == (2, 4)
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["best_epoch"] == 2 and meta["train_config"]["patience"] == 2
    assert_same_weights(tmp_path / "model", tmp_path / "straight" / "model", atol=0)


def test_a_kept_state_at_this_runs_stopping_epoch_says_early_stopping(tiny_prepared, tiny_sasrec_config,
                                                                       fast_train_config, tmp_path, monkeypatch):
    """A kept final state the epoch cap (or the clock) ended at the very epoch where this run's patience ends
    it reports early stopping, as one uninterrupted run does (its check after the epoch comes first)."""
    script = ScriptedValidation(monkeypatch)
    cfg = dataclasses.replace(fast_train_config, epochs=3, patience=20)
    capped = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, keep_final_state=True)
    assert capped.stopped_by == "max_epochs"
    script.epoch, seen = 3, Interrupt()
    result = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, patience=1), tmp_path,
                 on_epoch=seen, keep_final_state=True)
    assert (seen.seen, result.stopped_by, result.epochs_run) == ([], "early_stopping", 3)


def test_a_state_saved_at_the_stopping_epoch_resumes_without_another_epoch(
        tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path, monkeypatch):
    """Killed after its stopping epoch's state was saved (before the loop's stop), a run resumed and trained
    one epoch more than an uninterrupted run — and could have found another best there."""
    script = ScriptedValidation(monkeypatch)
    cfg = dataclasses.replace(fast_train_config, epochs=12, patience=2)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=4))
    script.epoch, again = 4, Interrupt()
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=again)
    assert again.seen == []
    assert (result.best_epoch, result.epochs_run, result.stopped_by) == (2, 4, "early_stopping")
    assert not any((tmp_path / "resume").iterdir())


def test_a_state_saved_past_where_this_run_stops_is_not_resumed(tiny_prepared, tiny_sasrec_config,
                                                                fast_train_config, tmp_path, monkeypatch,
                                                                caplog):
    """A state a larger patience carried past this run's stopping epoch is not this run's beginning (a best
    found after that epoch would be taken): the run trains from the start and ends as a straight one."""
    script = ScriptedValidation(monkeypatch)
    cfg = dataclasses.replace(fast_train_config, epochs=12, patience=2)
    straight = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "straight")
    script.epoch = 0
    run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, patience=4), tmp_path / "p",
        keep_final_state=True)
    script.epoch, seen = 0, Interrupt()
    with caplog.at_level(logging.INFO, logger="recsys.train"):
        result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "p", on_epoch=seen)
    assert seen.seen == [1, 2, 3, 4]
    said = "the saved state (epoch 10) went past epoch 4, where patience=2, min_epochs=0 stop this run"
    assert said in caplog.text
    assert (result.best_epoch, result.epochs_run) == (straight.best_epoch, straight.epochs_run) == (2, 4)
    assert_same_weights(tmp_path / "p" / "model", tmp_path / "straight" / "model")


def test_a_killed_run_resumes_under_another_time_budget(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                         tmp_path, caplog):
    """Neither `max_minutes` nor `progress` is part of the resume key."""
    cfg = dataclasses.replace(fast_train_config, epochs=3, max_minutes=600.0)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=2))
    continued = Interrupt()
    with caplog.at_level(logging.INFO, logger="recsys.train"):
        other_budget = dataclasses.replace(cfg, max_minutes=0.0, progress="auto")
        run(tiny_prepared, tiny_sasrec_config, other_budget, tmp_path, on_epoch=continued)
    assert continued.seen == [3]
    assert "resumed model=sasrec from epoch=2" in caplog.text


def test_a_killed_run_resumed_under_a_spent_budget_stops_without_another_epoch(
        tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    cfg = dataclasses.replace(fast_train_config, epochs=3)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=2))
    continued = Interrupt()
    result = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, max_minutes=1e-9), tmp_path,
                 on_epoch=continued)
    assert continued.seen == []
    assert (result.stopped_by, result.epochs_run) == ("time_limit", 2)
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_a_run_whose_last_epoch_ends_past_the_time_limit_stopped_by_max_epochs(
        tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    cfg = dataclasses.replace(fast_train_config, epochs=1, max_minutes=1e-9)
    assert run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path).stopped_by == "max_epochs"


def test_other_config_ignores_stale_resume_state(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path,
                                                 caplog):
    cfg = dataclasses.replace(fast_train_config, epochs=3)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=2))
    for other_model, other_train in [(tiny_sasrec_config, dataclasses.replace(cfg, lr=1e-3)),
                                     (dataclasses.replace(tiny_sasrec_config, dropout=0.3), cfg)]:
        seen = Interrupt()
        with caplog.at_level(logging.INFO, logger="recsys.train"):
            run(tiny_prepared, other_model, other_train, tmp_path, on_epoch=seen)
        assert seen.seen == [1, 2, 3]
        assert "resumed" not in caplog.text
    # A completed run of another configuration replaced the output: the interrupted run's state went with
    # it (issue 16: no leftovers), so the original configuration trains from the start.
    assert not any((tmp_path / "resume").iterdir())
    seen = Interrupt()
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=seen)
    assert seen.seen == [1, 2, 3]


def test_a_half_deleted_resume_state_is_no_state(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                 tmp_path):
    """A state folder that lost its tensors (an older version's save was killed while it deleted the last
    epoch's state) made every later run fail to load it: now such a folder is not a state, and the run
    trains from the start."""
    cfg = dataclasses.replace(fast_train_config, epochs=3)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=2))
    [state] = (tmp_path / "resume").iterdir()
    (state / "state.safetensors").unlink()
    seen = Interrupt()
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=seen)
    assert seen.seen == [1, 2, 3]
    assert not any((tmp_path / "resume").iterdir())


def test_a_save_beside_a_half_folder_keeps_the_whole_old_state_until_the_new_one_is_in(
        tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path, monkeypatch):
    """The state moved aside to `.old` (a kill between the renames) with a half folder in its place (an older
    version's kill): the next save removed `.old` before putting its own in place, so a kill in that gap left
    no state and training began again at epoch 1. Now `.old` goes only after the new state is in."""
    from recsys.train_state import Resume

    cfg = dataclasses.replace(fast_train_config, epochs=3)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=2))
    [state] = (tmp_path / "resume").iterdir()
    old = state.with_name(state.name + ".old")
    state.rename(old)
    state.mkdir()
    (state / "state.json").write_text("{}")  # half: no tensors
    model_name, key = state.name.split("-", 1)
    resume = Resume(tmp_path / "resume", model_name, key)
    assert resume.peek()["epoch"] == 2  # from .old

    def killed(self, target):
        raise KeyboardInterrupt  # the new state's rename never happens

    monkeypatch.setattr(type(state), "rename", killed)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(KeyboardInterrupt):
        resume.save(model, optimizer, torch.Generator(), {"epoch": 3, "curve": []})
    monkeypatch.undo()
    assert resume.peek()["epoch"] == 2  # the whole `.old` is still there to resume from


def test_an_interrupted_runs_state_survives_another_interrupted_run(tiny_prepared, tiny_sasrec_config,
                                                                      fast_train_config, tmp_path):
    """Only completion clears: two interrupted configurations each keep their state and resume from it."""
    cfg = dataclasses.replace(fast_train_config, epochs=3)
    other = dataclasses.replace(cfg, lr=1e-3)
    for train_config in (cfg, other):
        with pytest.raises(KeyboardInterrupt):
            run(tiny_prepared, tiny_sasrec_config, train_config, tmp_path, on_epoch=Interrupt(at=2))
    assert len(list((tmp_path / "resume").iterdir())) == 2
    seen = Interrupt()
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=seen)
    assert seen.seen == [3] and not any((tmp_path / "resume").iterdir())


def test_resume_state_is_pruned_when_dvc_restored_the_output(tmp_path):
    """`dvc repro` restored a model from its cache: the stage never ran, so the flow prunes that model's
    state (and only that model's: `sasrec-big` is another model)."""
    from recsys.layout import prune_resume_state

    root = tmp_path / ".resume"
    keep = [root / f"sasrec-big-{'b' * 20}", root / f"mojito-{'c' * 20}"]
    gone = [root / f"sasrec-{'a' * 20}", root / f"sasrec-{'d' * 20}.tmp"]
    for path in keep + gone:
        path.mkdir(parents=True)
        (path / "state.json").write_text("{}")
    assert sorted(prune_resume_state(root, ["sasrec"])) == sorted(gone)
    assert sorted(root.iterdir()) == sorted(keep)


def test_other_data_ignores_stale_resume_state(tiny_prepared, tiny_interactions, tiny_sasrec_config,
                                               fast_train_config, tmp_path):
    from recsys.prepare import prepare

    cfg = dataclasses.replace(fast_train_config, epochs=2)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=Interrupt(at=1))
    changed = prepare(tiny_interactions.iloc[:-1], PrepareConfig(**tiny_prepared.fingerprint["config"]))
    assert changed.fingerprint["fingerprint"] != tiny_prepared.fingerprint["fingerprint"]
    seen = Interrupt()
    run(changed, tiny_sasrec_config, cfg, tmp_path, on_epoch=seen)
    assert seen.seen == [1, 2]


# --- stopping -----------------------------------------------------------------------------------------------


def test_early_stopping_after_patience_flat_epochs(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    # lr = 0: the weights never change, so validation never improves after epoch 1.
    cfg = dataclasses.replace(fast_train_config, epochs=20, patience=2, lr=0.0)
    seen = Interrupt()
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=seen)
    assert seen.seen == [1, 2, 3]
    assert (result.best_epoch, result.epochs_run, result.stopped_by) == (1, 3, "early_stopping")


def test_early_stopping_keeps_the_best_epoch(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path,
                                             monkeypatch):
    import recsys.train as train_module

    scripted = iter([0.1, 0.3, 0.2, 0.3, 0.25, 0.9])  # best at epoch 2; ties do not count as improvement

    def fake_validate(model, inputs):
        value = next(scripted)
        return {"ndcg@10": value, "hr@10": value, "mrr": value}

    monkeypatch.setattr(train_module, "validate", fake_validate)
    cfg = dataclasses.replace(fast_train_config, epochs=20, patience=3)
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path)
    assert (result.best_epoch, result.epochs_run, result.stopped_by) == (2, 5, "early_stopping")
    assert result.best_valid["ndcg@10"] == 0.3
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["best_epoch"] == 2 and meta["valid_metrics"]["ndcg@10"] == 0.3


def test_learning_rate_decays_after_flat_epochs_and_survives_resume(tiny_prepared, tiny_sasrec_config,
                                                                     fast_train_config, tmp_path, monkeypatch):
    import recsys.train as train_module

    scripted = iter([0.1, 0.3, 0.2, 0.2, 0.4, 0.3, 0.3, 0.3])  # improvements at epochs 1, 2 and 5

    def fake_validate(model, inputs):
        value = next(scripted)
        return {"ndcg@10": value, "hr@10": value, "mrr": value}

    monkeypatch.setattr(train_module, "validate", fake_validate)
    cfg = dataclasses.replace(fast_train_config, epochs=8, patience=10, lr=0.01, lr_decay=0.5,
                              lr_decay_patience=2)
    seen = Interrupt(at=6)  # the decayed rate and the flat-epoch count must survive the interruption
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path, on_epoch=seen)
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path)
    assert (result.best_epoch, result.epochs_run) == (5, 8)
    with open(tmp_path / "curve.csv") as f:
        lrs = [float(row["lr"]) for row in csv.DictReader(f)]
    # The rate each epoch trained with: halved after the flat epochs 3–4, kept through the improvement at 5,
    # halved again after the flat epochs 6–7 (epoch 7 ran after the resume).
    assert lrs == [0.01, 0.01, 0.01, 0.01, 0.005, 0.005, 0.005, 0.0025]


def test_time_limit_stops_after_one_epoch(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    cfg = dataclasses.replace(fast_train_config, epochs=20, max_minutes=1e-9)
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path)
    assert (result.epochs_run, result.stopped_by, result.best_epoch) == (1, "time_limit", 1)
    assert (tmp_path / "model" / "model.safetensors").is_file()


# --- stage entry points -------------------------------------------------------------------------------------


def test_train_and_evaluate_stage_mains(tiny_prepared, write_params, tmp_path):
    from recsys import evaluate, train
    from recsys.config import ConfigError
    from recsys.prepare import save

    root = tmp_path / "repo"
    save(tiny_prepared, root / "artifacts" / "prepared")
    params = write_params({"train": {"epochs": 2}})
    train.main(["--model", "sasrec", "--params", str(params), "--root", str(root)])
    evaluate.main(["--model", "sasrec", "--params", str(params), "--root", str(root)])
    assert (root / "artifacts" / "models" / "sasrec" / "model.safetensors").is_file()
    assert [int(r["epoch"]) for r in read_curve(root / "plots" / "sasrec.csv")] == [1, 2]
    metrics = json.loads((root / "metrics" / "sasrec.json").read_text())
    for key in ("ndcg@5", "ndcg@10", "ndcg@20", "hr@5", "hr@10", "hr@20", "mrr"):
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["n_users"] == tiny_prepared.fingerprint["n_test"]
    per_user = pd.read_parquet(root / "artifacts" / "eval" / "sasrec" / "per_user.parquet")
    assert per_user["ndcg@10"].mean() == pytest.approx(metrics["ndcg@10"])
    assert not (root / ".resume").exists() or not any((root / ".resume").iterdir())
    with pytest.raises(ConfigError, match="invalid model name"):
        train.main(["--model", "../sasrec", "--params", str(params), "--root", str(root)])


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["after_epoch_saved", "resume_state_moved_aside"])
def test_a_training_stage_killed_after_an_epoch_resumes_to_the_same_model(tiny_prepared, write_params,
                                                                         tmp_path, fault):
    """kill -9 (`RECSYS_FAULT`) right after epoch 1's state is saved, in the stage as `dvc repro` runs it, or
    while epoch 2's is put in its place (epoch 1's moved aside: the save deleted it in place, and a kill then
    could leave a state every later run failed to load); the rerun resumes from epoch 1 and ends with the
    model, curve and metrics of an uninterrupted run, and leaves no resume state or temp folder behind."""
    from flow_support import train_stage

    from recsys.prepare import save

    params = write_params({"train": {"epochs": 3}})
    roots = {name: tmp_path / name for name in ("straight", "killed")}

    def stage(root, extra_env=None):
        return train_stage(root, params, extra_env)

    for root in roots.values():
        save(tiny_prepared, root / "artifacts" / "prepared")
    assert stage(roots["straight"]).returncode == 0
    killed = stage(roots["killed"], {"RECSYS_FAULT": fault})
    assert killed.returncode == 1 and f"injected fault at {fault}" in killed.stderr, killed.stderr[-2000:]
    # The best model so far is a complete checkpoint (saved by renames), never a half-written one.
    best = load_model(roots["killed"] / "artifacts" / "models" / "sasrec")[1]["best_epoch"]
    assert best == 1 or (fault == "resume_state_moved_aside" and best == 2)
    assert any((roots["killed"] / ".resume").iterdir())  # epoch 1's state, kept for the rerun
    rerun = stage(roots["killed"])
    assert rerun.returncode == 0 and "resumed model=sasrec from epoch=1" in rerun.stderr, rerun.stderr[-2000:]

    assert_same_weights(*(r / "artifacts" / "models" / "sasrec" for r in (roots["killed"],
                                                                          roots["straight"])))
    curves = [read_curve(r / "plots" / "sasrec.csv") for r in (roots["killed"], roots["straight"])]
    assert [row["valid_ndcg@10"] for row in curves[0]] == [row["valid_ndcg@10"] for row in curves[1]]
    assert not any((roots["killed"] / ".resume").iterdir())
    assert not [p for p in (roots["killed"] / "artifacts" / "models").iterdir() if p.name.startswith(".")]


# --- checkpoints --------------------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path, tiny_sasrec_config):
    torch.manual_seed(0)
    model = SASRec(tiny_sasrec_config, n_items=6, n_users=3).eval()
    out = save_checkpoint(tmp_path / "ckpt", model, dataset_fingerprint="f" * 64, item_ids=list("abcdef"),
                          user_ids=["u1", "u2", "u3"], extra={"best_epoch": 4})
    return model, out


def sample_batch() -> Batch:
    items = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 1]])
    return Batch(items=items, times=torch.zeros_like(items), users=torch.tensor([1, 2]))


def test_checkpoint_round_trip(saved, tiny_sasrec_config):
    model, out = saved
    assert {p.name for p in out.iterdir()} == CHECKPOINT_FILES
    loaded, meta = load_model(out)
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded.score(sample_batch()), model.score(sample_batch()))
    assert meta["config"] == dataclasses.asdict(tiny_sasrec_config)
    assert (meta["model"], meta["n_items"], meta["n_users"], meta["format_version"], meta["best_epoch"]) == (
        "sasrec", 6, 3, 1, 4)
    assert meta["dataset_fingerprint"] == "f" * 64
    assert meta["items"] == [None, *"abcdef"] and meta["users"] == [None, "u1", "u2", "u3"]
    on_disk = json.loads((out / "model.json").read_text())
    assert on_disk["config"] == dataclasses.asdict(tiny_sasrec_config) and "items" not in on_disk


def test_checkpoint_never_unpickles(saved, monkeypatch):
    _, out = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint must never be unpickled")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    load_model(out)
    # The weights file is a safetensors file: an 8-byte header length, then a JSON header.
    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert "item_emb.weight" in header


def test_overwriting_a_checkpoint_leaves_no_temporaries(saved, tiny_sasrec_config):
    model, out = saved
    save_checkpoint(out, model, dataset_fingerprint="0" * 64, item_ids=list("abcdef"), user_ids=["u1", "u2", "u3"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["ckpt"]
    assert load_model(out)[1]["dataset_fingerprint"] == "0" * 64


def test_a_save_killed_midway_leaves_a_temp_folder_the_next_save_removes(saved, tmp_path):
    """kill -9 inside `save_checkpoint` (a real process, `RECSYS_FAULT`) leaves `.ckpt-xxxx` beside the
    checkpoint; the next save of that checkpoint removes it (issue 16)."""
    import os
    import subprocess
    import sys

    model, out = saved
    script = (
        "import torch, sys\n"
        "from recsys.checkpoint import save_checkpoint\n"
        "from recsys.models.sasrec import SASRec, SASRecConfig\n"
        "model = SASRec(SASRecConfig(dim=8, n_layers=1, n_heads=1, max_len=5), n_items=6, n_users=3)\n"
        "save_checkpoint(sys.argv[1], model, dataset_fingerprint='0' * 64, item_ids=list('abcdef'),\n"
        "                user_ids=['u1', 'u2', 'u3'])\n"
    )
    env = {**os.environ, "RECSYS_FAULT": "checkpoint_temp_written", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == 1, killed.stderr
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(".ckpt-")]
    assert len(left) == 1, left  # the leftover the kill made (and the checkpoint itself is untouched)
    assert load_model(out)[1]["dataset_fingerprint"] == "f" * 64
    save_checkpoint(out, model, dataset_fingerprint="0" * 64, item_ids=list("abcdef"), user_ids=["u1", "u2", "u3"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("damage", [
    "garbage", "truncated",
    "missing_weights", "missing_meta", "bad_json", "missing_items", "format", "shape", "unknown_key",
])
def test_damaged_checkpoint_is_a_checkpoint_error(saved, damage):
    _, out = saved
    weights_file, meta_file = out / "model.safetensors", out / "model.json"
    meta = json.loads(meta_file.read_text())
    if damage == "garbage":
        weights_file.write_bytes(b"\x00" * 64)
    elif damage == "truncated":
        weights_file.write_bytes(weights_file.read_bytes()[:200])
    elif damage == "missing_weights":
        weights_file.unlink()
    elif damage == "missing_meta":
        meta_file.unlink()
    elif damage == "bad_json":
        meta_file.write_text("{not json")
    elif damage == "missing_items":
        (out / "items.json").unlink()
    elif damage == "format":
        meta_file.write_text(json.dumps({**meta, "format_version": 99}))
    elif damage == "shape":
        meta_file.write_text(json.dumps({**meta, "n_items": 25}))
    elif damage == "unknown_key":
        meta_file.write_text(json.dumps({**meta, "config": {**meta["config"], "secret": 1}}))
    with pytest.raises(CheckpointError):
        load_model(out)


# --- schedule knobs -----------------------------------------------------------------------------------------


def test_warmup_ramps_the_learning_rate_linearly_then_holds_it(tiny_prepared, tiny_sasrec_config,
                                                               fast_train_config, tmp_path):
    from recsys.sequences import SequenceData

    n_spans = len(SequenceData.from_prepared(tiny_prepared).train_spans(tiny_sasrec_config.max_len))
    steps_per_epoch = math.ceil(n_spans / fast_train_config.batch_size)
    warmup = 2 * steps_per_epoch + 1  # ends one step into epoch 3
    cfg = dataclasses.replace(fast_train_config, epochs=4, lr=0.01, warmup_steps=warmup)
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path)
    lrs = [float(r["lr"]) for r in read_curve(tmp_path / "curve.csv")]
    # The curve records the rate of each epoch's last step.
    assert lrs[0] == pytest.approx(0.01 * steps_per_epoch / warmup)
    assert lrs[1] == pytest.approx(0.01 * 2 * steps_per_epoch / warmup)
    assert lrs[2:] == [pytest.approx(0.01)] * 2


def test_random_batching_trains_and_reaches_the_trainer(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                       tmp_path):
    """`train.batching: random` is a different batch plan (other losses from the first epoch on), and still
    learns: the planted chains beat popularity as with bucketed batches."""
    cfg = dataclasses.replace(fast_train_config, epochs=3)
    bucketed = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "b")
    uniform = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, batching="random"), tmp_path / "r")
    losses = {name: [r["loss"] for r in read_curve(tmp_path / name / "curve.csv")] for name in ("b", "r")}
    assert losses["b"] != losses["r"]
    pop = train_model("mostpop", MostPopConfig(), TrainConfig(device="cpu", progress="off"), tiny_prepared,
                      tmp_path / "mostpop")
    assert uniform.best_valid["ndcg@10"] > pop.best_valid["ndcg@10"] + 0.05
    del bucketed


def test_a_run_reports_its_cpu_seconds_beside_its_wall_seconds(trained_sasrec):
    result, _ = trained_sasrec
    assert 0 < result.cpu_seconds_to_best <= result.cpu_seconds
    # One process's CPU time: at most the wall time times the threads it may use (plus the clock's grain).
    assert result.cpu_seconds <= result.seconds * max(torch.get_num_threads(), 1) + 0.5


def test_min_epochs_holds_off_early_stopping(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    # lr = 0: validation never improves after epoch 1, so patience 2 alone would stop after epoch 3.
    cfg = dataclasses.replace(fast_train_config, epochs=20, patience=2, lr=0.0, min_epochs=6)
    result = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path)
    assert (result.best_epoch, result.epochs_run, result.stopped_by) == (1, 6, "early_stopping")


@pytest.mark.parametrize("scaling,expected", [("none", 1e-3), ("sqrt", 2e-3), ("linear", 4e-3)])
def test_learning_rate_scales_with_batch_size(scaling, expected):
    cfg = TrainConfig(lr=1e-3, batch_size=512, lr_reference_batch=128, lr_scaling=scaling)
    assert cfg.effective_lr == pytest.approx(expected)


@pytest.mark.parametrize("schedule,expected", [
    ("constant", [1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [1.0, 0.775, 0.55, 0.325, 0.1]),  # 0.1 + 0.9·(1 − t), t = (epoch − 1)/4; epoch 5: past the budget
    ("cosine", [1.0, 0.1 + 0.9 * (0.5 + 0.5 * math.cos(math.pi / 4)), 0.55,
                0.1 + 0.9 * (0.5 - 0.5 * math.cos(math.pi / 4)), 0.1]),
])
def test_lr_schedule_factor_falls_from_one_to_lr_final_over_the_epochs(schedule, expected):
    cfg = TrainConfig(epochs=4, lr_schedule=schedule, lr_final=0.1)
    assert [cfg.schedule_factor(e) for e in range(1, 6)] == pytest.approx(expected)


def test_lr_schedule_sets_each_epochs_rate_and_a_resumed_run_keeps_the_curve(
        tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path):
    """The rate of every epoch follows the cosine; warm-up ramps up to the epoch's scheduled rate, not to
    train.lr; a run interrupted after epoch 2 resumes on the same curve, bit for bit."""
    cfg = dataclasses.replace(fast_train_config, epochs=4, patience=10, lr=0.01, lr_schedule="cosine",
                              lr_final=0.0)
    whole = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "whole")
    lrs = [float(r["lr"]) for r in read_curve(tmp_path / "whole" / "curve.csv")]
    assert lrs == pytest.approx([0.01 * (0.5 + 0.5 * math.cos(math.pi * e / 4)) for e in range(4)])
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "cut", on_epoch=Interrupt(at=2))
    continued = Interrupt()
    resumed = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "cut", on_epoch=continued)
    assert continued.seen == [3, 4]  # resumed after epoch 2, not trained again from the start
    assert read_curve(tmp_path / "cut" / "curve.csv")[-1]["loss"] == read_curve(
        tmp_path / "whole" / "curve.csv")[-1]["loss"]
    assert resumed.best_valid == whole.best_valid
    # Warm-up that ends one step into epoch 3 of a linear schedule ramps towards each epoch's scheduled rate.
    from recsys.sequences import SequenceData

    n_spans = len(SequenceData.from_prepared(tiny_prepared).train_spans(tiny_sasrec_config.max_len))
    per_epoch = math.ceil(n_spans / cfg.batch_size)
    warmup = 2 * per_epoch + 1
    warm = dataclasses.replace(cfg, lr_schedule="linear", warmup_steps=warmup)
    run(tiny_prepared, tiny_sasrec_config, warm, tmp_path / "warm")
    assert [float(r["lr"]) for r in read_curve(tmp_path / "warm" / "curve.csv")] == pytest.approx(
        [0.01 * per_epoch / warmup, 0.0075 * 2 * per_epoch / warmup, 0.005, 0.0025])


def test_schedule_settings_are_validated():
    for bad in ({"warmup_steps": -1}, {"min_epochs": -2}, {"batch_size": 0}, {"lr_final": 1.5},
                {"lr_final": -0.1}):
        with pytest.raises(ValueError, match="train"):
            TrainConfig(**bad)


@pytest.mark.parametrize("name", ["sasrec", "mojito", "bert4rec"])
def test_micro_batches_take_the_same_step_as_the_whole_batch(tiny_prepared, name):
    """Without dropout (and, for BERT4Rec, with every position masked, so nothing is drawn), a step run as
    micro-batches moves every weight exactly as one plain forward/backward of the whole batch does: same
    gradient, less padding. max_len 8 < the longest spans (9 events), so BERT4Rec's cut to max_len counts."""
    from recsys.model_configs import MODEL_CONFIGS
    from recsys.models import build_model
    from recsys.sequences import SequenceData, TrainingTensors, micro_batches, random_batch_rows

    # Nothing drawn: no dropout, no MOJITO attention noise (σ = 0; its FISM sample is every item while
    # fism_items ≥ max_len), BERT4Rec masks every position.
    overrides = {"sasrec": {}, "mojito": {"noise_init": 0.0, "fism_items": 20},
                 "bert4rec": {"mask_prob": 1.0, "last_item_share": 0.0}}[name]
    config = MODEL_CONFIGS[name](dim=16, n_heads=1, n_layers=1, dropout=0.0, max_len=8, **overrides)
    data = SequenceData.from_prepared(tiny_prepared)
    tensors = TrainingTensors(data, data.train_spans(8, "all"))
    rows = random_batch_rows(tensors.lengths, 32, torch.Generator().manual_seed(0))[0]
    assert len(set(tensors.lengths[rows])) > 4 and tensors.lengths[rows].max() == 9  # mixed, and some cut
    after, losses = {}, {}
    for parts in (None, 4):  # None: the reference, one plain step on the whole batch
        torch.manual_seed(0)
        model = build_model(name, config, data.n_items, data.n_users)
        model.fit_statistics(data.train_items())
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        batch_rows = torch.from_numpy(rows)
        if parts is None:
            loss = model.loss(tensors.batch(batch_rows, int(tensors.lengths[rows].max()) - 1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            micro = micro_batches(tensors.lengths[rows], parts, model.loss_terms(tensors.lengths[rows]))
            assert len(micro) == parts
            loss = optimiser_step(model, model.loss, optimizer, tensors, batch_rows, micro)
        losses[parts] = float(loss.detach())
        after[parts] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert losses[4] == pytest.approx(losses[None], rel=1e-5)
    for key, value in after[None].items():
        torch.testing.assert_close(after[4][key], value, rtol=1e-4, atol=1e-6, msg=key)


def test_the_trainer_learns_the_same_with_and_without_micro_batches(tiny_prepared, tiny_sasrec_config,
                                                                    fast_train_config, tmp_path, monkeypatch):
    """Through the whole trainer (batch plans, warm-up, epoch loss, validation): `micro_batches` 1 and 4 give
    the same curve when nothing is drawn at random — and 4 really splits the steps (a spy on the planner)."""
    import recsys.train

    model_config = dataclasses.replace(tiny_sasrec_config, dropout=0.0)
    cfg = dataclasses.replace(fast_train_config, epochs=3, batching="random", warmup_steps=3)
    curves, planned = {}, {}
    real = recsys.train.micro_batches
    for parts in (1, 4):
        seen = planned.setdefault(parts, [])
        monkeypatch.setattr(recsys.train, "micro_batches",
                            lambda lengths, n, terms, seen=seen: seen.append(n) or real(lengths, n, terms))
        run(tiny_prepared, model_config, dataclasses.replace(cfg, micro_batches=parts), tmp_path / str(parts))
        curves[parts] = read_curve(tmp_path / str(parts) / "curve.csv")
    assert max(planned[1]) == 1 and max(planned[4]) == 4
    assert len(curves[1]) == len(curves[4]) == 3
    for a, b in zip(curves[1], curves[4]):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-4)
        assert float(a["valid_ndcg@10"]) == pytest.approx(float(b["valid_ndcg@10"]), abs=1e-4)


def test_a_resumed_optimiser_keeps_this_runs_implementation_not_the_saved_ones(tmp_path, tiny_sasrec_config):
    """The resume key does not name the device (`train.device: auto`), so a state saved by one implementation
    of Adam (a CPU's foreach) may be resumed by another (CUDA's fused, capturable under train.cuda_graph): the
    groups keep this run's flags, and the step counts sit where this implementation keeps them."""
    from recsys.train_state import Resume

    model = SASRec(tiny_sasrec_config, n_items=30, n_users=5)
    saving = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    model(sample_batch()).sum().backward()
    saving.step()
    resume = Resume(tmp_path, "sasrec", "k")
    resume.save(model, saving, torch.Generator(), {"epoch": 1})
    resuming = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    state = resume.load(model, resuming, torch.Generator(), torch.device("cpu"))
    assert state["epoch"] == 1
    assert resuming.param_groups[0]["foreach"] is False
    steps = [s["step"] for s in resuming.state.values()]
    assert steps and all(t.device.type == "cpu" and t.dtype == torch.float32 and float(t) == 1.0 for t in steps)
    assert any(float(s["exp_avg"].abs().sum()) > 0 for s in resuming.state.values())  # the moments came back


def test_a_resume_state_write_that_fails_leaves_the_last_state_and_no_temp_folder(tmp_path, monkeypatch,
                                                                                    tiny_sasrec_config):
    """A full disk while the tensors are written (a fault made here: save_file raises ENOSPC): the last epoch's
    state is still the one to resume from, and the half-written `.tmp` folder is gone, not left until the next
    run."""
    import errno

    from recsys import train_state
    from recsys.train_state import Resume

    model = SASRec(tiny_sasrec_config, n_items=30, n_users=5)
    optimizer = torch.optim.Adam(model.parameters())
    resume = Resume(tmp_path, "sasrec", "k")
    resume.save(model, optimizer, torch.Generator(), {"epoch": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(train_state, "save_file", full)
    with pytest.raises(OSError, match="No space left"):
        resume.save(model, optimizer, torch.Generator(), {"epoch": 2})
    assert resume.peek()["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sasrec-k"]


def test_a_curve_write_that_fails_leaves_the_old_curve_and_no_temp_file(tmp_path):
    from recsys.train import _write_curve

    curve = tmp_path / "plots" / "sasrec.csv"
    _write_curve(curve, [{"epoch": 1, "loss": 2.0}])
    before = curve.read_bytes()
    with pytest.raises(ValueError, match="not in fieldnames"):  # a row the header does not cover
        _write_curve(curve, [{"epoch": 1, "loss": 2.0}, {"epoch": 2, "loss": 1.5, "extra": 0}])
    assert curve.read_bytes() == before
    assert sorted(p.name for p in curve.parent.iterdir()) == ["sasrec.csv"]


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_a_stage_interrupted_mid_training_says_so_in_one_line_and_resumes(tiny_prepared, write_params, tmp_path):
    """SIGINT to the train stage (a Ctrl-C, or `run_dvc` stopping the stages of an interrupted run): it
    printed a 60-line KeyboardInterrupt traceback into `dvc repro`'s output; now one line, the process ends by
    the SIGINT (a shell's 130), and the state of the last finished epoch is kept for the rerun."""
    from flow_support import interrupt_when

    from recsys.prepare import save

    # (params.yaml's sasrec.train.patience would end it on its own: the interrupt must find it training)
    params = write_params({"train": {"epochs": 100000}, "sasrec": {"train": {"patience": 100000}}})
    save(tiny_prepared, tmp_path / "artifacts" / "prepared")
    # (until an epoch's state is saved whole: its folder renamed into place)
    interrupt_when([sys.executable, "-m", "recsys.train", "--model", "sasrec", "--params", str(params), "--root",
                    str(tmp_path)], lambda: _saved_states(tmp_path), seconds=300, poll=0.2, cwd=tmp_path,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert _saved_states(tmp_path)


def _saved_states(root: Path) -> list[Path]:
    return [d for d in (root / ".resume").glob("*") if not d.name.endswith(".tmp") and (d / "state.json").is_file()]
