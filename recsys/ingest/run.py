"""Running ingest: under the workspace lock, recover, finish a pending push, ingest each batch file in
turn, file it away, and push. What the CLI (`recsys ingest`) and the flow (`flows/ingest.py`) both call."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from recsys import validation
from recsys.config import IngestConfig
from recsys.ingest.commit import commit
from recsys.ingest.errors import BatchRejected, IngestError
from recsys.ingest.keys import KeyIndex, open_index
from recsys.ingest.layout import (
    PROCESSED,
    REJECTED,
    Paths,
    check_inbox,
    check_inside_inbox,
    file_sha256,
    inbox_files,
    named_batches,
)
from recsys.ingest.layout import paths as ingest_paths
from recsys.ingest.plan import plan
from recsys.ingest.recovery import complete_push, recover_commits
from recsys.ingest.report import IngestSummary, iso, rejected
from recsys.workspace import workspace_lock

log = logging.getLogger(__name__)


class IngestRun(list):
    """The batch summaries of one run, in order, plus `actions`: what the run did first or last that
    was not about one batch (recovered an interrupted commit, completed or made a push); the first
    `done_first` of them came before any batch."""

    def __init__(self, summaries: Iterable[IngestSummary] = (), actions: Iterable[str] = ()):
        super().__init__(summaries)
        self.actions = list(actions)
        self.done_first = len(self.actions)


class PushFailed(IngestError):
    """The batches are committed locally but the DVC remote does not have them yet. Transient unless DVC has
    no usable remote: an unreachable one comes back, and a retry pushes first (the flows retry it)."""

    def __init__(self, message: str, run: IngestRun, transient: bool = True):
        super().__init__(message, transient)
        self.run = run

    def __reduce__(self):  # type: ignore[no-untyped-def]  # Prefect keeps a failed task's exception: copyable
        return (PushFailed, (str(self), self.run, self.transient))


def ingest_batches(
    paths: Sequence[str | Path],
    repo_root: str | Path,
    config: IngestConfig,
    inbox: str | Path | None = None,
    move: bool = False,
    params: str | Path | None = None,
) -> IngestRun:
    """Ingest each file in turn; naming the inbox itself means every file in it. A bad batch gives a
    `rejected` summary (with a report) and changes nothing; `IngestError` is raised when ingest itself cannot
    run (DVC, configuration), when a path is no batch file in the inbox (`named_batches`) or when the push
    failed (`PushFailed`, which carries the run), `ConfigError` for an inbox that is no inbox (`check_inbox`):
    both refusals before anything is locked. With `move`, each file is then moved to `inbox/processed/`
    (ingested or already ingested) or `inbox/rejected/`, as the flow does. `params`: the params.yaml `config`
    came from, when not the repository's (its registry section is what the inbox may not hold)."""
    where = check_inbox(ingest_paths(repo_root, config, inbox, params), config)
    return _run(where, config, named_batches(paths, where), move)


def ingest_inbox(repo_root: str | Path, config: IngestConfig, params: str | Path | None = None) -> IngestRun:
    """Ingest every file now in the inbox (sorted by name) and move it to `processed/` or `rejected/`."""
    return _run(check_inbox(ingest_paths(repo_root, config, params=params), config), config, None, move=True)


def _run(where: Paths, config: IngestConfig, files: list[Path] | None, move: bool) -> IngestRun:
    with workspace_lock(where.root), open_index(where.state) as index:
        run = IngestRun(actions=recover_commits(where, index))
        indexed = index.sync(where.store)
        if indexed:
            log.info("key index: indexed %d part(s): %s", len(indexed), ", ".join(indexed[:3]))
        push_error = _push(where, config, run, interrupted=True)
        run.done_first = len(run.actions)
        try:
            for path in inbox_files(where) if files is None else files:
                summary, read_as = _ingest_one(path, where, config, index)
                if move:
                    _file_away(path, summary, where, read_as)
                run.append(summary)
        except Exception as err:  # e.g. `dvc add` failing at the third batch: the first two are done
            # ... and pushed before the error goes up: the remote is not left short of the committed batches
            # until some later run (a deterministic failure is not retried). A push that fails too keeps its
            # marker for the next run; the batch's own error is the one to act on first.
            with contextlib.suppress(AttributeError):  # (an exception that takes no attributes: not ours)
                err.run = run  # type: ignore[attr-defined]
            try:
                late: BaseException | None = push_error or _push(where, config, run)
            except Exception as failed:  # (an OSError, a damaged data.dvc): never in place of the batch's error
                late = failed
            if late:
                run.actions.append(f"push not completed: {late}")
            raise
        # An unreachable remote does not stop local ingestion; the run fails at the end, the marker stays.
        push_error = push_error or _push(where, config, run)
        if push_error:
            raise PushFailed(str(push_error), run, push_error.transient)
    for action in run.actions:
        log.debug("ingest: %s", action)  # the caller says it (`run.actions`), once
    return run


def _push(
    where: Paths, config: IngestConfig, run: IngestRun, interrupted: bool = False
) -> IngestError | None:
    """Push if the marker says so; note what was done in `run`, return why it failed (or None)."""
    try:
        pushed = complete_push(where, config, interrupted)
    except IngestError as err:
        return err
    if pushed:
        run.actions.append(pushed)
    return None


def _file_away(path: Path, summary: IngestSummary, where: Paths, read_as: tuple[int, int] | None) -> None:
    """Move a batch out of the inbox once it is dealt with, so the inbox holds only what is new; a file of
    the same name already there with other bytes is kept (the batch's name gets its sha256's first 12
    hex digits)."""
    if summary.batch_sha256 is None:  # refused before reading (outside the inbox, missing): not ours to move
        return
    target = where.inbox / (REJECTED if summary.status == "rejected" else PROCESSED)
    if path.resolve().parent == target:
        return
    if _identity(path) != read_as:
        # Written to since it was read (`read_as`: its size and mtime then): its committed rows are stored;
        # the next run reads the whole file again, and the rows stored now are duplicates it skips.
        log.warning("%s changed after it was ingested (still being written?): left in the inbox for the next "
                    "run; %s", path.name, WHOLE_FILES)
        return
    target.mkdir(exist_ok=True)
    destination = target / path.name
    if destination.exists() and file_sha256(destination) != summary.batch_sha256:
        # Another batch that had this name: keep both (batch names repeat, e.g. a daily `export.csv`).
        destination = target / f"{path.stem}-{summary.batch_sha256[:12]}{path.suffix}"
    os.replace(path, destination)


def _ingest_one(path: Path, where: Paths, config: IngestConfig,
                index: KeyIndex) -> tuple[IngestSummary, tuple[int, int] | None]:
    """The batch's summary, and its size and mtime when it was read (None when refused before reading)."""
    started = time.time()
    try:
        resolved = check_inside_inbox(path, where.inbox)
    except BatchRejected as rejection:
        return rejected(None, path.name, str(rejection), None, None), None
    settled = _identity(resolved)
    sha = file_sha256(resolved)
    record = index.batch_record(where.manifest, sha)
    if record is not None:
        return _already_ingested(path.name, sha, record), settled
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", resolved.stem)[:64]
    report_json = where.reports / f"{stem}-{sha[:16]}.json"
    report_md = where.reports / f"{stem}-{sha[:16]}.md"
    base = {"source": path.name, "batch_sha256": sha, "started_at": iso(started)}
    try:
        planned = plan(resolved, where, config, index)
    except BatchRejected as rejection:
        summary = rejected(sha, path.name, str(rejection), report_json, report_md, rejection.details)
        report = {
            **base,
            "status": "rejected",
            "message": summary.message,  # the report says what the summary says
            **rejection.details,
            "validations": [v.to_dict() for v in rejection.validations],
        }
        validation.write_report(report, report_json, report_md)
        log.debug("rejected %s: %s", path.name, summary.message)  # the caller says it, once
        return summary, settled
    if _identity(resolved) != settled:  # still being written: nothing committed, and it stays where it is
        return rejected(None, path.name, f"{path.name} changed while it was read (still being written?); it "
                        f"stays in the inbox for the next run: {WHOLE_FILES}", None, None), None
    return commit(sha, path.name, planned, where, config, report_json, report_md, base, index), settled


# How a producer hands a batch over, so that no run ever reads half of it.
WHOLE_FILES = ("write a batch elsewhere (or under a name starting with '.'), then move it into the inbox in "
               "one step (mv)")


def _identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _already_ingested(source: str, sha: str, record: dict) -> IngestSummary:
    # The caller prints the file name; the message names the original only when it was another file.
    origin = f" from {record['source']}" if record["source"] != source else ""
    part = record.get("part_file") or "no new rows"
    message = (
        f"already ingested{origin} as {part} on {record.get('ingested_at', '?')[:10]} "
        f"(data version {record.get('data_version')}); nothing to do"
    )
    return IngestSummary(
        sha, source, "duplicate_batch", record["rows_in"], 0, 0, 0, record.get("part_file"),
        record.get("data_version"), None, None, message,
    )
