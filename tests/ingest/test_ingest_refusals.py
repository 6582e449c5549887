"""What `recsys ingest` refuses before anything is locked, moved or written: an inbox that is no inbox (the
repository, a folder above it, a folder the system owns) and a path that names no batch file in the inbox:
mistakes on the command line, said as one `error:` line, not rejected batches. A real git + DVC repository
with one batch ingested and the files of a project (README.md, pyproject.toml, …); `recsys ingest` runs as
a real subprocess, and every file and folder of the repository is compared before and after."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_support import NOT_AN_INBOX
from test_ingest_support import VENV_BIN, copy_with_its_remote, events, make_dvc_repo, tree, write_frame

from recsys.ingest.layout import NOTHING_TO_INGEST

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
    return copy_with_its_remote(template, tmp_path)


def cli(repo, *args):
    """`recsys ingest ARGS... --params params.yaml` in a fresh interpreter, from the repository."""
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop("RECSYS_FAULT", None)
    return subprocess.run([sys.executable, "-m", "recsys.cli", "ingest", *args, "--params", "params.yaml"],
                          cwd=repo, env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("inbox, why", [
    ("'.'", "{repo} is the repository root"),  # (`''` is refused as params.yaml loads: tests/test_config.py)
    ("..", "{repo.parent} is a folder above the repository {repo}"),
    ("data", "{repo}/data is data/, the raw store data.dvc versions"),
    (".dvc/cache", "{repo}/.dvc/cache lies in .dvc/, DVC's cache and configuration"),
    (".git", "{repo}/.git is .git/, git's repository"),
    (".ingest", "{repo}/.ingest is .ingest/, ingest's state and locks"),
    ("reports", "{repo}/reports holds reports/ingest/, ingest's reports (ingest.reports)"),
    ("artifacts/models", "{repo}/artifacts/models lies in artifacts/, the pipeline's outputs"),
    ("registry", ("{repo}/registry is registry/, the model registry "
                  "(registry.url, registry.artifact_root)")),
    ("expectations", ("{repo}/expectations is expectations/, the expectation suites the batches are "
                      "validated with")),
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


@pytest.mark.parametrize("setting, says", [
    ("quarantine: params.yaml", ("ingest.quarantine ({repo}/params.yaml) is a file, not a folder: set "
                                 "ingest.quarantine in params.yaml to a folder, such as quarantine")),
    ("reports: data/reports", ("ingest.reports ({repo}/data/reports) lies in data/, the raw store data.dvc "
                               "versions: set ingest.reports in params.yaml to a path of its own, such as "
                               "reports/ingest")),
    ("manifest: .dvc/m.jsonl", ("ingest.manifest ({repo}/.dvc/m.jsonl) lies in .dvc/, DVC's cache and "
                                "configuration: set ingest.manifest in params.yaml to a path of its own, such as "
                                "ingest_manifest.jsonl")),
], ids=["quarantine is a file", "reports in the store", "manifest in .dvc"])
def test_an_output_path_a_run_cannot_or_must_not_write_is_refused_before_anything_is_touched(repo, setting,
                                                                                              says):
    """`quarantine: params.yaml` failed in the commit, whose cleanup then failed too and left a journal that
    broke every later run and reader; `reports: data` wrote reports into the versioned raw store."""
    (repo / "params.yaml").write_text(PARAMS.format(inbox="inbox") + f"  {setting}\n")
    batch = events(10, start=500)
    batch.loc[0, "user_id"] = None  # one row to quarantine
    write_frame(repo / "inbox" / "b.csv", batch)
    before = tree(repo)
    done = cli(repo)
    assert (done.returncode, done.stdout) == (1, ""), done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"error: {says.format(repo=repo)}"], done.stderr
    assert tree(repo) == before


def test_a_quarantine_on_another_file_system_is_refused_before_anything_is_touched(repo):
    """A quarantine file is written in .ingest/tmp/ and renamed into place, which cannot cross file systems:
    the rename failed at the first bad row ("could not write the store (Invalid cross-device link)"), and the
    batch then stayed in the inbox, stopping every later run at it. A real second file system (tmpfs)."""
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == repo.stat().st_dev:
        pytest.skip("no second file system at /dev/shm")
    quarantine = other / f"recsys-quarantine-{os.getpid()}"  # not created: refused before anything is written
    (repo / "params.yaml").write_text(PARAMS.format(inbox="inbox") + f"  quarantine: {quarantine}\n"
                                      "  max_bad_row_share: 0.2\n")
    batch = events(10, start=500)
    batch.loc[0, "user_id"] = None  # one row to quarantine (1 in 10 is within the share allowed)
    write_frame(repo / "inbox" / "b.csv", batch)
    before = tree(repo)
    done = cli(repo)
    assert (done.returncode, done.stdout) == (1, ""), done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: ingest.quarantine ({quarantine}) is on another file system than the workspace's .ingest/ "
        "(where ingest writes each quarantine file before one rename puts it in place): set ingest.quarantine "
        "in params.yaml to a folder on the repository's disk, such as quarantine"], done.stderr
    assert tree(repo) == before and not quarantine.exists()


@pytest.mark.parametrize("name, says", [
    ("inbox/batch.csv", "inbox/batch.csv does not exist; the inbox {inbox} holds sub/, waiting.csv"),
    ("{outside}", ("{outside} is outside the inbox {inbox}: move the file into the inbox, then ingest it "
                   "from there")),
    ("README.md", ("README.md is outside the inbox {inbox}: move the file into the inbox, then ingest it "
                   "from there")),
    ("inbox/sub", ("inbox/sub is a folder: ingest reads one file per batch (CSV, JSON lines or Parquet); "
                   "name its files, or move them into the inbox itself")),
], ids=["missing", "outside", "README.md", "a folder in the inbox"])
def test_a_path_that_names_no_batch_in_the_inbox_is_refused_before_anything_is_touched(
        repo, tmp_path, name, says):
    """These were `rejected …` lines, as if a batch had been read (`recsys ingest inbox/batch.csv` for a
    missing file said `rejected batch.csv: inbox/batch.csv does not exist or is not a regular file`)."""
    outside = write_frame(tmp_path / "outside.csv", events(3, start=100))
    write_frame(repo / "inbox" / "waiting.csv", events(5, start=200))
    write_frame(repo / "inbox" / "sub" / "part.csv", events(5, start=300))
    before = tree(repo)
    done = cli(repo, "inbox/waiting.csv", name.format(outside=outside))  # a good batch first: not ingested
    assert done.returncode == 1, done.stdout + done.stderr
    line = "error: " + says.format(inbox=(repo / "inbox").resolve(), outside=outside)
    assert (done.stdout, done.stderr.splitlines()) == ("", [line]), done.stdout + done.stderr
    assert tree(repo) == before


def test_a_missing_file_says_the_inbox_is_empty(repo):
    before = tree(repo)
    done = cli(repo, "inbox/batch.csv")
    assert done.returncode == 1, done.stdout + done.stderr
    inbox = (repo / "inbox").resolve()
    assert done.stderr.splitlines() == [f"error: inbox/batch.csv does not exist; the inbox {inbox} is empty"]
    assert tree(repo) == before


@pytest.mark.parametrize("folder, what, why", [("rejected", "rejected", ": its report says why"),
                                               ("processed", "ingested", "")])
def test_a_batch_named_again_after_a_run_filed_it_says_where(repo, folder, what, why):
    """Naming a batch a run had already rejected said only that the inbox was empty."""
    write_frame(repo / "inbox" / folder / "batch.csv", events(5, start=400))
    before = tree(repo)
    done = cli(repo, "inbox/batch.csv")
    assert done.returncode == 1, done.stdout + done.stderr
    inbox = (repo / "inbox").resolve()
    assert done.stderr.splitlines() == [
        f"error: inbox/batch.csv does not exist (a batch of that name was {what} before and filed as "
        f"{inbox / folder / 'batch.csv'}{why}); the inbox {inbox} is empty"]
    assert tree(repo) == before


def test_naming_the_inbox_ingests_every_file_in_it(repo):
    """`recsys ingest inbox` said `rejected inbox: inbox is a folder: … move its files into the inbox one by
    one and remove the folder` — it told the user to delete the inbox."""
    write_frame(repo / "inbox" / "waiting.csv", events(5, start=200))
    before = tree(repo)
    refused = cli(repo, "inbox", "README.md")  # every other name is checked all the same
    assert refused.returncode == 1 and refused.stderr.startswith("error: README.md is outside the inbox")
    assert tree(repo) == before
    done = cli(repo, "inbox")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("waiting.csv: ingested 5 rows (data version "), done.stdout
    assert (repo / "inbox" / "processed" / "waiting.csv").is_file() and (repo / "inbox").is_dir()
    again = cli(repo, "inbox")
    assert (again.returncode, again.stdout.strip()) == (0, NOTHING_TO_INGEST), again.stdout + again.stderr
