"""What a training run carries from epoch to epoch besides its model and optimiser, and how it survives a
kill: the weights' moving average (`train.ema`) and the resumable state after each epoch (recsys/train.py
saves and loads it; safetensors + JSON, never unpickled)."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from recsys.faults import fault_point
from recsys.layout import prune_resume_state, resume_dir


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
             average: WeightAverage | None = None) -> None:
        tmp = self.dir.with_name(self.dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors = _prefixed("model", model)
        if average is not None:
            tensors.update(_prefixed("ema", average.module))
        opt = optimizer.state_dict()
        for pid, pstate in opt["state"].items():
            for name, value in pstate.items():
                tensors[f"optim.{pid}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
        tensors["rng.torch"] = torch.get_rng_state()
        tensors["rng.generator"] = generator.get_state()
        save_file(tensors, str(tmp / "state.safetensors"))
        # A rate held as a tensor (train.cuda_graph: recsys.step_graph) is saved as the number it holds.
        groups = [{k: float(v) if isinstance(v, torch.Tensor) else v for k, v in group.items()}
                  for group in opt["param_groups"]]
        (tmp / "state.json").write_text(json.dumps({**state, "param_groups": groups}))
        # By renames: the last epoch's state is moved aside, never deleted in place (a kill during a delete
        # left a state.json without its tensors, which every later run failed to load); a kill between the
        # renames leaves it whole at `.old`, and `load` resumes from it.
        old = self._old()
        shutil.rmtree(old, ignore_errors=True)
        if self.dir.exists():
            self.dir.rename(old)
            fault_point("resume_state_moved_aside")
        tmp.rename(self.dir)
        shutil.rmtree(old, ignore_errors=True)

    def _old(self) -> Path:
        return self.dir.with_name(self.dir.name + ".old")

    def _source(self) -> Path | None:
        return next((d for d in (self.dir, self._old()) if _whole(d)), None)

    def peek(self) -> dict | None:
        """The saved state's JSON part (epoch, curve, …) without loading its tensors, or None."""
        source = self._source()
        return json.loads((source / "state.json").read_text()) if source is not None else None

    def adopt(self, roots: Iterable[Path], accept: Callable[[dict, Path], bool]) -> Path | None:
        """Copy in, as this run's state, the kept final state (marked `stopped_by`) of this same run key under
        another root that `accept(state, root)` takes — the one with the most epochs; returns that root, or
        None (none there, or this run has a state of its own). A copy, by a rename of a whole `.tmp` folder:
        the other root's state stays as it was."""
        if self._source() is not None:
            return None
        found = []
        for root in roots:
            other = resume_dir(root, self.model_name, self.key)
            if other.resolve() == self.dir.resolve() or not _whole(other):
                continue
            state = json.loads((other / "state.json").read_text())
            if "stopped_by" in state and accept(state, Path(root)):
                found.append((int(state["epoch"]), str(root)))
        if not found:
            return None
        root = Path(max(found)[1])
        tmp = self.dir.with_name(self.dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(resume_dir(root, self.model_name, self.key), tmp)
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
        return state

    def clear(self) -> None:
        prune_resume_state(self.root, [self.model_name])
