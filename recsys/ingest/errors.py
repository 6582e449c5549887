"""What can go wrong in ingest: the run itself cannot proceed, one batch is bad, or a run rejected some."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # validation loads pandas: not for the paths and errors a nothing-new run touches
    from recsys.validation import SuiteResult


class IngestError(Exception):
    """Ingest could not run (environment, DVC, configuration). The message says what and what to do.
    Deterministic unless `transient` says a retry may pass (DVC's lock held, an unreachable remote)."""

    def __init__(self, message: str = "", transient: bool = False):
        super().__init__(message)
        self.transient = transient
        # Raised out of a run that had dealt with batches (committed, filed away, rejected) before it failed:
        # that run (`recsys.ingest.run.IngestRun`), for the caller to report: those batches have left the
        # inbox, so a retry or the next run does not see them again.
        self.run: Any = None


class DvcAddFailed(IngestError):
    """`dvc add` of the store failed: transient when DVC's own lock was held (another `dvc` command in this
    workspace), deterministic otherwise (the same add fails the same way)."""


class BatchRejected(IngestError):
    """This batch is bad as a whole; nothing was changed."""

    def __init__(self, message: str, validations: Sequence[SuiteResult] = (), **details: Any):
        super().__init__(message)
        self.validations = list(validations)
        self.details = details


class BatchesRejected(IngestError):
    """A run dealt with every batch and rejected some: how the flows end then (`recsys ingest` prints the same
    line and exits 1), once the accepted batches are in — and, in the pipeline, retrained on. Deterministic:
    the same bytes are rejected again, so never retried. `result` is what the flow would have returned."""

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


def rejection(summaries: Sequence[Mapping[str, Any]], filed_in: Path) -> str | None:
    """The one line for a run's rejected batches — each file, why, where it went and its report — or None when
    none was rejected: the words of `recsys ingest` and the flows alike. (A batch with no report was never
    read — a folder, a link out of the inbox — and stays where it is.)"""
    rejected = [s for s in summaries if s["status"] == "rejected"]
    if not rejected:
        return None
    each = "; ".join(f"{s['source']}: {s['message'].removeprefix('batch rejected: ')}" + (
        f" (moved to {filed_in}/, report: {s['report_markdown']})" if s.get("report_markdown") else "")
        for s in rejected)
    return f"rejected {len(rejected)} of {len(summaries)} batch{'' if len(summaries) == 1 else 'es'}: {each}"
