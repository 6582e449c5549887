"""`recsys registry list | show VERSION | history | rollback [--to VERSION] | promote --model NAME`."""

from __future__ import annotations

import json
import re
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, NoReturn

import typer

from recsys.config import DEFAULT_PARAMS, ConfigError, load_params, params_root
from recsys.entry import usage_line, verbose_requested
from recsys.lineage import describe_init

app = typer.Typer(help="Model registry: versions, the champion, promotion history, rollback.",
                  no_args_is_help=True, pretty_exceptions_enable=False)

ParamsOption = Annotated[
    Path, typer.Option("--params", help="params.yaml; relative registry paths are resolved next to it.")
]


MAX_VERSION = 2**63 - 1  # the largest integer both SQLite and PostgreSQL (bigint) store
_VERSION = re.compile(r"[1-9][0-9]{0,18}")  # ASCII digits only: int() would also take " 1", "+1", "١"


def fail(message: str, code: int = 1) -> NoReturn:
    """One `error:` line and exit `code`; `recsys --verbose` adds the traceback of the error being handled."""
    if verbose_requested() and sys.exc_info()[1] is not None:
        traceback.print_exc()
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def refuse_usage(command: str, message: str) -> NoReturn:
    """A command line that does not parse, refused before anything ran: one line naming the command and its
    help (as Click's own refusals are), exit 2."""
    typer.echo(usage_line(command, message), err=True)
    raise typer.Exit(2)


def parse_version(text: str, command: str, what: str = "version") -> int:
    """A version argument of `command`: a positive whole number in range, written plainly — anything else is
    refused (exit 2, one line naming the input and the help) before the registry is even opened."""
    if not _VERSION.fullmatch(text) or int(text) > MAX_VERSION:
        refuse_usage(command, f"{what} {text!r} is not a version number: expected a whole number from 1 to "
                              f"{MAX_VERSION}")
    return int(text)


def parse_count(text: str, command: str, option: str, most: int = MAX_VERSION) -> int:
    """A count option of `command` (`-k`, `-n`): a whole number from 1 to `most`, written plainly. Click's
    int takes "+2", " 3", "1_0" and any size (one past SQLite's INTEGER was a traceback from `history -n`)."""
    if not _VERSION.fullmatch(text) or int(text) > most:
        refuse_usage(command, f"{option} {text!r} is not a whole number from 1 to {most}")
    return int(text)


def expected_errors() -> tuple[type[Exception], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    from recsys.registry import ArtifactError, RegistryError

    return (ConfigError, RegistryError, ArtifactError, SQLAlchemyError, OSError)


def describe(err: Exception, doing: str, url: str | None = None) -> str:
    """One line for an expected failure; a database error names what was being done and the registry
    (`recsys.registry.records.database_failure`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from recsys.registry.records import database_failure

    return str(database_failure(err, doing, url) if isinstance(err, SQLAlchemyError) else err)


def registry_label(params_path: Path) -> str:
    """The registry params.yaml (or RECSYS_REGISTRY_URL) names, as a message may show it (password masked)."""
    from recsys.registry import registry_url
    from recsys.registry.db import masked_url

    return masked_url(registry_url(load_params(params_path).registry))


@contextmanager
def open_from_params(params_path: Path, doing: str = "registry",
                     read_only: bool = False) -> Iterator:  # type: ignore[type-arg]
    """The registry named in params.yaml; an expected failure becomes one line naming `doing`, exit 1.
    `read_only`: a command that only reads creates no registry file (`open_registry`)."""
    from recsys.registry import open_registry, registry_url

    url = None
    try:
        params = load_params(params_path)
        url = registry_url(params.registry)
        registry = open_registry(params.registry, params_root(params_path), params.gate, read_only)
    except expected_errors() as err:
        fail(describe(err, doing, url))
    try:
        yield registry
    except expected_errors() as err:
        fail(describe(err, doing, url))
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
    with open_from_params(params, "cannot list versions", read_only=True) as registry:
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
                v.role or "",
                describe_init(v.params.get("init")) if v.params.get("model") else "-",
                _fmt(v.metrics.get(metric)),
                (v.eval_fingerprint or "-")[:12],
                v.dataset_version or "-",
                v.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            ]
            for v in versions
        ]
        typer.echo(_table(["", "version", "architecture", "status", "role", "init", metric, "eval set",
                           "dataset", "created"], rows))


# Unknown options are handed to VERSION, so that `show -1` is refused as a version like `show 0` is.
@app.command("show", context_settings={"ignore_unknown_options": True})
def show(version: Annotated[str, typer.Argument(help="Version number.", metavar="VERSION")],
         params: ParamsOption = DEFAULT_PARAMS) -> None:
    """Everything recorded about one version."""
    number = parse_version(version, "recsys registry show")
    with open_from_params(params, f"cannot show version {number}", read_only=True) as registry:
        v = registry.get_version(number)
        fields = {
            "version": v.version,
            "champion": v.is_champion,
            "architecture": v.architecture,
            "status": v.status,
            "role": v.role,
            "init": describe_init(v.params.get("init")),  # the details are under params.init
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
    limit: Annotated[str, typer.Option("--limit", "-n", help="Show the last N events.")] = "50",
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Promotion decisions and rollbacks, oldest first, each with its reason."""
    count = parse_count(limit, "recsys registry history", "--limit")
    with open_from_params(params, "cannot read the promotion history", read_only=True) as registry:
        events = registry.history(count)
        if not events:
            typer.echo("no promotion events yet")
            return
        started = {v.version: v.params.get("init") for v in registry.list_versions() if v.params.get("model")}
        rows = [
            [
                str(e.id),
                e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                e.decision,
                f"v{e.candidate_version}",
                describe_init(started[e.candidate_version]) if e.candidate_version in started else "-",
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
        typer.echo(_table(["#", "time", "decision", "candidate", "init", "baseline", metric,
                           "baseline " + metric, "delta", "p", "reason"], rows))


@app.command("rollback")
def rollback(
    to: Annotated[
        str | None, typer.Option("--to", help="Version to make champion (a former champion).")
    ] = None,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Move the champion back to the previous champion (or to --to VERSION); recorded as an event."""
    target = parse_version(to, "recsys registry rollback", "--to") if to is not None else None
    doing = f"cannot roll back to version {target}" if target is not None else "cannot roll back"
    # Without a registry file there is nothing to roll back: the refusal must not create one (a writer whose
    # file exists opens it as always: `read_only` only decides what a missing SQLite file becomes).
    with open_from_params(params, doing, read_only=True) as registry:
        event = registry.rollback(target)
        typer.echo(
            f"champion is now v{event.candidate_version} (was v{event.baseline_version}): {event.reason}"
        )


@app.command("promote")
def promote_command(
    model: Annotated[str, typer.Option("--model", help="Model whose checkpoint to register and gate.")],
    baseline: Annotated[
        str, typer.Option("--baseline",
                          help="Model the first champion must beat: one that learns by counting (mostpop).")
    ] = "mostpop",
    dataset_version: Annotated[
        str | None,
        typer.Option("--dataset-version",
                     help="Dataset label to record (default: the DVC version of data/)."),
    ] = None,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Register artifacts/models/MODEL and run the gate with the evaluate stage's results; show the decision.

    The same promotion step as the retrain flow (`recsys.promotion.promote_candidate`): the same lineage,
    the baseline installed as champion while no model has passed the gate (promoting the baseline itself
    then installs it, ungated), the champion re-scored on new data. REFUSED, and NOT CHAMPION (a replayed
    promotion whose version a rollback has replaced since), are normal outcomes (exit 0); the reason is
    printed and recorded.
    """
    from recsys.promotion import promote_candidate
    from recsys.registry import registry_url

    if dataset_version is not None and not dataset_version.strip():
        refuse_usage("recsys registry promote",
                     "--dataset-version is empty: leave it out for the DVC version of data/, or give a label")
    if dataset_version is not None and not dataset_version.isprintable():  # recorded for good, shown in tables
        refuse_usage("recsys registry promote", f"--dataset-version {dataset_version!r} holds a control "
                                                "character: give a label on one line")
    url = None
    try:
        loaded = load_params(params)
        url = registry_url(loaded.registry)
        decision = promote_candidate(params_root(params), loaded, model, baseline=baseline,
                                     dataset_version=dataset_version)
    except expected_errors() as err:
        fail(describe(err, f"cannot promote {model!r}", url))
    verb = ("PROMOTED" if decision.promoted else "NOT CHAMPION" if decision.decision == "promoted"
            else "REFUSED")
    replay = " (already decided earlier; nothing changed)" if decision.replayed else ""
    typer.echo(f"{verb} v{decision.version} ({model}){replay}: {decision.reason}")
