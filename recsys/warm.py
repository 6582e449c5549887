"""Warm start: a candidate begins from the registry champion's weights instead of a fresh initialisation.

The champion reaches the train stage as an explicit input, `artifacts/warm/<model>/`: `source.json` names
the registry version, its artifact sha256 and the sha256 of each file (or says why there is nothing to start
from), and `checkpoint/` holds a copy of that checkpoint. `recsys.warm_source` writes it from the registry
before `dvc repro` runs (`recsys warm`, `recsys bootstrap`, the retrain flow); dvc.yaml lists the directory
as a dependency of `train@<model>`, so a new champion re-runs exactly the stages that start from it and
training stays a function of (dataset, params, initial weights). The stage never opens the registry.

`train.init` (per model too):
- `cold` (default): the source is never read; training is what it was before warm starts existed.
- `warm`: start from the champion, or stop with one line saying what differs and which setting to change.
- `auto`: start warm when the champion is compatible; otherwise train cold and log why. Also cold for every
  `warm_cold_every`-th version of a warm-started line, counted by the `warm_streak` each checkpoint records
  (warm starts since the line's last cold try), and when new items exceed `warm_max_catalogue_growth` of the
  champion's catalogue. Such a cold try records the source it stood in for (`cold_try_of`), and the version
  the run gates records every cold try of the run (`cold_tries`; only the best by validation is gated). When
  that version is rejected, the champion (and its streak) stays, and the next data version's source says so
  (`cold_tried`, written by recsys/warm_source.py from the registry): that run warm-starts again, its
  streak counted afresh from 1, so a line whose cold retrains keep losing is tried cold once every
  `warm_cold_every` versions, not on every run after the first loss.

Compatible: the same model (family and loss) with the same config, except the fields the model declares free
(`SequentialModel.warm_free_fields`: dropout, negatives, initialisation...). What carries over
(`transfer`): every tensor of the same name and shape — blocks, position embeddings, norms, heads; tensors
indexed by id (`SequentialModel.id_rows`) row by row through the raw ids — known items and users keep their
rows, new ones keep their fresh (seeded) initialisation, rows of ids gone from the data are dropped; padding
and special rows (BERT4Rec's [mask]) carry over in place. A tensor whose shape a free field changed (MOJITO's
time encoder under another `time_dim`) stays fresh and is listed. The optimiser is built afterwards, so it
starts fresh; early stopping runs as for a cold start. The gate does not know how a candidate started.

Only the train stage's side (`start`, `transfer`) imports torch: writing and reading `source.json` is plain
files, so resolving the sources of `cold` models (every nothing-new scheduled run) never loads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from recsys.atomic import remove_stale_temp_dirs, replace_dir
from recsys.checkpoint import CheckpointError, read_meta
from recsys.config import ConfigError, PrepareConfig
from recsys.held_out import late_data_leak
from recsys.layout import WARM_SOURCE_FILE
from recsys.lineage import split_changes
from recsys.model_configs import TrainConfig

if TYPE_CHECKING:
    import torch

    from recsys.models.base import SequentialModel

log = logging.getLogger(__name__)

SOURCE_FILE = WARM_SOURCE_FILE
CHECKPOINT = "checkpoint"
FORMAT_VERSION = 1
# Why there is nothing to start from, as `recsys.warm_source` records it. These stay the same while the
# situation does (no version numbers), so a champion change that cannot matter re-runs nothing.
WRITTEN_COLD = "the warm source was written while train.init was cold (`recsys warm` rewrites it)"
NO_EARLIER_CHAMPION = "the registry had no champion before the current data version"
# The key under `init` of a checkpoint trained cold in place of a warm start (train.warm_cold_every): the
# source version it stood in for, which recsys/warm_source.py looks for among the gate's rejections.
COLD_TRY_OF = "cold_try_of"
# The key, in a registered version's params, of the cold tries among the workspace's checkpoints when it was
# gated (recsys/promotion.py): only the best by validation is gated, so a cold try another model beat on
# validation lost with the candidate that did.
COLD_TRIES = "cold_tries"
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # a checkpoint's file: a name, never a path
_HEX = re.compile(r"^[0-9a-f]{64}$")


class WarmStartRefused(Exception):
    """The champion cannot be the starting point. `fix` says which setting would make it one."""

    def __init__(self, reason: str, fix: str, record: dict[str, Any] | None = None):
        super().__init__(reason)
        self.fix = fix
        self.record = record or {}  # what the cold checkpoint records beside the reason


@dataclass(frozen=True)
class WarmSource:
    """What `source.json` says: the registry version to start from, or why there is none."""

    version: int | None = None
    artifact_sha256: str | None = None
    files: tuple[tuple[str, int, str], ...] = ()  # (name, size, sha256) of each checkpoint file
    reason: str | None = None
    # A cold try in place of a warm start from this version (train.warm_cold_every) lost the gate on an
    # earlier data version: `auto` starts warm again. Written only when true (older records stay byte-equal).
    cold_tried: bool = False

    def record(self) -> dict[str, Any]:
        if self.version is None:
            return {"format_version": FORMAT_VERSION, "source": None, "reason": self.reason}
        return {"format_version": FORMAT_VERSION, "reason": None,
                "source": {"version": self.version, "artifact_sha256": self.artifact_sha256,
                           "files": [list(f) for f in self.files],
                           **({"cold_tried": True} if self.cold_tried else {})}}


# --- the source directory: written by recsys.warm_source, read by the train stage -------------------------


def write_none(warm_dir: Path, reason: str) -> bool:
    """Record that there is nothing to start from, and why. Returns False when that was already recorded."""
    return _write(Path(warm_dir), WarmSource(reason=reason), None)


def write_source(warm_dir: Path, version: int, artifact_sha256: str, files: Sequence[Sequence[Any]],
                 checkpoint_dir: Path, cold_tried: bool = False) -> bool:
    """Copy a (verified) registry checkpoint in as the source; `files` is its manifest's
    [name, size, sha256] list; `cold_tried` as WarmSource's. Returns False when the directory already held
    exactly this."""
    listed = tuple((str(name), int(size), str(digest)) for name, size, digest in files)
    source = WarmSource(version, artifact_sha256, listed, cold_tried=cold_tried)
    _check_record(source, Path(warm_dir))
    return _write(Path(warm_dir), source, Path(checkpoint_dir))


def _write(warm_dir: Path, source: WarmSource, checkpoint_dir: Path | None) -> bool:
    # A killed write's temp copy (or the old directory moved aside): writers hold the workspace lock, so any
    # that exist now are leftovers, and each is a whole checkpoint's size.
    remove_stale_temp_dirs(warm_dir)
    text = source_text(source)
    path = warm_dir / SOURCE_FILE
    # Already in place only when nothing else is there either: DVC hashes the whole directory, and a fan-out
    # worker's copy holds exactly these entries.
    expected = {SOURCE_FILE, CHECKPOINT} if checkpoint_dir is not None else {SOURCE_FILE}
    if (path.is_file() and path.read_bytes() == text.encode("utf-8")
            and {p.name for p in warm_dir.iterdir()} == expected):
        try:
            check_files(warm_dir, source.files)
            return False
        except CheckpointError:
            pass  # damaged since: write it again
    warm_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{warm_dir.name}-", dir=warm_dir.parent))
    try:
        if checkpoint_dir is not None:
            (tmp / CHECKPOINT).mkdir()
            for name, _, _ in source.files:
                shutil.copyfile(checkpoint_dir / name, tmp / CHECKPOINT / name)
            check_files(tmp, source.files)  # the copy is exactly what the registry addressed
        (tmp / SOURCE_FILE).write_text(text, encoding="utf-8")
        replace_dir(tmp, warm_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def read_source(warm_dir: Path | None) -> WarmSource:
    """The source recorded in `warm_dir` (a missing directory is 'nothing to start from')."""
    if warm_dir is None:
        return WarmSource(reason="no warm source was given")
    if not (Path(warm_dir) / SOURCE_FILE).is_file():
        return WarmSource(reason=f"there is no warm source at {warm_dir} (`recsys warm` writes it)")
    path = Path(warm_dir) / SOURCE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is damaged ({err}); run `recsys warm` to write it again") from err
    return parse_source(text, path)


def source_text(source: WarmSource) -> str:
    """`source.json`'s exact text for `source` (DVC hashes these bytes)."""
    return json.dumps(source.record(), indent=2, sort_keys=True) + "\n"


def parse_source(text: str, path: Path) -> WarmSource:
    """A `source.json` text (read from `path`, or shipped in a fan-out work order) as a checked WarmSource."""
    try:
        raw = json.loads(text)
        if raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported format {raw.get('format_version')!r}")
        if raw.get("source") is None:
            return WarmSource(reason=str(raw.get("reason") or "no source recorded"))
        src = raw["source"]
        tried = src.get("cold_tried", False)
        if not isinstance(tried, bool):
            raise ValueError(f"cold_tried is {tried!r}, not true or false")
        source = WarmSource(int(src["version"]), str(src["artifact_sha256"]),
                            tuple((str(n), int(s), str(d)) for n, s, d in src["files"]), cold_tried=tried)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path} is damaged ({err}); run `recsys warm` to write it again") from err
    _check_record(source, path.parent)
    return source


def _check_record(source: WarmSource, warm_dir: Path) -> None:
    bad = [name for name, _, digest in source.files
           if not _FILE_NAME.fullmatch(name) or not _HEX.fullmatch(digest)]
    valid = (source.version or 0) >= 1 and _HEX.fullmatch(source.artifact_sha256 or "")
    if not valid or bad or not source.files:
        raise CheckpointError(f"{warm_dir / SOURCE_FILE}: invalid source (version {source.version!r}, files "
                              f"{bad or len(source.files)}); run `recsys warm` to write it again")


def check_files(warm_dir: Path, files: Sequence[tuple[str, int, str]]) -> None:
    """The copied checkpoint holds exactly `files`, byte for byte (sizes and sha256)."""
    directory = Path(warm_dir) / CHECKPOINT
    present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    expected = sorted(name for name, _, _ in files)
    if present != expected:
        raise CheckpointError(f"{directory} holds {present or 'nothing'}, expected {expected or 'nothing'}; "
                              "run `recsys warm` to write it again")
    for name, size, digest in files:
        data = (directory / name).read_bytes()
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise CheckpointError(f"{directory / name} is not the registry's file (size {len(data)}, "
                                  f"expected {size}); run `recsys warm` to write it again")


# --- the train stage's side --------------------------------------------------------------------------------


def start(model: SequentialModel, model_name: str, model_config: Any, cfg: TrainConfig, warm_dir: Path | None,
          item_ids: Sequence[str], user_ids: Sequence[str],
          held_out_from: float | None = None, split: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Apply `cfg.init` to a freshly built `model`. Returns what the checkpoint records under `init` — None
    for `cold` (and for models that learn by counting), so a cold checkpoint is what it always was.
    `held_out_from`: today's global_time cut (the prepared fingerprint's); a champion that trained on events
    from it on is refused (`late_data_leak`). `split`: the prepare settings today's data was split with (the
    prepared fingerprint's config); a champion whose checkpoint recorded others is refused too — `recsys warm`
    never picks one, but `dvc repro` after a change to prepare's settings reruns this stage on the source an
    earlier `recsys warm` wrote."""
    if cfg.init == "cold" or not model.trainable:
        return None
    ids = {"items": [None, *map(str, item_ids)], "users": [None, *map(str, user_ids)]}
    try:
        record = _warm_start(model, model_name, model_config, cfg, warm_dir, ids, held_out_from, split)
    except WarmStartRefused as refused:
        if cfg.init == "warm":
            raise ConfigError(f"{model_name}: cannot warm-start: {refused}; {refused.fix}, or set train.init "
                              f"(or {model_name}.train.init) to auto or cold in params.yaml") from None
        log.warning("init=cold model=%s (train.init auto): %s", model_name, refused)
        return {"requested": cfg.init, "mode": "cold", "reason": str(refused), **refused.record}
    counts = " ".join(f"{kind}_{k}={v}" for kind in ("items", "users") if kind in record
                      for k, v in record[kind].items())
    log.info("init=warm model=%s from=v%d warm_streak=%d %s%s", model_name, record["from_version"],
             record["warm_streak"], counts, f" fresh={','.join(record['fresh'])}" if record["fresh"] else "")
    return record


def _warm_start(model: SequentialModel, model_name: str, model_config: Any, cfg: TrainConfig,
                warm_dir: Path | None, ids: dict[str, list], held_out_from: float | None,
                split: dict[str, Any] | None = None) -> dict[str, Any]:
    source = read_source(warm_dir)
    rewrite = f"run `recsys warm` once a {model_name} version is champion"
    if source.version is None:
        raise WarmStartRefused(source.reason or "no champion to start from", rewrite)
    assert warm_dir is not None
    check_files(warm_dir, source.files)
    checkpoint = Path(warm_dir) / CHECKPOINT
    meta = read_meta(checkpoint)
    v = f"v{source.version}"
    if meta.get("model") != model_name:
        raise WarmStartRefused(f"the champion {v} is a {meta.get('model')} model, not {model_name}", rewrite)
    if leak := late_data_leak(meta.get("train_until"), held_out_from):
        raise WarmStartRefused(f"the champion {v} was {leak}", "train this version cold (a version trained on "
                                                                "today's split can be the next source)")
    if changed := _split_changes(meta.get("prepare"), split):
        raise WarmStartRefused(f"the champion {v} trained on data split otherwise ({changed}): it may have "
                               "learnt events today's split validates and tests on",
                               "run `recsys warm` (it picks a source split as today's data is), or train this "
                               "version cold")
    from recsys.models import config_from_dict

    try:  # the champion's config as this version reads it: retired keys dropped, keys added since defaulted
        theirs = dataclasses.asdict(config_from_dict(model_name, dict(meta.get("config") or {})))
    except (ValueError, TypeError) as err:
        raise WarmStartRefused(f"the champion {v}'s config cannot be used by this version ({err})",
                               f"train a {model_name} cold (train.init: cold) and promote it") from None
    ours = dataclasses.asdict(model_config)
    differ = [k for k in sorted(set(ours) | set(theirs))
              if k not in model.warm_free_fields and ours.get(k) != theirs.get(k)]
    if differ:
        what = ", ".join(f"{k}={theirs.get(k)!r} (now {ours.get(k)!r})" for k in differ)
        others = " (and the others)" if len(differ) > 1 else ""
        raise WarmStartRefused(f"the champion {v} has {what}",
                               f"set {model_name}.{differ[0]} back to {theirs.get(differ[0])!r}{others}")
    before = meta.get("init") or {}
    streak = int(before.get("warm_streak", 0)) if before.get("mode") == "warm" else 0
    old_ids = {"items": list(meta["items"]), "users": list(meta["users"])}
    if cfg.init == "auto":
        every = cfg.warm_cold_every
        if every and streak + 1 >= every:
            if source.cold_tried:  # tried cold on an earlier batch and lost: warm again, counted afresh
                streak = 0
            else:
                raise WarmStartRefused(
                    f"the champion {v} ends a line of {streak} warm start(s) and train.warm_cold_every = "
                    f"{every} trains every {every}th version cold",
                    "lower it or set train.warm_cold_every to 0",
                    {COLD_TRY_OF: {"version": source.version, "artifact_sha256": source.artifact_sha256}})
        known = set(old_ids["items"][1:])
        new = sum(1 for item in ids["items"][1:] if item not in known)
        growth = new / max(len(known), 1)
        if growth > cfg.warm_max_catalogue_growth:
            raise WarmStartRefused(
                f"the catalogue grew by {new} items, {growth:.1%} of the champion {v}'s {len(known)}, more "
                f"than train.warm_max_catalogue_growth = {cfg.warm_max_catalogue_growth:g}",
                "raise train.warm_max_catalogue_growth")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(checkpoint / "model.safetensors"))  # tensors only: nothing is unpickled
    except (OSError, SafetensorError) as err:
        raise CheckpointError(f"{checkpoint}: cannot read the champion's weights ({err})") from err
    counts, fresh = transfer(model, state, old_ids, ids, keep=cfg.warm_keep)
    until = meta.get("train_until")  # the newest event its weights have seen, carried on (held_out.weights_until)
    return {"requested": cfg.init, "mode": "warm", "from_version": source.version,
            "from_sha256": source.artifact_sha256, "warm_streak": streak + 1, **counts, "fresh": fresh,
            **({"keep": cfg.warm_keep} if cfg.warm_keep != 1.0 else {}),
            **({"from_train_until": until} if isinstance(until, (int, float)) else {})}


def _split_changes(recorded: Any, split: dict[str, Any] | None) -> str | None:
    """How the champion's recorded prepare settings differ from today's (`recsys.lineage.split_changes`)."""
    if not isinstance(split, dict):
        return None
    try:
        today = PrepareConfig(**split)
    except (TypeError, ValueError):  # prepared by another recsys version: `recsys warm` checked the source
        return None
    return split_changes(recorded, today)


def transfer(model: SequentialModel, champion: dict[str, torch.Tensor], old_ids: dict[str, list],
             new_ids: dict[str, list], keep: float = 1.0) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Load `champion`'s tensors into `model` (see the module docstring). `old_ids` / `new_ids` give, per
    kind ("items", "users"), the raw id of each row ([None, id1, id2, ...]). A parameter carried over becomes
    `keep` × the champion's + (1 − `keep`) × the model's own fresh value (train.warm_keep; buffers are copied
    as they are). Returns the per-kind counts of ids kept, new and dropped, and the names of the tensors
    left fresh."""
    import torch

    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    parameters = {name for name, _ in model.named_parameters()}

    def carried(name: str, theirs: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
        return theirs if keep == 1.0 or name not in parameters else keep * theirs + (1.0 - keep) * ours
    kinds = sorted(set(model.id_rows.values()))
    counts: dict[str, dict[str, int]] = {}
    rows = {}
    for kind in kinds:
        where = {raw: i for i, raw in enumerate(old_ids[kind]) if i > 0}
        pairs = [(j, where[raw]) for j, raw in enumerate(new_ids[kind]) if j > 0 and raw in where]
        kept = len(pairs)
        counts[kind] = {"kept": kept, "new": len(new_ids[kind]) - 1 - kept,
                        "dropped": len(old_ids[kind]) - 1 - kept}
        rows[kind] = (torch.tensor([j for j, _ in pairs], dtype=torch.long),
                      torch.tensor([i for _, i in pairs], dtype=torch.long))
    fresh = []
    for name, ours in state.items():
        theirs = champion.get(name)
        if theirs is not None:  # the champion loads on the CPU; the model may be on a GPU
            theirs = theirs.to(ours.device, ours.dtype)
        kind = model.id_rows.get(name)
        if kind is None:
            if theirs is None or theirs.shape != ours.shape:
                fresh.append(name)
            else:
                ours.copy_(carried(name, theirs, ours))
            continue
        n_new, n_old = len(new_ids[kind]), len(old_ids[kind])
        if theirs is None or theirs.dim() != ours.dim() or theirs.shape[1:] != ours.shape[1:] or (
                ours.shape[0] - n_new != theirs.shape[0] - n_old or ours.shape[0] < n_new):
            shape = None if theirs is None else tuple(theirs.shape)
            raise WarmStartRefused(f"the champion's {name} has shape {shape} for {n_old - 1} {kind}, not one "
                                   f"matching {tuple(ours.shape)} for {n_new - 1}", "train it cold once")
        special = ours.shape[0] - n_new  # rows after the last id ([mask]) stay in place
        ours[0] = carried(name, theirs[0], ours[0])  # padding / unknown
        new_rows, old_rows = (r.to(ours.device) for r in rows[kind])
        ours[new_rows] = carried(name, theirs[old_rows], ours[new_rows])
        if special:
            ours[-special:] = carried(name, theirs[-special:], ours[-special:])
    model.load_state_dict(state, strict=True)
    return counts, fresh
