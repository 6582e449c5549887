"""What a training run carries from epoch to epoch besides its model and optimiser, and how it survives a
kill: the weights' moving average (`train.ema`) and the resumable state after each epoch (recsys/train.py
saves and loads it; safetensors + JSON, never unpickled)."""

from __future__ import annotations

import copy
import dataclasses
import filecmp
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from recsys.checkpoint import CHECKPOINT_FILES, CheckpointError, copy_checkpoint, read_meta
from recsys.faults import fault_point
from recsys.layout import prune_resume_state, resume_dir
from recsys.model_configs import TrainConfig


class WeightAverage:
    """`train.ema`: a copy of the model whose parameters follow the trained ones as an exponential moving
    average, `avg ← decay · avg + (1 − decay) · live` after every optimiser step (buffers are the model's own
    statistics, fixed before training, and copied once). Updated on the device; nothing waits for it."""

    def __init__(self, model: torch.nn.Module, decay: float, warmup: bool = False):
        self.decay, self.warmup = decay, warmup
        self.module = copy.deepcopy(model).requires_grad_(False)
        self._average, self._live = list(self.module.parameters()), list(model.parameters())

    def decay_at(self, step: int) -> float:
        """The decay of optimiser step `step` (from 1): `train.ema_warmup`'s min(decay, (1 + t) / (10 + t))."""
        return min(self.decay, (1.0 + step) / (10.0 + step)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, step: int) -> None:
        torch._foreach_lerp_(self._average, self._live, 1.0 - self.decay_at(step))


def _prefixed(prefix: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's state as CPU tensors named `<prefix>.<key>` (several modules in one safetensors file)."""
    return {f"{prefix}.{k}": v.detach().cpu().contiguous() for k, v in module.state_dict().items()}


def _load_prefixed(module: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str, device) -> None:
    """`_prefixed`'s inverse: the `<prefix>.` tensors back into `module`, on `device`."""
    head = f"{prefix}."
    module.load_state_dict({k[len(head):]: v.to(device) for k, v in tensors.items() if k.startswith(head)})


# Train settings that bound or display a run without changing what it computes epoch by epoch: they are not
# part of its resume key, so a run stopped or killed under one time budget goes on under another.
BUDGET_FIELDS = ("max_minutes", "progress")
# Early stopping's settings only decide where the same epochs end: a state saved under a smaller patience or
# epoch floor is the start of this run's (`early_stop_epoch` checks it from the state's curve), so a run
# early stopping ended goes on under a larger patience from its kept final state instead of from epoch 1.
STOPPING_FIELDS = ("patience", "min_epochs", "warm_min_epochs", "warm_patience")


# Model settings added after states were saved, at the value that trains what ran before them: left out of
# the key there, so a run interrupted before an upgrade resumes after it (BERT4Rec's attn_dropout -1 = dropout).
CONFIG_BEFORE_THE_KEY = {"attn_dropout": -1.0}


def run_key(model_name: str, model_config: Any, train_config: TrainConfig, fingerprint: str,
            init: dict | None = None, mask_seen: bool = True) -> str:
    train = {k: v for k, v in dataclasses.asdict(train_config).items()
             if k not in BUDGET_FIELDS and k not in STOPPING_FIELDS}
    if train.get("precision") == "auto":  # what every run did before the key: a state saved then resumes
        del train["precision"]
    config = dataclasses.asdict(model_config)
    for field, before in CONFIG_BEFORE_THE_KEY.items():
        if field in config and config[field] == before:  # as every run before the key: its states resume
            del config[field]
    key = {"model": model_name, "config": config, "train": train, "data": fingerprint}
    if init is not None:  # a warm start from another champion is another run
        key["init"] = init
    if not mask_seen:  # validation under evaluate.mask_seen: false selects other epochs (absent: as before)
        key["mask_seen"] = False
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


BEST = "best"  # the best checkpoint's files inside a saved state


def best_epoch_of(folder: Path) -> int | None:
    """The best epoch a checkpoint folder records, or None where there is no readable one."""
    try:
        return read_meta(folder).get("best_epoch")
    except CheckpointError:
        return None


# Early stopping's rule, its one home: the training loop (recsys/train.py) applies it epoch by epoch and
# `early_stop_epoch` replays it on a saved curve (resume, adoption, the benchmarks' checks), so a change to
# the rule (a minimum improvement, say) is made here and reaches both.
def improves(score: float, best: float) -> bool:
    """A validation score is a new best: above the best so far, by any margin (the kept checkpoint's)."""
    return score > best


def stops(bad_epochs: int, epoch: int, patience: int, floor: int) -> bool:
    """Early stopping ends the run after `epoch`: `patience` epochs without a new best, at or after `floor`."""
    return bad_epochs >= patience and epoch >= floor


def early_stop_epoch(curve: list[dict], patience: int, floor: int, column: str) -> int | None:
    """The epoch at which early stopping (`improves`, `stops`) ends a run with this validation curve, or
    None if it does not within the curve — the training loop's own rule, replayed on a saved state's curve."""
    best, bad = -math.inf, 0
    for row in curve:
        score = row[column]
        best, bad = (score, 0) if improves(score, best) else (best, bad + 1)
        if stops(bad, int(row["epoch"]), patience, floor):
            return int(row["epoch"])
    return None


def _same_weights(a: Path, b: Path) -> bool:
    try:
        return filecmp.cmp(a / "model.safetensors", b / "model.safetensors", shallow=False)
    except OSError:
        return False


def _whole(state_dir: Path) -> bool:
    """Both files of a saved state are there (not so in a folder an older version's killed save left)."""
    return (state_dir / "state.json").is_file() and (state_dir / "state.safetensors").is_file()


class Resume:
    """Full trainer state after an epoch, as safetensors + JSON, in `<root>/<model>-<run key>`.

    When training completes, every state of the model goes: this run's, another run key's (an interrupted
    run of another config or data, which this output replaces) and a `.tmp` or `.old` a kill left;
    `recsys.layout.prune_resume_state` does the same when the output is complete by another route (DVC
    restored it from its cache)."""

    def __init__(self, root: Path, model_name: str, key: str):
        self.root, self.model_name, self.key = root, model_name, key
        self.dir = resume_dir(root, model_name, key)

    def save(self, model, optimizer, generator: torch.Generator, state: dict,
             average: WeightAverage | None = None, best: Path | None = None) -> None:
        """`best`: the run's best checkpoint folder, kept in the state as `best/` (hard links where the file
        system allows, else copies): a run resumed where the checkpoint is gone (`dvc repro` removes a stage's
        outputs before it runs) or another run's (`adopt`) gets it back from the state, whole."""
        tmp = self.dir.with_name(self.dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            self._write(tmp, model, optimizer, generator, state, average, best)
        except BaseException:  # (a full disk, an interrupt) the last whole state stays, and no half `.tmp`
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # By renames: the last epoch's state is moved aside, never deleted in place (a kill during a delete
        # left a state.json without its tensors, which every later run failed to load); a kill between the
        # renames leaves it whole at `.old`, and `load` resumes from it.
        old = self._old()
        if _whole(self.dir):
            shutil.rmtree(old, ignore_errors=True)
            self.dir.rename(old)
            fault_point("resume_state_moved_aside")
        else:  # none, or a half folder an older version's kill left: a whole `.old` stays until the new is in
            shutil.rmtree(self.dir, ignore_errors=True)
        tmp.rename(self.dir)
        shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def _write(tmp: Path, model, optimizer, generator: torch.Generator, state: dict,
               average: WeightAverage | None, best: Path | None) -> None:
        """The state's files, into the empty folder `tmp`."""
        if best is not None and (Path(best) / "model.json").is_file():
            (tmp / BEST).mkdir()
            for name in CHECKPOINT_FILES:
                try:
                    os.link(Path(best) / name, tmp / BEST / name)
                except OSError:
                    shutil.copy2(Path(best) / name, tmp / BEST / name)
        tensors = _prefixed("model", model)
        if average is not None:
            tensors.update(_prefixed("ema", average.module))
        opt = optimizer.state_dict()
        for pid, pstate in opt["state"].items():
            for name, value in pstate.items():
                tensors[f"optim.{pid}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
        tensors["rng.torch"] = torch.get_rng_state()
        tensors["rng.generator"] = generator.get_state()
        # On CUDA, dropout, BERT4Rec's masks and sampled negatives draw from each device's own generator
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for index, rng in enumerate(torch.cuda.get_rng_state_all()):
                tensors[f"rng.cuda.{index}"] = rng
        save_file(tensors, str(tmp / "state.safetensors"))
        # A rate held as a tensor (train.cuda_graph: recsys.step_graph) is saved as the number it holds.
        groups = [{k: float(v) if isinstance(v, torch.Tensor) else v for k, v in group.items()}
                  for group in opt["param_groups"]]
        (tmp / "state.json").write_text(json.dumps({**state, "param_groups": groups}))

    def _old(self) -> Path:
        return self.dir.with_name(self.dir.name + ".old")

    def _source(self) -> Path | None:
        return next((d for d in (self.dir, self._old()) if _whole(d)), None)

    def best(self) -> Path | None:
        """The best checkpoint kept in the saved state (`save(best=)`), or None (none kept, as in a state an
        older version saved)."""
        source = self._source()
        return source / BEST if source is not None and (source / BEST / "model.json").is_file() else None

    def peek(self) -> dict | None:
        """The saved state's JSON part (epoch, curve, …) without loading its tensors, or None."""
        source = self._source()
        return json.loads((source / "state.json").read_text()) if source is not None else None

    def restore_best(self, out_dir: Path, best_epoch: int, settings: dict) -> bool:
        """After a resume: make the checkpoint in `out_dir` the saved state's best one, recording `settings`
        as its `train_config`. Put back from the state where it is missing or other weights (`dvc repro`
        removes a stage's outputs before it runs; an adopted state's checkpoint is in another run's folder):
        True. Where only the settings differ (early stopping's, resumed under others), rewritten with them."""
        settings = json.loads(json.dumps(settings))  # as model.json holds them (tuples become lists)
        kept = self.best()
        if kept is not None and best_epoch_of(kept) == best_epoch and not _same_weights(kept, Path(out_dir)):
            copy_checkpoint(kept, out_dir, train_config=settings)
            return True
        try:
            recorded = read_meta(out_dir)
        except CheckpointError:
            return False  # no checkpoint, and none kept (a state an older version saved): as before
        if recorded.get("train_config") != settings:
            copy_checkpoint(out_dir, out_dir, train_config=settings)
        return False

    def adopt(self, roots: Iterable[Path], patience: int, floor: int, column: str) -> Path | None:
        """Copy in, as this run's state, the kept final state (marked `stopped_by`, with its best checkpoint)
        of this same run key under another root (the same run under other early-stopping settings) whose
        epochs are this run's first ones (`early_stop_epoch` under `patience`, `floor`) — the one with the
        most epochs; returns that root, or None (none there, or this run has a state of its own). A copy, by a
        rename of a whole `.tmp` folder: the other root's state stays as it was."""
        if self._source() is not None:
            return None
        found = []
        for root in roots:
            other = resume_dir(root, self.model_name, self.key)
            if other.resolve() == self.dir.resolve() or not _whole(other):
                continue
            state = json.loads((other / "state.json").read_text())
            stop = early_stop_epoch(state["curve"], patience, floor, column)
            beginning = stop is None or stop >= state["epoch"]
            if "stopped_by" in state and best_epoch_of(other / BEST) == state["best_epoch"] and beginning:
                found.append((int(state["epoch"]), str(root)))
        if not found:
            return None
        root = Path(max(found)[1])
        tmp = self.dir.with_name(self.dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(resume_dir(root, self.model_name, self.key), tmp)
        except BaseException:  # no half copy left behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(self.dir, ignore_errors=True)  # a half folder (this run has no whole state)
        tmp.rename(self.dir)
        return root

    def load(self, model, optimizer, generator: torch.Generator, device,
             average: WeightAverage | None = None) -> dict | None:
        source = self._source()
        if source is None:
            return None
        tensors = load_file(str(source / "state.safetensors"))
        state = json.loads((source / "state.json").read_text())
        _load_prefixed(model, tensors, "model", device)
        if average is not None:  # the run key includes train.ema: a state with an average has one saved
            _load_prefixed(average.module, tensors, "ema", device)
        optim_state: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("optim."):
                _, pid, name = key.split(".", 2)
                optim_state.setdefault(int(pid), {})[name] = value.to(device) if name != "step" else value
        # The saved groups carry the saving run's implementation flags; this run keeps its own (a state saved
        # on a CPU, resumed on CUDA, must come back fused and, under train.cuda_graph, capturable).
        flags = {k: optimizer.defaults[k] for k in ("fused", "capturable", "foreach") if k in optimizer.defaults}
        optimizer.load_state_dict({"state": optim_state, "param_groups": state.pop("param_groups")})
        on_device = bool(flags.get("fused") or flags.get("capturable"))
        for group in optimizer.param_groups:
            group.update(flags)
            for param in group["params"]:
                pstate = optimizer.state.get(param, {})
                if "step" in pstate:  # where this implementation keeps its step count
                    pstate["step"] = pstate["step"].to(param.device if on_device else "cpu", torch.float32)
        torch.set_rng_state(tensors["rng.torch"])
        generator.set_state(tensors["rng.generator"])
        cuda = [tensors[f"rng.cuda.{i}"] for i in range(len(tensors)) if f"rng.cuda.{i}" in tensors]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)  # (a state saved on another machine's devices: drawn afresh)
        return state

    def clear(self) -> None:
        prune_resume_state(self.root, [self.model_name])
