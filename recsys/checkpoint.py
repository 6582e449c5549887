"""Checkpoints: safetensors weights + JSON metadata; a model is rebuilt from these files alone.

Layout of a checkpoint directory:
  model.safetensors   the state dict (tensors only — nothing is ever unpickled)
  model.json          {"model", "config", "n_items", "n_users", "dataset_fingerprint", "format_version", ...}
  items.json          raw item id of each model item id (index 0 = padding = null)
  users.json          raw user id of each model user id (index 0 = unknown = null)
Writes go to a temporary sibling directory that is renamed into place, so a reader never sees half a
checkpoint. Torch and the model classes are imported by the two functions that touch weights
(`save_checkpoint`, `load_model`): reading metadata — the warm sources of `cold` models, the registry — never
loads them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recsys.atomic import remove_stale_temp_dirs, replace_dir
from recsys.faults import fault_point

if TYPE_CHECKING:
    import torch

    from recsys.models.base import SequentialModel

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CHECKPOINT_FILES = ("model.safetensors", "model.json", "items.json", "users.json")  # the layout above


class CheckpointError(ValueError):
    pass


def save_checkpoint(
    out_dir: str | Path,
    model: SequentialModel,
    *,
    dataset_fingerprint: str,
    item_ids: list[str],
    user_ids: list[str],
    extra: dict[str, Any] | None = None,
) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "model": model.name,
        "config": dataclasses.asdict(model.config),
        "n_items": model.n_items,
        "n_users": model.n_users,
        "dataset_fingerprint": dataset_fingerprint,
        **(extra or {}),
    }
    remove_stale_temp_dirs(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        fault_point("checkpoint_temp_written")  # (after mkdtemp: a kill here leaves the temp folder)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "model.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        (tmp / "items.json").write_text(json.dumps([None, *map(str, item_ids)]))
        (tmp / "users.json").write_text(json.dumps([None, *map(str, user_ids)]))
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def copy_checkpoint(source: str | Path, out_dir: str | Path, **meta: Any) -> Path:
    """Put a copy of checkpoint `source` in place of `out_dir` (a temp copy, then renames, as a save), with
    `meta` replacing those keys of its model.json (a run that adopts another's training records its own
    `train_config`)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for name in CHECKPOINT_FILES:
            shutil.copy2(Path(source) / name, tmp / name)
        recorded = json.loads((tmp / "model.json").read_text())
        (tmp / "model.json").write_text(json.dumps({**recorded, **meta}, indent=2, sort_keys=True) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_meta(checkpoint_dir: str | Path) -> dict[str, Any]:
    path = Path(checkpoint_dir)
    try:
        meta = json.loads((path / "model.json").read_text())
        meta["items"] = json.loads((path / "items.json").read_text())
        meta["users"] = json.loads((path / "users.json").read_text())
    except FileNotFoundError as err:
        raise CheckpointError(f"{path} is not a checkpoint: {err.filename} missing") from err
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: corrupt checkpoint metadata ({err})") from err
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unsupported checkpoint format {meta.get('format_version')!r}")
    return meta


def load_model(checkpoint_dir: str | Path, device: str | torch.device = "cpu") -> tuple[SequentialModel, dict]:
    """Rebuild the model from its own JSON config and load the safetensors weights (strictly)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from recsys.models import build_model, config_from_dict

    path = Path(checkpoint_dir)
    meta = read_meta(path)
    try:
        config = config_from_dict(meta["model"], meta["config"])
        model = build_model(meta["model"], config, n_items=meta["n_items"], n_users=meta["n_users"])
        state = load_file(str(path / "model.safetensors"), device=str(device))
        model.load_state_dict(state, strict=True)
    except (KeyError, ValueError, RuntimeError, OSError, SafetensorError) as err:
        raise CheckpointError(f"{path}: cannot rebuild the model ({err})") from err
    return model.to(device).eval(), meta
