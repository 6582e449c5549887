"""recsys.retraining's reading of the training curves while `dvc repro` runs: what the retrain flow logs and
puts in its progress artifact."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest

from recsys.config import load_params
from recsys.layout import VALID_COLUMN, Layout
from recsys.retraining import ModelProgress, training_progress, training_status

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_curve(root: Path, model: str, valids: list[float], first_epoch: int = 1) -> Path:
    """A curve as the trainer writes it (recsys.train `_write_curve`): one row an epoch."""
    path = Layout(root).curve(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["epoch", "loss", VALID_COLUMN, "valid_hr@10", "seconds", "lr"])
        writer.writeheader()
        for i, valid in enumerate(valids):
            writer.writerow({"epoch": first_epoch + i, "loss": "nan" if first_epoch == 0 else 5.0 - i,
                             VALID_COLUMN: valid, "valid_hr@10": 2 * valid, "seconds": i + 1.0, "lr": 0.001})
    return path


@pytest.fixture
def params():
    return load_params(REPO_ROOT / "params.yaml")


def test_status_is_each_model_this_run_has_trained_with_its_newest_and_best_epoch(tmp_path, params):
    stale = write_curve(tmp_path, "bert4rec", [0.5, 0.6])  # a previous run's: DVC had not deleted it yet
    since = time.time() - 1  # (file times come from a coarser clock than time.time())
    os.utime(stale, (since - 60, since - 60))
    write_curve(tmp_path, "mostpop", [0.0244], first_epoch=0)
    write_curve(tmp_path, "sasrec", [0.10, 0.31, 0.31, 0.25])  # the best is the first of equals, as trained
    models = ["mostpop", "sasrec", "bert4rec", "mojito"]  # mojito has not started

    status = training_status(tmp_path, params, models, since)

    sasrec_budget = params.train_config("sasrec").epochs
    assert status == [ModelProgress("mostpop", 0, 0, 0.0244, 0.0244, 0, done=True),
                      ModelProgress("sasrec", 4, sasrec_budget, 0.25, 0.31, 2)]
    assert [str(p) for p in status] == [
        "mostpop counted (valid_ndcg@10=0.0244)",
        f"sasrec epoch 4/{sasrec_budget} valid_ndcg@10=0.2500 (best 0.3100 at epoch 2)"]
    # Of the four models' budgets: MostPop's whole (counted), SASRec's 4 epochs, none of the other two.
    assert training_progress(status, len(models)) == pytest.approx((1 + 4 / sasrec_budget) / 4)


def test_a_curve_written_before_the_newest_is_a_finished_run(tmp_path, params):
    """`dvc repro` trains one model at a time: once the next model's curve appears, the one before has ended,
    whether early stopping ended it or the budget did."""
    since = time.time() - 10
    sasrec = write_curve(tmp_path, "sasrec", [0.10, 0.31, 0.31, 0.25])
    bert4rec = write_curve(tmp_path, "bert4rec", [0.05])
    os.utime(sasrec, (since + 1, since + 1))
    os.utime(bert4rec, (since + 2, since + 2))
    budgets = {m: params.train_config(m).epochs for m in ("sasrec", "bert4rec")}

    status = training_status(tmp_path, params, ["sasrec", "bert4rec"], since)

    assert [(p.model, p.done) for p in status] == [("sasrec", True), ("bert4rec", False)]
    assert [str(p) for p in status] == [
        f"sasrec done after 4/{budgets['sasrec']} epochs (best valid_ndcg@10=0.3100 at epoch 2)",
        f"bert4rec epoch 1/{budgets['bert4rec']} valid_ndcg@10=0.0500 (best 0.0500 at epoch 1)"]
    assert training_progress(status, 2) == pytest.approx((1 + 1 / budgets["bert4rec"]) / 2)

    write_curve(tmp_path, "bert4rec", [0.05] * budgets["bert4rec"])  # the last model at its budget: done too
    assert all(p.done for p in training_status(tmp_path, params, ["sasrec", "bert4rec"], since))


def test_a_curve_being_rewritten_or_empty_is_no_progress_yet(tmp_path, params):
    since = time.time() - 1
    path = Layout(tmp_path).curve("sasrec")
    path.parent.mkdir(parents=True)
    path.write_text("epoch,loss,valid_ndcg@10\n1,5.0,")  # half a row: the next poll reads it whole
    assert training_status(tmp_path, params, ["sasrec"], since) == []
    path.write_text("")
    assert training_status(tmp_path, params, ["sasrec"], since) == []
    assert training_progress([], 2) == 0.0


def test_progress_never_passes_a_models_whole_budget(tmp_path, params):
    """A run of more epochs than params.yaml's (`--epochs`, a resumed longer run) counts as done, not more."""
    since = time.time() - 1
    budget = params.train_config("sasrec").epochs
    write_curve(tmp_path, "sasrec", [0.1] * (budget + 3))
    assert training_progress(training_status(tmp_path, params, ["sasrec"], since), 1) == 1.0
