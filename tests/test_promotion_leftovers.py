"""No leftovers from promotion: a refused promotion copies nothing into the store; a promotion killed mid-copy
(kill -9 of a real process) leaves scratch that the next operation removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_registry_cli import _write_stage_outputs, invoke, open_from, write_params
from test_registry_support import make_checkpoint, make_eval, registry_config

from recsys.commands.registry import app as registry_app
from recsys.config import GateConfig
from recsys.registry import RegistryError, open_registry


def stage_outputs(root: Path) -> None:
    _write_stage_outputs(root, "mostpop", make_eval(-0.15, seed=7), b"mostpop")
    _write_stage_outputs(root, "sasrec", make_eval(0.0, seed=8), b"sasrec")


def store_contents(root: Path) -> dict[str, list[str]]:
    store = root / "registry" / "artifacts"
    return {sub: sorted(p.name for p in (store / sub).iterdir()) if (store / sub).is_dir() else []
            for sub in ("sha256", "tmp")}


def test_a_refused_promotion_copies_nothing(tmp_path):
    params_path = write_params(tmp_path)
    stage_outputs(tmp_path)
    label = "d" * 129
    refused = invoke(registry_app, "promote", "--model", "sasrec", "--dataset-version", label,
                     "--params", str(params_path))
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert refused.exit_code == 1 and len(lines) == 1
    assert "dataset_version is longer than 128 characters (129" in lines[0]
    # Neither the candidate nor the baseline was copied, and nothing was registered.
    assert store_contents(tmp_path) == {"sha256": [], "tmp": []}
    with open_from(params_path) as reg:
        assert reg.list_versions() == [] and reg.history() == []

    accepted = invoke(registry_app, "promote", "--model", "sasrec", "--dataset-version", "d" * 128,
                      "--params", str(params_path))
    assert accepted.exit_code == 0, accepted.output
    assert len(store_contents(tmp_path)["sha256"]) == 2 and store_contents(tmp_path)["tmp"] == []


@pytest.mark.parametrize("bad", [{"dataset_version": "x" * 129}, {"code_version": "c" * 65},
                                 {"params": {"lr": float("nan")}}, {"params": {"f": object()}}])
def test_registration_is_validated_before_the_copy(tmp_path, bad):
    with open_registry(registry_config(tmp_path), tmp_path, GateConfig()) as reg:
        ckpt = make_checkpoint(tmp_path / "ckpts", "a")
        with pytest.raises(RegistryError):
            reg.register(ckpt, make_eval(0.0), **bad)
        assert not (tmp_path / "artifacts" / "sha256").exists() or not any((tmp_path / "artifacts" / "sha256").iterdir())
        assert reg.list_versions() == []


CHILD = """
import sys, time
from pathlib import Path

import recsys.registry.store as store

real_listing, marker = store._listing, Path(sys.argv[2])


def listing_then_wait(directory):
    if directory.name == "copy":  # the checkpoint is in this operation's scratch, not yet in the store
        marker.write_text("copied")
        time.sleep(600)
    return real_listing(directory)


store._listing = listing_then_wait
from recsys.config import load_params
from recsys.promotion import promote_candidate

root = Path(sys.argv[1])
promote_candidate(root, load_params(root / "params.yaml"), "sasrec")
"""


@pytest.mark.slow
def test_a_promotion_killed_mid_copy_leaves_nothing_after_the_next_one(tmp_path):
    params_path = write_params(tmp_path)
    stage_outputs(tmp_path)
    script, marker = tmp_path / "child.py", tmp_path / "copied"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(marker)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600  # imports are slow on a loaded machine
        while not marker.exists():
            assert child.poll() is None, child.stdout.read().decode() if child.stdout else ""
            assert time.monotonic() < deadline, "the promotion never reached the copy"
            time.sleep(0.2)
        os.kill(child.pid, signal.SIGKILL)  # kill -9 at the boundary: copied into scratch, not yet stored
    finally:
        child.kill()
        child.wait(60)
    assert child.returncode == -signal.SIGKILL
    left = store_contents(tmp_path)
    assert left["sha256"] == []
    assert len([n for n in left["tmp"] if n.endswith(".lock")]) == 1 and len(left["tmp"]) == 2  # the leftover

    again = invoke(registry_app, "promote", "--model", "sasrec", "--params", str(params_path))
    assert again.exit_code == 0 and again.output.startswith("PROMOTED v2 (sasrec)"), again.output
    after = store_contents(tmp_path)
    assert after["tmp"] == [] and len(after["sha256"]) == 2
    with open_from(params_path) as reg:
        assert [v.architecture for v in reg.list_versions()] == ["mostpop", "sasrec"]
        assert reg.champion_version() == 2
