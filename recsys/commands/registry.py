"""`recsys registry list | show VERSION | history | rollback [--to VERSION] | promote --model NAME`."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, NoReturn

import typer

from recsys.config import DEFAULT_PARAMS, ConfigError, load_params

app = typer.Typer(help="Model registry: versions, the champion, promotion history, rollback.",
                  no_args_is_help=True, pretty_exceptions_enable=False)

ParamsOption = Annotated[
    Path, typer.Option("--params", help="params.yaml; relative registry paths are resolved next to it.")
]


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def expected_errors() -> tuple[type[Exception], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    from recsys.registry import ArtifactError, RegistryError

    return (ConfigError, RegistryError, ArtifactError, SQLAlchemyError, OSError)


@contextmanager
def open_from_params(params_path: Path) -> Iterator:  # type: ignore[type-arg]
    """The registry named in params.yaml; any expected failure becomes a one-line error and exit 1."""
    from recsys.registry import open_registry

    try:
        params = load_params(params_path)
        registry = open_registry(params.registry, Path(params_path).resolve().parent, params.gate)
    except expected_errors() as err:
        fail(str(err))
    try:
        yield registry
    except expected_errors() as err:
        fail(str(err))
    finally:
        registry.close()


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


@app.command("list")
def list_versions(params: ParamsOption = DEFAULT_PARAMS) -> None:
    """All versions, oldest first; `*` marks the champion."""
    with open_from_params(params) as registry:
        versions = registry.list_versions()
        metric = registry.gate.metric
        if not versions:
            typer.echo(f"no versions registered for model {registry.model_name!r}")
            return
        rows = [
            [
                "*" if v.is_champion else "",
                str(v.version),
                v.architecture,
                v.status,
                _fmt(v.metrics.get(metric)),
                (v.eval_fingerprint or "-")[:12],
                v.dataset_version or "-",
                v.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            ]
            for v in versions
        ]
        typer.echo(_table(["", "version", "architecture", "status", metric, "eval set", "dataset",
                           "created"], rows))


@app.command("show")
def show(version: Annotated[int, typer.Argument(help="Version number.")],
         params: ParamsOption = DEFAULT_PARAMS) -> None:
    """Everything recorded about one version."""
    with open_from_params(params) as registry:
        v = registry.get_version(version)
        fields = {
            "version": v.version,
            "champion": v.is_champion,
            "architecture": v.architecture,
            "status": v.status,
            "artifact_uri": v.artifact_uri,
            "artifact_sha256": v.artifact_sha256,
            "dataset_version": v.dataset_version,
            "dataset_fingerprint": v.dataset_fingerprint,
            "code_version": v.code_version,
            "eval_fingerprint": v.eval_fingerprint,
            "created_at": v.created_at.isoformat(),
            "metrics": v.metrics,
            "params": v.params,
        }
        typer.echo(json.dumps(fields, indent=2, sort_keys=False))


@app.command("history")
def history(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show the last N events.")] = 50,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Promotion decisions and rollbacks, oldest first, each with its reason."""
    with open_from_params(params) as registry:
        events = registry.history(limit)
        if not events:
            typer.echo("no promotion events yet")
            return
        rows = [
            [
                str(e.id),
                e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                e.decision,
                f"v{e.candidate_version}",
                f"v{e.baseline_version}" if e.baseline_version is not None else (e.baseline_kind or "-"),
                _fmt(e.candidate_metric),
                _fmt(e.baseline_metric),
                "-" if e.delta is None else f"{e.delta:+.4f}",
                _fmt_p(e.p_value),
                e.reason,
            ]
            for e in events
        ]
        metric = events[-1].metric
        typer.echo(_table(["#", "time", "decision", "candidate", "baseline", metric, "baseline " + metric,
                           "delta", "p", "reason"], rows))


@app.command("rollback")
def rollback(
    to: Annotated[
        int | None, typer.Option("--to", help="Version to make champion (a former champion).")
    ] = None,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Move the champion back to the previous champion (or to --to VERSION); recorded as an event."""
    with open_from_params(params) as registry:
        event = registry.rollback(to)
        typer.echo(
            f"champion is now v{event.candidate_version} (was v{event.baseline_version}): {event.reason}"
        )


@app.command("promote")
def promote_command(
    model: Annotated[str, typer.Option("--model", help="Model whose checkpoint to register and gate.")],
    baseline: Annotated[
        str, typer.Option("--baseline", help="Model the first champion must beat (no champion yet).")
    ] = "mostpop",
    dataset_version: Annotated[
        str | None, typer.Option("--dataset-version", help="Label stored with the version (e.g. a tag).")
    ] = None,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Register artifacts/models/MODEL and run the gate with the evaluate stage's results; show the decision.

    A refused candidate is a normal outcome (exit 0); the reason is printed and recorded.
    """
    from recsys.config import validate_name
    from recsys.registry import promote, read_eval_outputs

    try:
        loaded = load_params(params)
        root = Path(params).resolve().parent
        validate_name(model, "model name")
        validate_name(baseline, "baseline model name")
        candidate = read_eval_outputs(root, model)
        if candidate is None:
            fail(
                f"no evaluation for {model!r} (metrics/{model}.json, "
                f"artifacts/eval/{model}/per_user.parquet); run `dvc repro evaluate@{model}` first"
            )
        mostpop = read_eval_outputs(root, baseline) if baseline != model else None
        decision = promote(root / "artifacts" / "models" / model, candidate, params=loaded,
                           mostpop_result=mostpop, dataset_version=dataset_version, repo_root=root)
    except expected_errors() as err:
        fail(str(err))
    verb = "PROMOTED" if decision.promoted else "REFUSED"
    replay = " (already decided earlier; nothing changed)" if decision.replayed else ""
    typer.echo(f"{verb} v{decision.version} ({model}){replay}: {decision.reason}")
