"""`params.yaml` → frozen dataclasses. The one source of hyperparameters.

Every section maps to a dataclass; an unknown key anywhere is an error (a typo must never silently fall back
to a default). Model sections are typed by the model's own config class (see `recsys.models`), optionally
with a nested `train:` mapping that overrides the global `train` section for that model only.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from recsys.layout import PARAMS
# no torch: parsing params must not load it
from recsys.model_configs import (MODEL_CONFIGS, RETIRED_KEYS, SettingError, check_sizes, require,
                                  retired_value)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PARAMS = Path(PARAMS)  # relative: entry points run from the repository root, as DVC does

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
SEED_MAX = 2**32 - 1  # the largest seed numpy's global generator takes (the trainer seeds it)


class ConfigError(ValueError):
    """params.yaml (or an override) is invalid; the message says which key and why."""


def workspace_root(root: str | Path, option: str = "--repo-root") -> Path:
    """The repository a command was pointed at (`option`), resolved; refused with one line before anything is
    locked or written there unless it is a folder holding params.yaml (a file, a typo, a subfolder)."""
    path = Path(root).resolve()
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise ConfigError(f"{option} {root}: {what}; name the repository (the folder with params.yaml and "
                          "dvc.yaml)")
    if not (path / PARAMS).is_file():
        raise ConfigError(f"{option} {root}: {path} holds no {PARAMS}; name the repository (the folder with "
                          f"{PARAMS} and dvc.yaml)")
    return path


def check_seed(seed: int, section: str) -> None:
    require(0 <= seed <= SEED_MAX, "seed", seed, f"in [0, {SEED_MAX}] (2**32 - 1)", section)


def check_share(config: Any, key: str, section: str) -> None:
    """`key` a share: in [0, 1]."""
    require(0.0 <= getattr(config, key) <= 1.0, key, getattr(config, key), "in [0, 1]", section)


@dataclass(frozen=True)
class GenerateConfig:
    """Synthetic interactions with planted structure (the embedded default dataset)."""

    n_users: int = 300
    n_items: int = 200
    mean_events_per_user: int = 40
    n_clusters: int = 8
    start: str = "2024-01-01T00:00:00Z"
    days: int = 180
    seed: int = 0

    def __post_init__(self) -> None:
        check_sizes(self, "n_users", "n_items", "mean_events_per_user", "n_clusters", "days",
                    section="generate")
        # every cluster is a chain of items: one with no item cannot be walked
        require(self.n_clusters <= self.n_items, "n_clusters", self.n_clusters,
                f"at most generate.n_items ({self.n_items})", "generate")
        try:  # the standard library's parser (pandas, which generates, is too slow to load for every command)
            datetime.fromisoformat(self.start)
        except ValueError:
            raise SettingError("start", f"must be an ISO 8601 date and time such as 2024-01-01T00:00:00Z, "
                                        f"got {self.start!r}", "generate") from None
        check_seed(self.seed, "generate")


@dataclass(frozen=True)
class PrepareConfig:
    min_user_interactions: int = 5
    min_item_interactions: int = 5
    split: Literal["loo", "global_time"] = "loo"
    # global_time only: quantiles of the event-time distribution where validation and test periods start.
    valid_quantile: float = 0.8
    test_quantile: float = 0.9

    def __post_init__(self) -> None:
        check_sizes(self, "min_user_interactions", "min_item_interactions", section="prepare")
        # checked under loo too: a setting that cannot work is refused before anyone switches to global_time
        for key in ("valid_quantile", "test_quantile"):
            require(0.0 < getattr(self, key) < 1.0, key, getattr(self, key), "in (0, 1)", "prepare")
        require(self.valid_quantile < self.test_quantile, "test_quantile", self.test_quantile,
                f"above prepare.valid_quantile ({self.valid_quantile}): the validation period ends where the "
                "test period starts", "prepare")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    patience: int = 10
    seed: int = 42
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Stop after this many minutes even if validation still improves (0 = no limit); the best checkpoint
    # so far is kept, so the run stays honest, just shorter.
    max_minutes: float = 0.0
    grad_clip: float = 5.0
    # Validation targets per scoring batch; 0 = auto: 512 on a CPU, on CUDA as many as fit 2^28 elements of
    # the model's score table (recsys.ranking.scoring_batch_size).
    eval_batch_size: int = 0
    progress: Literal["auto", "on", "off"] = "auto"
    # Learning rate × lr_decay after lr_decay_patience epochs without a new best validation NDCG@10
    # (1.0 = constant learning rate). Early stopping still counts from the last improvement.
    lr_decay: float = 1.0
    lr_decay_patience: int = 5
    # Linear learning-rate warm-up over this many optimiser steps (0 = none).
    warmup_steps: int = 0
    # The rate over a run of `epochs` epochs, set at the start of each epoch: "constant", or decayed from
    # `lr` in epoch 1 towards lr × lr_final after epoch `epochs` along a "cosine" or "linear" curve (a
    # budgeted run: set `epochs` to the budget, and patience to it or more). A pure function of the epoch,
    # so a resumed run continues the same curve; warm-up and lr_decay act on top of it.
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    lr_final: float = 0.0
    # Early stopping may not end a cold run before this epoch (a slow start is not a plateau); a warm start
    # has its own floor, warm_min_epochs.
    min_epochs: int = 0
    # `lr` is the rate at batch size `lr_reference_batch`; another batch size scales it by
    # (batch_size / lr_reference_batch) ** {none: 0, sqrt: 0.5, linear: 1} (large GPU batches).
    lr_scaling: Literal["none", "sqrt", "linear"] = "none"
    lr_reference_batch: int = 128
    # Training sequences per user: "last" = the newest max_len + 1 training events (the SASRec reference);
    # "all" = the whole training history in windows of max_len + 1 events (recsys.sequences.train_spans).
    windows: Literal["last", "all"] = "last"
    # How an epoch's spans form batches: "bucketed" = similar lengths together (least padding: the cheapest
    # epoch on CPU), "random" = uniform batches (every target weighs the same in expectation; issue 11).
    batching: Literal["bucketed", "random"] = "bucketed"
    # Each optimiser step runs as this many length-sorted micro-batches whose gradients add up to the whole
    # batch's (recsys.sequences.micro_batches): the same update with less padding. 0 = auto: 8 on a CPU
    # (a uniform ML-100K epoch 1.9–2.3 × cheaper), 1 on CUDA.
    micro_batches: int = 0
    # Where training starts (recsys/warm.py): "cold" = a fresh initialisation; "warm" = the registry
    # champion's weights (same model family and shapes, or the stage stops and says what differs); "auto" =
    # warm when the champion is compatible, else cold with the reason logged — and cold anyway for every
    # `warm_cold_every`-th version of a warm-started line (0 = never) or when the catalogue grew by more
    # than `warm_max_catalogue_growth` (new items / the champion's items).
    init: Literal["cold", "warm", "auto"] = "cold"
    warm_cold_every: int = 5
    warm_max_catalogue_growth: float = 0.2
    # A warm start's epoch floor: `min_epochs` is for cold starts (a slow start from random weights is not a
    # plateau); a warm start begins near its optimum and the cold floor would make it as long as a cold run.
    warm_min_epochs: int = 0
    # Share of the champion's weights a warm start keeps: every carried-over tensor becomes
    # warm_keep × champion + (1 − warm_keep) × this run's fresh initialisation ("shrink and perturb", Ash &
    # Adams 2020, with the perturbation drawn from the model's own initialiser). 1 = the champion as it is.
    warm_keep: float = 1.0
    # Train at one fixed shape (full-width batches of batch_size rows, padding masked in the loss) and, on
    # CUDA, capture the step once as a CUDA graph and replay it: the step no longer waits for the host
    # (recsys/step_graph.py). Models with loss ce; one process; micro_batches 0 or 1. On a CPU the same step
    # runs eagerly, at full width (slower than micro-batches there).
    cuda_graph: bool = False
    # Exponential moving average of the weights, updated after every optimiser step with this decay (0 =
    # off; 0.99 averages over roughly the last 100 steps). Validation, the best checkpoint and so the test
    # score the averaged weights; the optimiser keeps stepping the raw ones.
    ema: float = 0.0
    # How the process's C allocator treats the tensors a CPU step frees (glibc on Linux; elsewhere nothing
    # changes): "retain" keeps freed memory in the process for the next step instead of handing every large
    # block back to the kernel and faulting it in again (recsys.device.retain_cpu_memory; ML-100K SASRec:
    # validation 39 % and the whole run 11 % faster, benchmarks/RESULTS.md); "system" leaves the C library's
    # defaults. The trainer and the evaluate stage (its test pass) apply it. Speed only: the same numbers
    # either way.
    cpu_allocator: Literal["retain", "system"] = "retain"

    @property
    def effective_lr(self) -> float:
        power = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}[self.lr_scaling]
        return self.lr * (self.batch_size / self.lr_reference_batch) ** power

    def schedule_factor(self, epoch: int) -> float:
        """`lr_schedule`'s share of the rate in `epoch` (1-based): lr_final + (1 − lr_final)·f(t), t = (epoch −
        1) / epochs, f falling from 1 at t = 0 to 0 at t = 1 — reached after the last epoch, so none trains at
        lr_final itself (PyTorch's CosineAnnealingLR with T_max = epochs, stepped once an epoch). 1 for
        "constant"."""
        if self.lr_schedule == "constant":
            return 1.0
        t = min(max(epoch - 1, 0) / self.epochs, 1.0)
        f = 0.5 * (1.0 + math.cos(math.pi * t)) if self.lr_schedule == "cosine" else 1.0 - t
        return self.lr_final + (1.0 - self.lr_final) * f

    def __post_init__(self) -> None:
        for name in ("epochs", "patience"):
            require(getattr(self, name) >= 1, name, getattr(self, name), ">= 1 (whole epochs)", "train")
        for name in ("lr", "max_minutes", "grad_clip", "weight_decay"):
            zero = {"lr": "the weights stay as initialised", "max_minutes": "no time limit",
                    "grad_clip": "no clipping", "weight_decay": "none"}[name]
            value = getattr(self, name)
            require(0.0 <= value < math.inf, name, value, f"a finite number >= 0 (0 = {zero})", "train")
        require(0.0 < self.lr_decay <= 1.0, "lr_decay", self.lr_decay, "in (0, 1]", "train")
        require(0.0 <= self.lr_final <= 1.0, "lr_final", self.lr_final, "in [0, 1] (the share of train.lr "
                "that lr_schedule decays to by the end of the last epoch)", "train")
        check_sizes(self, "lr_decay_patience", "batch_size", "lr_reference_batch", section="train")
        for name in ("warmup_steps", "min_epochs", "warm_min_epochs", "micro_batches", "eval_batch_size"):
            require(getattr(self, name) >= 0, name, getattr(self, name), ">= 0", "train")
        require(self.warm_cold_every >= 0, "warm_cold_every", self.warm_cold_every,
                ">= 0 (0 = never forced cold)", "train")
        growth = self.warm_max_catalogue_growth
        require(growth >= 0.0, "warm_max_catalogue_growth", growth, ">= 0", "train")
        require(0.0 < self.warm_keep <= 1.0, "warm_keep", self.warm_keep, "in (0, 1] (1 = the champion's "
                "weights as they are; a smaller share blends in a fresh initialisation)", "train")
        require(0.0 <= self.ema < 1.0, "ema", self.ema, "in [0, 1) (0 = off; the decay of the weights' "
                "moving average per optimiser step)", "train")
        check_seed(self.seed, "train")


@dataclass(frozen=True)
class EvaluateConfig:
    ks: tuple[int, ...] = (5, 10, 20)
    batch_size: int = 0  # targets per scoring batch; 0 = auto, as train.eval_batch_size
    # Sampled metrics are a labelled extra for comparison with papers; 0 disables them.
    sampled_negatives: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        require(len(self.ks) > 0 and all(k >= 1 for k in self.ks), "ks", list(self.ks),
                "a non-empty list of cut-offs >= 1", "evaluate")
        require(self.batch_size >= 0, "batch_size", self.batch_size, ">= 0 (0 = auto)", "evaluate")
        require(self.sampled_negatives >= 0, "sampled_negatives", self.sampled_negatives, ">= 0 (0 = none)",
                "evaluate")
        check_seed(self.seed, "evaluate")


@dataclass(frozen=True)
class IngestConfig:
    inbox: str = "inbox"
    store: str = "data"
    quarantine: str = "quarantine"
    reports: str = "reports/ingest"
    manifest: str = "ingest_manifest.jsonl"
    # Earliest plausible event (UTC seconds) and how far into the future a timestamp may be.
    timestamp_floor: int = 788918400  # 1995-01-01; MovieLens-100K starts 1997-09-20, -20M 1995-01-09
    max_future_skew_seconds: int = 86400
    min_rows: int = 1
    max_bad_row_share: float = 0.05
    max_unseen_user_share: float = 1.0
    max_unseen_item_share: float = 0.5
    allowed_events: tuple[str, ...] = ("view", "click", "cart", "purchase", "rating")
    dvc_push: bool = True
    # {canonical column: source column} for batches whose columns are named differently, e.g.
    # {user_id: userId, timestamp: ts}. Unmapped canonical columns are expected under their own name.
    column_mapping: dict[str, str] = field(default_factory=dict)
    # Source columns outside the canonical schema: reject the batch (default; a renamed column is then
    # caught instead of silently lost) or drop them.
    extra_columns: Literal["reject", "drop"] = "reject"

    def __post_init__(self) -> None:
        from recsys.layout import DATA

        if self.store != DATA:  # bootstrap, dvc.yaml's prepare stage and data.dvc all name it
            raise ValueError(f"ingest.store must be {DATA!r} (the raw store data.dvc versions and dvc.yaml's "
                             f"prepare stage reads; the layout is fixed), got {self.store!r}: remove the setting")
        for key in ("inbox", "quarantine", "reports", "manifest"):  # "" would be the repository root itself
            require(getattr(self, key) != "", key, getattr(self, key),
                    "a path relative to the repository root", "ingest")
        require(self.timestamp_floor >= 0, "timestamp_floor", self.timestamp_floor,
                ">= 0 (UTC seconds since 1970)", "ingest")
        require(self.max_future_skew_seconds >= 0, "max_future_skew_seconds", self.max_future_skew_seconds,
                ">= 0", "ingest")
        check_sizes(self, "min_rows", section="ingest")  # a batch with no rows has nothing to ingest
        for key in ("max_bad_row_share", "max_unseen_user_share", "max_unseen_item_share"):
            check_share(self, key, "ingest")
        require(len(self.allowed_events) > 0 and all(self.allowed_events), "allowed_events",
                list(self.allowed_events), "a non-empty list of event names", "ingest")
        if self.column_mapping:  # (the schema module loads pyarrow: only when there is a mapping to check)
            from recsys.schema import mapping_problem

            problem = mapping_problem(self.column_mapping)
            if problem:
                raise ValueError(f"ingest.column_mapping: {problem}")


@dataclass(frozen=True)
class RegistryConfig:
    url: str = "sqlite:///registry/registry.db"
    artifact_root: str = "registry/artifacts"
    model_name: str = "next_item"

    def __post_init__(self) -> None:  # "" would store artifacts in the repository root itself
        require(self.artifact_root != "", "artifact_root", self.artifact_root, "a folder path", "registry")


@dataclass(frozen=True)
class GateConfig:
    metric: str = "ndcg@10"  # one of `gate_metrics(evaluate.ks)` (parse_params checks it against them)
    min_delta: float = 0.0
    significance: bool = True
    alpha: float = 0.05

    def __post_init__(self) -> None:
        require(0.0 <= self.min_delta < math.inf, "min_delta", self.min_delta,
                "a finite number >= 0 (the gain over the baseline a promotion needs)", "gate")
        require(0.0 < self.alpha < 1.0, "alpha", self.alpha,
                "in (0, 1) (the paired test's significance level)", "gate")


def gate_metrics(ks: tuple[int, ...]) -> list[str]:
    """The per-user metrics the evaluate stage writes for cut-offs `ks` — the ones the gate can compare
    (`recsys.metrics.per_user_metrics` names them; tests/test_metrics.py keeps the two in step)."""
    return [name for k in ks for name in (f"ndcg@{k}", f"hr@{k}")] + ["mrr"]


@dataclass(frozen=True)
class Params:
    models: tuple[str, ...]
    model_configs: dict[str, Any]
    model_train: dict[str, TrainConfig]
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    gate: GateConfig = field(default_factory=GateConfig)

    def model_config(self, name: str) -> Any:
        if name not in self.model_configs:
            raise ConfigError(f"unknown model {name!r}: params.yaml has no section for it; known models are "
                              f"{sorted(self.model_configs)}")
        return self.model_configs[name]

    def train_config(self, name: str) -> TrainConfig:
        return self.model_train.get(name, self.train)


_SECTIONS: dict[str, type] = {
    "generate": GenerateConfig,
    "prepare": PrepareConfig,
    "train": TrainConfig,
    "evaluate": EvaluateConfig,
    "ingest": IngestConfig,
    "registry": RegistryConfig,
    "gate": GateConfig,
}


def _coerce(cls_name: str, key: str, hint: Any, value: Any) -> Any:
    origin = get_origin(hint)
    where = f"{cls_name}.{key}"
    if origin is Literal:
        if value not in get_args(hint):
            raise ConfigError(f"{where}: {value!r} is not one of {list(get_args(hint))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (elem, _ellipsis) = get_args(hint)
        return tuple(_coerce(cls_name, key, elem, v) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def build_dataclass(cls: type, raw: dict[str, Any] | None, section: str | None = None) -> Any:
    """Build `cls` from a mapping, rejecting unknown keys and wrongly typed values."""
    section = section or cls.__name__
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: expected a mapping, got {type(raw).__name__}")
    for key in raw:
        if key in RETIRED_KEYS.get(section, {}):
            raise ConfigError(f"{section}.{key} no longer exists: {RETIRED_KEYS[section][key]}")
    if retired := retired_value(section, raw):
        key, value, why = retired
        raise ConfigError(f"{section}.{key}: {value!r} no longer exists: {why}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{section}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    values = {k: _coerce(section, k, hints[k], v) for k, v in raw.items()}
    try:
        return cls(**values)
    except SettingError as err:  # named where it was written: `sasrec.train.lr`, not `train.lr`
        raise ConfigError(f"{section}.{err.key} {err.problem}") from err
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{section}: {err}") from err


def parse_params(raw: dict[str, Any]) -> Params:
    if not isinstance(raw, dict):
        raise ConfigError("params.yaml must be a mapping of sections")
    raw = dict(raw)
    models = raw.pop("models", ["mostpop", "sasrec"])
    if not isinstance(models, list) or not models:
        raise ConfigError("models: expected a non-empty list of model names")
    for name in models:
        if name not in MODEL_CONFIGS:
            raise ConfigError(f"models: unknown model {name!r}; available: {sorted(MODEL_CONFIGS)}")
    if len(set(models)) != len(models):
        raise ConfigError(f"models: duplicate names in {models}")

    sections = {k: build_dataclass(cls, raw.pop(k, None), k) for k, cls in _SECTIONS.items()}
    model_configs: dict[str, Any] = {}
    model_train: dict[str, TrainConfig] = {}
    for name, cfg_cls in MODEL_CONFIGS.items():
        section = dict(raw.pop(name, None) or {})
        train_override = section.pop("train", None)
        model_configs[name] = build_dataclass(cfg_cls, section, name)
        if train_override is not None:
            if not isinstance(train_override, dict):
                raise ConfigError(f"{name}.train: expected a mapping")
            merged = {**dataclasses.asdict(sections["train"]), **train_override}
            model_train[name] = build_dataclass(TrainConfig, merged, f"{name}.train")
    if raw:
        raise ConfigError(f"unknown section(s) {sorted(raw)} in params.yaml")
    ks, metric = sections["evaluate"].ks, sections["gate"].metric
    if metric not in gate_metrics(ks):  # else every candidate is refused for want of the metric
        raise ConfigError(f"gate.metric {metric!r} is not a metric the evaluate stage writes: with "
                          f"evaluate.ks {list(ks)} it must be one of {', '.join(gate_metrics(ks))}")
    return Params(models=tuple(models), model_configs=model_configs, model_train=model_train, **sections)


def read_params(path: str | Path = DEFAULT_PARAMS) -> Any:
    """A params file's YAML, unchecked (None when empty). A file that cannot be read or parsed is one line
    naming it — where it was looked for, and `--params`, the option of every command that reads one."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as err:
        where = "" if path.is_absolute() else " (relative to the current folder)"
        raise ConfigError(f"params file not found: {path.absolute()}{where}: run from the repository root or "
                          f"pass --params PATH") from err
    except IsADirectoryError as err:
        raise ConfigError(f"params file {path} is a folder: pass --params PATH naming the params.yaml file "
                          f"itself") from err
    except OSError as err:  # no permission, a broken link, ...
        raise ConfigError(f"cannot read params file {path}: {err.strerror or err} (--params PATH reads "
                          f"another)") from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"params file {path} is not UTF-8 text: byte 0x{data[err.start]:02x} on line "
                          f"{line}; save it as UTF-8 (or pass --params PATH)") from err
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {yaml_problem(err)}") from err


def yaml_problem(err: yaml.YAMLError) -> str:
    """pyyaml's error as one line: where (1-based line and column) and its short problem text, and what it
    was parsing where that began elsewhere (an unclosed `{` is found at the end of the file) — without the
    source lines and caret diagrams of its str()."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or not problem:
        return " ".join(str(err).split())
    line = f"line {mark.line + 1}, column {mark.column + 1}: {' '.join(problem.split())}"
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and start is not None and (start.line, start.column) != (mark.line, mark.column):
        line += f" ({' '.join(context.split())} from line {start.line + 1}, column {start.column + 1})"
    return line


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    return parse_params(read_params(path) or {})


def validate_name(name: str, what: str = "name") -> str:
    """Names used in paths and SQL identifiers come from an allow-list pattern."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"invalid {what} {name!r}: use lowercase letters, digits and _ (max 64)")
    return name
