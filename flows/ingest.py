"""Ingest flow: every file in the inbox → Great Expectations validation → exactly-once append → `dvc add`.

    python -m flows.ingest

Bad batches never reach the store: they are rejected whole (moved to `inbox/rejected/` with a report) or
their bad rows quarantined; ingested and already-ingested batches move to `inbox/processed/` (as with
`recsys ingest`). A run is finished only when the DVC remote holds the data: it first completes what an
interrupted run left (commit, push), and fails if the push fails. A run that rejected a batch deals with
every other one first, then fails (not retried: the same bytes are rejected again) with `recsys ingest`'s
line naming each rejected file and its report. The validation summary of each batch is published as a
Prefect artifact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.states import State

from flows.artifacts import publish_ingest
from flows.errors import add_verbose_flag, quiet_console, retry_if_transient, run_main
from recsys.bootstrap import PRESENT, ensure_raw_store
from recsys.config import ConfigError, IngestConfig, load_params, workspace_root
from recsys.entry import ArgumentParser, is_transient
from recsys.ingest.errors import BatchesRejected, rejection
from recsys.ingest.layout import NOTHING_TO_INGEST, REJECTED, check_inbox, has_work
from recsys.ingest.layout import paths as ingest_paths
from recsys.layout import Layout

ROOT = Path(".")  # flows run from the repository root (deployments set it in their pull step)


@task(name="bootstrap", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_if_transient)
def bootstrap(repo_root: str) -> str:
    """The raw store exists (pulled, or generated on a fresh clone where nothing was ever ingested), and what
    a killed ingest or bootstrap left undone (its commit, its push) is finished (`ensure_raw_store`), before
    batches are appended to the store or `dvc repro` reads it (inside `dvc repro`, `prepare` cannot `dvc add`
    it). The ingest and retrain flows' first step; it logs what it did unless the store was simply there."""
    done = ensure_raw_store(Path(repo_root))
    if done != PRESENT:
        get_run_logger().info("%s", done)
    return done


def ingest_config(repo_root: str, inbox: str | None) -> IngestConfig:
    """params.yaml's ingest section, with `inbox` (relative to the repository, or absolute) in place of
    ingest.inbox when given. A given inbox must be an existing folder: a typo would otherwise be an
    empty inbox and a run that says "nothing to ingest". Neither may be the repository or a folder the
    system owns (`check_inbox`)."""
    config = load_params(Layout(workspace_root(repo_root)).params).ingest
    if inbox is None:
        check_inbox(ingest_paths(repo_root, config), config)
        return config
    if not inbox.strip():
        raise ConfigError("inbox is empty: leave it unset for params.yaml's ingest.inbox, or name a folder")
    if not (Path(repo_root) / inbox).is_dir():
        raise ConfigError(f"inbox {inbox} is not a folder (relative paths are read from the repository "
                          f"{Path(repo_root).resolve()}); create it or correct --inbox / the flow's inbox")
    given = dataclasses.replace(config, inbox=inbox)
    check_inbox(ingest_paths(repo_root, given), config)
    return given


def has_batches_or_unfinished_work(repo_root: str, config: IngestConfig) -> bool:
    """`recsys.ingest.layout.has_work` for this repository and inbox: a few stats, before any ingest code loads."""
    return has_work(ingest_paths(repo_root, config), config)


# A transient failure (an unreachable remote, DVC's lock held by another `dvc` command) is retried inside the
# task, not by Prefect's task retries: the batches an attempt dealt with have left the inbox, and a retry by
# Prefect would return only its own (an attempt that rejected a batch, then failed to push, would end in a
# run that says nothing was rejected). Each attempt first completes what the one before left (commit, push).
INGEST_ATTEMPTS = 3
INGEST_RETRY_DELAY_S = 5.0


@task(name="ingest-inbox")
def ingest_inbox_task(repo_root: str, config: IngestConfig) -> dict[str, Any]:
    """Recovery, every batch in the inbox, then the push, retried while the failure is transient; every
    attempt's batches are in the result (or, when the last attempt fails, in its exception's `run`)."""
    from recsys.ingest import IngestRun, ingest_inbox

    done = IngestRun()
    for attempt in range(1, INGEST_ATTEMPTS + 1):
        try:
            run = ingest_inbox(Path(repo_root), config)
        except Exception as err:  # an IngestError, or e.g. an OSError (a full disk) after some batches
            _add(done, getattr(err, "run", None))
            if attempt == INGEST_ATTEMPTS or not is_transient(err):
                if done or done.actions:
                    with contextlib.suppress(AttributeError):
                        err.run = done  # type: ignore[attr-defined]
                raise
            get_run_logger().warning("ingest attempt %d of %d failed: %s; retrying in %.0f s", attempt,
                                     INGEST_ATTEMPTS, err, INGEST_RETRY_DELAY_S)
            time.sleep(INGEST_RETRY_DELAY_S)
        else:
            _add(done, run)
            break
    return ingest_result(done)


def _add(done: Any, run: Any) -> None:
    """Append one attempt's `IngestRun` (None: it failed before any batch) to the task's."""
    if run is not None:
        done.extend(run)
        done.actions.extend(run.actions)


def ingest_result(run: Any) -> dict[str, Any]:
    """The task's result (JSON-able) from an `IngestRun`."""
    return {"summaries": [dataclasses.asdict(s) for s in run], "actions": list(run.actions)}


@flow(name="ingest", log_prints=True)
def ingest(inbox: str | None = None, repo_root: str = str(ROOT)) -> dict[str, Any]:
    """Validate and append every batch waiting in the inbox.

    Args:
        inbox: inbox folder (default: params.yaml `ingest.inbox`, relative to the repository); a given one
            must be an existing folder.
        repo_root: the repository (DVC workspace) to ingest into; its params.yaml is read.
    """
    quiet_console()
    config = ingest_config(repo_root, inbox)  # read once; a bad inbox is refused before anything runs
    logger = get_run_logger()
    bootstrap(repo_root)
    failed = None
    if has_batches_or_unfinished_work(repo_root, config):
        state = ingest_inbox_task(repo_root, config, return_state=True)
        if state.is_failed():
            failed = state.result(raise_on_failure=False)
            if getattr(failed, "run", None) is None:  # nothing was dealt with: nothing to report
                raise failed
            done = ingest_result(failed.run)  # report the batches dealt with, then fail with the error
        else:
            done = state.result()
    else:  # the nightly run when nothing arrived: skip loading the ingest code (pandas, GX) and its task
        logger.info(NOTHING_TO_INGEST)
        done = {"summaries": [], "actions": []}
    for action in done["actions"]:
        logger.info("%s", action)
    for s in done["summaries"]:
        if s["status"] != "rejected":  # the rejected ones: in the run's failure
            logger.info("%s: %s", s["source"], s["message"])
    publish_ingest(done["summaries"])
    summary = summarise(done)
    rejected = rejection(done["summaries"], ingest_paths(repo_root, config).inbox / REJECTED)
    if failed is not None:  # a push that kept failing (or a failure after some batches): the run's error,
        if rejected:        # with the rejected batches said first
            logger.error("%s", rejected)
        raise failed
    if rejected:  # every batch is dealt with (the accepted ones ingested and pushed): the run fails, once
        raise BatchesRejected(rejected, result=summary)
    return summary


def ingest_outcome(state: State) -> tuple[dict[str, Any], BatchesRejected | None]:
    """The ingest flow's summary from its final state, and its `BatchesRejected` when it rejected batches, for
    a caller that goes on with the accepted data and fails at its end (the pipeline); any other failure is
    raised here."""
    if state.is_failed():
        failure = state.result(raise_on_failure=False)
        if isinstance(failure, BatchesRejected):
            return failure.result, failure
    return state.result(), None


def summarise(done: dict[str, Any]) -> dict[str, Any]:
    """The ingest flow's result from the task's (or an empty) list of batch summaries and actions."""
    summaries = done["summaries"]
    versions = [s["data_version"] for s in summaries if s.get("data_version")]
    return {
        "batches": len(summaries),
        "ingested": sum(s["status"] == "ingested" for s in summaries),
        "rejected": sum(s["status"] == "rejected" for s in summaries),
        "duplicates": sum(s["status"] == "duplicate_batch" for s in summaries),
        "rows_accepted": sum(s["rows_accepted"] for s in summaries),
        "data_version": versions[-1] if versions else None,
        "actions": done["actions"],
        "summaries": summaries,
    }


def main(argv: list[str] | None = None) -> None:
    parser = add_verbose_flag(ArgumentParser("flows.ingest", description="run the ingest flow"))
    parser.add_argument("--inbox", help="inbox folder (default: params.yaml ingest.inbox)")
    parser.add_argument("--repo-root", default=str(ROOT),
                        help="the repository to work in: params.yaml, dvc.yaml, data/ (default: the current folder)")
    args = parser.parse_args(argv)

    def run() -> dict[str, Any]:
        try:
            summary = ingest(inbox=args.inbox, repo_root=args.repo_root)
        except BatchesRejected as rejected:  # what was done, then its one line (run_main)
            print(json.dumps(rejected.result, indent=2, default=str))
            raise
        print(json.dumps(summary, indent=2, default=str))
        return summary

    run_main(run, args.verbose, precheck=lambda: ingest_config(args.repo_root, args.inbox))


if __name__ == "__main__":
    main()
