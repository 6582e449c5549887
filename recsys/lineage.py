"""Lineage of a trained model: what it was trained from (params, dataset version) and with (code version).

Captured once, here, for every promotion — from the flow or by hand — so the registry records the same
facts whichever path registered a model.
"""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsys.config import ConfigError, Params, PrepareConfig

# DVC bookkeeping changes with every `dvc repro`/`dvc add`; it says nothing about the code.
_NOT_CODE = (":(exclude)dvc.lock", ":(exclude)*.dvc")


@dataclass(frozen=True)
class Lineage:
    # {"model": name, "config": the checkpoint's own model config, "train": ..., "evaluate": the evaluation
    # settings this version was scored with — and with which a champion is re-scored against it, "init":
    # how training started (recsys/warm.py: {"mode": "warm", "from_version": N, ...} or {"mode": "cold"})}
    params: dict[str, Any]
    dataset_version: str | None
    code_version: str | None

    def as_kwargs(self) -> dict[str, Any]:
        return {"params": self.params, "dataset_version": self.dataset_version,
                "code_version": self.code_version}


def git_code_version(repo_root: Path) -> str | None:
    """The commit the code is at, with '-dirty' when tracked files other than DVC's lock and pointer files
    changed; None outside a git checkout (or before its first commit)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=repo_root,
                             capture_output=True, text=True, timeout=10)
        if sha.returncode != 0 or not sha.stdout.strip():
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_NOT_CODE],
            cwd=repo_root, capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def trained_data_version(repo_root: Path) -> str | None:
    """The dataset version the `prepare` stage last ran on, as `dvc repro` recorded it in dvc.lock (the md5 of
    its `data` dependency): what the models of a DVC-run pipeline were trained on, even after an ingest has
    moved data.dvc on. None without such a record (stages run by hand)."""
    import yaml

    from recsys.layout import DATA

    path = Path(repo_root) / "dvc.lock"
    if not path.is_file():
        return None
    try:
        stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stages") or {}
    except yaml.YAMLError:
        return None
    deps = (stages.get("prepare") or {}).get("deps") or []
    return next((d.get("md5") for d in deps if isinstance(d, dict) and d.get("path") == DATA), None)


def dataset_version(repo_root: Path) -> str | None:
    """The DVC version (md5) of the raw store, or None when it is not tracked by DVC."""
    from recsys.workspace import data_version

    return data_version(Path(repo_root))


def model_params(params: Params, model: str, checkpoint_meta: dict[str, Any]) -> dict[str, Any]:
    """The settings a version is registered with, in one shape for every caller. `train` is what the
    checkpoint was trained with (its `train_config`), not what params.yaml says now: a run under `--epochs 3`
    or another params file registered params.yaml's settings. A checkpoint without one (MostPop, or saved
    before it was recorded) takes params.yaml's."""
    train = checkpoint_meta.get("train_config")
    if train is None:
        try:
            train = dataclasses.asdict(params.train_config(model))
        except (ConfigError, TypeError):
            train = None
    return {
        "model": model,
        "config": checkpoint_meta.get("config"),  # what was trained, from the checkpoint itself
        "train": train,
        "evaluate": dataclasses.asdict(params.evaluate),
        "init": checkpoint_meta.get("init") or {"mode": "cold"},  # a cold checkpoint records nothing
        # The prepare settings its training data was split with (None: MostPop, or trained before they were
        # recorded): a warm start from it must see the same split (recsys/warm_source.py).
        "prepare": checkpoint_meta.get("prepare"),
        "train_until": checkpoint_meta.get("train_until"),  # its newest training event (`late_data_leak`)
    }


def split_otherwise(version: Any, prepare: PrepareConfig | None) -> str | None:
    """How the split settings a registry version recorded (its params' "prepare", `model_params`) differ from
    `prepare`'s ("prepare.split loo, now global_time"), or None when they match or either is unknown. A
    version trained under other ones may have learnt events today's split validates and tests on: it is
    never a warm source (recsys/warm_source.py) nor the gate's yardstick (recsys/promotion.py)."""
    return split_changes((version.params or {}).get("prepare"), prepare)


def split_changes(recorded: Any, prepare: PrepareConfig | None) -> str | None:
    """`split_otherwise` for recorded split settings as they are (a checkpoint's "prepare", the train stage's
    check of its warm source, recsys/warm.py): how they differ from `prepare`'s, or None."""
    if prepare is None or not isinstance(recorded, dict):
        return None
    ours = _split_settings(prepare)
    try:
        theirs = _split_settings(PrepareConfig(**recorded))
    except (TypeError, ValueError):  # recorded by another recsys version: today's keys, as a split reads them
        known = {f.name for f in dataclasses.fields(prepare)}
        theirs = {k: v for k, v in recorded.items() if k in known}
        if theirs.get("split") == "loo":
            theirs = {k: v for k, v in theirs.items() if k in ours or k == "split"}
    changed = ["split"] if theirs.get("split") != ours.get("split") else sorted(
        k for k in ours.keys() | theirs.keys() if theirs.get(k) != ours.get(k))
    return "; ".join(f"prepare.{k} {theirs.get(k)}, now {ours.get(k)}" for k in changed) or None


def _split_settings(prepare: PrepareConfig) -> dict[str, Any]:
    """The settings that decide which events a split puts in training (the quantiles only under global_time):
    runs with equal ones train on the same events of the same data."""
    settings = dataclasses.asdict(prepare)
    if prepare.split == "loo":
        del settings["valid_quantile"], settings["test_quantile"]
    return settings


def describe_init(init: dict[str, Any] | None) -> str:
    """How a version's training started, in a few words: 'warm from v3', 'cold', 'cold (auto: <why>)'."""
    init = init or {}
    if init.get("mode") == "warm":
        return f"warm from v{init.get('from_version')}"
    return f"cold ({init.get('requested')}: {init['reason']})" if init.get("reason") else "cold"


def capture(
    repo_root: Path, params: Params, model: str, checkpoint_meta: dict[str, Any],
    dataset_version_override: str | None = None,
) -> Lineage:
    root = Path(repo_root)
    dataset = dataset_version_override if dataset_version_override is not None else dataset_version(root)
    return Lineage(
        params=model_params(params, model, checkpoint_meta),
        dataset_version=dataset,
        code_version=git_code_version(root),
    )
