"""DVC experiments, as README's entry points name them: `dvc exp run --temp -C artifacts/warm -S …` trains
and evaluates a model with other settings beside the workspace, `dvc exp show` compares them — and neither
touches the workspace's params.yaml, its metrics or the registry (an experiment never becomes a champion)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from flow_support import make_repo, sh, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GIT_IDENTITY = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
                "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.invalid"}


def experiments(shown: list[dict]) -> dict[str, dict]:
    """`dvc exp show --json` → {experiment name: its data (params, metrics)} for every experiment listed."""
    out = {}
    for baseline in shown:
        for branch in baseline.get("experiments") or []:
            for rev in branch.get("revs") or []:
                out[rev["name"]] = rev["data"]
    return out


@pytest.fixture
def committed_clone(tmp_path):
    """A fresh clone in miniature set up as README says (`recsys bootstrap`), committed as a clone is: its
    data.dvc names the data it holds (a clone's committed data.dvc names the default dataset)."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = make_repo(tmp_path / "repo")
    env = {**subprocess_env(), **GIT_IDENTITY}
    sh(["git", "add", "-A"], repo, env)
    sh(["git", "commit", "-q", "-m", "a clone"], repo, env)
    return repo, env


def test_a_temp_experiment_trains_other_settings_and_leaves_the_workspace_alone(committed_clone):
    repo, env = committed_clone
    params_before = (repo / "params.yaml").read_bytes()

    sh(["dvc", "exp", "run", "--temp", "-C", "artifacts/warm", "--name", "narrow", "-S", "sasrec.dim=8",
        "evaluate@sasrec"], repo, env)

    shown = experiments(json.loads(sh(["dvc", "exp", "show", "--json"], repo, env)))
    assert set(shown) == {"narrow"}, shown
    data = shown["narrow"]
    assert data["params"]["params.yaml"]["data"]["sasrec"]["dim"] == 8
    metrics = data["metrics"]["metrics/sasrec.json"]["data"]
    assert 0.0 < metrics["valid"]["ndcg@10"] <= 1.0 and 0.0 < metrics["ndcg@10"] <= 1.0, metrics
    # The workspace is as it was: its settings, no stage outputs of the experiment, no registry opened.
    assert (repo / "params.yaml").read_bytes() == params_before
    assert not (repo / "metrics").exists() and not (repo / "artifacts" / "models").exists()
    assert not (repo / "registry").exists()


def test_without_the_warm_source_copied_a_temp_experiment_cannot_start(committed_clone):
    """Why README's command copies `artifacts/warm`: the warm source is a dependency of every train stage
    that `recsys bootstrap` / `recsys warm` write outside git and DVC, so a temp workspace lacks it."""
    repo, env = committed_clone
    done = subprocess.run(["dvc", "exp", "run", "--temp", "-S", "sasrec.dim=8", "evaluate@sasrec"], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "artifacts/warm/sasrec" in done.stdout + done.stderr
