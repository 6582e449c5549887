"""The retraining loop end to end: ingest the inbox, then retrain + gate + register.

    python -m flows.pipeline     # the README's main job; prints the champion and a sample recommendation

A run with no new data retrains nothing (DVC finds every stage up to date) and the gate replays its earlier
decision, so the nightly schedule is cheap when nothing arrived.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from prefect import flow

from flows.ingest import ingest
from flows.retrain import retrain

ROOT = Path(".")  # flows run from the repository root (deployments set it in their pull step)


@flow(name="pipeline", log_prints=True)
def pipeline(
    models: list[str] | None = None,
    force: bool = False,
    epochs: int | None = None,
    inbox: str | None = None,
    repo_root: str = str(ROOT),
    params_file: str = "params.yaml",
) -> dict[str, Any]:
    """Ingest new batches, then retrain what changed and gate the best candidate.

    Args:
        models: models to train (default: all in params.yaml).
        force: retrain even when nothing changed.
        epochs: override `train.epochs` for this run only.
        inbox: inbox folder (default: params.yaml `ingest.inbox`).
        repo_root: the repository (DVC workspace).
        params_file: params file name inside the repository.
    """
    ingested = ingest(inbox=inbox, repo_root=repo_root, params_file=params_file)
    retrained = retrain(models=models, force=force, epochs=epochs, repo_root=repo_root, params_file=params_file)
    return {"ingest": {k: v for k, v in ingested.items() if k != "summaries"}, "retrain": retrained}


def describe_champion(repo_root: Path, params_file: str = "params.yaml", k: int = 5) -> str:
    """A few lines for people: the champion and what it recommends to one user."""
    from recsys.commands.recommend import recommend_for_user
    from recsys.config import load_params
    from recsys.prepare import load
    from recsys.registry import open_registry

    params = load_params(repo_root / params_file)
    registry = open_registry(params.registry, repo_root, params.gate)
    version = registry.champion_version()
    if version is None:
        return "no champion yet"
    info = registry.get_version(version)
    model, meta = registry.load_champion()
    prepared_dir = repo_root / "artifacts" / "prepared"
    user = str(load(prepared_dir).users["user_id"].iloc[0])
    recs = recommend_for_user(model, meta, registry.champion_dir(), prepared_dir, user, k, None)
    lines = [f"champion: version {version} ({info.architecture}), test ndcg@10 = "
             f"{info.metrics.get('ndcg@10', float('nan')):.4f}", f"top-{k} for user {user}:"]
    lines += [f"  {r.rank}. {r.item_id}  {r.title or ''}  (score {r.score:.3f})" for r in recs]
    return "\n".join(lines)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description="run the pipeline flow (ingest → retrain → gate)")
    parser.add_argument("--models", nargs="*", help="models to train (default: all in params.yaml)")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--repo-root", default=str(ROOT))
    args = parser.parse_args()
    summary = pipeline(models=args.models, force=args.force, epochs=args.epochs, repo_root=args.repo_root)
    print(json.dumps(summary, indent=2, default=str))
    print(describe_champion(Path(args.repo_root)))
