"""An S3 DVC remote, end to end, against a real S3-compatible server (moto, over HTTP on 127.0.0.1): the
origin bootstraps, trains and `dvc push --run-cache`es to the bucket; fresh `git clone`s configured with the
README's commands get everything back and retrain nothing — with the origin's dvc.lock (`dvc pull`, then every
stage is up to date) and without it (`dvc repro --pull` restores every stage from the run-cache in S3)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from flow_support import make_repo, running_stages, sh, subprocess_env
from s3 import S3Server, isolated_aws_env, s3_server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODELS = ["mostpop", "sasrec"]
STAGES = {"prepare"} | {f"{stage}@{model}" for stage in ("train", "evaluate") for model in MODELS}
# Outputs git does not carry (all git-ignored): only the remote brings them to a clone.
SHARED_FILES = [f"metrics/{m}.json" for m in MODELS] + [f"plots/{m}.csv" for m in MODELS]
PREFIX = "dvc"  # the remote is s3://<bucket>/dvc
GIT = ["git", "-c", "user.name=recsys-tests", "-c", "user.email=tests@example.invalid", "-c",
       "commit.gpgsign=false"]


def use_s3_remote(repo: Path, server: S3Server, bucket: str, env: dict[str, str]) -> None:
    """The README's commands on the origin: the remote's URL in `.dvc/config` (committed, so clones have it),
    endpoint and credentials in `--local` config (git-ignored)."""
    sh(["dvc", "config", "--local", "--unset", "core.remote"], repo, env)  # clone_repo's private local remote
    sh(["dvc", "remote", "add", "-d", "storage", f"s3://{bucket}/{PREFIX}"], repo, env)
    set_local_remote_options(repo, server, env)


def set_local_remote_options(repo: Path, server: S3Server, env: dict[str, str], **extra: str) -> None:
    """What every clone runs again: `.dvc/config.local` is not cloned."""
    options = {"endpointurl": server.endpoint_url, "access_key_id": server.access_key_id,
               "secret_access_key": server.secret_access_key, **extra}
    for option, value in options.items():
        sh(["dvc", "remote", "modify", "--local", "storage", option, value], repo, env)


def skipped_stages(dvc_output: str, reason: str) -> set[str]:
    """Stages `dvc repro` skipped with `reason` ("didn't change, skipping" or "is cached - skipping run")."""
    return {line.split("'")[1] for line in dvc_output.splitlines()
            if line.startswith("Stage '") and reason in line}


@dataclass
class Origin:
    repo: Path
    env: dict[str, str]
    seed_commit: str  # data.dvc and params, no dvc.lock: what a teammate has before anyone trained


@pytest.fixture(scope="module")
def origin(s3_server: S3Server, tmp_path_factory) -> Origin:  # noqa: F811
    if shutil.which("git") is None:
        pytest.skip("needs git")
    env = isolated_aws_env(subprocess_env())
    bucket = s3_server.create_bucket()
    repo = make_repo(tmp_path_factory.mktemp("s3") / "origin",
                     {"models": MODELS, "train": {"epochs": 2, "patience": 2}}, bootstrap=False)
    use_s3_remote(repo, s3_server, bucket, env)
    sh(["recsys", "bootstrap", "--root", str(repo)], repo, env)
    sh(["git", "add", "-A"], repo, env)
    sh([*GIT, "commit", "-qm", "seed data"], repo, env)
    seed_commit = sh(["git", "rev-parse", "HEAD"], repo, env).strip()

    assert running_stages(sh(["dvc", "repro"], repo, env)) == STAGES
    # Not pushed yet: the remote lacks the pipeline's outputs and says so ("in sync" below means something).
    status = sh(["dvc", "status", "--cloud"], repo, env).splitlines()
    unpushed = [line.split(":", 1)[1].strip() for line in status if line.strip().startswith("new:")]
    for output in ("metrics/sasrec.json", "plots/sasrec.csv", "artifacts/models/sasrec/model.safetensors"):
        assert output in unpushed, unpushed
    assert not s3_server.keys(bucket, f"{PREFIX}/runs/")

    sh(["dvc", "push", "--run-cache"], repo, env)
    assert "Cache and remote 'storage' are in sync" in sh(["dvc", "status", "--cloud"], repo, env)
    assert s3_server.keys(bucket, f"{PREFIX}/runs/"), "no run-cache entry reached the bucket"
    sh(["git", "add", "dvc.lock"], repo, env)
    sh([*GIT, "commit", "-qm", "trained"], repo, env)
    return Origin(repo, env, seed_commit)


def fresh_clone(origin: Origin, target: Path, server: S3Server, **remote_options: str) -> Path:
    sh(["git", "clone", "-q", str(origin.repo), str(target)], target.parent, origin.env)
    assert not (target / ".dvc" / "config.local").exists()  # endpoint and credentials stay behind
    set_local_remote_options(target, server, origin.env, **remote_options)
    return target


def assert_same_results(origin: Origin, clone: Path) -> None:
    for name in SHARED_FILES:
        assert (clone / name).read_bytes() == (origin.repo / name).read_bytes(), name


def test_clone_pulls_everything_and_repro_retrains_nothing(origin, s3_server, tmp_path):  # noqa: F811
    clone = fresh_clone(origin, tmp_path / "clone", s3_server)
    assert not (clone / "metrics").exists() and not (clone / "artifacts").exists()  # git did not bring them

    sh(["dvc", "pull"], clone, origin.env)
    assert_same_results(origin, clone)
    sh(["recsys", "warm"], clone, origin.env)  # each model's warm source (a dep of its train stage; not in git)
    repro = sh(["dvc", "repro"], clone, origin.env)
    assert running_stages(repro) == set(), repro
    assert skipped_stages(repro, "didn't change, skipping") == STAGES, repro
    assert "Data and pipelines are up to date" in sh(["dvc", "status"], clone, origin.env)
    assert sh(["git", "status", "--porcelain"], clone, origin.env) == ""  # dvc.lock untouched


def test_clone_without_the_lock_file_restores_every_stage_from_the_s3_run_cache(origin, s3_server,
                                                                                tmp_path):  # noqa: F811
    clone = fresh_clone(origin, tmp_path / "clone", s3_server)
    sh(["git", "checkout", "-q", origin.seed_commit], clone, origin.env)
    assert not (clone / "dvc.lock").exists()

    sh(["recsys", "warm"], clone, origin.env)
    repro = sh(["dvc", "repro", "--pull"], clone, origin.env)
    assert running_stages(repro) == set(), repro
    assert skipped_stages(repro, "is cached - skipping run") == STAGES, repro
    assert_same_results(origin, clone)
    assert (clone / "dvc.lock").read_text() == (origin.repo / "dvc.lock").read_text()


def test_pull_from_a_bucket_without_the_data_fails(origin, s3_server, tmp_path):  # noqa: F811
    empty = s3_server.create_bucket()
    clone = fresh_clone(origin, tmp_path / "clone", s3_server, url=f"s3://{empty}/{PREFIX}")
    done = subprocess.run(["dvc", "pull"], cwd=clone, env=origin.env, capture_output=True, text=True,
                          timeout=600)
    output = done.stdout + done.stderr
    # Same server and credentials as the passing tests: the failure is the missing data, not the connection.
    assert done.returncode != 0, output
    assert "Missing cache files" in output and "failed to pull data from the cloud" in output, output
    assert not (clone / "metrics" / "sasrec.json").exists()
