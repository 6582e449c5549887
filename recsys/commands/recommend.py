"""`recsys recommend --user ID -k 10 [--at ISO-TIME]`: the champion's top-k for one user.

The user's history comes from the prepared dataset (`artifacts/prepared/`: all of the user's events, or
those up to `--at`); raw ids are mapped to the champion checkpoint's own ids, because the champion may have
been trained on an older dataset version. Items the user has already interacted with are never shown.

`app` is a Typer whose callback *is* the command, so `app.add_typer(app, name="recommend")` in
recsys/cli.py gives `recsys recommend --user ID` directly (no sub-command name to repeat).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from recsys.commands.registry import ParamsOption, expected_errors, fail, open_from_params
from recsys.config import DEFAULT_PARAMS


class RecommendError(ValueError):
    """The request cannot be served (unknown user, missing prepared data, bad time); says why."""


@dataclass(frozen=True)
class Recommendation:
    rank: int
    item_id: str
    title: str | None
    score: float


def parse_time(value: str) -> int:
    """ISO-8601 → UTC seconds; a time without a zone is taken as UTC."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise RecommendError(f"--at {value!r} is not an ISO-8601 time (e.g. 2024-05-01T12:00:00Z)") from err
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp())


def recommend_for_user(
    model: Any,
    meta: dict[str, Any],
    checkpoint_dir: Path,
    prepared_dir: Path,
    user_id: str,
    k: int,
    at_time: int | None,
) -> list[Recommendation]:
    import pandas as pd

    from recsys.recommend import recommend

    try:
        events = pd.read_parquet(prepared_dir / "events.parquet", columns=["user", "item", "timestamp"])
        items = pd.read_parquet(prepared_dir / "items.parquet")
        users = pd.read_parquet(prepared_dir / "users.parquet")
    except (FileNotFoundError, OSError) as err:
        raise RecommendError(
            f"prepared dataset not found under {prepared_dir} ({err}); run `dvc repro prepare` first"
        ) from err
    match = users.loc[users["user_id"].astype(str) == str(user_id), "user"]
    if match.empty:
        raise RecommendError(f"unknown user {user_id!r}: not in {prepared_dir / 'users.parquet'}")
    history = events[events["user"] == int(match.iloc[0])]  # already in stable time order
    if at_time is not None:
        history = history[history["timestamp"] <= at_time]

    raw_of_dataset_item = dict(zip(items["item"].astype(int), items["item_id"].astype(str)))
    titles: dict[str, str] = {}
    if "title" in items.columns:
        titles = {
            str(i): str(t) for i, t in zip(items["item_id"], items["title"]) if t is not None and t == t
        }
    model_items: list[Any] = json.loads((checkpoint_dir / "items.json").read_text())
    model_users: list[Any] = json.loads((checkpoint_dir / "users.json").read_text())
    index_of_raw = {str(raw): i for i, raw in enumerate(model_items) if raw is not None}
    user_index = {str(raw): i for i, raw in enumerate(model_users) if raw is not None}.get(str(user_id), 0)

    history_items: list[int] = []
    history_times: list[int] = []
    for item, ts in zip(history["item"].astype(int), history["timestamp"].astype("int64")):
        index = index_of_raw.get(raw_of_dataset_item.get(int(item), ""))
        if index is not None:  # items the champion never saw cannot be fed to it
            history_items.append(index)
            history_times.append(int(ts))
    ranked = recommend(model, meta, history_items, k, at_time, history_times=history_times,
                       user_index=user_index)
    out = []
    for rank, (index, score) in enumerate(ranked, start=1):
        raw = str(model_items[index])
        out.append(Recommendation(rank, raw, titles.get(raw), score))
    return out


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
        prepared_dir = prepared if prepared is not None else registry.repo_root / "artifacts" / "prepared"
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
