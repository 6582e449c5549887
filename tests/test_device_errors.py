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

# What the CPU has: the machine's memory, or a container's limit where one is tighter (recsys.device.cgroup_memory)
CPU_MEMORY = r"\([0-9.]+ of (?:its )?[0-9.]+ GiB (?:control-group \(container\) limit )?available\)"
IMPOSSIBLE = 10**13  # float32 elements: 40 TB, refused by the allocator at once (no memory is touched)


def test_running_out_of_memory_becomes_one_line_naming_the_setting():
    """A real allocation failure (the CPU allocator's, a plain RuntimeError) inside the guard."""
    with pytest.raises(DeviceError) as caught:
        with out_of_memory_as_error("cpu", "training sasrec (128 sequences a step)",
                                    "lower train.batch_size (now 128)"):
            torch.empty(IMPOSSIBLE)
    message = str(caught.value)
    assert re.fullmatch(r"out of memory training sasrec \(128 sequences a step\) on the CPU "
                        rf"{CPU_MEMORY}: lower train.batch_size \(now 128\)", message), message
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
                        rf"{CPU_MEMORY}: set evaluate.batch_size below 512 "
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


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
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


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
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
    assert re.search(rf"GiB for them, their gradients and Adam's moments, more than the CPU {CPU_MEMORY} "
                     r"holds; lower sasrec.dim \(now 1,048,576\) or sasrec.n_layers \(now 1\), or "
                     r"train on a device with more memory \(train.device\)$", last), last
    assert not (tmp_path / "artifacts" / "models" / "sasrec").exists()


GIB = 2**30


def _cgroup_v2(tmp_path, path: str, groups: dict[str, tuple[str, int, int]]):
    """A cgroup v2 tree under tmp_path: {group: (memory.max, memory.current, inactive_file)}."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup").write_text(f"0::{path}\n")
    for group, (limit, used, inactive) in groups.items():
        d = tmp_path / "fs" / group
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(f"{limit}\n")
        (d / "memory.current").write_text(f"{used}\n")
        (d / "memory.stat").write_text(f"anon 1\ninactive_file {inactive}\nactive_file 7\n")
    return str(tmp_path / "cgroup"), str(tmp_path / "fs")


def test_a_containers_memory_limit_is_read_from_its_control_groups(tmp_path):
    """A pod's limit (cgroup v2): the tightest group above the process counts, its reclaimable page cache
    does not; cgroup v1's memory controller likewise; no limit anywhere, or no /proc file: None."""
    from recsys.device import cgroup_memory

    proc, root = _cgroup_v2(tmp_path / "v2", "/kubepods/pod1/c1", {
        "kubepods": (str(4 * GIB), 3 * GIB, GIB), "kubepods/pod1": ("max", 3 * GIB, 0),
        "kubepods/pod1/c1": (str(8 * GIB), GIB, 0)})
    assert cgroup_memory(proc, root) == (2 * GIB, 4 * GIB)  # 4 GiB − (3 − 1 reclaimable) beats 8 − 1
    proc, root = _cgroup_v2(tmp_path / "ns", "/", {"": (str(GIB), GIB // 4, 0)})  # a container's namespace
    assert cgroup_memory(proc, root) == (3 * GIB // 4, GIB)
    proc, root = _cgroup_v2(tmp_path / "none", "/user.slice", {"user.slice": ("max", GIB, 0)})
    assert cgroup_memory(proc, root) is None
    v1 = tmp_path / "v1"
    group = v1 / "fs" / "memory" / "docker" / "abc"
    group.mkdir(parents=True)
    (v1 / "cgroup").write_text("9:name=systemd:/\n4:memory:/docker/abc\n3:cpuset:/\n0::/\n")
    (group / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (group / "memory.usage_in_bytes").write_text(f"{3 * GIB // 2}\n")
    (group / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {GIB // 2}\n")
    assert cgroup_memory(str(v1 / "cgroup"), str(v1 / "fs")) == (GIB, 2 * GIB)
    (group / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory(str(v1 / "cgroup"), str(v1 / "fs")) is None
    assert cgroup_memory(str(tmp_path / "absent"), root) is None  # not Linux


def test_a_model_over_the_containers_limit_is_refused_naming_the_limit(tmp_path, monkeypatch):
    """/proc/meminfo shows the host's memory inside a container; the parameter check reads the group's limit,
    so a model past it is refused in one line instead of the kernel killing the stage without a word."""
    from recsys import device

    proc, root = _cgroup_v2(tmp_path, "/", {"": (str(GIB), GIB // 2, 0)})
    monkeypatch.setattr(device, "PROC_CGROUP", proc)
    monkeypatch.setattr(device, "CGROUP_ROOT", root)
    assert device.available_bytes("cpu") == GIB // 2
    device.check_parameters_fit(GIB // 2 // 16, "cpu", "small", "lower it")  # exactly fits: no error
    with pytest.raises(DeviceError) as caught:
        device.check_parameters_fit(GIB // 16, "cpu", "sasrec (dim 9)", "lower sasrec.dim (now 9)")
    assert str(caught.value) == ("sasrec (dim 9) has 67,108,864 parameters: training needs 1.0 GiB for them, their "
                                 "gradients and Adam's moments, more than the CPU (0.5 of its 1.0 GiB control-group "
                                 "(container) limit available) holds; lower sasrec.dim (now 9)")


def test_data_parallel_cpu_ranks_on_one_machine_each_count_a_copy(tmp_path, monkeypatch):
    """torchrun's ranks on one CPU machine share its memory, each with the whole model: a model that fits once
    but not LOCAL_WORLD_SIZE times is refused, saying so."""
    from recsys import device

    proc, root = _cgroup_v2(tmp_path, "/", {"": (str(GIB), 0, 0)})
    monkeypatch.setattr(device, "PROC_CGROUP", proc)
    monkeypatch.setattr(device, "CGROUP_ROOT", root)
    n = GIB // 16 // 3  # a third of the limit
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    device.check_parameters_fit(n, "cpu", "m", "lower it")  # three copies fit
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(DeviceError, match=r"training needs 1\.3 GiB for them, their gradients and Adam's moments "
                                          r"\(4 processes on this machine, a copy each\), more than the CPU "):
        device.check_parameters_fit(n, "cpu", "m", "lower it")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert device.local_processes() == 1
