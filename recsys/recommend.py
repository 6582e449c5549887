"""Serving: top-k next items for a user or any recent history, and who answers.

`recommend` works in the *model's* ids (index into the checkpoint's `items.json`/`users.json`);
`score_history` / `recommend_for_user` map raw ids to them, because the champion may have been trained on an
older dataset version than the one the history comes from. `answer` serves one request (`recsys recommend`):

- `--user ID`: the user's history from the prepared dataset (all events, or those up to `--at`);
- `--history I1,I2,...`: any recent history as raw item ids, oldest first (a user who arrived since the last
  training, an anonymous session), each taken as happening at `--at` (default now); items the champion never
  saw are skipped and reported.

Who answers, and why, is part of every answer (`source`):
  `champion`            the champion scored the history;
  `baseline_champion`   no model has passed the gate yet, so the baseline (MostPop) is champion;
  `popularity_fallback` the champion cannot score this request (a user it has never seen, or a history —
                        given, or a user's events up to `--at` — with no item it knows), or no champion is
                        registered yet: the latest registered baseline answers, or, if none is registered,
                        item popularity in the prepared dataset (counted up to `--at`).
Items already in the history are never shown. `describe_champion` is what the pipeline prints at the end.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from recsys.entry import first_line


def _max_len(model: Any, meta: dict[str, Any]) -> int:
    config = getattr(model, "config", None)
    value = getattr(config, "max_len", None) or (meta.get("config") or {}).get("max_len")
    return int(value) if value else 0


def recommend(
    model: Any,
    meta: dict[str, Any],
    history_items: Sequence[int],
    k: int,
    at_time: int | None,
    *,
    history_times: Sequence[int] | None = None,
    user_index: int = 0,
) -> list[tuple[int, float]]:
    """The k best (item_index, score) pairs, best first; no padding, no history item unless meta's mask_seen is false.

    `history_items` are model item ids (1..n_items) in time order, `history_times` their UTC seconds (0 when
    unknown), `at_time` the moment being recommended for (default: now), `user_index` the model's user id
    (0 = unknown user).
    """
    import torch  # here, not at import: the flows import this module and most runs never score

    from recsys.models.base import Batch

    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    n_items = int(meta.get("n_items", getattr(model, "n_items", 0)))
    history = [int(i) for i in history_items if 0 < int(i) <= n_items]
    times = [int(t) for t in (history_times if history_times is not None else [0] * len(history_items))]
    if len(times) != len(history_items):
        raise ValueError("history_times must have one entry per history item")
    times = [t for i, t in zip(history_items, times) if 0 < int(i) <= n_items]
    max_len = _max_len(model, meta) or max(len(history), 1)
    window, window_times = history[-max_len:], times[-max_len:]
    pad = max_len - len(window)
    now = int(time.time()) if at_time is None else int(at_time)
    batch = Batch(
        items=torch.tensor([[0] * pad + window], dtype=torch.long),  # (1, L) left-padded
        times=torch.tensor([[0] * pad + window_times], dtype=torch.long),  # (1, L)
        users=torch.tensor([int(user_index)], dtype=torch.long),  # (1,)
        next_time=torch.tensor([now], dtype=torch.long),  # (1,)
    )
    model.eval()
    with torch.no_grad():
        scores = model.score(batch)[0].float().cpu().clone()  # (n_items + 1,)
    scores = torch.nan_to_num(scores, nan=float("-inf"))  # topk would rank NaN first
    scores[0] = float("-inf")
    if history and meta.get("mask_seen", True):  # (checkpoints from before the key masked them)
        scores[torch.tensor(sorted(set(history)), dtype=torch.long)] = float("-inf")
    allowed = int((scores > float("-inf")).sum())
    if allowed == 0:
        return []
    values, indices = torch.topk(scores, min(k, allowed))
    return [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist())]


CHAMPION, BASELINE_CHAMPION, POPULARITY_FALLBACK = "champion", "baseline_champion", "popularity_fallback"
MAX_K = 1000  # the most items one answer lists (`recsys recommend -k`)
# Why an answer has no items (`Answer.empty_because`; None when it has some):
NOTHING_COUNTED = "nothing_counted"  # dataset popularity with no events up to `--at`
HISTORY_COVERS_ALL = "history_covers_all"  # every item the answer could rank is in the history


def not_in_the_dataset(user: str) -> str:
    """What is said of a user id the prepared dataset lacks (it gets an answer all the same)."""
    return (f"user {user!r} is not in the prepared dataset (new, a typo, or with fewer events than prepare's "
            "minimum)")


class RecommendError(ValueError):
    """The request cannot be served (missing prepared data, bad time, bad history); says why."""


@dataclass(frozen=True)
class Recommendation:
    rank: int
    item_id: str
    title: str | None
    score: float


@dataclass
class Answer:
    """One answer, as printed and as `--json` gives it."""

    source: str  # CHAMPION | BASELINE_CHAMPION | POPULARITY_FALLBACK
    reason: str
    model_version: int | None  # the registry version that scored the items (None: dataset popularity)
    architecture: str
    champion_version: int | None  # None: no champion is registered yet
    k: int
    at: str | None
    user: str | None
    history: list[str] | None  # the --history given, raw ids
    skipped_items: list[str] = field(default_factory=list)  # history items the answerer never saw
    recommendations: list[Recommendation] = field(default_factory=list)
    empty_because: str | None = None  # NOTHING_COUNTED | HISTORY_COVERS_ALL when `recommendations` is empty


# --- the prepared dataset ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    events: Any  # user, item, timestamp (stable time order)
    items: Any
    users: Any

    def titles(self) -> dict[str, str]:
        if "title" not in self.items.columns:
            return {}
        return {str(i): str(t) for i, t in zip(self.items["item_id"], self.items["title"])
                if t is not None and t == t}

    def _user_code(self, user_id: str) -> int | None:
        match = self.users.loc[self.users["user_id"].astype(str) == str(user_id), "user"]
        return None if match.empty else int(match.iloc[0])

    def has_user(self, user_id: str) -> bool:
        return self._user_code(user_id) is not None

    def unknown_items(self, item_ids: Sequence[str]) -> list[str]:
        """The ids, in order, that are no item of the dataset."""
        known = set(self.items["item_id"].astype(str))
        return [raw for raw in item_ids if str(raw) not in known]

    def user_history(self, user_id: str, at_time: int | None) -> tuple[list[str], list[int]] | None:
        """The user's (raw item ids, times) in time order, or None when the dataset has no such user."""
        code = self._user_code(user_id)
        if code is None:
            return None
        history = self.events[self.events["user"] == code]  # already in stable time order
        if at_time is not None:
            history = history[history["timestamp"] <= at_time]
        raw_of = dict(zip(self.items["item"].astype(int), self.items["item_id"].astype(str)))
        return ([raw_of.get(int(i), "") for i in history["item"].astype(int)],
                [int(t) for t in history["timestamp"].astype("int64")])

    def popularity(self, at_time: int | None = None) -> list[tuple[str, float]]:
        """Items by their number of events (up to `at_time` when given: no count from the future)."""
        events = self.events if at_time is None else self.events[self.events["timestamp"] <= at_time]
        counts = events["item"].astype(int).value_counts()
        raw_of = dict(zip(self.items["item"].astype(int), self.items["item_id"].astype(str)))
        return [(raw_of[int(i)], float(c)) for i, c in counts.items() if int(i) in raw_of]


# The columns an answer reads from each file of a prepared dataset (recsys/prepare.py writes them).
PREPARED_COLUMNS = {"events": ("user", "item", "timestamp"), "items": ("item", "item_id"),
                    "users": ("user", "user_id")}


def read_prepared(prepared_dir: Path, required: bool) -> Prepared | None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    rebuild = "`recsys bootstrap && dvc repro prepare` builds it (the flows and `bash scripts/demo.sh` do)"
    schemas = {}
    for name in PREPARED_COLUMNS:
        path = prepared_dir / f"{name}.parquet"
        try:
            schemas[name] = pq.read_schema(path).names
        except (FileNotFoundError, NotADirectoryError) as err:
            if not required:
                return None
            raise RecommendError(f"prepared dataset not found under {prepared_dir} ({err}): {rebuild}") from err
        except (OSError, pa.ArrowException) as err:  # there, but not Parquet (truncated, overwritten)
            raise RecommendError(f"{path} cannot be read as Parquet ({first_line(err)}); {rebuild}") from err
    for name, columns in PREPARED_COLUMNS.items():
        if missing := [c for c in columns if c not in schemas[name]]:
            raise RecommendError(f"{prepared_dir / name}.parquet is not a prepared dataset's: it lacks column(s) "
                                 f"{', '.join(missing)}; point --prepared at prepare's output, or {rebuild}")
    prepared = Prepared(
        pd.read_parquet(prepared_dir / "events.parquet", columns=list(PREPARED_COLUMNS["events"])),
        pd.read_parquet(prepared_dir / "items.parquet"),
        pd.read_parquet(prepared_dir / "users.parquet"),
    )
    for code, table in (("item", prepared.items), ("user", prepared.users)):
        if unlisted := int((~prepared.events[code].isin(table[code])).sum()):
            article = "an" if code == "item" else "a"
            raise RecommendError(f"{prepared_dir} is not one prepared dataset: {unlisted} event(s) name {article} "
                                 f"{code} that {code}s.parquet lacks; {rebuild}")
    return prepared


# --- scoring with one checkpoint ---------------------------------------------------------------------------


def _vocabulary(checkpoint_dir: Path) -> tuple[list[Any], dict[str, int], dict[str, int]]:
    model_items: list[Any] = json.loads((checkpoint_dir / "items.json").read_text())
    model_users: list[Any] = json.loads((checkpoint_dir / "users.json").read_text())
    items = {str(raw): i for i, raw in enumerate(model_items) if raw is not None}
    users = {str(raw): i for i, raw in enumerate(model_users) if raw is not None}
    return model_items, items, users


def score_history(
    model: Any, meta: dict[str, Any], checkpoint_dir: Path, raw_items: list[str], raw_times: list[int],
    k: int, at_time: int | None, user_id: str | None = None,
) -> tuple[list[tuple[str, float]], list[str]]:
    """Top-k (raw item id, score) for a raw history, and the history items this checkpoint never saw."""
    model_items, index_of_raw, user_index = _vocabulary(checkpoint_dir)
    items, times, skipped = [], [], []
    for raw, ts in zip(raw_items, raw_times):
        index = index_of_raw.get(raw)
        if index is None:
            skipped.append(raw)  # an item the model never saw cannot be fed to it
        else:
            items.append(index)
            times.append(ts)
    ranked = recommend(model, meta, items, k, at_time, history_times=times,
                       user_index=user_index.get(str(user_id), 0) if user_id is not None else 0)
    return [(str(model_items[i]), score) for i, score in ranked], skipped


def recommend_for_user(
    model: Any,
    meta: dict[str, Any],
    checkpoint_dir: Path,
    prepared_dir: Path,
    user_id: str,
    k: int,
    at_time: int | None,
) -> list[Recommendation]:
    """The model's top-k for a user of the prepared dataset (raises RecommendError for an unknown user)."""
    prepared = read_prepared(prepared_dir, required=True)
    assert prepared is not None
    history = prepared.user_history(user_id, at_time)
    if history is None:
        raise RecommendError(f"unknown user {user_id!r}: not in {prepared_dir / 'users.parquet'}")
    ranked, _ = score_history(model, meta, checkpoint_dir, *history, k, at_time, user_id)
    titles = prepared.titles()
    return [Recommendation(r, raw, titles.get(raw), s) for r, (raw, s) in enumerate(ranked, start=1)]


# --- who answers -----------------------------------------------------------------------------------------


def _baseline_reason(registry: Any, version: int) -> str:
    """Why the baseline champion answers: nothing has passed the gate yet, or the champion was rolled back to
    it after a model had (the newest such is named)."""
    baselines = {v.version for v in registry.list_versions() if v.is_baseline}
    events = registry.history()
    gated = [e.candidate_version for e in events
             if e.decision == "promoted" and e.candidate_version not in baselines]
    if not gated:
        return f"no model has passed the gate yet: baseline champion v{version} answers"
    moved = [e for e in events if e.decision in ("promoted", "rollback")][-1]  # how it became champion
    how = ("the champion was rolled back to it" if moved.decision == "rollback" else
           "it refreshed the baseline the champion had been rolled back to")
    return f"baseline champion v{version} answers: {how} (v{gated[-1]} passed the gate; `recsys registry " \
           "history` says when)"


def answer(
    registry: Any, prepared_dir: Path, k: int, at_time: int | None, *,
    user: str | None = None, history: list[str] | None = None, registry_label: str | None = None,
    prepared_required: bool = False, mask_seen: bool = True,
) -> Answer:
    """Serve one request from the champion, or say why popularity answers instead (module docstring).
    `registry_label` (the registry's URL, password masked) is named when no champion is registered: a typo in
    registry.url reads as an empty registry, and the answer should say which one it read. The prepared dataset
    is required for a user's request, and whenever `prepared_required` (a `--prepared` the person named).
    `mask_seen`: evaluate.mask_seen, for dataset popularity (a model serves by its checkpoint's rule)."""
    from recsys.checkpoint import load_model

    prepared = read_prepared(prepared_dir, required=user is not None or prepared_required)
    raw_items, raw_times = _request_history(prepared, user, history, at_time)
    at = datetime.fromtimestamp(at_time, timezone.utc).isoformat() if at_time is not None else None
    # A user id not in the data (a typo, or someone new) gets an answer all the same, which says so
    unknown = user is not None and (prepared is None or not prepared.has_user(user))
    stranger = f"; {not_in_the_dataset(user)}" if unknown else ""
    if registry.champion_version() is None:  # nothing gated yet (a fresh clone, a first `dvc repro`)
        result = Answer(source=POPULARITY_FALLBACK, reason="", model_version=None,
                        architecture="dataset popularity", champion_version=None, k=k, at=at, user=user,
                        history=history)
        ranked = _popularity(registry, prepared, raw_items, raw_times, k, at_time, result, mask_seen, unanswerable=(
            "nothing can answer yet: no model is registered and there is no prepared dataset to count popularity "
            "in; `python -m flows.pipeline` (or `bash scripts/demo.sh` on the embedded data) trains, gates and "
            "registers one — or `dvc repro` then `recsys registry promote --model mostpop`"))
        where = f" in {registry_label}" if registry_label else ""
        result.reason = f"popularity fallback: no champion is registered yet{where}; {result.reason}{stranger}"
        return _with_items(result, ranked, prepared)

    champion = registry.champion_info()
    checkpoint = registry.champion_dir()  # every file's sha256 verified before loading
    model, meta = load_model(checkpoint)
    result = Answer(
        source=BASELINE_CHAMPION if champion.is_baseline else CHAMPION,
        reason=(_baseline_reason(registry, champion.version) + stranger if champion.is_baseline
                else f"champion v{champion.version} answers"),
        model_version=champion.version, architecture=champion.architecture,
        champion_version=champion.version, k=k, at=at, user=user, history=history,
    )
    _, known_items, known_users = _vocabulary(checkpoint)
    fallback_reason = None
    if not champion.is_baseline:
        if unknown:  # whether the champion knows the id or not: no events here, nothing known to exclude
            fallback_reason = f"{not_in_the_dataset(user)}; their items are not known to be excluded"
        elif user is not None and user not in known_users:
            fallback_reason = f"user {user!r} arrived after champion v{champion.version} was trained"
        elif not any(item in known_items for item in raw_items):  # nothing to score: an all-padding input
            until = f" up to {at}" if at else ""
            fallback_reason = (
                f"none of the history's items is known to champion v{champion.version}" if user is None else
                f"user {user!r} has no events{until} for champion v{champion.version} to score"
                if not raw_items
                else f"none of user {user!r}'s {len(raw_items)} events{until} is an item champion "
                     f"v{champion.version} knows")
    if fallback_reason is None:
        ranked, result.skipped_items = score_history(model, meta, checkpoint, raw_items, raw_times, k,
                                                     at_time, user)
    else:
        ranked = _popularity(registry, prepared, raw_items, raw_times, k, at_time, result, mask_seen)
        result.source = POPULARITY_FALLBACK
        result.reason = f"popularity fallback: {fallback_reason}; {result.reason}"
    return _with_items(result, ranked, prepared)


def _request_history(prepared: Prepared | None, user: str | None, history: list[str] | None,
                     at_time: int | None) -> tuple[list[str], list[int]]:
    """The request's raw item ids and times: the user's events (up to `at_time`) from the prepared dataset, or
    the `--history` given, each at `at_time` (default now). An unknown user has none."""
    if user is not None:
        assert prepared is not None
        found = prepared.user_history(user, at_time)
        return found if found is not None else ([], [])
    now = at_time if at_time is not None else int(time.time())
    return list(history or []), [now] * len(history or [])


def _with_items(result: Answer, ranked: list[tuple[str, float]], prepared: Prepared | None) -> Answer:
    titles = prepared.titles() if prepared is not None else {}
    if not ranked and result.empty_because is None:
        result.empty_because = HISTORY_COVERS_ALL
    result.recommendations = [Recommendation(rank, raw, titles.get(raw), score)
                              for rank, (raw, score) in enumerate(ranked, start=1)]
    return result


def _popularity(
    registry: Any, prepared: Prepared | None, raw_items: list[str], raw_times: list[int], k: int,
    at_time: int | None, result: Answer, mask_seen: bool = True,
    unanswerable: str = ("no popularity fallback: no baseline version is registered and there is no prepared "
                         "dataset; run `dvc repro` and `recsys registry promote --model mostpop`"),
) -> list[tuple[str, float]]:
    """Popularity from the latest registered baseline (verified before loading), else from the dataset.
    Fills in who answered on `result`; with neither, `unanswerable` is the error (the caller's situation)."""
    from recsys.checkpoint import load_model

    baseline = registry.latest_baseline()
    if baseline is not None:
        checkpoint = registry.version_dir(baseline.version)
        model, meta = load_model(checkpoint)
        ranked, result.skipped_items = score_history(model, meta, checkpoint, raw_items, raw_times, k,
                                                     at_time)
        result.model_version, result.architecture = baseline.version, baseline.architecture
        result.reason = f"baseline v{baseline.version} ({baseline.architecture}) answers"
        return ranked
    if prepared is None:
        raise RecommendError(unanswerable)
    seen = set(raw_items) if mask_seen else set()
    result.model_version, result.architecture = None, "dataset popularity"
    result.reason = "item popularity in the prepared dataset answers (no baseline version is registered)"
    result.skipped_items = prepared.unknown_items(raw_items)
    counted = prepared.popularity(at_time)
    if not counted:  # (else an empty answer means the history holds every item counted)
        result.reason += f"; the prepared dataset holds no events up to {result.at} to count"
        result.empty_because = NOTHING_COUNTED
    return [(raw, count) for raw, count in counted if raw not in seen][:k]


def gate_metric(decision: dict[str, Any] | None, champion_version: int) -> float | None:
    """The champion's metric as the gate last measured it on the current test set: the candidate's own
    value when it was just promoted, the re-scored champion's when the candidate was refused."""
    if not decision:
        return None
    if decision.get("promoted") and decision.get("version") == champion_version:
        return decision.get("candidate_metric")
    if decision.get("baseline_kind") == "champion" and decision.get("baseline_version") == champion_version:
        return decision.get("baseline_metric")
    return None


def describe_champion(repo_root: Path, decision: dict[str, Any] | None = None, k: int = 5) -> str:
    """A few lines for people: the champion, its NDCG@10 as the gate used it, and (when `k` > 0) what it
    recommends to one user — which loads the model, so a run that changed nothing passes `k=0`."""
    from recsys.config import load_params
    from recsys.layout import Layout
    from recsys.registry import open_registry

    paths = Layout(repo_root)
    params = load_params(paths.params)
    with open_registry(params.registry, paths.root, params.gate) as registry:
        version = registry.champion_version()
        if version is None:
            return "no champion yet"
        info = registry.get_version(version)
        if k > 0:
            from recsys.prepare import load  # pandas: only when there is a user to recommend to

            model, meta = registry.load_champion()
            user = str(load(paths.prepared).users["user_id"].iloc[0])
            recs = recommend_for_user(model, meta, registry.champion_dir(), paths.prepared, user, k, None)
    metric = (decision or {}).get("metric") or "ndcg@10"
    used = gate_metric(decision, version)
    if used is not None:
        measured = f"{metric} = {used:.4f} (on the current test set, as the gate used it)"
    else:
        measured = f"{metric} = {info.metrics.get(metric, float('nan')):.4f} (recorded when it was registered)"
    lines = [f"champion: version {version} ({info.architecture}), test {measured}"]
    if k > 0:
        lines.append(f"top-{k} for user {user}:")
        lines += [f"  {r.rank}. {r.item_id}  {r.title or ''}  (score {r.score:.3f})" for r in recs]
    return "\n".join(lines)
