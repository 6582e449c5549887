"""`recsys recommend --user ID -k 10 [--at ISO-TIME]`: the champion's top-k for one user.

The user's history comes from the prepared dataset (`artifacts/prepared/`: all of the user's events, or
those up to `--at`); `recsys.recommend.recommend_for_user` maps raw ids to the champion checkpoint's own ids.
Items the user has already interacted with are never shown.

`app` is a Typer whose callback *is* the command, so `app.add_typer(app, name="recommend")` in
recsys/cli.py gives `recsys recommend --user ID` directly (no sub-command name to repeat).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recsys.commands.registry import ParamsOption, expected_errors, fail, open_from_params
from recsys.config import DEFAULT_PARAMS
from recsys.layout import Layout
from recsys.recommend import RecommendError, parse_time, recommend_for_user


def recommend_command(
    user: Annotated[str, typer.Option("--user", help="Raw user id, as in the dataset.")],
    k: Annotated[int, typer.Option("-k", "--k", min=1, max=1000, help="How many items.")] = 10,
    at: Annotated[str | None, typer.Option("--at", help="Recommend as of this ISO-8601 time (UTC).")] = None,
    prepared: Annotated[
        Path | None, typer.Option("--prepared", help="Prepared dataset dir (default: artifacts/prepared).")
    ] = None,
    params: ParamsOption = DEFAULT_PARAMS,
) -> None:
    """Top-k items for a user from the current champion (titles shown when the dataset has them)."""
    try:
        at_time = parse_time(at) if at is not None else None
    except RecommendError as err:
        fail(str(err))
    with open_from_params(params) as registry:
        prepared_dir = prepared if prepared is not None else Layout(registry.repo_root).prepared
        from recsys.checkpoint import CheckpointError, load_model

        champion = registry.champion_version()
        try:
            checkpoint = registry.champion_dir()  # every file's sha256 verified before loading
            model, meta = load_model(checkpoint)
            results = recommend_for_user(model, meta, checkpoint, prepared_dir, user, k, at_time)
        except (RecommendError, CheckpointError, ValueError) as err:
            fail(str(err))
        except expected_errors() as err:
            fail(str(err))
        typer.echo(f"top {k} for user {user} from champion v{champion}:")
        if not results:
            typer.echo("(nothing left to recommend: the user has seen every item the model knows)")
        for r in results:
            title = f"  {r.title}" if r.title else ""
            typer.echo(f"{r.rank:>3}. {r.item_id}{title}  (score {r.score:.4f})")


app = typer.Typer(pretty_exceptions_enable=False)
app.callback(invoke_without_command=True)(recommend_command)
