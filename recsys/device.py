"""Which torch device a stage runs on (`train.device` in params.yaml), and what a device that cannot run
the configuration tells a person: no CUDA where `cuda` was asked for, or memory running out. Both are
`DeviceError`s — user errors (`recsys.entry`): one line naming the setting to change, no retry. Also how the
C allocator treats the memory a CPU step frees (`train.cpu_allocator`, `retain_cpu_memory`), and what a
training step computes in (`train.precision`, `training_autocast`)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Iterator

import torch

log = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    """The device cannot run what the settings ask (no CUDA, out of memory). The same settings on the same
    device fail the same way, so a flow does not retry it; the message says which setting to change."""

    transient = False


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceError(f"train.device is 'cuda' but torch {torch.__version__} ({build}) sees no CUDA "
                          "device: set train.device to auto or cpu, or install torch's CUDA build (README)")
    return torch.device(name)


# /proc/cpuinfo flags of CPUs that compute bfloat16 products natively (oneDNN's bf16 kernels): on x86 (`flags`)
# AVX512-BF16 (AMD Zen 4+, Intel Cooper Lake+) and AMX (Intel Sapphire Rapids+); on Arm (`Features`) the
# Armv8.6 BF16 extension (Neoverse V1/N2, AWS Graviton 3+). Without them torch emulates bf16 on a CPU, which
# is slower than float32.
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
CPUINFO_FLAG_LINES = ("flags", "Features")  # x86, Arm


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's flags as /proc/cpuinfo lists them (x86 `flags`, Arm `Features`); empty off Linux."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(CPUINFO_FLAG_LINES):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this machine's CPU lists a native bfloat16 flag (Linux; elsewhere False: `auto` keeps fp32)."""
    return bool(NATIVE_BF16_CPU_FLAGS & cpu_flags(cpuinfo))


def training_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """`train.precision` on `device`: the autocast dtype of a training step, or None for float32. "auto" is
    bfloat16 on CUDA that supports it and float32 on a CPU: bf16 on a CPU is asked for by name while its
    quality is being measured over seeds (benchmarks/RESULTS.md, session 43)."""
    if precision == "fp32" or device.type not in ("cpu", "cuda"):
        return None
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if precision == "bf16":
        if device.type == "cuda" and not cuda_bf16:
            raise DeviceError(f"train.precision is 'bf16' but {torch.cuda.get_device_name(device)} has no "
                              "bfloat16 support: set train.precision to auto or fp32")
        if device.type == "cpu" and not cpu_has_native_bf16():
            log.warning("train.precision=bf16 on a CPU without AVX512-BF16, AMX or Arm BF16: torch emulates "
                        "bfloat16 there, slower than float32; set train.precision to auto or fp32")
        return torch.bfloat16
    return torch.bfloat16 if cuda_bf16 else None


def precision_name(dtype: torch.dtype | None) -> str:
    """What a step ran in, as benchmark rows and logs record it: "bf16" or "fp32"."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def step_precision(model_name: str, precision: str, device: torch.device) -> torch.dtype | None:
    """`training_autocast` for one model's run, said once in the log: what its steps compute in."""
    dtype = training_autocast(precision, device)
    log.info("model=%s device=%s precision=%s (train.precision=%s)", model_name, device.type,
             precision_name(dtype), precision)
    return dtype


def step_autocast(device: torch.device, dtype: torch.dtype | None, cache_enabled: bool | None = None):
    """The context a training step's forward pass and loss run in: autocast to `dtype`, or none (float32)."""
    return torch.autocast(device_type=device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None,
                          cache_enabled=cache_enabled)


# glibc's mallopt(3) parameters.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# Free memory at the top of the heap kept for the next step rather than returned to the kernel.
RETAINED_BYTES = 1 << 30
_retained = False  # whether this process's C allocator has been set to retain


def retain_cpu_memory(mode: str, device: torch.device) -> bool:
    """`train.cpu_allocator` for a process training or scoring on `device` (the trainer, the evaluate
    stage); True when the C allocator now keeps what a step frees. Only a CPU device's steps allocate through
    it: on another device nothing is set.

    glibc hands every block over its mmap threshold (at most 32 MB) straight back to the kernel when it is
    freed, so a CPU step that allocates the same (batch, heads, L, L) attention weights or score table each
    time faults the same pages in again each time (a 40 MB softmax: 45 ms instead of 19 ms). "retain" serves
    large blocks from the heap too (M_MMAP_MAX 0) and keeps up to `RETAINED_BYTES` of freed memory at its top
    (M_TRIM_THRESHOLD), so the next step reuses pages already mapped. The process then stays near its peak
    memory instead of shrinking between steps, and the peak can grow a little (ML-100K SASRec: 1.11 GB
    against 1.05 GB; benchmarks/RESULTS.md). A process-wide setting: once set it stays for the process.
    Off Linux, or on a C library without mallopt (musl), nothing changes."""
    global _retained
    if device.type != "cpu":
        return False
    if mode != "retain":
        if _retained:
            log.warning("train.cpu_allocator=system: an earlier run in this process set retain, which stays "
                        "until the process ends")
        return _retained
    if _retained:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("train.cpu_allocator: no mallopt in this C library; its defaults stay")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES)):
        log.debug("train.cpu_allocator: mallopt refused the settings; the C library's defaults stay")
        return False
    _retained = True
    log.debug("train.cpu_allocator=retain: freed CPU memory (up to %d MiB) stays in the process for the next "
              "step or scoring batch (set it to system for the C library's defaults)", RETAINED_BYTES >> 20)
    return True


def cpu_memory_retained() -> bool:
    """Whether `retain_cpu_memory` has set this process's C allocator to retain."""
    return _retained


def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA allocation that failed, or the CPU allocator's (a plain RuntimeError in torch)."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


# Where Linux says which control groups this process is in, and where their files are mounted.
PROC_CGROUP, CGROUP_ROOT = "/proc/self/cgroup", "/sys/fs/cgroup"
_NO_LIMIT = 2 ** 62  # cgroup v1 writes "no limit" as a number near 2^63


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    return None


def _stat(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def cgroup_memory(proc_cgroup: str | None = None, root: str | None = None) -> tuple[int, int] | None:
    """(available, limit) bytes under the tightest memory limit of this process's control group and the groups
    above it (a container's or a Kubernetes pod's limit, which /proc/meminfo does not show: past it the kernel
    kills the process without a word); available = limit − use, less the reclaimable page cache. None where
    no group sets a limit (cgroup v2's memory.max, v1's memory.limit_in_bytes) or none can be read."""
    root = root or CGROUP_ROOT
    try:
        lines = Path(proc_cgroup or PROC_CGROUP).read_text().splitlines()
    except OSError:
        return None
    tightest = None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # cgroup v2, the unified hierarchy
            base, files = Path(root), ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # cgroup v1's memory controller
            base, files = Path(root) / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                  "total_inactive_file")
        else:
            continue
        group = base / path.strip("/")
        # Inside a container's cgroup namespace the group is the mount's root; walk up to it either way.
        for level in [group, *group.parents]:
            if len(level.parts) < len(base.parts):
                break
            limit, used = _read_int(level / files[0]), _read_int(level / files[1])
            if limit is None or used is None or limit >= _NO_LIMIT:
                continue
            free = max(limit - max(used - _stat(level / "memory.stat", files[2]), 0), 0)
            if tightest is None or free < tightest[0]:
                tightest = (free, limit)
    return tightest


def _meminfo() -> dict[str, int]:
    info = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info[key] = int(value.split()[0]) * 1024 if value.split() else 0
    return info


def memory_text(device: torch.device | str) -> str:
    """'<device> (F of T GiB free)': what the message's reader compares the settings with."""
    device = torch.device(device)
    gib = 2.0 ** 30
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return f"{torch.cuda.get_device_name(device)} ({free / gib:.1f} of {total / gib:.1f} GiB free)"
    info, group = _meminfo(), cgroup_memory()
    if group is not None and group[0] < info.get("MemAvailable", group[0] + 1):
        return (f"the CPU ({group[0] / gib:.1f} of its {group[1] / gib:.1f} GiB control-group (container) limit "
                "available)")
    if "MemAvailable" in info and "MemTotal" in info:
        return f"the CPU ({info['MemAvailable'] / gib:.1f} of {info['MemTotal'] / gib:.1f} GiB available)"
    return "the CPU"


# What training holds per parameter at least: the weights, their gradients and Adam's two moments (float32).
TRAINING_BYTES_PER_PARAMETER = 16


def available_bytes(device: torch.device | str) -> int | None:
    """Memory a new allocation can take now: CUDA's free memory; a CPU's MemAvailable, or less where a control
    group's limit (a container's) leaves less (`cgroup_memory`); None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    known = [v for v in (_meminfo().get("MemAvailable"), (cgroup_memory() or (None,))[0]) if v is not None]
    return min(known) if known else None


def check_parameters_fit(n_parameters: int, device: torch.device | str, what: str, advice: str) -> None:
    """Refuse, before anything is allocated, a model whose parameters alone — with their gradients and
    Adam's moments — exceed the device's available memory: allocating it would fail part-way (or, on a CPU
    that overcommits, be killed without a word). `what` names the model with the sizes that matter,
    `advice` the settings to lower."""
    device = torch.device(device)
    copies = local_processes() if device.type == "cpu" else 1  # each GPU rank has a device of its own
    need = n_parameters * TRAINING_BYTES_PER_PARAMETER * copies
    have = available_bytes(device)
    if have is not None and need > have:
        gib = 2.0 ** 30
        each = f" ({copies} processes on this machine, a copy each)" if copies > 1 else ""
        raise DeviceError(f"{what} has {n_parameters:,} parameters: training needs {need / gib:.1f} GiB for them, "
                          f"their gradients and Adam's moments{each}, more than {memory_text(device)} holds; "
                          f"{advice}")


def local_processes() -> int:
    """How many training processes share this machine: torchrun's LOCAL_WORLD_SIZE (data-parallel CPU ranks
    each hold the whole model in the same memory), else 1."""
    with contextlib.suppress(ValueError):
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    return 1


@contextlib.contextmanager
def out_of_memory_as_error(device: torch.device | str, doing: str, advice: str) -> Iterator[None]:
    """Turns running out of memory inside the block into one `DeviceError` line: what was being done (with
    the sizes that matter), the device's memory, and `advice` (the settings to change, with their values)."""
    try:
        yield
    except RuntimeError as err:
        if not is_out_of_memory(err):
            raise
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # the numbers below are then the device's, not this run's cache
        raise DeviceError(f"out of memory {doing} on {memory_text(device)}: {advice}") from err
