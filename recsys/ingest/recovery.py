"""Recovery: finish or roll back what a crash interrupted, before anything reads or writes the store.

`recover` is the one function every entry point that reads the store calls first (the `prepare` stage,
hence `dvc repro` and the retrain flow; the ingest CLI and flow through `run`). It empties the scratch
folder and completes (part on disk) or rolls back (part never written) each commit whose journal is still
in `.ingest/pending/`, so no reader ever sees a part without its manifest record. `complete_push` finishes a
push that a crash or an unreachable remote left undone; only ingest and bootstrap runs push (a reader needs no
remote), each first finishing what a killed one left (`finish_interrupted`).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from recsys import store as raw_store
from recsys.atomic import fsync_dir, remove_if_there
from recsys.config import IngestConfig
from recsys.ingest.commit import finish_commit, mark_push_pending, record_commit
from recsys.ingest.dvc import data_version, dvc_enabled, dvc_push, store_recorded
from recsys.ingest.errors import IngestError
from recsys.ingest.keys import KeyIndex
from recsys.ingest.layout import Paths, paths, push_owed
from recsys.ingest.manifest import read_manifest, repair_manifest
from recsys.ingest.report import write_final_report
from recsys.faults import fault_point
from recsys.workspace import inside_dvc_stage, workspace_lock

log = logging.getLogger(__name__)


def recover(repo_root: str | Path, config: IngestConfig | None = None) -> list[str]:
    """Finish or roll back commits interrupted by a crash; returns what was done (empty when nothing was).

    Takes the workspace lock, so it also waits for an ingest in progress; a process started by a lock
    holder (`dvc repro` inside the retrain flow) shares its parent's lock.
    """
    where = paths(repo_root, config or IngestConfig())
    with workspace_lock(where.root):
        actions = recover_locked(where)
    for action in actions:  # a reader (`prepare`) says nothing else about it
        log.warning("recovery: %s", action)
    return actions


def recover_locked(paths: Paths, index: KeyIndex | None = None) -> list[str]:
    """`recover` for a caller that holds the workspace lock and says what was done itself (an ingest run)."""
    actions = []
    clear_scratch(paths)
    repair_manifest(paths.manifest)
    if not paths.pending.is_dir():
        return actions
    journals = sorted(paths.pending.glob("*.json"))
    if not journals:
        return actions
    recorded = _recorded(paths, index)
    for journal in journals:
        entry = json.loads(journal.read_text(encoding="utf-8"))
        record, part = entry["record"], entry["record"]["part_file"]
        sha = record["batch_sha256"]
        part_path = paths.store / raw_store.INTERACTIONS_DIR / part if part else None
        quarantine = entry["report"].get("quarantine_file")
        known = recorded(sha)
        if known is not None:
            write_final_report(entry, known["data_version"])
            action = f"batch {sha[:16]} was already recorded; cleared its journal"
        elif not _written_before_the_crash(part_path, quarantine):
            if quarantine:
                remove_if_there(Path(quarantine))
            action = f"batch {sha[:16]} ({record['source']}) crashed before its part was written; rolled back"
        else:
            record = _complete(paths, entry, index)
            action = f"batch {sha[:16]} ({record['source']}) was written but not recorded; completed it"
        journal.unlink()
        fsync_dir(paths.pending)
        actions.append(action)
    return actions


def _recorded(paths: Paths, index: KeyIndex | None) -> Callable[[str], dict | None]:
    """sha → the manifest's record of that batch, or None: through the key index an ingest run holds (a look
    up), else by one read of the manifest (a reader's recovery, which opens no index)."""
    if index is not None:
        return lambda sha: index.batch_record(paths.manifest, sha)
    records = {r["batch_sha256"]: r for r in read_manifest(paths.manifest)}
    return records.get


def _written_before_the_crash(part: Path | None, quarantine: str | None) -> bool:
    """Whether a journal's files were all written (the commit writes the quarantine file, then the part):
    a batch without a part (its good rows all duplicates) is complete only once its quarantine file is —
    recording it without would point its report at a file that does not exist, and lose those rows."""
    if part is not None:
        return part.exists()
    return quarantine is None or Path(quarantine).exists()


def _complete(paths: Paths, entry: dict, index: KeyIndex | None) -> dict:
    """`finish_commit` a journal whose part is on disk. Inside a stage of `dvc repro`, which holds the store
    locked (a `dvc add` of it can only fail), only the record: when data.dvc already records the store as it
    is — `dvc repro` saves a changed data source (`data.dvc`) before it runs a stage — the manifest line,
    under the version DVC wrote; else a refusal that names the command that completes it. Raises
    `IngestError`, before anything reads the store."""
    record = entry["record"]
    where = f"batch {record['batch_sha256'][:16]} ({record['source']}) was written but not recorded"
    if record["part_file"] and inside_dvc_stage():
        if not store_recorded(paths):
            raise IngestError(f"{where}, and a stage of `dvc repro` cannot record it (DVC holds the store "
                              "locked); run `recsys ingest` (it completes interrupted commits), then "
                              "`dvc repro`")
        return record_commit(paths, entry, {**record, "data_version": data_version(paths)}, index)
    try:
        return finish_commit(paths, entry, index)
    except IngestError as err:  # `dvc add` failed: stop before any read
        raise IngestError(
            f"{where}, and completing it failed ({err}); run `recsys ingest` (it completes interrupted "
            "commits), then retry",
            transient=err.transient,  # DVC's lock held: a retry may pass
        ) from err


def recover_commits(paths: Paths, index: KeyIndex | None = None) -> list[str]:
    """`recover_locked`, then the push marker for what it did: a commit completed by recovery may never have
    been pushed (another run's push may have removed the marker its commit wrote)."""
    actions = recover_locked(paths, index)
    if actions:
        mark_push_pending(paths)
    return actions


def finish_interrupted(paths: Paths, config: IngestConfig) -> list[str]:
    """What a killed ingest or bootstrap left undone, for a caller that holds the workspace lock and ingests
    nothing itself (a bootstrap): its commits (`recover_commits`), then its push (`complete_push`), which so
    includes what recovery completed. Returns what was done. A push that fails is said, not raised: the
    store is whole here and a reader (a retrain) needs no remote; the marker stays for the next run."""
    actions = recover_commits(paths)
    try:
        pushed = complete_push(paths, config, interrupted=True)
    except IngestError as err:
        return [*actions, f"push not completed: {err}"]
    return [*actions, pushed] if pushed else actions


def clear_scratch(paths: Paths) -> None:
    """Temp files of an interrupted run: the scratch folder, and `.tmp-*` parts of older versions."""
    shutil.rmtree(paths.scratch, ignore_errors=True)
    raw_store.remove_stale_temp_files(paths.store)


def complete_push(paths: Paths, config: IngestConfig, interrupted: bool = False) -> str | None:
    """Push the store if the push marker says the remote may lack data; returns what was done.

    Raises `IngestError` when the push fails: the data is committed locally, and the marker stays, so
    the next run (or a retry of this one) pushes it.
    """
    if not push_owed(paths, config):  # no marker; or pushes are off here, and the marker waits for a run
        return None                    # that has them on (a staging params file must not forget the push)
    if not dvc_enabled(paths.root):  # no DVC, no remote to be short of
        paths.push_marker.unlink()
        return None
    version = data_version(paths)
    fault_point("before_push")
    failure = dvc_push(paths)
    if failure:
        then = ("once the remote is reachable" if failure.transient else
                "once DVC has a remote it can push to (`dvc remote list`; README, Scaling out)")
        raise IngestError(
            f"the DVC remote does not have data version {version} yet: {failure.message}; the data is "
            f"committed locally — run `recsys ingest` (or `dvc push data.dvc`) again {then}",
            transient=failure.transient,  # an unreachable remote may come back; a missing one will not
        )
    fault_point("after_push")
    if not any(paths.pending.glob("*.json")):  # a commit in progress may add a version yet: the marker stays
        paths.push_marker.unlink()
        fsync_dir(paths.state)
    what = "completed an interrupted push" if interrupted else "pushed"
    return f"{what}: data version {version} is on the DVC remote"
