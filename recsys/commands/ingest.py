"""`recsys ingest PATH...` — validate interaction batches and append them to the DVC-versioned store."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from recsys.config import DEFAULT_PARAMS, ConfigError, IngestConfig, build_dataclass, params_root, read_params

app = typer.Typer(add_completion=False)  # this one command; recsys/cli.py registers it as `recsys ingest`


def load_ingest_config(params: Path) -> IngestConfig:
    """Only the `ingest` section: ingest must not need torch or the model registry to start."""
    raw = read_params(params) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{params} must be a mapping of sections")
    return build_dataclass(IngestConfig, raw.get("ingest"), "ingest")


@app.command(context_settings={"allow_interspersed_args": True})
def ingest(
    paths: Annotated[
        Optional[list[str]],
        typer.Argument(help="Batch files (CSV, Parquet, JSON lines) in the inbox; none, or the inbox itself: "
                            "every file in it."),
    ] = None,
    params: Annotated[Path, typer.Option(help="params.yaml; its folder is the repo root.")] = DEFAULT_PARAMS,
) -> None:
    """Ingest each batch exactly once and move it to inbox/processed/ (or inbox/rejected/), as the ingest
    flow does; print what happened. Exit code 1 if any batch was rejected (the others are ingested, and one
    `error:` line names each rejected batch and its report) or the push did not finish."""
    if any(not path.strip() for path in paths or []):  # Path("") is the current folder: "outside the inbox"
        raise typer.BadParameter("empty: name a batch file in the inbox (or none: every file in it)",
                                 param_hint="'PATHS...'")
    batches = [Path(path) for path in paths or []]
    from recsys.ingest.errors import rejection
    from recsys.ingest.layout import NOTHING_TO_INGEST, REJECTED, check_inbox, has_work
    from recsys.ingest.layout import paths as ingest_paths

    root = params_root(params)
    try:
        config = load_ingest_config(params)
        # the repository root is no inbox, nor the registry where this params file puts it
        where = check_inbox(ingest_paths(root, config, params=params), config)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    if not batches and not has_work(where, config):  # a few stats: no ingest code, no key index
        typer.echo(NOTHING_TO_INGEST)
        return
    # GX import is slow; keep --help and the empty run fast
    from recsys.ingest import IngestError, ingest_batches, ingest_inbox

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_error = None
    try:
        run = (ingest_batches(batches, root, config, move=True, params=params) if batches
               else ingest_inbox(root, config, params))
    except Exception as err:  # an IngestError, or e.g. an OSError (a full disk) after some batches
        if getattr(err, "run", None) is None:  # refused or failed before any batch was dealt with
            if not isinstance(err, (IngestError, ConfigError)):
                raise  # the entry point's one line (or traceback, where asked for)
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
        run, run_error = err.run, str(err)  # a failed push, or a failure after some batches: say those first
    # Before the batches: a recovered commit (whose batch then says "already ingested"), a push a killed run
    # left undone.
    for action in run.actions[:run.done_first]:
        typer.echo(action)
    for summary in run:
        if summary.status != "rejected":  # the rejected ones: in the last line
            typer.echo(f"{summary.source}: {summary.message}")
            if summary.quarantine_file:
                typer.echo(f"  quarantined rows: {summary.quarantine_file}")
    for action in run.actions[run.done_first:]:
        typer.echo(action)
    if not run and not run.actions and run_error is None:  # an empty inbox (not a first batch that failed)
        typer.echo(NOTHING_TO_INGEST)
    rejected = rejection([dataclasses.asdict(s) for s in run], where.inbox / REJECTED)
    failures = [failure for failure in (run_error, rejected) if failure]
    if failures:
        typer.echo(f"error: {'; also '.join(failures)}", err=True)
        raise typer.Exit(1)
