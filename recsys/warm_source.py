"""Each model's warm source (`artifacts/warm/<model>/`, recsys/warm.py) resolved from the registry.

Run before `dvc repro` — by the retrain flow, `recsys warm` and `recsys bootstrap` — because the train stage
never opens the registry: what it starts from must be a file DVC can hash. For a model whose `train.init`
is `warm` or `auto` the source is a registry champion of that model (below; its artifact verified, then
copied in), else a note saying why there is none; for `cold` and counting models the note is a constant,
so their stages never re-run because the champion changed.

What a model starts from depends on the registry and the data version alone — never on what a workspace held
before — so a fresh clone resolves what the workspace that trained resolved, and DVC's run-cache key for
`train@<model>` is the same on both. The rule: a model starts from *the champion as the current data arrived*
— the last version to become champion (promoted, installed as the baseline or rolled back to) that was not
trained on the current data version. A champion trained on the current data (usually the model those very
stages trained) becomes the source once new data arrives, so a run with nothing new retrains nothing, whatever
family the new champion is. `warm` asks for a start in any case: when the champion as the data arrived was
another model (or there was none), it starts from the first version of its own family that became champion
on the current data, a choice later promotions on the same data do not move either.

A source must have been trained on data split as today's (`prepare`: the k-core thresholds and the split,
recorded in its checkpoint and version): with the same settings a data version that only grows keeps every
event the source trained on in training, but under another split rule today's validation and test events
may be among them — an evaluation that leaks, and a promotion it may decide. Such a champion is passed over
as if it were another family's (a version that recorded no settings, trained before they were, is taken as
it was). Equal settings are not enough under global_time when late-arriving events move the quantile cut
before the source's newest training event; that is known only once today's data is prepared, so the train
stage checks it (recsys/warm.py, `held_out.late_data_leak`).

A source also says whether a cold try in its place (`auto`'s every `warm_cold_every`-th version) already lost
the gate on an earlier data version (`cold_tried`): the registry keeps rejected versions, each with the
cold tries of its run and the sources they stood in for (recsys/promotion.py). On the data that try was
trained on it is not said, so a run with nothing new resolves the bytes it resolved before and retrains
nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from recsys.checkpoint import CheckpointError
from recsys.config import Params, PrepareConfig, validate_name
from recsys.layout import Layout
from recsys.lineage import split_otherwise
from recsys.model_configs import TRAINABLE
from recsys.registry import Registry, VersionInfo, database_errors, open_registry, registry_url
from recsys.registry.store import MANIFEST, ArtifactIntegrityError, ArtifactStore, artifact_root
from recsys.retraining import listed_models
from recsys.warm import (
    COLD_TRIES,
    NO_EARLIER_CHAMPION,
    SOURCE_FILE,
    WRITTEN_COLD,
    WarmSource,
    parse_source,
    source_text,
    write_none,
    write_source,
)
from recsys.workspace import data_version, workspace_lock

log = logging.getLogger(__name__)


def resolve_warm_sources(root: Path, params: Params, models: Sequence[str] | None = None, *,
                         held: bool = False) -> list[str]:
    """Write the warm source of each model (default: every model in params.yaml), under the workspace lock
    (`held`: the caller holds it already — the retrain flow resolves again under the lock its `dvc repro`
    runs in, so that an ingest or a promotion since its first resolution cannot leave the stage training
    today's data from the source chosen for yesterday's). Returns one line per model saying what it will
    start from."""
    root = Path(root)
    names = listed_models(params, models)
    trainable = {m: TRAINABLE.get(m, False) for m in names}
    wanted = [m for m in names if trainable[m] and params.train_config(m).init != "cold"]
    lines = []
    with (contextlib.nullcontext() if held else workspace_lock(root),
          database_errors("cannot resolve the warm sources", registry_url(params.registry)),
          contextlib.ExitStack() as stack):
        registry = stack.enter_context(open_registry(params.registry, root, params.gate)) if wanted else None
        champions = registry.champion_line() if registry is not None else []
        # Every version's record, read once and only when a model has a source to check for a lost cold try
        # (a nothing-new scheduled run with no champion, or only cold models, never reads it).
        versions = functools.cache(registry.list_versions if registry is not None else list)
        current = data_version(root)
        for m in names:
            line = _resolve(root, params, m, trainable[m], registry, champions, versions, current)
            log.debug("warm source %s", line)  # (every caller prints the lines it returns)
            lines.append(line)
    return lines


MOVED_ON = "warm source %s: it moved on since the run resolved it (an ingest or a promotion in between)"


def moved_under_lock(root: Path, params: Params) -> list[str]:
    """Resolve every model's source again, under the workspace lock the caller holds and runs `dvc` in (the
    retrain flow's `reproduce`, the fan-out coordinator before it hands out work orders): an ingest or a
    promotion since the run's first resolution (each takes the lock in between) would otherwise train
    today's data from the source chosen for yesterday's. Returns the lines of the sources that moved
    (log them with `MOVED_ON`)."""
    return [line for line in resolve_warm_sources(root, params, held=True) if line.endswith("(updated)")]


@dataclass(frozen=True)
class Choice:
    """What a model starts from: a version, or the reason recorded for none; `says` is its line."""

    version: VersionInfo | None
    reason: str | None
    says: str


def choose(champions: Sequence[VersionInfo], model: str, mode: str, current_data: str | None,
           prepare: PrepareConfig | None = None) -> Choice:
    """The warm source of `model` under `mode` (warm | auto), from every version that became champion, in
    order (`Registry.champion_line`), the current data version and the current prepare settings (None:
    not compared). Reasons recorded for none name no version numbers, so they stay the same while the
    situation does."""
    if not champions:
        return Choice(None, NO_EARLIER_CHAMPION, f"{model}: none (no champion yet)")
    champion = champions[-1]
    earlier = [i for i, v in enumerate(champions) if not _trained_on(v, current_data)]
    arrived = champions[earlier[-1]] if earlier else None  # the champion as the current data arrived
    later = champions[earlier[-1] + 1:] if earlier else champions  # each trained on the current data
    family = arrived is not None and arrived.architecture == model
    differs = split_otherwise(arrived, prepare) if family else None
    pick = arrived if family and differs is None else None
    if pick is None and mode == "warm":
        pick = next((v for v in later if v.architecture == model and split_otherwise(v, prepare) is None),
                    None)
    ours = champion.architecture == model
    otherwise = split_otherwise(champion, prepare) if ours else None
    when = f"the champion v{champion.version} was trained on the current data" + (
        f" (a {champion.architecture} model)" if not ours else
        f" prepared otherwise ({otherwise})" if otherwise else "; new data makes it the warm source")
    if pick is not None:
        return Choice(pick, None, f"{model}: v{pick.version}" if pick.version == champion.version else
                      f"{model}: v{pick.version} kept ({when})")
    if arrived is None:
        return Choice(None, NO_EARLIER_CHAMPION, f"{model}: none kept ({when})")
    if differs is not None:
        return Choice(None, "the champion as the current data arrived was trained on data prepared "
                            f"otherwise ({differs}): it may have learnt today's validation and test events",
                      f"{model}: none (v{arrived.version} was trained on data prepared otherwise: {differs})")
    reason = f"the champion is a {arrived.architecture} model, not {model}"
    if arrived.version == champion.version:
        return Choice(None, reason, f"{model}: none (the champion v{champion.version} is a "
                                    f"{champion.architecture} model)")
    return Choice(None, reason, f"{model}: none (the champion as the current data arrived, v{arrived.version}, "
                                f"is a {arrived.architecture} model; {when})")


def _trained_on(version: VersionInfo, data: str | None) -> bool:
    return data is not None and version.dataset_version == data


def cold_tried(versions: Sequence[VersionInfo], model: str, source: VersionInfo,
               current_data: str | None) -> bool:
    """Whether a cold try of `model` in place of a warm start from `source` (recsys/warm.py's `cold_try_of`)
    lost: a version the gate rejected, trained on a data version other than the current one, lists it among
    its run's cold tries (`cold_tries`: itself, or a model it beat on validation)."""
    for v in versions:
        if v.status != "rejected" or _trained_on(v, current_data):
            continue
        tries = (v.params or {}).get(COLD_TRIES)
        if isinstance(tries, list) and any(isinstance(t, dict) and t.get("model") == model
                                           and t.get("artifact_sha256") == source.artifact_sha256
                                           for t in tries):
            return True
    return False


class WarmSourceUnavailable(Exception):
    """A fan-out worker cannot reproduce the coordinator's warm source; the message names the setting."""


def materialise_warm_source(root: Path, params: Params, model: str, shipped: str) -> str:
    """On a fan-out worker: make `artifacts/warm/<model>` exactly the coordinator's, from its `source.json`
    text (`shipped`, in the work order) — the named checkpoint is copied from `registry.artifact_root`,
    which must be storage every worker mounts at the same path, and verified against the record. Same
    bytes, so DVC's run-cache key for `train@<model>` is the coordinator's. Everything is checked before
    anything is written. Returns one line, as `resolve_warm_sources` does."""
    root = Path(root)
    warm_dir = Layout(root).warm_dir(validate_name(model, "model name"))
    where = f"the work order's warm source record for {model}"
    try:
        source = parse_source(shipped, warm_dir / SOURCE_FILE)
    except CheckpointError as err:
        raise WarmSourceUnavailable(f"{where} is damaged ({err.__cause__ or err}); the coordinator writes it "
                                    "with `recsys warm`") from err
    if source_text(source) != shipped:
        raise WarmSourceUnavailable(f"{where} is not as this commit writes it (another recsys version on the "
                                    "coordinator?); run both from the same commit")
    with workspace_lock(root):
        if source.version is None:
            write_none(warm_dir, source.reason or "")
            line = f"{model}: none ({source.reason})"
        else:
            store = artifact_root(params.registry.artifact_root, root)
            try:
                directory, files = _verified(ArtifactStore(store), source.artifact_sha256 or "")
            except ArtifactIntegrityError as err:
                raise WarmSourceUnavailable(
                    f"{model} starts from registry v{source.version}, which this worker cannot read ({err}): "
                    f"registry.artifact_root ({params.registry.artifact_root}) must be storage every worker "
                    "mounts at the same absolute path, or set train.init: cold") from err
            stored = WarmSource(source.version, source.artifact_sha256,
                                tuple((str(n), int(z), str(d)) for n, z, d in files),
                                cold_tried=source.cold_tried)
            if source_text(stored) != shipped:
                raise WarmSourceUnavailable(f"{model}: the artifact of v{source.version} in {store} lists other "
                                            "files than the coordinator's record")
            write_source(warm_dir, source.version, source.artifact_sha256 or "", files, directory,
                         cold_tried=source.cold_tried)
            line = f"{model}: v{source.version}"
    log.info("warm source %s (from the work order)", line)
    return line


def _verified(store: ArtifactStore, sha256: str) -> tuple[Path, list]:
    """A stored artifact's directory, re-hashed (ArtifactIntegrityError if tampered with or missing), and its
    manifest's [name, size, sha256] listing."""
    directory = store.verify(sha256)
    return directory, json.loads((directory / MANIFEST).read_text(encoding="utf-8"))["files"]


def _resolve(root: Path, params: Params, model: str, trainable: bool, registry: Registry | None,
             champions: Sequence[VersionInfo], versions: Callable[[], Sequence[VersionInfo]],
             current_data: str | None) -> str:
    warm_dir = Layout(root).warm_dir(model)
    mode = params.train_config(model).init
    if not trainable:
        write_none(warm_dir, f"{model} learns by counting, not from weights")
        return f"{model}: cold (a counting model)"
    if mode == "cold":
        write_none(warm_dir, WRITTEN_COLD)
        return f"{model}: cold (train.init is cold)"
    assert registry is not None
    choice = choose(champions, model, mode, current_data, params.prepare)
    if choice.version is None:
        write_none(warm_dir, choice.reason or "")
        return choice.says
    info = choice.version
    directory, files = _verified(registry.store, info.artifact_sha256)
    tried = cold_tried(versions(), model, info, current_data)
    changed = write_source(warm_dir, info.version, info.artifact_sha256, files, directory, cold_tried=tried)
    said = choice.says + (" (a cold try from it lost the gate)" if tried else "")
    return said + (" (updated)" if changed else "")
