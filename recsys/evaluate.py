"""Honest evaluation: full ranking over the catalogue, seen items masked, ties against the target.

`evaluate_model` ranks every target of a split; `evaluate_checkpoint` does it for a saved model on any
prepared dataset — including one newer than the model (the gate re-scores the champion this way): items the
model never saw cannot be recommended, and a target it never saw ranks last.

The `evaluate` DVC stage (`main`) scores the test split once per model and writes `metrics/<model>.json`
(keys `ndcg@10`, `hr@10`, …) and the per-user values the promotion gate tests on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from recsys.atomic import atomic_path, write_text_atomic
from recsys.config import EvaluateConfig, Params
from recsys.device import resolve_device, retain_cpu_memory
from recsys.digest import CHECKPOINT_SHA256, directory_digest
from recsys.entry import model_stage_args
from recsys.layout import Layout
from recsys.metrics import per_user_metrics
from recsys.prepare import Prepared, load
from recsys.ranking import rank_targets, scoring_memory, summarise
from recsys.sequences import SequenceData

if TYPE_CHECKING:
    from recsys.models.base import SequentialModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]
    per_user: pd.DataFrame  # user, user_id, rank, ndcg@k, hr@k, mrr (one row per evaluated user)
    eval_fingerprint: str
    split: str
    seconds: float


# The ranking rule's version, in every evaluation fingerprint: scores stored under another rule (a champion's
# in the registry) are not compared with today's but re-scored. 2: a repeated target is a miss
# (`recsys.ranking.ranks_of`); 1 ranked it among the unseen items.
PROTOCOL_VERSION = 2


def eval_fingerprint(prepared: Prepared, split: str, mask_seen: bool = True) -> str:
    """Identifies the evaluation: the same prepared dataset, split and ranking rule ⇒ the same users, inputs,
    targets and rank of each (a model's figures comparable with another's). `evaluate.mask_seen: false` is
    another rule (the default's fingerprint is unchanged by the key)."""
    key = f"{prepared.fingerprint['fingerprint']}:{split}"
    rule = f"protocol{PROTOCOL_VERSION}" + ("" if mask_seen else ":all-items")
    return hashlib.sha256(f"{key}:{rule}".encode()).hexdigest()


def evaluate_model(
    model: SequentialModel,
    prepared: Prepared,
    split: str,
    config: EvaluateConfig = EvaluateConfig(),
    *,
    data: SequenceData | None = None,
    device: torch.device | str = "cpu",
    item_map: np.ndarray | None = None,
    user_map: np.ndarray | None = None,
) -> EvalResult:
    started = time.perf_counter()
    data = data or SequenceData.from_prepared(prepared)
    with scoring_memory(model, config.batch_size, "evaluate.batch_size", device, split):
        users, ranks, sampled = rank_targets(
            model, data, split, batch_size=config.batch_size, device=device, item_map=item_map,
            user_map=user_map, sampled_negatives=config.sampled_negatives, seed=config.seed,
            mask_seen=config.mask_seen,
        )
    values = per_user_metrics(ranks, config.ks)
    metrics = summarise(values)
    if sampled is not None:
        for name, vals in per_user_metrics(sampled, config.ks).items():
            metrics[f"sampled{config.sampled_negatives}_{name}"] = float(vals.mean())
    metrics["n_users"] = int(len(users))
    user_ids = prepared.users.set_index("user")["user_id"]
    per_user = pd.DataFrame({"user": users.astype(np.int32), "user_id": user_ids.loc[users].to_numpy(),
                             "rank": ranks.numpy().astype(np.int64)})
    for name, vals in values.items():
        per_user[name] = vals.numpy()
    return EvalResult(metrics, per_user, eval_fingerprint(prepared, split, config.mask_seen), split,
                      time.perf_counter() - started)


def vocabulary_maps(meta_items: list, meta_users: list, prepared: Prepared) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Dataset id → model id (0 = unknown to the model); None where the vocabularies are identical."""
    ds_items = [None, *prepared.items["item_id"].tolist()]
    ds_users = [None, *prepared.users["user_id"].tolist()]

    def build(model_ids: list, dataset_ids: list) -> np.ndarray | None:
        if list(model_ids) == dataset_ids:
            return None
        index = {raw: i for i, raw in enumerate(model_ids) if i > 0}
        return np.array([0] + [index.get(raw, 0) for raw in dataset_ids[1:]], dtype=np.int64)

    return build(meta_items, ds_items), build(meta_users, ds_users)


def evaluate_checkpoint(
    checkpoint_dir: str | Path,
    prepared_dir: str | Path,
    split: str = "test",
    config: EvaluateConfig = EvaluateConfig(),
    device: str = "cpu",
) -> EvalResult:
    from recsys.checkpoint import load_model

    model, meta = load_model(checkpoint_dir, device=device)
    prepared = load(prepared_dir)
    item_map, user_map = vocabulary_maps(meta["items"], meta["users"], prepared)
    return evaluate_model(model, prepared, split, config, device=device, item_map=item_map, user_map=user_map)


def score_test_split(checkpoint_dir: str | Path, prepared_dir: str | Path, params: Params, name: str,
                     cuda_absent_is_cpu: bool = False) -> EvalResult:
    """Score model `name`'s checkpoint on the test split where its evaluate stage runs: its own
    `train.device` (where the model trains is where its test pass runs; with `cuda_absent_is_cpu`, `cuda` on
    a machine without one is the CPU), its scoring batches' freed memory kept as `train.cpu_allocator`
    says — they free and allocate the same large blocks as validation does in training (speed only; the
    numbers are the same either way)."""
    train_config = params.train_config(name)
    wanted = train_config.device
    device = resolve_device("auto" if cuda_absent_is_cpu and wanted == "cuda" else wanted)
    retain_cpu_memory(train_config.cpu_allocator, device)
    return evaluate_checkpoint(checkpoint_dir, prepared_dir, "test", params.evaluate, device=str(device))


def write_outputs(result: EvalResult, metrics_path: Path, per_user_path: Path, extra: dict | None = None) -> None:
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    per_user_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(per_user_path, per_user_path.parent) as tmp:  # the gate reads both: never half of one
        result.per_user.to_parquet(tmp, index=False)
    payload = {**result.metrics, "eval_seconds": round(result.seconds, 3), "eval_fingerprint": result.eval_fingerprint,
               **(extra or {})}
    write_text_atomic(metrics_path, json.dumps(payload, indent=2, sort_keys=True) + "\n", metrics_path.parent)


def main(argv: list[str] | None = None) -> None:
    name, params, root = model_stage_args("recsys.evaluate", "evaluate stage: score the test split once",
                                          argv)
    paths = Layout(root)
    if not (paths.model_dir(name) / "model.json").is_file():  # before anything is loaded or allocated
        from recsys.checkpoint import CheckpointError

        raise CheckpointError(f"{paths.model_dir(name)} holds no trained {name}: run "
                              f"`dvc repro train@{name}` (or `recsys train --model {name}`) first")
    # Which checkpoint these numbers are of (the registry's address for it): a promotion refuses metrics of
    # another one — a checkpoint retrained, resumed or damaged since it was scored.
    checkpoint_sha256 = directory_digest(paths.model_dir(name))
    result = score_test_split(paths.model_dir(name), paths.prepared, params, name)
    train_summary = json.loads((paths.model_dir(name) / "model.json").read_text())
    write_outputs(result, paths.metrics(name), paths.per_user(name),
                  {"best_epoch": train_summary.get("best_epoch"), "valid": train_summary.get("valid_metrics", {}),
                   CHECKPOINT_SHA256: checkpoint_sha256})
    log.info("evaluate model=%s split=test %s", name,
             " ".join(f"{k}={v:.4f}" for k, v in result.metrics.items() if isinstance(v, float)))


if __name__ == "__main__":
    from recsys.entry import run_entry

    run_entry(main)
