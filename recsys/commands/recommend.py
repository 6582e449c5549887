"""`recsys recommend --user ID | --history I1,I2,... [-k 10] [--at ISO-TIME] [--json]`: always an answer.

Parsing and printing only; who answers and why (champion, baseline champion, popularity fallback) is
`recsys.recommend.answer`.

`app` is a Typer of this one command (run on its own, it is the command); recsys/cli.py registers that
command as `recsys recommend`, so its usage line has no sub-command to name.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from recsys.commands.registry import (
    ParamsOption,
    describe,
    expected_errors,
    fail,
    open_from_params,
    parse_count,
    refuse_usage,
    registry_label,
)
from recsys.config import DEFAULT_PARAMS, load_params, params_root
from recsys.layout import Layout
from recsys.recommend import MAX_K, NOTHING_COUNTED, Answer, RecommendError, answer


def parse_time(value: str) -> int:
    """`--at`: ISO-8601 → UTC seconds; a time without a zone is taken as UTC."""
    try:
        # Python 3.11 takes any character between the date and the time ("2024-05-01x12:00"): ISO says T
        if len(value) > 10 and value[4:5] == value[7:8] == "-" and value[10] not in "Tt ":
            raise ValueError("the date and the time are joined by T")
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise RecommendError(f"--at {value!r} is not an ISO-8601 time (e.g. 2024-05-01T12:00:00Z)") from err
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:  # the answer says its time in UTC: a zone that moves it past year 1 or 9999 has no such time
        moment.astimezone(UTC)
    except (OverflowError, ValueError) as err:
        raise RecommendError(f"--at {value!r} is outside the years 1 to 9999 in UTC") from err
    # Floored, exactly (int() of the float truncated toward 1970: 1969-12-31T23:59:59.5Z became 1970)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(seconds=1)


def parse_history(value: str) -> list[str]:
    items = [part.strip() for part in value.split(",")]
    if not items or any(not item for item in items):
        raise RecommendError(f"--history {value!r}: expected raw item ids separated by commas, e.g. i1,i2,i3")
    return items


def _print(result: Answer) -> None:
    subject = (f"user {result.user}" if result.user is not None
               else f"history of {len(result.history or [])} item(s)")
    by = (f"v{result.model_version} ({result.architecture})" if result.model_version is not None
          else result.architecture)
    typer.echo(f"top {result.k} for {subject} from {by} [{result.source}]: {result.reason}")
    if not result.recommendations:
        typer.echo("(nothing to recommend: see above)" if result.empty_because == NOTHING_COUNTED else
                   "(nothing left to recommend: the history covers every item the answer could rank)")
    for r in result.recommendations:
        title = f"  {r.title}" if r.title else ""
        typer.echo(f"{r.rank:>3}. {r.item_id}{title}  (score {r.score:.4f})")
    if result.skipped_items:
        to = f"v{result.model_version}" if result.model_version is not None else "the prepared dataset"
        typer.echo(f"note: skipped {len(result.skipped_items)} history item(s) unknown to {to}: "
                   + ", ".join(result.skipped_items))


def recommend_command(
    user: Annotated[str | None, typer.Option("--user", help="Raw user id, as in the dataset.")] = None,
    history: Annotated[
        str | None, typer.Option("--history", help="Raw item ids, oldest first, comma-separated.")
    ] = None,
    k: Annotated[str, typer.Option("-k", "--k", help=f"How many items (1 to {MAX_K}).")] = "10",
    at: Annotated[str | None, typer.Option("--at", help="Recommend as of this ISO-8601 time (UTC).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable answer.")] = False,
    prepared: Annotated[
        str | None, typer.Option("--prepared", help="Prepared dataset dir (default: artifacts/prepared).")
    ] = None,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Top-k items for a user or a history from the current champion, saying who answered and why."""
    from recsys.checkpoint import CheckpointError

    if (user is None) == (history is None):
        refuse_usage("recsys recommend", "give exactly one of --user ID or --history I1,I2,...")
    if user is not None and not user.strip():
        refuse_usage("recsys recommend", "--user is empty: give a raw user id, as in the dataset")
    for option, value in (("--user", user), ("--history", history)):  # `--user --json`: the next option
        if value is not None and value.startswith("--"):                  # was taken for the id
            refuse_usage("recsys recommend", f"{option} {value!r} looks like an option: give {option}'s value "
                                             "first")
    count = parse_count(k, "recsys recommend", "-k", MAX_K)
    if prepared is not None and not (prepared.strip() and Path(prepared).is_dir()):
        # named, so meant: answering without it (no titles, a history's seen items unknown) was silent
        said = ("is empty" if not prepared.strip() else "is a file" if Path(prepared).exists()
                else "does not exist")
        refuse_usage("recsys recommend", f"--prepared {prepared!r} {said}: name prepare's output folder "
                                         "(artifacts/prepared by default)")
    try:
        at_time = parse_time(at) if at is not None else None
        items = parse_history(history) if history is not None else None
    except RecommendError as err:  # a value of the wrong kind: a command line that does not parse
        refuse_usage("recsys recommend", str(err))
    subject = f"user {user!r}" if user is not None else f"history {history!r}"
    with open_from_params(params, f"cannot recommend for {subject}", read_only=True) as registry:
        root = params_root(params)
        prepared_dir = Path(prepared) if prepared is not None else Layout(root).prepared
        try:
            result = answer(registry, prepared_dir, count, at_time, user=user, history=items,
                            registry_label=registry_label(params), prepared_required=prepared is not None,
                            mask_seen=load_params(params).evaluate.mask_seen)
        except (RecommendError, CheckpointError, ValueError) as err:
            fail(str(err))
        except expected_errors() as err:
            fail(describe(err, f"cannot recommend for {subject}"))
    if as_json:
        typer.echo(json.dumps(asdict(result), indent=2))
    else:
        _print(result)


app = typer.Typer(pretty_exceptions_enable=False)
app.command()(recommend_command)
