"""Errors a user can fix (bad config, bad input, missing files): one clear line, exit 1, no traceback."""

from __future__ import annotations

import logging
import sys
from typing import Callable

_USER_ERRORS = [
    ("recsys.config", "ConfigError"), ("recsys.data", "DataError"), ("recsys.prepare", "PrepareError"),
    ("recsys.checkpoint", "CheckpointError"), ("recsys.ingest", "IngestError"),
    ("recsys.registry", "RegistryError"), ("recsys.workspace", "DvcError"),
]


def user_errors() -> tuple[type[BaseException], ...]:
    """The user-error classes of the modules loaded so far (a module never imported raised nothing), so
    checking costs no imports."""
    errors: list[type[BaseException]] = [FileNotFoundError]
    for module, name in _USER_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None:
            errors.append(cls)
    return tuple(errors)


def run_entry(main: Callable[[], None]) -> None:
    """Run a stage's `main()` (what `dvc repro` calls) with logging set up and user errors reported plainly."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        main()
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
