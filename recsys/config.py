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
from recsys.model_configs import (
    MODEL_CONFIGS,
    RETIRED_KEYS,
    SettingError,
    TrainConfig,
    check_seed,
    check_sizes,
    cuda_graph_refusal,
    require,
    retired_value,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PARAMS = Path(PARAMS)  # relative: entry points run from the repository root, as DVC does

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class ConfigError(ValueError):
    """params.yaml (or an override) is invalid; the message says which key and why."""


def workspace_root(root: str | Path, option: str = "--repo-root") -> Path:
    """The repository a command was pointed at (`option`), resolved; refused with one line before anything
    is locked or written there unless it is a folder holding params.yaml (an empty value, a file, a typo, a
    subfolder). DVC is asked for where needed, not here (ingest runs without it; bootstrap needs it)."""
    advice = f"name the repository (the folder with {PARAMS} and dvc.yaml)"
    if not str(root).strip():  # Path("") is the current folder: an empty value ran there
        raise ConfigError(f"{option} is empty: {advice}")
    path = Path(root).resolve()
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise ConfigError(f"{option} {root}: {what}; {advice}")
    if not (path / PARAMS).is_file():
        raise ConfigError(f"{option} {root}: {path} holds no {PARAMS}; {advice}")
    return path


def params_root(params: str | Path, relative: bool = False) -> Path:
    """The repository a params file belongs to: its folder, resolved. Every command given `--params` reads
    and writes there, not in the current folder (`--params OTHER/params.yaml` works on OTHER). With
    `relative`, said from the current folder where it is inside it (`.` for `params.yaml`, as `dvc repro`
    runs the stages), so the stages' paths and messages read as they always did."""
    root = Path(params).resolve().parent
    if relative and root.is_relative_to(Path.cwd()):
        return root.relative_to(Path.cwd())
    return root


def check_share(config: Any, key: str, section: str) -> None:
    """`key` a share: in [0, 1]."""
    require(0.0 <= getattr(config, key) <= 1.0, key, getattr(config, key), "in [0, 1]", section)


MAX_GENERATED_EVENTS = 10_000_000  # `generate`'s bound on its events (n_users × mean_events_per_user) and items


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
        # The generator holds every event in memory (~0.4 GB and ~4.5 s a million on a 2-core box): n_users
        # 10^12 ran for as long as it took. A synthetic set stays a demo's size; real data is imported.
        require(self.n_items <= MAX_GENERATED_EVENTS, "n_items", self.n_items,
                f"at most {MAX_GENERATED_EVENTS:,}", "generate")
        events = self.n_users * self.mean_events_per_user
        require(events <= MAX_GENERATED_EVENTS, "mean_events_per_user", self.mean_events_per_user,
                f"such that generate.n_users × mean_events_per_user is at most {MAX_GENERATED_EVENTS:,} events "
                f"(the generator holds them all in memory; {self.n_users:,} × {self.mean_events_per_user:,} = "
                f"{events:,}; `recsys data import` takes a real dataset of any size)", "generate")
        require(self.days <= 36_500, "days", self.days, "at most 36,500 (a century)", "generate")
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
class EvaluateConfig:
    ks: tuple[int, ...] = (5, 10, 20)
    batch_size: int = 0  # targets per scoring batch; 0 = auto, as train.eval_batch_size
    sampled_negatives: int = 0  # > 0: a labelled extra of sampled metrics, for comparison with papers only
    seed: int = 0
    # A user's own items ruled out of validation, test (a repeated target: a miss; PROTOCOL.md) and serving;
    # false ranks every item (data where people come back to items: listening, groceries). README.
    mask_seen: bool = True

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
            require(getattr(self, key).strip() != "", key, getattr(self, key),
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


# The registry's URL from the environment, in place of params.yaml's `registry.url`: a password stays out of
# the repository (and out of DVC: no stage has `registry` among its params).
# `recsys.registry.core.registry_url` reads it; ingest's inbox check too (the registry's files are no inbox).
REGISTRY_URL_ENV = "RECSYS_REGISTRY_URL"


@dataclass(frozen=True)
class RegistryConfig:
    url: str = "sqlite:///registry/registry.db"
    artifact_root: str = "registry/artifacts"
    model_name: str = "next_item"

    def __post_init__(self) -> None:  # "" would store artifacts in the repository root itself
        require(self.artifact_root != "", "artifact_root", self.artifact_root, "a folder path", "registry")
        # Checked here, not first when the registry opens (after a retrain flow's training, say)
        require(self.url.strip() != "", "url", self.url,
                "a database URL (leave the key out for the SQLite default)", "registry")
        require(bool(NAME_PATTERN.fullmatch(self.model_name)), "model_name", self.model_name,
                "lowercase letters, digits and _ (max 64), starting with a letter", "registry")


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


_YAML12_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def _coerce(cls_name: str, key: str, hint: Any, value: Any) -> Any:
    origin = get_origin(hint)
    where = f"{cls_name}.{key}"
    if origin is Literal:
        allowed = get_args(hint)
        if isinstance(value, bool) and {"on", "off"} <= set(allowed):
            value = "on" if value else "off"  # YAML 1.1 reads an unquoted on/off (yes/no) as true/false
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in value.items()):
            raise ConfigError(f"{where}: expected a mapping of names to names (from: to), got {value!r}")
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
        if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value):
            return float(value)  # `1e-3`: a number to YAML 1.2 (and DVC), a string to PyYAML's YAML 1.1
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
    unknown = sorted(set(raw) - known, key=str)  # (YAML may give a key that is no string: `on:` is True)
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
        if not isinstance(name, str):  # `- sasrec:` (a mapping) was an "unhashable type" traceback
            raise ConfigError(f"models: expected model names, got {name!r}; write `models: [mostpop, sasrec]`")
        if name not in MODEL_CONFIGS:
            raise ConfigError(f"models: unknown model {name!r}; available: {sorted(MODEL_CONFIGS)}")
    if len(set(models)) != len(models):
        raise ConfigError(f"models: duplicate names in {models}")

    sections = {k: build_dataclass(cls, raw.pop(k, None), k) for k, cls in _SECTIONS.items()}
    model_configs: dict[str, Any] = {}
    model_train: dict[str, TrainConfig] = {}
    for name, cfg_cls in MODEL_CONFIGS.items():
        section = raw.pop(name, None)
        if section is None:
            section = {}
        if not isinstance(section, dict):  # `sasrec: 5` (dict() of it was a traceback)
            raise ConfigError(f"{name}: expected a mapping, got {type(section).__name__}")
        section = dict(section)
        train_override = section.pop("train", None)
        model_configs[name] = build_dataclass(cfg_cls, section, name)
        if train_override is not None:
            if not isinstance(train_override, dict):
                raise ConfigError(f"{name}.train: expected a mapping, got {type(train_override).__name__}")
            merged = {**dataclasses.asdict(sections["train"]), **train_override}
            model_train[name] = build_dataclass(TrainConfig, merged, f"{name}.train")
    if raw:
        raise ConfigError(f"unknown section(s) {sorted(raw, key=str)} in params.yaml")
    for name in models:  # before any stage runs, not when the trainer reaches the model
        if refusal := cuda_graph_refusal(name, model_configs[name], model_train.get(name, sections["train"])):
            raise ConfigError(refusal)
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
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {yaml_problem(err)}") from err


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key written twice in one mapping: PyYAML keeps the last silently, while DVC
    refuses the file — `recsys train` and `dvc repro` would read different settings."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping (first on line {first.line + 1}): keep "
                    "one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


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
