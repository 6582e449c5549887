"""What `recsys ingest` refuses before anything is locked, moved or written: an inbox that is no inbox (the
repository, a folder above it, a folder the system owns). A real git + DVC repository with one batch
ingested and the files of a project (README.md, pyproject.toml, …); `recsys ingest` runs as a real
subprocess, and every file and folder of the repository is compared before and after."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flow_support import NOT_AN_INBOX
from test_ingest_support import VENV_BIN, copy_repo, events, make_dvc_repo, run, tree, write_frame

pytestmark = pytest.mark.slow
PARAMS = "ingest:\n  inbox: {inbox}\n  max_unseen_item_share: 1.0\n"
PROJECT_FILES = {"README.md": "# a project\n", "pyproject.toml": "[project]\nname = 'shop'\n",
                 "prefect.yaml": "name: shop\n", "dvc.yaml": "stages: {}\n"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("refusals")
    repo = make_dvc_repo(base / "repo", base / "remote")
    (repo / "params.yaml").write_text(PARAMS.format(inbox="inbox"))
    done = cli(repo, str(write_frame(repo / "inbox" / "history.csv", events(30))))
    assert done.returncode == 0, done.stderr  # data/, data.dvc, ingest_manifest.jsonl, .ingest/, reports/
    for name, text in PROJECT_FILES.items():
        (repo / name).write_text(text)
    return repo


@pytest.fixture
def repo(template, tmp_path):
    repo = copy_repo(template, tmp_path / "repo")
    remote = tmp_path / "remote"
    run(["cp", "-r", str(template.parent / "remote"), str(remote)], tmp_path)
    run([str(VENV_BIN / "dvc"), "remote", "modify", "local", "url", str(remote)], repo)
    return repo


def cli(repo, *args):
    """`recsys ingest ARGS... --params params.yaml` in a fresh interpreter, from the repository."""
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop("RECSYS_FAULT", None)
    return subprocess.run([sys.executable, "-m", "recsys.cli", "ingest", *args, "--params", "params.yaml"],
                          cwd=repo, env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("inbox, why", [
    ("''", "{repo} is the repository root"),
    ("'.'", "{repo} is the repository root"),
    ("..", "{repo.parent} is a folder above the repository {repo}"),
    ("data", "{repo}/data is data/, the raw store"),
    (".dvc/cache", "{repo}/.dvc/cache lies in .dvc/, DVC's cache and configuration"),
    (".git", "{repo}/.git is .git/, git's repository"),
    (".ingest", "{repo}/.ingest is .ingest/, ingest's state and locks"),
    ("reports", "{repo}/reports holds reports/ingest/, ingest's reports (ingest.reports)"),
    ("artifacts/models", "{repo}/artifacts/models lies in artifacts/, the pipeline's outputs"),
], ids=lambda value: value if "{" not in value else "")
@pytest.mark.parametrize("args", [[], ["README.md"]], ids=["whole inbox", "a file"])
def test_an_inbox_that_is_no_inbox_is_refused_before_anything_is_touched(repo, inbox, why, args):
    """`ingest.inbox: ''` was the repository root: every file of it was taken for a batch and moved into
    `rejected/` — README.md, params.yaml, dvc.yaml, data.dvc, dvc.lock, the manifest — with a report each."""
    (repo / "params.yaml").write_text(PARAMS.format(inbox=inbox))
    before = tree(repo)
    done = cli(repo, *args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"error: inbox {why.format(repo=repo)}: {NOT_AN_INBOX}"], done.stderr
    assert done.stdout == ""
    assert tree(repo) == before  # nothing moved, locked, written or created
