"""Ingest flow: every file in the inbox → Great Expectations validation → exactly-once append → `dvc add`.

    python -m flows.ingest

Bad batches never reach the store: they are rejected whole (moved to `inbox/rejected/` with a report) or
their bad rows quarantined; ingested and already-ingested batches move to `inbox/processed/` (as with
`recsys ingest`). A run is finished only when the DVC remote holds the data: it first completes what an
interrupted run left (commit, push), and fails if the push fails. The validation summary of each batch is
published as a Prefect artifact.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from recsys.config import load_params

ROOT = Path(".")  # flows run from the repository root (deployments set it in their pull step)


@task(name="ingest-inbox", retries=2, retry_delay_seconds=5)
def ingest_inbox_task(repo_root: str, params_file: str, inbox: str | None) -> dict[str, Any]:
    """Recovery, every batch in the inbox, then the push; a failed push fails the task (and a retry, or the
    next run, pushes first)."""
    from recsys.ingest import ingest_inbox

    config = load_params(Path(repo_root) / params_file).ingest
    if inbox:
        config = dataclasses.replace(config, inbox=inbox)
    run = ingest_inbox(Path(repo_root), config)
    return {"summaries": [dataclasses.asdict(s) for s in run], "actions": run.actions}


def publish(summaries: list[dict[str, Any]]) -> None:
    if not summaries:
        create_markdown_artifact("# Ingest\n\nThe inbox was empty: nothing to validate.", key="validation-summary",
                                 description="Great Expectations validation of each batch")
        return
    create_table_artifact(
        [{k: s.get(k) for k in ("source", "status", "rows_in", "rows_accepted", "rows_quarantined",
                                "rows_duplicate", "data_version")} for s in summaries],
        key="ingest-batches", description="Batches ingested in this run",
    )
    parts = ["# Ingest: validation summary", ""]
    for s in summaries:
        parts += [f"## {s['source']}: {s['status']}", "", s["message"], ""]
        report = s.get("report_markdown")
        if report and Path(report).is_file():
            parts += [Path(report).read_text(encoding="utf-8"), ""]
    create_markdown_artifact("\n".join(parts), key="validation-summary",
                             description="Great Expectations validation of each batch")


@flow(name="ingest", log_prints=True)
def ingest(inbox: str | None = None, repo_root: str = str(ROOT), params_file: str = "params.yaml") -> dict[str, Any]:
    """Validate and append every batch waiting in the inbox.

    Args:
        inbox: inbox folder (default: params.yaml `ingest.inbox`, relative to the repository).
        repo_root: the repository (DVC workspace) to ingest into.
        params_file: params file name inside the repository.
    """
    logger = get_run_logger()
    done = ingest_inbox_task(repo_root, params_file, inbox)
    summaries = done["summaries"]
    for action in done["actions"]:
        logger.info("%s", action)
    for s in summaries:
        (logger.warning if s["status"] == "rejected" else logger.info)("%s: %s", s["source"], s["message"])
    publish(summaries)
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


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description="run the ingest flow")
    parser.add_argument("--inbox")
    parser.add_argument("--repo-root", default=str(ROOT))
    args = parser.parse_args()
    print(json.dumps(ingest(inbox=args.inbox, repo_root=args.repo_root), indent=2, default=str))
