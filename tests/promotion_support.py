"""A miniature pipeline workspace for the promotion tests (no tests here): real tiny trained models, their
`evaluate` stage outputs, a DVC pointer for the dataset version and a git history for the code version."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

DATA_MD5 = "0123456789abcdef0123456789abcdef.dir"


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def train(model: str, config, train_config, prepared, out: Path) -> Path:  # type: ignore[no-untyped-def]
    from recsys.train import train_model

    train_model(model, config, train_config, prepared, out, curve_path=out.parent / f"{model}-curve.csv")
    return out


def write_stage_outputs(  # type: ignore[no-untyped-def]
    root: Path, model: str, checkpoint: Path, prepared_dir: Path, evaluate_config
) -> None:
    """What `dvc repro evaluate@<model>` leaves: the checkpoint, metrics/<m>.json, per-user results."""
    from recsys.evaluate import evaluate_checkpoint, write_outputs

    target = root / "artifacts" / "models" / model
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(checkpoint, target)
    from recsys.digest import CHECKPOINT_SHA256, directory_digest

    result = evaluate_checkpoint(target, prepared_dir, "test", evaluate_config)
    write_outputs(result, root / "metrics" / f"{model}.json",
                  root / "artifacts" / "eval" / model / "per_user.parquet",
                  {CHECKPOINT_SHA256: directory_digest(target)})  # which checkpoint it scored, as the stage says


def make_workspace(root: Path, params_path: Path, prepared_dir: Path, checkpoints: dict[str, Path]) -> Path:
    """`root` as the pipeline leaves it after `dvc repro`, committed to git (then one tracked file edited,
    so the code version is dirty)."""
    from recsys.config import load_params

    params = load_params(params_path)
    root.mkdir(parents=True, exist_ok=True)
    if params_path != root / "params.yaml":
        shutil.copy2(params_path, root / "params.yaml")
    shutil.copytree(prepared_dir, root / "artifacts" / "prepared")
    for model, checkpoint in checkpoints.items():
        write_stage_outputs(root, model, checkpoint, root / "artifacts" / "prepared", params.evaluate)
    (root / "data.dvc").write_text(f"outs:\n- md5: {DATA_MD5}\n  nfiles: 1\n  path: data\n")
    (root / "code.py").write_text("VERSION = 1\n")
    (root / ".gitignore").write_text("/artifacts/\n/metrics/\n/registry*/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "workspace")
    (root / "code.py").write_text("VERSION = 2\n")  # uncommitted code change: '-dirty'
    return root


def version_rows(registry) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every field of every version, as the registry shows it (the creation time aside)."""
    return [{k: v for k, v in dataclasses.asdict(info).items() if k != "created_at"}
            for info in registry.list_versions()]


def event_rows(registry) -> list[dict]:  # type: ignore[no-untyped-def]
    return [{k: v for k, v in dataclasses.asdict(e).items() if k not in ("created_at", "id")}
            for e in registry.history()]


def evaluation_rows(registry) -> list[dict]:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from recsys.registry.db import Evaluation, ModelVersion
    from recsys.registry.db import read_session

    with read_session(registry.engine) as session:
        rows = session.execute(
            select(ModelVersion.version, Evaluation.eval_fingerprint, Evaluation.metrics, Evaluation.per_user,
                   Evaluation.source)
            .join(ModelVersion, ModelVersion.id == Evaluation.version_id)
            .order_by(ModelVersion.version, Evaluation.id)
        ).all()
    return [dict(row._mapping) for row in rows]
