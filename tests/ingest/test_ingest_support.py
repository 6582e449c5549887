"""Helpers shared by the ingest tests (no tests here): tiny repos, batch files, byte snapshots."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from dvc_support import (  # noqa: F401 (re-exported)
    VENV_BIN,
    copy_repo,
    copy_with_its_remote,
    make_dvc_repo,
    run,
    tree,
)

from recsys.config import IngestConfig

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
