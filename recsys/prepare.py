"""The `prepare` stage: raw canonical interactions → a dense, split, fingerprinted dataset.

1. Iterative k-core (users ≥ `min_user_interactions`, items ≥ `min_item_interactions`, until stable).
2. Stable time order per user: (timestamp, original order). Ties are common (77.5 % of ML-1M rows share a
   (user, second)), so the original order is the documented tie-break.
3. Dense ids in order of first appearance, 0 = padding.
4. Split roles: leave-one-out (last = test target, second-to-last = validation target) or a global-time split
   (targets are each user's first event in the validation / test period; see `PrepareConfig`).
   Role codes: 0 = train, 1 = validation target, 2 = test target, 3 = history only (model input for a later
   target, never trained on nor scored). A target's model input is every earlier event of its user.
5. A sha256 fingerprint of the result (ids, times, roles and the config) written beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from recsys import layout, schema
from recsys.atomic import remove_stale_temp_dirs, replace_dir
from recsys.config import IngestConfig, PrepareConfig, load_params, params_root
from recsys.entry import ArgumentParser, first_line, nonempty_path

log = logging.getLogger(__name__)

TRAIN, VALID, TEST, HISTORY = 0, 1, 2, 3
ROLE_OF_SPLIT = {"valid": VALID, "test": TEST}


class PrepareError(ValueError):
    pass


@dataclass(frozen=True)
class Prepared:
    events: pd.DataFrame  # user, item, timestamp, role — sorted by user then stable time order
    items: pd.DataFrame  # item (dense id), item_id (raw), title
    users: pd.DataFrame  # user (dense id), user_id (raw)
    fingerprint: dict

    @property
    def n_items(self) -> int:
        return len(self.items)

    @property
    def n_users(self) -> int:
        return len(self.users)


def k_core(frame: pd.DataFrame, min_user: int, min_item: int) -> pd.DataFrame:
    """Drop users and items with too few interactions, repeatedly, until every one left qualifies."""
    while True:
        user_counts = frame[schema.USER].map(frame[schema.USER].value_counts())
        item_counts = frame[schema.ITEM].map(frame[schema.ITEM].value_counts())
        keep = (user_counts >= min_user) & (item_counts >= min_item)
        if keep.all():
            return frame
        frame = frame[keep]


def stable_time_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Sort by timestamp with the original row order (`seq`) breaking ties."""
    return frame.sort_values([schema.TIMESTAMP, "seq"], kind="stable")


def split_times(timestamp: np.ndarray, config: PrepareConfig) -> tuple[float, float]:
    """global_time's cuts (Unix seconds): validation from the first, test from the second — the
    `valid_quantile` and `test_quantile` of every event's time after the k-core filter."""
    t_valid, t_test = np.quantile(timestamp, [config.valid_quantile, config.test_quantile])
    return float(t_valid), float(t_test)


def assign_roles(user: np.ndarray, timestamp: np.ndarray, config: PrepareConfig,
                 cuts: tuple[float, float] | None = None) -> np.ndarray:
    """Roles for events already sorted by (user, time); under global_time cut at `cuts` (`split_times`,
    computed here when not given)."""
    n = len(user)
    roles = np.full(n, TRAIN, dtype=np.int8)
    starts = np.flatnonzero(np.r_[True, user[1:] != user[:-1]])
    ends = np.r_[starts[1:], n]
    lengths = ends - starts
    if config.split == "loo":
        eligible = lengths >= 3  # a user needs at least one training event before both targets
        roles[(ends - 1)[eligible]] = TEST
        roles[(ends - 2)[eligible]] = VALID
        return roles

    t_valid, t_test = cuts or split_times(timestamp, config)
    roles[timestamp >= t_valid] = HISTORY
    keep = np.ones(n, dtype=bool)
    for s, e in zip(starts, ends):  # per-user scan; global-time splits are an option, not the hot path
        ts = timestamp[s:e]
        has_train = ts[0] < t_valid
        in_valid = np.flatnonzero((ts >= t_valid) & (ts < t_test))
        if has_train and len(in_valid):
            roles[s + in_valid[0]] = VALID
        in_test = np.flatnonzero(ts >= t_test)
        if has_train and len(in_test):
            roles[s + in_test[0]] = TEST
            keep[s + in_test[0] + 1 : e] = False  # nothing after the test target is ever input
        elif len(in_test):
            keep[s + in_test[0] : e] = False
    roles[~keep] = -1
    return roles


def _kcore_name(config: PrepareConfig) -> str:
    u, i = config.min_user_interactions, config.min_item_interactions
    return f"{u}-core filter" if u == i else f"k-core filter (users ≥ {u}, items ≥ {i})"


def _thresholds(config: PrepareConfig) -> str:
    return (f"prepare.min_user_interactions / min_item_interactions in params.yaml "
            f"(now {config.min_user_interactions}/{config.min_item_interactions})")


def prepare(interactions: pd.DataFrame, config: PrepareConfig, titles: pd.DataFrame | None = None) -> Prepared:
    if len(interactions) == 0:
        raise PrepareError("no interactions to prepare: the raw store is empty (`recsys bootstrap` fills it)")
    frame = interactions[[schema.USER, schema.ITEM, schema.TIMESTAMP]].copy()
    frame["seq"] = np.arange(len(frame), dtype=np.int64)
    n_in, users_in, items_in = len(frame), frame[schema.USER].nunique(), frame[schema.ITEM].nunique()
    frame = k_core(frame, config.min_user_interactions, config.min_item_interactions)
    log.info("%s kept %d of %d events, %d of %d users, %d of %d items", _kcore_name(config), len(frame), n_in,
             frame[schema.USER].nunique(), users_in, frame[schema.ITEM].nunique(), items_in)
    if len(frame) == 0:
        raise PrepareError(f"{_kcore_name(config)} kept 0 of {n_in:,} events; lower {_thresholds(config)}")
    frame = stable_time_order(frame)
    # Dense ids by first appearance in time order: deterministic and independent of id spelling.
    user_ids = pd.unique(frame[schema.USER])
    item_ids = pd.unique(frame[schema.ITEM])
    frame["user"] = pd.Categorical(frame[schema.USER], categories=user_ids).codes.astype(np.int32) + 1
    frame["item"] = pd.Categorical(frame[schema.ITEM], categories=item_ids).codes.astype(np.int32) + 1
    frame = frame.sort_values("user", kind="stable")  # keeps the time order within each user

    user = frame["user"].to_numpy()
    timestamp = frame[schema.TIMESTAMP].to_numpy(np.int64)
    cuts = split_times(timestamp, config) if config.split == "global_time" else None  # (roles, fingerprint)
    roles = assign_roles(user, timestamp, config, cuts)
    events = pd.DataFrame({"user": user, "item": frame["item"].to_numpy(), "timestamp": timestamp, "role": roles})
    events = events[events.role >= 0].reset_index(drop=True)
    counts = events["role"].value_counts()
    n_valid, n_test = int(counts.get(VALID, 0)), int(counts.get(TEST, 0))
    log.info("%s split kept %d of %d events: %d validation and %d test targets", config.split, len(events),
             len(frame), n_valid, n_test)

    items = pd.DataFrame({"item": np.arange(1, len(item_ids) + 1, dtype=np.int32), "item_id": item_ids.astype(str)})
    items["title"] = None
    if titles is not None and len(titles):
        lookup = dict(zip(titles["item_id"].astype(str), titles["title"]))
        items["title"] = items["item_id"].map(lookup)
    users = pd.DataFrame({"user": np.arange(1, len(user_ids) + 1, dtype=np.int32), "user_id": user_ids.astype(str)})
    return Prepared(events, items, users, fingerprint_of(events, items, users, config, cuts))


def require_targets(prepared: Prepared, config: PrepareConfig) -> None:
    """The stage refuses a dataset with no validation or test target: nothing downstream could run on it."""
    fp = prepared.fingerprint
    if fp["n_valid"] and fp["n_test"]:
        return
    n_events, n_users = fp["n_events"], fp["n_users"]
    if config.split == "loo":
        raise PrepareError(
            f"dataset too small to split: after the {_kcore_name(config)} {n_users:,} users with {n_events:,} "
            "events remain and none has the 3 events leave-one-out needs (train, validation, test); add data "
            f"or lower {_thresholds(config)}")
    raise PrepareError(
        "dataset too small to split: no user has events both before and after the global_time cutoffs; "
        f"change prepare.valid_quantile / test_quantile in params.yaml (now {config.valid_quantile}/"
        f"{config.test_quantile})")


def fingerprint_of(events: pd.DataFrame, items: pd.DataFrame, users: pd.DataFrame, config: PrepareConfig,
                   cuts: tuple[float, float] | None = None) -> dict:
    digest = hashlib.sha256()
    for column in ("user", "item", "timestamp", "role"):
        digest.update(np.ascontiguousarray(events[column].to_numpy()).tobytes())
    digest.update("\x1f".join(items["item_id"]).encode())
    digest.update("\x1f".join(users["user_id"]).encode())
    digest.update(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
    counts = events["role"].value_counts()
    train_times = events.loc[events["role"] == TRAIN, "timestamp"]
    return {
        "fingerprint": digest.hexdigest(),
        "n_users": int(len(users)),
        "n_items": int(len(items)),
        "n_events": int(len(events)),
        "n_train": int(counts.get(TRAIN, 0)),
        "n_valid": int(counts.get(VALID, 0)),
        "n_test": int(counts.get(TEST, 0)),
        "split": config.split,
        "config": dataclasses.asdict(config),
        # When training ends and (global_time) the held-out and the test periods start, in Unix seconds: a
        # model trained on events up to a time at or after today's cut may have learnt today's validation and
        # test events (a warm start compares `held_out_from`, recsys/warm.py) or its test events (the gate,
        # `test_from`, recsys/promotion.py) — late-arriving data moves the quantile cuts earlier.
        "train_until": int(train_times.max()) if len(train_times) else None,
        "held_out_from": cuts[0] if cuts else None,
        "test_from": cuts[1] if cuts else None,
    }


def save(prepared: Prepared, out_dir: str | Path) -> None:
    """Write the prepared dataset as a whole new `out_dir`: a sibling temp folder, then renames (a kill
    leaves the previous dataset, not its fingerprint over some new tables; at most a `.<name>-<hex>` folder
    that the next save removes)."""
    out = Path(out_dir)
    remove_stale_temp_dirs(out)  # (refuses a file where `out` or a folder above it goes: before any mkdir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}-{secrets.token_hex(4)}")
    tmp.mkdir()  # (not mkdtemp: its 0700 would become the dataset's mode)
    try:
        prepared.events.to_parquet(tmp / "events.parquet", index=False)
        prepared.items.to_parquet(tmp / "items.parquet", index=False)
        prepared.users.to_parquet(tmp / "users.parquet", index=False)
        # Written last: its presence marks a complete directory.
        (tmp / layout.PREPARED_FINGERPRINT).write_text(json.dumps(prepared.fingerprint, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load(prepared_dir: str | Path) -> Prepared:
    path = Path(prepared_dir)
    if not (path / layout.PREPARED_FINGERPRINT).is_file():
        raise PrepareError(f"{path} is not a prepared dataset (no {layout.PREPARED_FINGERPRINT}); `recsys bootstrap && dvc repro prepare` builds it (the flows and `bash scripts/demo.sh` do)")
    import pyarrow as pa

    part = path / layout.PREPARED_FINGERPRINT
    try:
        fingerprint = json.loads(part.read_text(encoding="utf-8"))
        frames = {}
        for name in ("events", "items", "users"):
            part = path / f"{name}.parquet"
            frames[name] = pd.read_parquet(part)
    except (OSError, ValueError, pa.ArrowException) as err:  # missing, truncated, not JSON, not Parquet
        raise PrepareError(f"{part} cannot be read ({first_line(err)}): the prepare stage's output is damaged; "
                           "rebuild it with `dvc repro prepare`") from err
    return Prepared(events=frames["events"], items=frames["items"], users=frames["users"],
                    fingerprint=fingerprint)


def read_titles(store: Path) -> pd.DataFrame | None:
    items_csv = store / "items.csv"
    if not items_csv.is_file():
        return None
    try:
        return pd.read_csv(items_csv, dtype=str)
    except (OSError, ValueError) as err:  # not UTF-8 text, not CSV
        raise PrepareError(f"{items_csv} cannot be read ({first_line(err)}); put the data "
                           "version back with `dvc checkout data.dvc` (or `dvc pull data.dvc`)") from err


def main(argv: list[str] | None = None,
         before_read: Callable[[Path, IngestConfig], object] | None = None) -> None:
    """The prepare stage. `before_read(repo root, ingest config)` runs first: the stage's `__main__` passes
    `recsys.ingest.recover` (an interrupted ingest commit is completed or rolled back before the store is
    read), kept out of this function so that modules importing this one do not depend on the ingest code.
    The store and the output default to those of the params file's repository (`params_root`)."""
    from recsys.store import read_store

    parser = ArgumentParser("recsys.prepare", description="prepare stage: raw store → split dataset")
    parser.add_argument("--params", type=nonempty_path, default=layout.PARAMS)
    parser.add_argument("--store", type=nonempty_path,
                        help=f"raw store (default: {layout.DATA} beside the params file)")
    parser.add_argument("--out", type=nonempty_path,
                        help=f"output folder (default: {layout.PREPARED} beside the params file)")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    if before_read is not None:
        before_read(params_root(args.params), params.ingest)  # no reader sees a half-committed batch
    paths = layout.Layout(params_root(args.params, relative=True))
    store = args.store if args.store is not None else paths.data
    out = args.out if args.out is not None else paths.prepared
    interactions = read_store(store)
    if len(interactions) == 0:
        raise PrepareError(f"no interactions in the raw store {store}/: run `recsys bootstrap` first (it runs "
                           "`dvc pull`, or generates the default dataset)")
    prepared = prepare(interactions, params.prepare, read_titles(store))
    require_targets(prepared, params.prepare)
    save(prepared, out)
    fp = prepared.fingerprint
    log.info("prepared users=%d items=%d events=%d valid=%d test=%d fingerprint=%s", fp["n_users"],
             fp["n_items"], fp["n_events"], fp["n_valid"], fp["n_test"], fp["fingerprint"][:12])


if __name__ == "__main__":
    from recsys.entry import run_entry
    from recsys.ingest import recover

    run_entry(lambda: main(before_read=recover))
