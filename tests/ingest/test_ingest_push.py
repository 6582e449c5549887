"""Push is part of the commit, and every crash boundary converges: real git + DVC repos with a local remote,
`recsys ingest` run as a real subprocess that dies at each named boundary (RECSYS_FAULT makes it `os._exit`,
which is what `kill -9` does to it), then a re-run. Afterwards: exactly-once data, `dvc status` and
`dvc status -c` clean, no leftovers."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
from test_ingest_support import (
    VENV_BIN,
    config,
    copy_with_its_remote,
    events,
    make_dvc_repo,
    run,
    write_frame,
)

from recsys import ingest
from recsys.ingest import commit as commit_module
from recsys.ingest.layout import NOTHING_TO_INGEST
from recsys.ingest.manifest import read_manifest
from recsys.store import read_store

pytestmark = pytest.mark.slow
PARAMS = "ingest:\n  max_unseen_item_share: 1.0\n"
BOUNDARIES = ["after_journal", "part_temp_written", "after_part_write", "after_dvc_add", "after_manifest",
              "before_push", "after_push"]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("push")
    repo = make_dvc_repo(base / "repo", base / "remote")
    (repo / "params.yaml").write_text(PARAMS)
    result = cli(repo, repo / "inbox" / "h.csv", frame=events(30))
    assert result.returncode == 0, result.stderr
    return repo


@pytest.fixture
def repo(template, tmp_path):
    return copy_with_its_remote(template, tmp_path)


def cli(repo, path=None, frame=None, fault=None):
    """`recsys ingest [PATH] --params params.yaml` in a fresh interpreter, optionally dying at `fault`."""
    if frame is not None:
        write_frame(path, frame)
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop(ingest.FAULT_ENV, None)
    if fault:
        env[ingest.FAULT_ENV] = fault
    args = [sys.executable, "-m", "recsys.cli", "ingest", *([str(path)] if path else []), "--params",
            str(repo / "params.yaml")]
    return subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, check=False)


def repeated(result):
    """The lines of a run's stderr that say again what its stdout said (as a log record, say): none, when each
    thing is said once on the console."""
    said = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return [line for line in result.stderr.splitlines() if any(text in line for text in said)]


def dvc_clean(repo):
    """`dvc status` (workspace vs data.dvc) and `dvc status -c` (cache vs remote) both report nothing."""
    local = json.loads(run([str(VENV_BIN / "dvc"), "status", "--json", "data.dvc"], repo))
    remote = json.loads(run([str(VENV_BIN / "dvc"), "status", "-c", "--json", "data.dvc"], repo))
    return local == {} and remote == {}, (local, remote)


def leftovers(repo):
    state = repo / ".ingest"
    found = [p for p in (state / "tmp").rglob("*")] if (state / "tmp").exists() else []
    found += list((state / "pending").iterdir()) if (state / "pending").exists() else []
    found += [p for p in (repo / "data" / "interactions").iterdir() if p.name.startswith(".")]
    found += [state / "push-pending.json"] if (state / "push-pending.json").exists() else []
    found += list((state / "dvc-running").glob("*"))  # notes of `dvc` processes a killed run started
    return found


@pytest.mark.parametrize("fault", BOUNDARIES)
def test_killed_at_each_boundary_then_rerun_converges_exactly_once(repo, fault):
    batch = events(12, start=100)
    path = repo / "inbox" / "b.csv"
    crashed = cli(repo, path, frame=batch, fault=fault)
    assert crashed.returncode != 0, crashed.stdout  # it really died there
    assert "Traceback" not in crashed.stderr

    # The re-run: the file is still in the inbox (a crash before it was filed away) or in processed/.
    pending = path if path.exists() else repo / "inbox" / "processed" / "b.csv"
    again = cli(repo, pending)
    assert again.returncode == 0, again.stderr
    assert repeated(again) == [], again.stdout + again.stderr  # what recovery did: said once, on stdout
    assert len(read_store(repo / "data")) == 42  # exactly once
    assert [r["source"] for r in read_manifest(repo / "ingest_manifest.jsonl")] == ["h.csv", "b.csv"]
    clean, status = dvc_clean(repo)
    assert clean, status
    assert leftovers(repo) == []
    if fault in ("after_manifest", "before_push"):
        assert "already ingested" in again.stdout and "completed an interrupted push" in again.stdout


def test_nothing_new_run_finishes_a_pending_push_and_says_so(repo):
    crashed = cli(repo, repo / "inbox" / "b.csv", frame=events(5, start=200), fault="before_push")
    assert crashed.returncode != 0
    clean, _ = dvc_clean(repo)
    assert not clean  # committed locally, not on the remote
    again = cli(repo)  # empty inbox: nothing to ingest
    assert again.returncode == 0, again.stderr
    assert "completed an interrupted push: data version" in again.stdout
    clean, status = dvc_clean(repo)
    assert clean, status
    quiet = cli(repo)
    assert quiet.returncode == 0 and quiet.stdout.strip() == NOTHING_TO_INGEST, quiet.stdout



def test_a_run_with_pushes_off_keeps_the_remote_s_debt_for_the_next_run_with_them_on(repo, tmp_path):
    """A push killed midway, then runs under a params file with `ingest.dvc_push: false` (staging, say): they
    ingest without pushing and used to delete the marker, so the remote stayed short of both batches with
    nothing left to say so. Now the marker stays (no work for a nothing-new run while pushes are off), and
    the first run with pushes on pushes the store, every batch."""
    crashed = cli(repo, repo / "inbox" / "b.csv", frame=events(5, start=200), fault="before_push")
    assert crashed.returncode != 0 and not dvc_clean(repo)[0]
    marker = repo / ".ingest" / "push-pending.json"
    (repo / "params.yaml").write_text(PARAMS + "  dvc_push: false\n")
    staged = cli(repo, repo / "inbox" / "c.csv", frame=events(5, start=300))
    assert staged.returncode == 0, staged.stderr
    assert "c.csv: ingested 5 rows" in staged.stdout and "pushed" not in staged.stdout, staged.stdout
    quiet = cli(repo)
    assert quiet.returncode == 0 and quiet.stdout.strip() == NOTHING_TO_INGEST, quiet.stdout
    assert marker.is_file() and not dvc_clean(repo)[0]  # the remote still lacks b and c, and it is known
    (repo / "params.yaml").write_text(PARAMS)
    again = cli(repo)
    assert again.returncode == 0, again.stderr
    assert "completed an interrupted push: data version" in again.stdout, again.stdout
    clean, status = dvc_clean(repo)
    assert clean, status
    assert leftovers(repo) == [] and len(read_store(repo / "data")) == 40
def test_unreachable_remote_fails_the_run_with_one_line_and_the_next_run_pushes(repo, tmp_path):
    good_remote = run([str(VENV_BIN / "dvc"), "remote", "list"], repo).split()[1]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote folder should be")
    run([str(VENV_BIN / "dvc"), "remote", "modify", "local", "url", str(blocked)], repo)
    result = cli(repo, repo / "inbox" / "b.csv", frame=events(5, start=300))
    assert result.returncode == 1
    assert "b.csv: ingested 5 rows" in result.stdout
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "the DVC remote does not have data version" in error[0], result.stderr
    assert "Traceback" not in result.stderr
    run([str(VENV_BIN / "dvc"), "remote", "modify", "local", "url", good_remote], repo)
    again = cli(repo)
    assert again.returncode == 0 and "completed an interrupted push" in again.stdout, again.stderr
    clean, status = dvc_clean(repo)
    assert clean, status


def test_a_repository_without_a_remote_fails_the_push_as_not_transient(repo):
    """No remote configured fails the same way every time: not retried, and the line says what to set up."""
    for scope in ([], ["--local"]):
        subprocess.run([str(VENV_BIN / "dvc"), "remote", "default", "--unset", *scope], cwd=repo, check=False,
                       capture_output=True)
    write_frame(repo / "inbox" / "c.csv", events(5, start=400))
    with pytest.raises(ingest.PushFailed) as failed:
        ingest.ingest_batches([repo / "inbox" / "c.csv"], repo, config(dvc_push=True))
    assert failed.value.transient is False, str(failed.value)
    message = str(failed.value)
    assert "no remote specified" in message and "once DVC has a remote it can push to" in message, message
    assert [s.status for s in failed.value.run] == ["ingested"]  # committed locally all the same


def test_a_rejected_batch_fails_the_run_with_one_line_once_the_others_are_ingested_and_pushed(repo):
    """The good batch is ingested and pushed, the bad one moved to `rejected/` with its report; the run ends
    with one `error:` line naming it, as the flows do (they share `recsys.ingest.errors.rejection`)."""
    write_frame(repo / "inbox" / "a_good.csv", events(5, start=500))
    bad = repo / "inbox" / "b_bad.csv"
    bad.write_text("user_id,item_id\nu1\n")
    report = repo.resolve() / "reports" / "ingest" / f"b_bad-{ingest.file_sha256(bad)[:16]}.md"
    result = cli(repo)
    assert result.returncode == 1, result.stdout + result.stderr
    line = ("error: rejected 1 of 2 batches: b_bad.csv: malformed CSV: CSV parse error: Expected 2 columns, "
            f"got 1: u1 (moved to {repo.resolve()}/inbox/rejected/, report: {report})")
    assert [text for text in result.stderr.splitlines() if text.startswith("error:")] == [line], result.stderr
    assert result.stderr.splitlines()[-1] == line and "Traceback" not in result.stderr
    assert "a_good.csv: ingested 5 rows (data version " in result.stdout
    assert "pushed: data version " in result.stdout
    # Each thing once: no INFO record repeats the stdout lines, no WARNING (or stdout line) the rejection.
    console = result.stdout + result.stderr
    assert repeated(result) == [] and console.count("b_bad.csv") == 1, console
    assert "wrote store part" not in console, console
    assert (repo / "inbox" / "processed" / "a_good.csv").is_file()
    assert (repo / "inbox" / "rejected" / "b_bad.csv").is_file() and report.is_file()
    clean, status = dvc_clean(repo)
    assert clean, status


def test_a_batch_that_fails_after_others_were_committed_still_pushes_them(repo, monkeypatch):
    """A deterministic failure at the second batch (recording it fails: a full disk) is not retried, so the
    run pushes what it committed before the error goes up: the remote is not left short of the first batch
    (nor of the second's rows, in data.dvc since its `dvc add`) until some later run happens to push."""
    write_frame(repo / "inbox" / "a.csv", events(5, start=600))
    write_frame(repo / "inbox" / "b.csv", events(5, start=700))
    real = commit_module.append_manifest

    def full_at_b(manifest, record):  # the only mocked fault: ENOSPC cannot be produced for real here
        if record["source"] == "b.csv":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(manifest, record)

    monkeypatch.setattr(commit_module, "append_manifest", full_at_b)
    with pytest.raises(ingest.IngestError, match="recording the batch failed") as failed:
        ingest.ingest_inbox(repo, config(dvc_push=True))
    assert [s.status for s in failed.value.run] == ["ingested"]
    assert [a for a in failed.value.run.actions if a.startswith("pushed: data version ")], failed.value.run.actions
    clean, status = dvc_clean(repo)  # data.dvc names b's part since its `dvc add`: the remote has both
    assert clean, status
    # b's journal waits for recovery, which may add a version yet (a reader's recovery too): the marker stays
    assert (repo / ".ingest" / "push-pending.json").is_file()
    monkeypatch.undo()
    again = cli(repo)  # recovery records b, and the run pushes what it owes
    assert again.returncode == 0, again.stderr
    assert len(read_store(repo / "data")) == 40
    assert [r["source"] for r in read_manifest(repo / "ingest_manifest.jsonl")] == ["h.csv", "a.csv", "b.csv"]
    clean, status = dvc_clean(repo)
    assert clean, status
    assert leftovers(repo) == []


def test_a_batch_that_fails_while_the_remote_is_unreachable_says_both(repo, monkeypatch, tmp_path):
    """The push attempted after a batch's failure fails too: the batch's error is the one raised, the push's
    is said beside it, and the marker stays for the next run."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote folder should be")
    good_remote = run([str(VENV_BIN / "dvc"), "remote", "list"], repo).split()[1]
    run([str(VENV_BIN / "dvc"), "remote", "modify", "local", "url", str(blocked)], repo)
    write_frame(repo / "inbox" / "a.csv", events(5, start=800))
    write_frame(repo / "inbox" / "b.csv", events(5, start=900))
    real = commit_module.append_manifest

    def full_at_b(manifest, record):  # the only mocked fault: ENOSPC cannot be produced for real here
        if record["source"] == "b.csv":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(manifest, record)

    monkeypatch.setattr(commit_module, "append_manifest", full_at_b)
    with pytest.raises(ingest.IngestError, match="recording the batch failed") as failed:
        ingest.ingest_inbox(repo, config(dvc_push=True))
    late = [a for a in failed.value.run.actions if a.startswith("push not completed: ")]
    assert len(late) == 1 and "the DVC remote does not have data version" in late[0], failed.value.run.actions
    assert (repo / ".ingest" / "push-pending.json").is_file()
    monkeypatch.undo()
    run([str(VENV_BIN / "dvc"), "remote", "modify", "local", "url", good_remote], repo)
    again = cli(repo)
    assert again.returncode == 0 and "completed an interrupted push" in again.stdout, again.stderr
    clean, status = dvc_clean(repo)
    assert clean, status
    assert leftovers(repo) == []
