"""Each model's warm source (`artifacts/warm/<model>/`, recsys/warm.py) resolved from the registry.

Run before `dvc repro` — by the retrain flow, `recsys warm` and `recsys bootstrap` — because the train stage
never opens the registry: what it starts from must be a file DVC can hash. For a model whose `train.init`
is `warm` or `auto` the source is the registry champion when it is a version of that model (its artifact
verified, then copied in), else a note saying why there is none; for `cold` and counting models the note
is a constant, so their stages never re-run because the champion changed.

One rule keeps a run with nothing new from retraining: a champion trained on the current data version does
not replace a source already in place. It usually *is* the model those stages just trained, and starting it
again from itself on the same data would only churn versions; it becomes the source once new data arrives.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

from recsys.checkpoint import CheckpointError
from recsys.config import Params, validate_name
from recsys.layout import Layout
from recsys.model_configs import TRAINABLE
from recsys.retraining import listed_models
from recsys.registry import NotFoundError, VersionInfo, open_registry
from recsys.registry.store import MANIFEST, ArtifactIntegrityError, ArtifactStore, artifact_root
from recsys.warm import (
    SOURCE_FILE, WRITTEN_COLD, WarmSource, parse_source, read_source, source_text, write_none, write_source,
)
from recsys.workspace import data_version, workspace_lock

log = logging.getLogger(__name__)


def resolve_warm_sources(root: Path, params: Params, models: Sequence[str] | None = None) -> list[str]:
    """Write the warm source of each model (default: every model in params.yaml), under the workspace lock.
    Returns one line per model saying what it will start from."""
    root = Path(root)
    names = listed_models(params, models)
    trainable = {m: TRAINABLE.get(m, False) for m in names}
    wanted = [m for m in names if trainable[m] and params.train_config(m).init != "cold"]
    lines = []
    with workspace_lock(root):
        champion = _champion(root, params) if wanted else None
        current = data_version(root)
        for m in names:
            line = _resolve(root, params, m, trainable[m], champion, current)
            log.debug("warm source %s", line)  # (every caller prints the lines it returns)
            lines.append(line)
    return lines


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
                                tuple((str(n), int(z), str(d)) for n, z, d in files))
            if source_text(stored) != shipped:
                raise WarmSourceUnavailable(f"{model}: the artifact of v{source.version} in {store} lists other "
                                            "files than the coordinator's record")
            write_source(warm_dir, source.version, source.artifact_sha256 or "", files, directory)
            line = f"{model}: v{source.version}"
    log.info("warm source %s (from the work order)", line)
    return line


def _champion(root: Path, params: Params) -> tuple[VersionInfo, Path, list] | None:
    """The champion, its verified artifact directory and that directory's manifest listing, or None."""
    with open_registry(params.registry, root, params.gate) as registry:
        try:
            info = registry.champion_info()
        except NotFoundError:
            return None
        return info, *_verified(registry.store, info.artifact_sha256)


def _verified(store: ArtifactStore, sha256: str) -> tuple[Path, list]:
    """A stored artifact's directory, re-hashed (ArtifactIntegrityError if tampered with or missing), and its
    manifest's [name, size, sha256] listing."""
    directory = store.verify(sha256)
    return directory, json.loads((directory / MANIFEST).read_text(encoding="utf-8"))["files"]


def _resolve(root: Path, params: Params, model: str, trainable: bool,
             champion: tuple[VersionInfo, Path, list] | None, current_data: str | None) -> str:
    warm_dir = Layout(root).warm_dir(model)
    mode = params.train_config(model).init
    if not trainable:
        write_none(warm_dir, f"{model} learns by counting, not from weights")
        return f"{model}: cold (a counting model)"
    if mode == "cold":
        write_none(warm_dir, WRITTEN_COLD)
        return f"{model}: cold (train.init is cold)"
    if champion is None:
        write_none(warm_dir, "the registry has no champion yet")
        return f"{model}: none (no champion yet)"
    info, directory, files = champion
    if info.architecture != model:
        write_none(warm_dir, f"the champion is a {info.architecture} model, not {model}")
        return f"{model}: none (the champion v{info.version} is a {info.architecture} model)"
    existing = _existing(warm_dir)
    same_data = info.dataset_version is not None and info.dataset_version == current_data
    if existing is not None and same_data and existing.version != info.version and (
            existing.version is not None or mode == "auto"):
        held = f"v{existing.version}" if existing.version is not None else "none"
        return (f"{model}: {held} kept (the champion v{info.version} was trained on the current data; new "
                "data makes it the warm source)")
    changed = write_source(warm_dir, info.version, info.artifact_sha256, files, directory)
    return f"{model}: v{info.version}" + (" (updated)" if changed else "")


def _existing(warm_dir: Path) -> WarmSource | None:
    """The source in place, unless there is none, it is unreadable, or it was written for `cold`."""
    if not (warm_dir / SOURCE_FILE).is_file():
        return None
    try:
        source = read_source(warm_dir)
    except CheckpointError:
        return None
    return None if source.reason == WRITTEN_COLD else source
