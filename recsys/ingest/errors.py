"""What can go wrong in ingest: the run itself cannot proceed, or one batch is bad."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # validation loads pandas: not for the paths and errors a nothing-new run touches
    from recsys.validation import SuiteResult


class IngestError(Exception):
    """Ingest could not run (environment, DVC, configuration). The message says what and what to do.
    Deterministic unless `transient` says a retry may pass (DVC's lock held, an unreachable remote)."""

    def __init__(self, message: str = "", transient: bool = False):
        super().__init__(message)
        self.transient = transient


class DvcAddFailed(IngestError):
    """`dvc add` of the store failed: transient when DVC's own lock was held (another `dvc` command in this
    workspace), deterministic otherwise (the same add fails the same way)."""


class BatchRejected(IngestError):
    """This batch is bad as a whole; nothing was changed."""

    def __init__(self, message: str, validations: Sequence[SuiteResult] = (), **details: Any):
        super().__init__(message)
        self.validations = list(validations)
        self.details = details
