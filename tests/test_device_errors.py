"""What a person reads when the device cannot run the settings, or training diverges (recsys/device.py,
recsys/train.py): one `error:` line with the numbers and the setting to change, exit code 1, no traceback, and
no retry by the flows (the same settings fail the same way)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from flow_support import train_stage

from recsys.device import DeviceError, is_out_of_memory, out_of_memory_as_error, resolve_device
from recsys.entry import is_transient, is_user_error
from recsys.train import TrainingError, train_model

IMPOSSIBLE = 10**13  # float32 elements: 40 TB, refused by the allocator at once (no memory is touched)


def test_running_out_of_memory_becomes_one_line_naming_the_setting():
    """A real allocation failure (the CPU allocator's, a plain RuntimeError) inside the guard."""
    with pytest.raises(DeviceError) as caught:
        with out_of_memory_as_error("cpu", "training sasrec (128 sequences a step)",
                                    "lower train.batch_size (now 128)"):
            torch.empty(IMPOSSIBLE)
    message = str(caught.value)
    assert re.fullmatch(r"out of memory training sasrec \(128 sequences a step\) on the CPU "
                        r"\([0-9.]+ of [0-9.]+ GiB available\): lower train.batch_size \(now 128\)",
                        message), message
    assert is_out_of_memory(caught.value.__cause__)  # the allocator's own error stays for --verbose
    assert is_user_error(caught.value) and not is_transient(caught.value)


def test_ranking_out_of_memory_names_the_scoring_batch_and_its_setting(tiny_sasrec_config):
    """One guard for every ranking (validation: train.eval_batch_size; the evaluate stage and the gate's
    re-scoring: evaluate.batch_size), with the batch an automatic setting resolved to."""
    from recsys.models.sasrec import SASRec
    from recsys.ranking import scoring_memory

    model = SASRec(tiny_sasrec_config, n_items=30, n_users=5)
    with pytest.raises(DeviceError) as caught:
        with scoring_memory(model, 0, "evaluate.batch_size", "cpu", "test"):
            torch.empty(IMPOSSIBLE)
    assert re.fullmatch(r"out of memory ranking the test split \(512 users a batch × 31 items\) on the CPU "
                        r"\([0-9.]+ of [0-9.]+ GiB available\): set evaluate.batch_size below 512 "
                        r"\(now 0 = auto\)", str(caught.value)), str(caught.value)


def test_other_runtime_errors_pass_through_the_guard():
    with pytest.raises(RuntimeError, match="shape") as caught:
        with out_of_memory_as_error("cpu", "training", "lower train.batch_size"):
            torch.zeros(2, 3) @ torch.zeros(2, 3)
    assert not isinstance(caught.value, DeviceError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_one_names_the_setting():
    with pytest.raises(DeviceError, match=r"train.device is 'cuda' but torch .* sees no CUDA device: set "
                                          r"train.device to auto or cpu") as caught:
        resolve_device("cuda")
    assert is_user_error(caught.value) and not is_transient(caught.value)


def test_a_diverging_loss_is_a_user_error_naming_the_learning_rate(tiny_prepared, tiny_sasrec_config,
                                                                    fast_train_config, tmp_path):
    cfg = dataclasses.replace(fast_train_config, lr=1e30, epochs=2)
    diverged = r"sasrec: the training loss became nan at epoch 1: lower train.lr \(now 1e\+30\) or set " \
               r"train.grad_clip \(now 5\)"
    with pytest.raises(TrainingError, match=diverged) as caught:
        train_model("sasrec", tiny_sasrec_config, cfg, tiny_prepared, tmp_path / "model",
                    resume_root=tmp_path / "resume")
    assert is_user_error(caught.value) and not is_transient(caught.value)


def _one_error_line(failed) -> str:
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "Traceback" not in failed.stderr, failed.stderr[-2000:]
    return failed.stderr.strip().splitlines()[-1]


def test_a_training_step_out_of_memory_stops_the_stage_with_one_line(tiny_prepared, write_params, tmp_path):
    """A setting whose first step asks the allocator for more than the machine has (10^11 shared negatives:
    800 GB of ids) — a real allocation failure, not a mock."""
    from recsys.prepare import save

    save(tiny_prepared, tmp_path / "artifacts" / "prepared")
    params = write_params({"train": {"epochs": 1, "batch_size": 256},
                           "sasrec": {"loss": "sampled_ce", "n_negatives": 10**11}})
    last = _one_error_line(train_stage(tmp_path, params))
    assert last.startswith("error: out of memory training sasrec (256 sequences of up to 20 events a step) "
                           "on the CPU ("), last
    advice = "lower train.batch_size (now 256) or raise train.micro_batches (now 8 a step on cpu)"
    assert last.endswith(advice), last
    assert not (tmp_path / "artifacts" / "models" / "sasrec").exists()  # nothing half-written
    if not torch.cuda.is_available():
        last = _one_error_line(train_stage(tmp_path, write_params({"train": {"device": "cuda"}})))
        assert last.startswith("error: train.device is 'cuda' but torch "), last


def test_a_model_too_large_to_train_is_refused_before_it_is_allocated(tiny_prepared, write_params, tmp_path):
    """Its parameters alone, with gradients and Adam's moments, exceed the machine's memory: the stage stops
    with one line naming the sizes (counted on the meta device, so nothing is allocated or killed)."""
    from recsys.prepare import save

    save(tiny_prepared, tmp_path / "artifacts" / "prepared")
    params = write_params({"train": {"epochs": 1}, "sasrec": {"dim": 2**20, "n_heads": 1}})
    last = _one_error_line(train_stage(tmp_path, params))
    n_parameters = re.search(r" has ([0-9,]+) parameters: ", last)
    assert n_parameters and int(n_parameters.group(1).replace(",", "")) > 6 * 2**40, last  # a block's 6d²
    assert last.startswith("error: sasrec (dim 1,048,576, n_layers 1, max_len 20; "
                           f"{tiny_prepared.n_items:,} items, {tiny_prepared.n_users:,} users) has "), last
    assert re.search(r"GiB for them, their gradients and Adam's moments, more than the CPU \([0-9.]+ of [0-9.]+ "
                     r"GiB available\) holds; lower sasrec.dim \(now 1,048,576\) or sasrec.n_layers \(now 1\), or "
                     r"train on a device with more memory \(train.device\)$", last), last
    assert not (tmp_path / "artifacts" / "models" / "sasrec").exists()
