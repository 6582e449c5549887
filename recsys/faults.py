"""Named crash points for the fault-injection tests: `RECSYS_FAULT=<name>` kills the process there.

Kept in a module of its own (no imports beyond the standard library) so that any stage can call it without
making DVC see the workspace or ingest code as that stage's dependency."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

FAULT_ENV = "RECSYS_FAULT"


def fault_point(name: str) -> None:
    """Crash here (no cleanup, like `kill -9`) when RECSYS_FAULT names this point. Used by crash tests."""
    if os.environ.get(FAULT_ENV) == name:
        log.error("injected fault at %s", name)
        os._exit(1)
