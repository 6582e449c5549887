"""What a retraining run decides around `dvc repro`: which models, which candidate, a one-run epochs override.

Plain functions the retrain flow calls (the flow says *when*; this says *what*):
`select_models` (params.yaml `models`, MostPop always in as the gate's baseline), `read_results` (each
model's evaluate-stage metrics), `choose_candidate` (best by *validation* NDCG@10 — the test split is only
measured), `training_status` and `training_progress` (from the training curves, while `dvc repro` runs) and
`epochs_override`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recsys.atomic import fsync_dir, write_text_atomic
from recsys.config import ConfigError, Params, validate_name
from recsys.layout import SELECTION_METRIC, VALID_COLUMN, Layout
from recsys.model_configs import BASELINE, MAX_EPOCHS
from recsys.workspace import workspace_lock


def check_models_given(models: Sequence[str] | None) -> None:
    """An empty list of models is refused, not read as "all": a UI form left empty must not start every
    model's training (None is "all in params.yaml")."""
    if models is not None and not list(models):
        raise ConfigError("models is an empty list: leave it unset for all in params.yaml, or name some")


def listed_models(params: Params, models: Sequence[str] | None) -> list[str]:
    """`models` (None: all in params.yaml), each a valid name listed in params.yaml `models`."""
    check_models_given(models)
    selected = [validate_name(m, "model name") for m in (list(params.models) if models is None else models)]
    unknown = [m for m in selected if m not in params.models]
    if unknown:
        raise ConfigError(f"model(s) {unknown} are not in params.yaml `models` {list(params.models)}; add them "
                          "there or choose among those")
    if twice := sorted({m for m in selected if selected.count(m) > 1}):  # a fan-out would hand one out twice
        raise ConfigError(f"model(s) {twice} are named more than once; name each once")
    return selected


def select_models(params: Params, models: list[str] | None) -> list[str]:
    """`models` (default: all in params.yaml), validated, with the baseline first when params lists it."""
    selected = listed_models(params, models)
    if BASELINE in params.models and BASELINE not in selected:
        selected = [BASELINE, *selected]
    return selected


def read_curve(path: Path) -> list[dict[str, float]]:
    """A training curve (plots/<model>.csv) as rows of floats; [] while absent or half-written."""
    if not path.is_file():
        return []
    try:
        with path.open() as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    except (OSError, ValueError):
        return []  # being rewritten right now; the next poll reads it


def read_results(root: Path, models: list[str]) -> dict[str, dict[str, Any]]:
    """Each model's test metrics (from the evaluate stage) and its validation metrics (from training)."""
    out = {}
    for m in models:
        path = Layout(root).metrics(m)
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing after dvc repro; run `dvc repro evaluate@{m}`")
        out[m] = json.loads(path.read_text())
    return out


def choose_candidate(results: dict[str, dict[str, Any]]) -> str | None:
    """The best model by validation NDCG@10 — never by test, which is only measured."""
    scored = {m: (r.get("valid") or {}).get(SELECTION_METRIC) for m, r in results.items() if m != BASELINE}
    scored = {m: s for m, s in scored.items() if isinstance(s, (int, float)) and s == s}
    return max(scored, key=scored.get) if scored else None


@dataclass(frozen=True)
class ModelProgress:
    """One model's training so far in this run, read off its curve (plots/<model>.csv)."""

    model: str
    epoch: int  # epochs finished (0 for a counting model, which is done once counted)
    budget: int  # train.epochs; early stopping may end the run before it (0 for a counting model)
    valid: float  # the newest epoch's validation NDCG@10
    best: float  # the best so far and its epoch: the checkpoint the run keeps (the first of equals, as the trainer)
    best_epoch: int
    done: bool = False  # its training has ended (early stopping may have ended it before the budget)

    @property
    def fraction(self) -> float:
        return 1.0 if self.budget == 0 or self.done else min(self.epoch / self.budget, 1.0)

    def __str__(self) -> str:
        if self.budget == 0:
            return f"{self.model} counted ({VALID_COLUMN}={self.valid:.4f})"
        if self.done:
            return (f"{self.model} done after {self.epoch}/{self.budget} epochs (best {VALID_COLUMN}="
                    f"{self.best:.4f} at epoch {self.best_epoch})")
        return (f"{self.model} epoch {self.epoch}/{self.budget} {VALID_COLUMN}={self.valid:.4f} "
                f"(best {self.best:.4f} at epoch {self.best_epoch})")


def training_status(root: Path, params: Params, models: Sequence[str], since: float) -> list[ModelProgress]:
    """Each of `models` (in that order) whose training curve this run has written: newer than `since`, a
    wall-clock time. DVC deletes a stage's outputs before running it, so an older curve is a previous run's.
    `dvc repro` runs one stage at a time, so every curve but the one written last belongs to a finished run."""
    found = []
    for m in models:
        curve = Layout(root).curve(m)
        written = curve.stat().st_mtime if curve.is_file() else -math.inf
        if written >= since and (rows := read_curve(curve)):
            found.append((m, written, rows))
    newest = max((written for _, written, _ in found), default=None)
    status = []
    for m, written, rows in found:
        best = max(rows, key=lambda row: row[VALID_COLUMN])
        counting = rows[-1]["epoch"] == 0  # (recsys.train: a model with nothing to train writes epoch 0 only)
        budget = 0 if counting else params.train_config(m).epochs
        status.append(ModelProgress(m, int(rows[-1]["epoch"]), budget, rows[-1][VALID_COLUMN], best[VALID_COLUMN],
                                    int(best["epoch"]), done=written < newest or rows[-1]["epoch"] >= budget))
    return status


def training_progress(status: Sequence[ModelProgress], n_models: int) -> float:
    """Share of `n_models`' epoch budgets done (a model not started yet counts 0)."""
    return sum(p.fraction for p in status) / max(n_models, 1)


def _backup_of(params_path: Path) -> Path:
    return Layout(params_path.parent).state / f"{params_path.name}.orig"


def check_epochs(epochs: int | None) -> None:
    """An `epochs` override is none (params.yaml's) or a whole number from 1 to `MAX_EPOCHS`; 0 is refused,
    not taken for none."""
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int)
                               or not 1 <= epochs <= MAX_EPOCHS):
        raise ConfigError(f"epochs override must be a whole number from 1 to {MAX_EPOCHS:,} (or none: "
                          f"params.yaml's train.epochs), got {epochs!r}")


class epochs_override:
    """Temporarily set `train.epochs` (and per-model `train.epochs`) in params.yaml for one `dvc repro`.

    DVC records the override in dvc.lock, so the next normal run retrains with the real value. The original
    file is kept beside the lock and restored on exit — also by the next run if this one was killed.
    """

    def __init__(self, params_path: Path, epochs: int | None, models: list[str]):
        self.path, self.epochs, self.models = Path(params_path), epochs, models
        self.backup = _backup_of(self.path)

    def __enter__(self):
        restore_params(self.path)
        check_epochs(self.epochs)
        if self.epochs is None:
            return self
        # PyYAML both ways (a YAML 1.2 writer would emit `off` unquoted, which 1.1 reads as false).
        original = self.path.read_text(encoding="utf-8")
        data = yaml.safe_load(original)
        data["train"]["epochs"] = self.epochs
        for m in self.models:
            if isinstance(data.get(m), dict) and isinstance(data[m].get("train"), dict):
                data[m]["train"]["epochs"] = self.epochs
        # The backup is whole before params.yaml changes, and each file is replaced in one step, so a kill or
        # a full disk at any point leaves params.yaml either as it was or restorable from a whole backup.
        scratch = Layout(self.path.parent).scratch
        self.backup.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.backup, original, scratch)
        # Comments are lost only for the duration of the run: the original bytes are restored on exit.
        write_text_atomic(self.path, yaml.safe_dump(data, sort_keys=False), scratch)
        return self

    def __exit__(self, *exc):
        restore_params(self.path)
        return False


def restore_params(params_path: Path) -> bool:
    """Put back the params file an interrupted `epochs_override` left rewritten; True when it did.

    Call it under the workspace lock: outside it, the backup may be a running override's."""
    params_path = Path(params_path)
    backup = _backup_of(params_path)
    if not backup.is_file():
        return False
    write_text_atomic(params_path, backup.read_text(encoding="utf-8"), Layout(params_path.parent).scratch)
    backup.unlink()
    fsync_dir(backup.parent)
    return True


def restore_left_override(params_path: Path) -> bool:
    """At the start of a run: put back params.yaml if a killed `--epochs` run left it rewritten (DVC would
    find its stages up to date with the override and keep it for good). Locks only when a backup is there."""
    params_path = Path(params_path)
    if not _backup_of(params_path).is_file():
        return False
    with workspace_lock(params_path.parent):
        return restore_params(params_path)
