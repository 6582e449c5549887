"""Which torch device a stage runs on (`train.device` in params.yaml), and what a device that cannot run
the configuration tells a person: no CUDA where `cuda` was asked for, or memory running out. Both are
`DeviceError`s — user errors (`recsys.entry`): one line naming the setting to change, no retry."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch


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


def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA allocation that failed, or the CPU allocator's (a plain RuntimeError in torch)."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def memory_text(device: torch.device | str) -> str:
    """'<device> (F of T GiB free)': what the message's reader compares the settings with."""
    device = torch.device(device)
    gib = 2.0 ** 30
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return f"{torch.cuda.get_device_name(device)} ({free / gib:.1f} of {total / gib:.1f} GiB free)"
    info = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info[key] = int(value.split()[0]) * 1024 if value.split() else 0
    if "MemAvailable" in info and "MemTotal" in info:
        return f"the CPU ({info['MemAvailable'] / gib:.1f} of {info['MemTotal'] / gib:.1f} GiB available)"
    return "the CPU"


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
