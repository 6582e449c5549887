"""Helpers shared by the ingest tests (no tests here): tiny repos, batch files, byte snapshots."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys.config import IngestConfig

VENV_BIN = Path(sys.executable).parent
# Fixed clock-independent timestamps well inside [floor, now + skew].
T0 = 1_700_000_000


def config(**overrides) -> IngestConfig:
    base = dict(dvc_push=False, max_bad_row_share=0.2, max_unseen_item_share=1.0)
    base.update(overrides)
    return IngestConfig(**base)


def make_repo(root: Path) -> Path:
    (root / "inbox").mkdir(parents=True, exist_ok=True)
    return root


def write_csv(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def events(n: int, start: int = 0, users: int = 5, items: int = 7) -> pd.DataFrame:
    """n distinct well-formed events."""
    idx = range(start, start + n)
    return pd.DataFrame(
        {
            "user_id": [f"u{i % users}" for i in idx],
            "item_id": [f"i{i % items}" for i in idx],
            "timestamp": [T0 + i for i in idx],
            "event": ["view" if i % 3 else "click" for i in idx],
        }
    )


def write_frame(path: Path, frame: pd.DataFrame) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        raise ValueError(path)
    return path


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file that a rejected/failed ingest must leave alone."""
    watched = [root / "ingest_manifest.jsonl", root / "data.dvc", root / ".gitignore"]
    out = {}
    data = root / "data"
    if data.exists():
        watched += sorted(p for p in data.rglob("*") if p.is_file())
    if (root / ".ingest" / "pending").exists():
        watched += sorted((root / ".ingest" / "pending").iterdir())
    for path in watched:
        if path.exists():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, f"{cmd} failed: {result.stderr}"
    return result.stdout


def make_dvc_repo(root: Path, remote: Path) -> Path:
    """A throw-away git + DVC repository with a local default remote."""
    make_repo(root)
    run(["git", "init", "-q"], root)
    run(["git", "config", "user.email", "t@example.com"], root)
    run(["git", "config", "user.name", "t"], root)
    dvc = [str(VENV_BIN / "dvc")] if (VENV_BIN / "dvc").exists() else [sys.executable, "-m", "dvc"]
    run([*dvc, "init", "-q"], root)
    run([*dvc, "config", "core.analytics", "false"], root)
    remote.mkdir(parents=True, exist_ok=True)
    run([*dvc, "remote", "add", "-d", "local", str(remote)], root)
    return root


def copy_repo(template: Path, target: Path) -> Path:
    shutil.copytree(template, target, symlinks=True)
    return target
