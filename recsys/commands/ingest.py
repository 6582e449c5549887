"""`recsys ingest PATH...` — validate interaction batches and append them to the DVC-versioned store."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
import yaml

from recsys.config import DEFAULT_PARAMS, ConfigError, IngestConfig, build_dataclass

app = typer.Typer(help=__doc__, add_completion=False, context_settings={"allow_interspersed_args": True})


def load_ingest_config(params: Path) -> IngestConfig:
    """Only the `ingest` section: ingest must not need torch or the model registry to start."""
    try:
        raw = yaml.safe_load(params.read_text(encoding="utf-8")) or {}
    except FileNotFoundError as err:
        raise ConfigError(f"params file not found: {params}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{params} is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{params} must be a mapping of sections")
    return build_dataclass(IngestConfig, raw.get("ingest"), "ingest")


@app.callback(invoke_without_command=True)
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Batch files (CSV, Parquet, JSON lines) in the inbox.")],
    params: Annotated[Path, typer.Option(help="params.yaml; its folder is the repo root.")] = DEFAULT_PARAMS,
) -> None:
    """Ingest each batch exactly once; print what happened. Exit code 1 if any batch was rejected."""
    from recsys.ingest import IngestError, ingest_batches  # GX import is slow; keep --help fast

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_ingest_config(params)
        summaries = ingest_batches(paths, params.resolve().parent, config)
    except (IngestError, ConfigError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    failed = False
    for summary in summaries:
        if summary.status == "rejected":
            failed = True
            typer.echo(f"rejected {summary.source}: {summary.message}", err=True)
            if summary.report_markdown:
                typer.echo(f"  report: {summary.report_markdown}", err=True)
        else:
            typer.echo(f"{summary.source}: {summary.message}")
            if summary.quarantine_file:
                typer.echo(f"  quarantined rows: {summary.quarantine_file}")
    if failed:
        raise typer.Exit(1)
