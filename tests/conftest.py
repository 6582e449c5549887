"""Shared fixtures: a tiny deterministic dataset (generated, prepared, saved) and small configs.

Everything here is offline and takes well under a second once per session. Fixtures with session scope hand
out shared objects: treat the frames as read-only (copy before changing them).
"""

from __future__ import annotations

import os

# Before anything imports Prefect / Great Expectations / DVC: no telemetry from tests.
os.environ["DO_NOT_TRACK"] = "1"
os.environ["GX_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
# A registry URL from the shell that runs the tests would redirect every registry they open.
os.environ.pop("RECSYS_REGISTRY_URL", None)

from pathlib import Path

import prefect.main  # noqa: F401  (see below)
import pytest
import torch
import yaml
from dvc_support import copy_repo, make_dvc_repo, point_remote
from flow_support import REPO_ROOT, merge_params

from recsys.config import GenerateConfig, PrepareConfig
from recsys.model_configs import TrainConfig

# Prefect's logging configuration, applied when it is first loaded, binds a console handler on the root logger
# to the sys.stderr of that moment (`import prefect` alone loads nothing: Prefect 3 loads lazily, and the
# first `from prefect import flow` configures logging — hence `prefect.main`). Loaded here, that is the session's
# stream; loaded first inside a test that captures output (capsys, CliRunner), it would be that test's stream,
# closed when the test ends, and every later log line in the worker would print a "Logging error" traceback
# into some other test's output.

# Tiny models on a shared 2-core machine: intra-op threads only add contention (a 5-epoch SASRec run on the
# tiny dataset takes ~0.2 s with one thread and 10 s+ with two when the other core is busy).
torch.set_num_threads(1)

TINY_GENERATE = GenerateConfig(n_users=40, n_items=30, mean_events_per_user=12, n_clusters=3, days=30, seed=1)
TINY_PREPARE = PrepareConfig(min_user_interactions=3, min_item_interactions=3)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_generate_config() -> GenerateConfig:
    """40 users × 30 items, ~12 events each, 3 genre chains: ~480 events."""
    return TINY_GENERATE


@pytest.fixture(scope="session")
def tiny_prepare_config() -> PrepareConfig:
    return TINY_PREPARE


@pytest.fixture(scope="session")
def tiny_generated(tiny_generate_config):
    """`recsys.data.Generated` (interactions + item titles) for the tiny config. Read-only."""
    from recsys.data import generate

    return generate(tiny_generate_config)


@pytest.fixture
def tiny_interactions(tiny_generated):
    """A fresh copy of the tiny canonical interaction table (safe to modify)."""
    return tiny_generated.interactions.copy()


@pytest.fixture(scope="session")
def tiny_prepared(tiny_generated, tiny_prepare_config):
    """`recsys.prepare.Prepared` of the tiny dataset (LOO split). Read-only."""
    from recsys.prepare import prepare

    return prepare(tiny_generated.interactions, tiny_prepare_config, tiny_generated.items)


@pytest.fixture(scope="session")
def tiny_prepared_dir(tiny_prepared, tmp_path_factory) -> Path:
    """The tiny prepared dataset saved as `artifacts/prepared` would be. Read-only."""
    from recsys.prepare import save

    out = tmp_path_factory.mktemp("prepared")
    save(tiny_prepared, out)
    return out


@pytest.fixture
def tiny_store(tmp_path, tiny_generated) -> Path:
    """A raw store (`<tmp>/data/interactions/part-0….parquet` + items.csv) holding the tiny dataset."""
    from recsys.data import write_store

    store = tmp_path / "data"
    write_store(tiny_generated, store)
    return store


@pytest.fixture(scope="session")
def tiny_sasrec_config():
    from recsys.models.sasrec import SASRecConfig

    return SASRecConfig(dim=16, n_layers=1, n_heads=1, dropout=0.1, max_len=20, loss="ce", n_negatives=8)


@pytest.fixture(scope="session")
def fast_train_config() -> TrainConfig:
    """A few CPU epochs without a progress bar; tests `dataclasses.replace` what they vary."""
    return TrainConfig(epochs=3, batch_size=16, lr=5e-3, patience=10, seed=0, device="cpu", progress="off",
                       eval_batch_size=64)


@pytest.fixture(scope="session")
def trained_sasrec(tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path_factory):
    """A SASRec checkpoint trained for 3 epochs on the tiny dataset: (TrainResult, checkpoint dir)."""
    from recsys.train import train_model

    root = tmp_path_factory.mktemp("trained_sasrec")
    result = train_model("sasrec", tiny_sasrec_config, fast_train_config, tiny_prepared, root / "model",
                         curve_path=root / "curve.csv", resume_root=root / "resume")
    return result, root / "model"


TINY_PARAMS_OVERRIDES = {
    "models": ["mostpop", "sasrec"],
    "generate": {"n_users": 40, "n_items": 30, "mean_events_per_user": 12, "n_clusters": 3, "days": 30,
                 "seed": 1},
    "prepare": {"min_user_interactions": 3, "min_item_interactions": 3},
    "train": {"epochs": 3, "patience": 2, "batch_size": 32, "lr": 0.005, "device": "cpu", "progress": "off",
              "eval_batch_size": 64},
    # the tiny rate for SASRec too: params.yaml's sasrec.train.lr (2e-3, for dim 128) would override train.lr
    "sasrec": {"dim": 16, "n_layers": 1, "n_heads": 1, "dropout": 0.1, "max_len": 20, "n_negatives": 8,
               "train": {"lr": 0.005}},
    "bert4rec": {"dim": 16, "n_layers": 1, "n_heads": 2, "ffn_dim": 32, "max_len": 20, "train": {"patience": 2}},
    "mojito": {"dim": 16, "n_layers": 1, "n_heads": 2, "max_len": 20, "time_dim": 4, "fism_items": 5},
}


@pytest.fixture
def write_params(repo_root, tmp_path):
    """Factory: write the repo's params.yaml merged with tiny settings and `overrides` (nested dicts merge,
    anything else replaces) to `path` (default `<tmp>/params.yaml`); returns the path."""
    base = yaml.safe_load((repo_root / "params.yaml").read_text())

    def write(overrides: dict | None = None, path: Path | None = None) -> Path:
        path = Path(path or tmp_path / "params.yaml")
        merged = merge_params(merge_params(base, TINY_PARAMS_OVERRIDES), overrides or {})
        path.write_text(yaml.safe_dump(merged, sort_keys=False))
        return path

    return write


@pytest.fixture(scope="module")
def dvc_template(tmp_path_factory):
    """One throw-away git + DVC repository per test module (`git init` + `dvc init` cost seconds)."""
    base = tmp_path_factory.mktemp("dvc-template")
    return make_dvc_repo(base / "repo", base / "remote")


@pytest.fixture
def dvc_repo(dvc_template, tmp_path):
    """A fresh copy of `dvc_template` with its own empty local remote at `tmp_path / "remote"`."""
    return point_remote(copy_repo(dvc_template, tmp_path / "repo"), tmp_path / "remote")
