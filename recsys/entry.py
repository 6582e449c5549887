"""Entry points: the per-model stage arguments, and errors a user can fix (bad config, bad input, missing
files) reported as one clear line with exit code 1 — no traceback."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
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


def model_stage_args(description: str, argv: list[str] | None = None):
    """`--model NAME [--params params.yaml] [--root .]` → (validated model name, Params, repo root)."""
    from recsys.config import load_params, validate_name

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".")
    args = parser.parse_args(argv)
    return validate_name(args.model, "model name"), load_params(args.params), Path(args.root)
