"""How flows behave as processes: telemetry off wherever one starts, retries only for what may pass,
tracebacks of user errors kept off the console (the end-to-end runs are in test_flows.py)."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys

import pytest
from dvc_support import tree
from flow_support import NOT_AN_INBOX, REPO_ROOT, TELEMETRY_ENV, flow_env
from sqlalchemy.exc import DatabaseError, OperationalError

from flows.errors import _HideUserErrorTracebacks, retry_if_transient
from recsys.config import ConfigError, load_params
from recsys.ingest.errors import BatchesRejected, DvcAddFailed, IngestError
from recsys.ingest.run import IngestRun, PushFailed
from recsys.prepare import PrepareError
from recsys.registry import ArtifactError, ArtifactIntegrityError
from recsys.registry.records import database_failure
from recsys.workspace import DvcError, StageError


def test_importing_the_flows_turns_telemetry_off_unless_set(tmp_path):
    code = "import os, flows; print([os.environ[n] for n in %r])" % (TELEMETRY_ENV,)
    env = flow_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "['1', 'false', 'false']"
    explicit = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env={**env, "DO_NOT_TRACK": "0"},
                              capture_output=True, text=True, check=True)
    assert explicit.stdout.strip() == "['0', 'false', 'false']"


def test_a_flow_process_against_a_configured_server_does_not_load_prefects_own_server(tmp_path):
    """With PREFECT_API_URL set there is no temporary server to start, so its modules (~0.6 s of imports in
    every flow process a worker or a schedule runs) are not loaded (test_flows.py starts one without it)."""
    code = ("import sys\nfrom flows.ephemeral import start_in_own_session\n"
            "print(start_in_own_session(), 'prefect.server.api.server' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**flow_env(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api"}, check=True)
    assert done.stdout.split() == ["None", "False"], done.stderr


@pytest.mark.parametrize("exc, retried", [
    (ConfigError("train: unknown key(s) ['epochz']"), False),
    (PrepareError("5-core filter kept 0 of 9 events"), False),
    (StageError("prepare: 5-core filter kept 0 of 9 events"), False),
    (DvcError("Unable to acquire lock"), True),
    (IngestError("ingest.max_batch_rows must be a whole number"), False),
    (BatchesRejected("rejected 1 of 2 batches: broken.csv: malformed CSV: …"), False),
    (PushFailed("the DVC remote does not have data version abc yet", IngestRun()), True),
    (PushFailed("… no remote specified …", IngestRun(), transient=False), False),
    (DvcAddFailed("`dvc add data` failed: ERROR: Unable to acquire lock", transient=True), True),
    (DvcAddFailed("`dvc add data` failed: ERROR: output 'data' is already specified",
                  transient=False), False),
    # a champion's artifact missing or tampered with is refused the same way again (`promote`, `warm-sources`)
    (ArtifactError("artifact 3f2a… is missing from the artifact store"), False),
    (ArtifactIntegrityError("artifact 3f2a… no longer matches its sha256"), False),
    (OSError("disk hiccup"), True),
    (RuntimeError("a bug, maybe a flaky one"), True),
    # the registry's database: a damaged file or refused credentials fail again; a busy or lost server may not
    (database_failure(DatabaseError("SELECT", {}, sqlite3.DatabaseError("file is not a database")), "x"), False),
    (database_failure(OperationalError("c", {}, Exception('password authentication failed for user "r"')), "x"),
     False),
    (database_failure(OperationalError("c", {}, sqlite3.OperationalError("database is locked")), "x"), True),
    (database_failure(OperationalError("c", {}, Exception("connection refused\n\tIs the server running")), "x"),
     True),
])
def test_prefect_retries_only_what_may_pass(exc, retried):
    from prefect.states import Failed

    assert retry_if_transient(None, None, Failed(data=exc)) is retried


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None,
                                 sys.exc_info())


def test_console_keeps_the_line_but_drops_the_traceback_of_a_user_error_only():
    hider = _HideUserErrorTracebacks()
    user = _record(StageError("prepare: 5-core filter kept 0 of 9 events"))
    assert hider.filter(user) and user.exc_info is None
    bug = _record(KeyError("a bug"))
    assert hider.filter(bug) and bug.exc_info is not None


def _flow_report(exc: BaseException) -> logging.LogRecord:
    record = _record(exc)
    record.name, record.msg, record.args = ("prefect.flow_runs", "Encountered exception during execution: %r",
                                            (exc,))
    return record


def test_under_run_main_the_flow_report_of_a_user_error_leaves_the_console_to_the_last_line(monkeypatch):
    """`run_main` prints a flow's user error as the process's last line, so Prefect's ERROR report of the same
    exception is not shown on the console too; a bug's report, a task's line and any served or worker
    process (no `run_main`: that report is the only one there) keep theirs."""
    import flows.errors

    hider = _HideUserErrorTracebacks()
    user = StageError("prepare: 5-core filter kept 0 of 9 events")
    assert hider.filter(_flow_report(user))  # no run_main: the report stays, without its traceback
    monkeypatch.setattr(flows.errors, "_FINAL_LINE_FOLLOWS", True)
    assert not hider.filter(_flow_report(user))
    bug = _flow_report(KeyError("a bug"))
    assert hider.filter(bug) and bug.exc_info is not None
    task = _record(user)  # prefect.task_runs
    assert hider.filter(task) and task.exc_info is None


@pytest.mark.parametrize("flow_name", ["ingest", "pipeline"])
@pytest.mark.parametrize("inbox, message", [
    ("", "inbox is empty: leave it unset"),
    ("no-such-folder", "inbox no-such-folder is not a folder"),
    ("params.yaml", "inbox params.yaml is not a folder"),
])
def test_a_given_inbox_must_be_a_folder_and_is_checked_before_anything_runs(
        flow_name, inbox, message, tmp_path):
    """A typo in --inbox (or the UI's field) was an empty inbox: "nothing to ingest", exit 0."""
    import importlib

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    flow = getattr(importlib.import_module(f"flows.{flow_name}"), flow_name)
    with pytest.raises(ConfigError, match=message):
        flow.fn(inbox=inbox, repo_root=str(repo))
    assert sorted(p.name for p in repo.iterdir()) == ["params.yaml"]  # nothing bootstrapped or locked


@pytest.mark.parametrize("where, message", [
    ("README.md", "--repo-root {root}/README.md: not a folder"),
    ("nowhere", "--repo-root {root}/nowhere: no such folder"),
    ("sub", "--repo-root {root}/sub: {root}/sub holds no params.yaml"),
])
@pytest.mark.parametrize("flow_name", ["retrain", "ingest", "pipeline"])
def test_a_flow_refuses_a_repo_root_that_is_not_a_repository_before_anything_runs(tmp_path, where, message,
                                                                                   flow_name):
    """A file as --repo-root was a NotADirectoryError traceback; a subfolder, a missing params.yaml (whose
    line told the flows' user to pass a --params they do not have)."""
    import importlib

    flow = getattr(importlib.import_module(f"flows.{flow_name}"), flow_name)
    (tmp_path / "README.md").write_text("x")
    (tmp_path / "sub").mkdir()
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as refused:
        flow.fn(repo_root=str(tmp_path / where))
    assert str(refused.value).startswith(message.format(root=tmp_path.resolve()))
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("flow_name", ["retrain", "ingest", "pipeline"])
def test_an_empty_repo_root_is_refused_not_taken_for_the_current_folder(tmp_path, monkeypatch, flow_name):
    """`--repo-root ""` ran the whole flow in whatever repository the command was started from."""
    import importlib

    flow = getattr(importlib.import_module(f"flows.{flow_name}"), flow_name)
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="^--repo-root is empty: name the repository"):
        flow.fn(repo_root="")
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


@pytest.mark.parametrize("where", ["README.md", "nowhere", "sub"])
def test_bootstrap_refuses_a_root_that_is_not_a_repository_and_creates_nothing(tmp_path, where):
    """It took the workspace lock first: a missing params.yaml left `.ingest/lock` in the wrong folder."""
    (tmp_path / "README.md").write_text("x")
    (tmp_path / "sub").mkdir()
    before = sorted(tmp_path.rglob("*"))
    done = subprocess.run([sys.executable, "-m", "recsys.cli", "bootstrap", "--root", str(tmp_path / where)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr.startswith(f"error: --root {tmp_path / where}: ") and done.stderr.count("\n") == 1
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_bootstrap_refuses_a_folder_that_is_no_dvc_repository_before_writing_its_store(tmp_path):
    """A params.yaml without `dvc init`: it wrote data/ and .ingest/, then failed at `dvc add data` ("not
    inside of a DVC repository"), and every rerun the same way. A present store needs no DVC (as for
    ingest)."""
    from recsys.data import generate, write_store

    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    before = tree(tmp_path)
    for _ in range(2):  # the same refusal again: nothing left behind to trip over
        done = subprocess.run([sys.executable, "-m", "recsys.cli", "bootstrap", "--root", str(tmp_path)],
                              capture_output=True, text=True, cwd=tmp_path, check=False)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr == (f"error: {tmp_path.resolve()} is not a DVC repository (no .dvc/): the raw "
                               "store is pulled, or generated and `dvc add`ed, with DVC; run this in a clone "
                               "of the project, or `dvc init` there first\n")
        assert tree(tmp_path) == before
    write_store(generate(load_params(tmp_path / "params.yaml").generate), tmp_path / "data")
    done = subprocess.run([sys.executable, "-m", "recsys.cli", "bootstrap", "--root", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0 and done.stdout.startswith("raw store present\n"), done.stderr


@pytest.mark.parametrize("root", ["", " "])
def test_bootstrap_refuses_an_empty_root_as_a_usage_error(tmp_path, root):
    """`--root ""` was the current folder (Path("") is "."): `--root "$REPO"` with REPO unset bootstrapped
    wherever the shell happened to be."""
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    before = tree(tmp_path)
    done = subprocess.run([sys.executable, "-m", "recsys.cli", "bootstrap", "--root", root],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == ("error: recsys bootstrap: Invalid value for '--root': empty: name the repository, "
                           "or leave --root out for the current folder (see 'recsys bootstrap --help')\n")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("flow_name", ["ingest", "pipeline"])
@pytest.mark.parametrize("setting, inbox, why", [  # (`ingest.inbox: ''` is refused as params.yaml loads)
    ("inbox", ".", "{repo} is the repository root"),
    ("inbox", "data", "{repo}/data is data/, the raw store data.dvc versions"),
    ("inbox", "inbox/rejected",
     "{repo}/inbox/rejected is inbox/rejected/, where a run files the batches it rejected"),
], ids=["--inbox .", "--inbox data", "--inbox inbox/rejected"])
def test_an_inbox_that_is_no_inbox_is_refused_before_anything_runs(flow_name, setting, inbox, why, tmp_path):
    """`python -m flows.ingest --inbox .` took every file of the repository for a batch and moved it into
    `./rejected/`; the inbox's own `rejected/` would file its batches in `rejected/rejected/`."""
    import importlib

    import yaml

    repo = (tmp_path / "repo").resolve()
    (repo / "inbox" / "rejected").mkdir(parents=True)
    (repo / "data").mkdir()
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["ingest"]["inbox"] = yaml.safe_load(setting)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (repo / "README.md").write_text("# a project\n")
    before = tree(repo)
    flow = getattr(importlib.import_module(f"flows.{flow_name}"), flow_name)
    with pytest.raises(ConfigError) as refused:
        flow.fn(inbox=inbox, repo_root=str(repo))
    assert str(refused.value) == f"inbox {why.format(repo=repo)}: {NOT_AN_INBOX}"
    assert tree(repo) == before  # nothing bootstrapped, locked, moved or written


def test_the_rejection_line_says_rejected_once_per_batch(tmp_path):
    """The plan's reasons begin 'batch rejected: ', which the line ('rejected 1 of 2 batches: …') already says."""
    from recsys.ingest.errors import rejection

    summaries = [{"status": "ingested", "source": "a.csv", "message": "ok"},
                 {"status": "rejected", "source": "b.csv", "report_markdown": "reports/ingest/b.md",
                  "message": "batch rejected: it has 0 data rows, at least 1 required"}]
    assert rejection(summaries, tmp_path / "inbox" / "rejected") == (
        f"rejected 1 of 2 batches: b.csv: it has 0 data rows, at least 1 required (moved to "
        f"{tmp_path}/inbox/rejected/, report: reports/ingest/b.md)")
    assert rejection(summaries[:1], tmp_path) is None


REFUSED_COMMAND_LINES = [
    (["flows.retrain", "--models", "nosuch"], "model(s) ['nosuch'] are not in params.yaml `models`"),
    (["flows.pipeline", "--models", "sasrec", "nosuch"], "model(s) ['nosuch'] are not in params.yaml `models`"),
    # a fan-out handed the model out twice and lost the first run's id
    (["flows.retrain", "--models", "sasrec", "sasrec"], "model(s) ['sasrec'] are named more than once"),
    (["flows.pipeline", "--inbox", "missing"], "inbox missing is not a folder"),
    (["flows.ingest", "--inbox", "missing"], "inbox missing is not a folder"),
    (["flows.ingest", "--inbox", "."], "inbox {repo} is the repository root"),
    (["flows.retrain", "--repo-root", "nowhere"], "--repo-root nowhere: no such folder"),
    (["flows.pipeline", "--repo-root", "sub"], "--repo-root sub: {repo}/sub holds no params.yaml"),
    # fan-out on the temporary server: it started, recorded a failed run, then found no deployment (~10 s)
    (["flows.retrain", "--fan-out", "train-model/worker"],
     "--fan-out train-model/worker needs the Prefect server its workers poll, and PREFECT_API_URL is not set"),
    (["flows.pipeline", "--fan-out", "train-model/worker"],
     "--fan-out train-model/worker needs the Prefect server its workers poll, and PREFECT_API_URL is not set"),
]
# one command line of each flow also runs as its own process (what a person types; the rest run in-process)
_AS_PROCESSES = [REFUSED_COMMAND_LINES[i] for i in (0, 3, 5, 8)]


def _command_line_id(value):
    return " ".join(value) if isinstance(value, list) else None


def _a_repository(tmp_path, params_text: str = ""):
    repo = (tmp_path / "repo").resolve()
    (repo / "sub").mkdir(parents=True)
    (repo / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text() + params_text)
    return repo


def _repo_root_argument(argv: list[str]) -> list[str]:
    return [] if "--repo-root" in argv else ["--repo-root", "."]


@pytest.mark.parametrize("argv, message", _AS_PROCESSES, ids=_command_line_id)
def test_a_flow_command_line_the_flow_would_refuse_is_refused_before_a_server_starts(argv, message, tmp_path):
    """`python -m flows.retrain --models nosuch` started Prefect's temporary server, recorded a failed flow
    run and printed the reason twice among seven lines (~20 s); now the command line is checked first: one
    `error:` line, exit 1, and no server database in PREFECT_HOME (no run was recorded)."""
    repo = _a_repository(tmp_path)
    done = subprocess.run([sys.executable, "-m", *argv, *_repo_root_argument(argv)], cwd=repo,
                          env=flow_env(tmp_path), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "" and done.stderr.startswith(f"error: {message.format(repo=repo)}"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert not list((tmp_path / "prefect-home").rglob("*.db"))  # no temporary server, no flow run


def _refused_in_process(monkeypatch, capsys, repo, argv: list[str]) -> str:
    """`python -m <argv>` run by the flow module's own `main` in this process, its flow replaced by one that
    fails the test if it is ever called: the command line's one stderr line, after exit code 1."""
    import importlib

    module = importlib.import_module(argv[0])
    flow_name = argv[0].removeprefix("flows.")
    started = []
    monkeypatch.setattr(module, flow_name, lambda **kwargs: started.append(kwargs))
    monkeypatch.chdir(repo)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # a user's shell may export one (README, Scaling out): these command lines are run without a server
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(SystemExit) as stopped:
        module.main([*argv[1:], *_repo_root_argument(argv)])
    out, err = capsys.readouterr()
    assert stopped.value.code == 1 and out == "" and not started, (err, started)
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv, message", REFUSED_COMMAND_LINES, ids=_command_line_id)
def test_every_refused_flow_command_line_is_one_line_before_the_flow_runs(argv, message, tmp_path, monkeypatch,
                                                                          capsys):
    """The same precheck, every case, through each flow module's `main` (the processes above show the
    process around it: the exit code, and no temporary server)."""
    repo = _a_repository(tmp_path)
    err = _refused_in_process(monkeypatch, capsys, repo, argv)
    assert err.startswith(f"error: {message.format(repo=repo)}"), err


PARAMS_TYPO_LINE = "error: unknown section(s) ['train_typo'] in params.yaml\n"


def test_a_params_file_the_flow_would_refuse_is_refused_before_a_server_starts(tmp_path):
    """Without --models the precheck read no params.yaml: a misspelt key started Prefect's server first."""
    repo = _a_repository(tmp_path, "\ntrain_typo: 1\n")
    done = subprocess.run([sys.executable, "-m", "flows.retrain", "--repo-root", "."], cwd=repo,
                          env=flow_env(tmp_path), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr == PARAMS_TYPO_LINE, done.stderr
    assert not list((tmp_path / "prefect-home").rglob("*.db"))


def test_the_pipelines_command_line_refuses_that_params_file_too(tmp_path, monkeypatch, capsys):
    repo = _a_repository(tmp_path, "\ntrain_typo: 1\n")
    assert _refused_in_process(monkeypatch, capsys, repo, ["flows.pipeline"]) == PARAMS_TYPO_LINE


def test_the_flows_epochs_option_is_bounded_as_train_epochs_is():
    """`--epochs 99999999999999999999` was accepted and retrained every model for as long as it took."""
    import argparse

    from flows.retrain import epochs_argument
    from recsys.model_configs import MAX_EPOCHS

    assert epochs_argument("3") == 3 and epochs_argument(str(MAX_EPOCHS)) == MAX_EPOCHS
    for text, says in ((str(MAX_EPOCHS + 1), "expected at most 1,000,000 epochs"),
                       ("99999999999999999999", "expected at most 1,000,000 epochs"),
                       ("0", "expected a whole number of at least 1"), ("2.0", "expected a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            epochs_argument(text)


def test_the_ingest_task_retries_any_transient_failure_and_keeps_every_attempts_batches(monkeypatch):
    """Only an IngestError was retried and carried the batches earlier attempts had dealt with: an attempt
    that rejected a batch and failed to push, then one that hit a full disk (an OSError), ended at once in an
    error that reported nothing rejected. Now every transient failure is retried, and the last one carries
    every attempt's batches."""
    import flows.ingest as ingest_flow
    import recsys.ingest
    from recsys.config import IngestConfig

    rejected = {"source": "b.csv", "status": "rejected", "message": "batch rejected: bad"}
    failures = iter([PushFailed("push failed", IngestRun([rejected]), transient=True),
                     OSError(28, "No space left on device"), OSError(28, "No space left on device")])

    def attempt(repo_root, config):
        raise next(failures)

    monkeypatch.setattr(recsys.ingest, "ingest_inbox", attempt)
    monkeypatch.setattr(ingest_flow, "INGEST_RETRY_DELAY_S", 0.0)
    monkeypatch.setattr(ingest_flow, "get_run_logger", lambda: logging.getLogger("test"))
    with pytest.raises(OSError, match="No space left") as failed:
        ingest_flow.ingest_inbox_task.fn(".", IngestConfig())
    assert next(failures, None) is None  # three attempts
    assert list(failed.value.run) == [rejected]


@pytest.mark.parametrize("models, message", [
    (["nope"], r"model\(s\) \['nope'\] are not in params.yaml `models`"),
    (["sasrec", "sasrec"], "sasrec"),
])
def test_a_pipeline_run_refuses_models_params_yaml_lacks_before_it_ingests(models, message, tmp_path):
    """A UI or API run (no command-line precheck) ingested, committed and pushed a batch, then refused the
    models it could have refused first."""
    from flows.pipeline import pipeline

    repo = tmp_path / "repo"
    (repo / "inbox").mkdir(parents=True)
    (repo / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    (repo / "inbox" / "batch.csv").write_text("user_id,item_id,timestamp\nu1,i1,1700000000\n")
    with pytest.raises(ConfigError, match=message):
        pipeline.fn(models=models, repo_root=str(repo))
    assert sorted(p.name for p in repo.iterdir()) == ["inbox", "params.yaml"]  # nothing bootstrapped or locked
    assert [p.name for p in (repo / "inbox").iterdir()] == ["batch.csv"]


@pytest.mark.parametrize("flow_module", ["retrain", "pipeline"])
@pytest.mark.parametrize("given", [{"epochs": True}, {"epochs": "3"}, {"epochs": 2.0}, {"force": "yes"},
                                   {"force": 1}])
def test_a_ui_run_s_parameters_are_not_coerced(flow_module, given, tmp_path, monkeypatch):
    """Prefect's lax validation turned `epochs: true` into a one-epoch override and `force: "yes"` into a
    forced run; the form's types (integer, boolean) are unchanged."""
    import importlib

    from prefect.exceptions import ParameterTypeError
    from prefect.utilities.callables import parameter_schema

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    flow = getattr(importlib.import_module(f"flows.{flow_module}"), flow_module)
    with pytest.raises(ParameterTypeError):
        flow.validate_parameters(given)
    assert flow.validate_parameters({"epochs": 3, "force": True}) | {} == {
        **flow.validate_parameters({}), "epochs": 3, "force": True}
    schema = parameter_schema(flow.fn).model_dump()["properties"]
    assert schema["force"]["type"] == "boolean" and {"type": "integer"} in schema["epochs"]["anyOf"]


def test_a_fan_out_give_up_time_must_be_finite():
    from flows.retrain import check_run_parameters

    with pytest.raises(ConfigError, match="fan_out_idle_minutes must be a finite number > 0, got inf"):
        check_run_parameters(None, "train-model/gpu", float("inf"))


def test_the_metrics_table_names_the_baseline_by_version_only_when_it_has_one():
    """The gate compared the candidate with the registered champion (`champion v3`) or, with none, with an
    unregistered reference result (`mostpop`: it was shown as "mostpop v")."""
    from flows.artifacts import metric_rows

    results = {"sasrec": {"ndcg@10": 0.2, "hr@10": 0.3, "mrr": 0.1, "best_epoch": 4, "valid": {"ndcg@10": 0.25}},
               "mostpop": {"ndcg@10": 0.05}}
    decision = {"model": "sasrec", "baseline_metric": 0.05, "baseline_kind": "mostpop", "baseline_version": None}
    rows = metric_rows(results, decision)
    assert [r["model"] for r in rows] == ["mostpop", "sasrec", "mostpop"]
    assert rows[1]["candidate"] == "yes" and rows[1]["test ndcg@10"] == "0.2000" and rows[1]["best epoch"] == "4"
    assert rows[2]["candidate"] == "baseline (same test set)" and rows[2]["test ndcg@10"] == "0.0500"
    champion = {**decision, "baseline_kind": "champion", "baseline_version": 3}
    assert metric_rows(results, champion)[-1]["model"] == "champion v3"
    assert len(metric_rows(results, {**decision, "baseline_metric": None})) == 2  # nothing compared: no row


def test_a_locked_sqlite_registry_says_who_may_hold_it():
    """After its 60 s busy timeout every command said only "database is locked"."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from recsys.registry.records import database_failure

    err = database_failure(OperationalError("c", {}, sqlite3.OperationalError("database is locked")), "cannot x")
    assert str(err) == ("cannot x: the registry database failed: database is locked (another process holds the "
                        "SQLite registry's write lock — a promotion, a rollback, or a program holding it open — past "
                        "SQLite's 60 s wait; run again when it has finished)")
