"""End to end on a copy of the repository: `recsys bootstrap` + `dvc repro` build every model's metrics, a
second repro re-runs nothing, and a model hyperparameter change re-runs only that model's stages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from flow_support import clone_repo, remote_of, running_stages, sh, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

METRICS = ("ndcg@10", "hr@10", "mrr")
MODELS = ["mostpop", "sasrec", "bert4rec", "mojito"]


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = clone_repo(tmp_path_factory.mktemp("pipeline") / "repo")
    return repo, subprocess_env(), remote_of(repo)


def write_tiny_params(repo: Path, write_params, dropout: float = 0.1) -> None:
    write_params({"models": MODELS, "train": {"epochs": 3, "patience": 2},
                  "sasrec": {"dropout": dropout}}, path=repo / "params.yaml")


def test_bootstrap_repro_and_incremental_rebuild(pipeline_repo, write_params):
    repo, env, remote = pipeline_repo
    write_tiny_params(repo, write_params)
    assert yaml.safe_load((repo / "params.yaml").read_text())["generate"]["n_users"] == 40

    sh(["recsys", "bootstrap", "--root", str(repo)], repo, env)
    assert any((repo / "data" / "interactions").glob("part-*.parquet"))
    assert any(p.is_file() for p in remote.rglob("*")), "bootstrap pushed nothing to the DVC remote"

    first = sh(["dvc", "repro"], repo, env)
    assert running_stages(first) == {"prepare"} | {f"{stage}@{m}" for stage in ("train", "evaluate") for m in MODELS}
    for model in MODELS:
        metrics = json.loads((repo / "metrics" / f"{model}.json").read_text())
        for key in METRICS:
            assert 0.0 <= metrics[key] <= 1.0, (model, key, metrics[key])
        assert (repo / "artifacts" / "models" / model / "model.safetensors").is_file()
        assert (repo / "artifacts" / "eval" / model / "per_user.parquet").is_file()
    assert (repo / "plots" / "sasrec.csv").read_text().count("\n") == 1 + 3  # header + 3 epochs

    shown = sh(["dvc", "metrics", "show"], repo, env)
    assert "ndcg@10" in shown and "hr@10" in shown and "metrics/sasrec.json" in shown
    sh(["dvc", "plots", "show"], repo, env)

    again = sh(["dvc", "repro"], repo, env)
    assert running_stages(again) == set(), again
    assert "didn't change" in again or "skipping" in again.lower()

    write_tiny_params(repo, write_params, dropout=0.3)
    changed = sh(["dvc", "repro"], repo, env)
    assert running_stages(changed) == {"train@sasrec", "evaluate@sasrec"}, changed

