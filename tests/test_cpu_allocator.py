"""`train.cpu_allocator` (recsys.device.retain_cpu_memory): with "retain", memory a CPU step frees stays in the
process for the next step instead of going back to the kernel; "system" leaves glibc as it is. Measured on
glibc's own counters (mallinfo2) in a fresh process each, since the setting is process-wide."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import subprocess
import sys
import textwrap

import pytest

from recsys.config import parse_params


def _has_mallinfo2() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _has_mallinfo2(), reason="glibc ≥ 2.33 (mallinfo2) on Linux only")

# Allocates and frees a 64 MiB tensor, as a step frees its attention weights, then reads glibc's counters:
# `mmapped` = bytes now in mmap'd blocks while the tensor lives, `kept` = bytes of free heap kept after it is
# freed. The mode is set directly, or (with a prepared dataset and an output dir) by training MostPop on a CPU,
# or (`- --evaluate <stage args>`) by the evaluate stage reading it from its params file.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, json, logging, sys
    import torch
    from recsys.device import cpu_memory_retained, retain_cpu_memory

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = Info
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("recsys.device").setLevel(logging.DEBUG)  # (its note of the setting is a debug line)
    big = torch.ones(64 << 18)  # 64 MiB: over glibc's largest mmap threshold (32 MiB)
    del big
    if len(sys.argv) > 2 and sys.argv[2] == "--evaluate":  # the evaluate stage, as `python -m recsys.evaluate`
        from recsys import evaluate
        evaluate.main(sys.argv[3:])
        applied = cpu_memory_retained()
    elif len(sys.argv) > 2:  # through the trainer, as `python -m recsys.train` takes it
        from recsys.model_configs import TrainConfig
        from recsys.model_configs import MostPopConfig
        from recsys.train import train_model
        train_model("mostpop", MostPopConfig(), TrainConfig(device="cpu", progress="off",
                    cpu_allocator=sys.argv[1]), sys.argv[2], sys.argv[3])
        applied = cpu_memory_retained()
    else:
        applied = retain_cpu_memory(sys.argv[1], torch.device("cpu"))
    big = torch.ones(64 << 18)
    mmapped = libc.mallinfo2().hblkhd
    del big
    print(json.dumps({"applied": applied, "mmapped": mmapped, "kept": libc.mallinfo2().fordblks}))
""")
MIB = 1 << 20


def probe(mode: str, *train_args: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode, *train_args], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout), done.stderr


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_retain_keeps_a_freed_step_tensor_in_the_process():
    kept, log = probe("retain")
    assert kept["applied"] is True
    assert kept["mmapped"] < 64 * MIB, kept  # served from the heap, not a fresh mapping
    assert kept["kept"] >= 64 * MIB, kept  # and still there, free for the next step, after it was freed
    assert "train.cpu_allocator=retain" in log and "set it to system" in log


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_system_leaves_the_c_library_alone():
    system, log = probe("system")
    assert system["applied"] is False
    assert system["mmapped"] >= 64 * MIB, system  # glibc's default: a block this large is its own mapping
    assert system["kept"] < 64 * MIB, system  # handed back to the kernel when freed
    assert "cpu_allocator" not in log


def test_params_yaml_retains_by_default(repo_root):
    import yaml
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    assert parse_params(raw).train.cpu_allocator == "retain"
    assert parse_params({}).train.cpu_allocator == "retain"
    assert parse_params({"train": {"cpu_allocator": "system"}}).train.cpu_allocator == "system"


@pytest.mark.parametrize("mode", ["retain", "system"])
@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_the_trainer_sets_it_on_a_cpu(mode, tiny_prepared_dir, tmp_path):
    state, log = probe(mode, str(tiny_prepared_dir), str(tmp_path / "model"))
    assert state["applied"] is (mode == "retain")
    assert (state["mmapped"] < 64 * MIB) is (mode == "retain"), state
    assert ("train.cpu_allocator=retain" in log) is (mode == "retain")


@pytest.mark.parametrize("mode", ["retain", "system"])
@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_the_evaluate_stage_sets_it_on_a_cpu(mode, tiny_prepared, write_params, tmp_path):
    """The test pass's scoring batches allocate like validation's: the stage takes the model's setting."""
    from recsys import train
    from recsys.prepare import save

    root = tmp_path / "repo"
    save(tiny_prepared, root / "artifacts" / "prepared")
    params = write_params({"train": {"device": "cpu", "cpu_allocator": mode}})
    stage = ["--model", "mostpop", "--params", str(params), "--root", str(root)]
    train.main(stage)
    state, log = probe("-", "--evaluate", *stage)
    assert state["applied"] is (mode == "retain")
    assert (state["mmapped"] < 64 * MIB) is (mode == "retain"), state
    assert ("train.cpu_allocator=retain" in log) is (mode == "retain")
    assert (root / "metrics" / "mostpop.json").is_file()  # the stage ran through
