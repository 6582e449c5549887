"""Fan-out's pure parts (recsys/fanout.py): what a work order carries, what fan-out refuses, which code must
be committed. The distributed run itself is tests/test_fanout_e2e.py (slow)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from flow_support import REPO_ROOT, merge_params
from recsys import fanout
from recsys.config import ConfigError, parse_params

SHA = "0123456789abcdef0123456789abcdef01234567"


def params(overrides: dict | None = None):
    return parse_params(merge_params(yaml.safe_load((REPO_ROOT / "params.yaml").read_text()), overrides or {}))


WARM = "artifacts/warm/sasrec/source.json"


def test_work_order_parameters_round_trip_and_validation():
    order = fanout.WorkOrder("sasrec", SHA, {"params.yaml": "models: [sasrec]\n", "dvc.lock": "schema: '2.0'\n",
                                            WARM: "{}\n"})
    assert fanout.WorkOrder(**order.parameters()) == order
    assert fanout.warm_source_file("sasrec") == WARM
    with pytest.raises(ConfigError, match="40-digit"):
        fanout.WorkOrder("sasrec", "HEAD", {"params.yaml": "", WARM: ""})
    with pytest.raises(ConfigError, match="only"):
        fanout.WorkOrder("sasrec", SHA, {"params.yaml": "", WARM: "", "data/x.parquet": ""})
    with pytest.raises(ConfigError, match="only"):  # another model's warm source is not this order's
        fanout.WorkOrder("sasrec", SHA, {"params.yaml": "", WARM: "", "artifacts/warm/bert4rec/source.json": ""})
    with pytest.raises(ConfigError, match=r"\['params.yaml', 'artifacts/warm/sasrec/source.json'\] missing"):
        fanout.WorkOrder("sasrec", SHA, {})
    with pytest.raises(ConfigError, match="model name"):
        fanout.WorkOrder("../etc", SHA, {"params.yaml": ""})


def test_fan_out_refuses_force_and_warm_starts_from_a_workspace_artifact_store(tmp_path):
    fanout.check_fan_out(params(), ["mostpop", "sasrec"], force=False)  # the default (cold) is fine
    with pytest.raises(ConfigError, match="--force cannot be combined with fan_out"):
        fanout.check_fan_out(params(), ["sasrec"], force=True)
    warm = params({"sasrec": {"train": {"init": "auto"}}})
    with pytest.raises(ConfigError, match=r"warm or auto \(\['sasrec'\]\) needs registry.artifact_root .* "
                                          r"'registry/artifacts' is in this workspace"):
        fanout.check_fan_out(warm, ["mostpop", "sasrec", "bert4rec"], force=False)
    fanout.check_fan_out(warm, ["mostpop", "bert4rec"], force=False)  # only the models being trained count
    counting = params({"train": {"init": "auto"}, "sasrec": {"train": {"init": "cold"}}})
    fanout.check_fan_out(counting, ["mostpop", "sasrec"], force=False)  # MostPop never reads weights
    shared = params({"sasrec": {"train": {"init": "auto"}}, "registry": {"artifact_root": str(tmp_path / "nfs")}})
    fanout.check_fan_out(shared, ["mostpop", "sasrec"], force=False, root=tmp_path / "repo")  # outside: fine
    absolute_inside = params({"sasrec": {"train": {"init": "auto"}},
                              "registry": {"artifact_root": str(tmp_path / "repo" / "registry")}})
    with pytest.raises(ConfigError, match="is in this workspace"):
        fanout.check_fan_out(absolute_inside, ["sasrec"], force=False, root=tmp_path / "repo")
    relative_outside = params({"sasrec": {"train": {"init": "auto"}}, "registry": {"artifact_root": "../nfs"}})
    with pytest.raises(ConfigError, match=r"'\.\./nfs' is relative, so each worker would resolve it inside its own"):
        fanout.check_fan_out(relative_outside, ["sasrec"], force=False, root=tmp_path / "repo")


def test_code_paths_are_the_model_stages_code_deps_and_dvc_yaml():
    paths = fanout.code_paths(yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text()))
    assert {"dvc.yaml", "recsys/train.py", "recsys/evaluate.py", "recsys/models/sasrec.py"} <= paths
    assert not {p for p in paths if p.startswith("artifacts/") or "${" in p}
    assert "recsys/prepare.py" in paths  # train imports it, so it is a train dep (as dvc.yaml says)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout


def test_uncommitted_code_lists_changed_and_new_stage_code_only(tmp_path):
    repo = tmp_path / "repo"
    (repo / "recsys" / "models").mkdir(parents=True)
    dvc_yaml = {"stages": {"train": {"foreach": "${models}", "do": {"deps": [
        "artifacts/prepared", "artifacts/warm/${item}", "recsys/train.py", "recsys/models/new.py"]}},
        "evaluate": {"foreach": "${models}", "do": {"deps": ["recsys/evaluate.py"]}}}}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(dvc_yaml))
    for name in ("recsys/train.py", "recsys/evaluate.py", "README.md", "params.yaml"):
        (repo / name).write_text("x\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c")
    assert fanout.uncommitted_code(repo) == []
    assert len(fanout.head_commit(repo)) == 40

    (repo / "recsys/train.py").write_text("y\n")
    (repo / "recsys/models/new.py").write_text("new\n")  # untracked, but a dep
    (repo / "README.md").write_text("docs\n")  # not stage code
    (repo / "params.yaml").write_text("shipped\n")  # shipped to the workers
    assert fanout.uncommitted_code(repo) == ["recsys/models/new.py", "recsys/train.py"]


def _committed_repo(path):
    """A git repository at `path` with one commit."""
    path.mkdir()
    (path / "a.txt").write_text("a\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "a")
    return path


def test_a_commit_no_remote_branch_holds_is_unpushed(tmp_path):
    """The workers check out the coordinator's HEAD from the repository they clone: a commit only this
    checkout holds is refused before anything is dispatched (the retrain flow's `committed_head`)."""
    seed = _committed_repo(tmp_path / "seed")
    assert not fanout.unpushed(seed, fanout.head_commit(seed))  # no remote: nothing to say
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(tmp_path / "team.git"))
    git(tmp_path, "clone", "-q", str(tmp_path / "team.git"), str(tmp_path / "mine"))
    mine = tmp_path / "mine"
    assert not fanout.unpushed(mine, fanout.head_commit(mine))  # the clone's HEAD is the remote's
    (mine / "a.txt").write_text("b\n")
    git(mine, "commit", "-qam", "b")
    assert fanout.unpushed(mine, fanout.head_commit(mine))
    git(mine, "push", "-q", "origin", "HEAD")
    assert not fanout.unpushed(mine, fanout.head_commit(mine))


def test_work_order_needs_a_prepare_entry_and_ships_params_and_lock(tmp_path):
    (tmp_path / "params.yaml").write_text("models: [sasrec]\n")
    with pytest.raises(ConfigError, match="dvc repro prepare"):
        fanout.work_order(tmp_path, "sasrec", SHA)
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"prepare": {"cmd": "x"}}}))
    with pytest.raises(ConfigError, match="source.json is missing: run `recsys warm`"):
        fanout.work_order(tmp_path, "sasrec", SHA)
    (tmp_path / WARM).parent.mkdir(parents=True)
    (tmp_path / WARM).write_text('{"source": null}\n')
    order = fanout.work_order(tmp_path, "sasrec", SHA)
    assert set(order.files) == {"params.yaml", "dvc.lock", WARM}
    assert order.files["params.yaml"] == "models: [sasrec]\n" and order.files[WARM] == '{"source": null}\n'


def test_a_work_order_never_carries_the_registry_password(tmp_path):
    """The team setup's `registry.url: postgresql+psycopg://recsys:PW@...` reached every worker run's
    parameters, which the Prefect server stores and its UI shows; the rest of params.yaml ships as it is."""
    text = ("models: [sasrec]  # a comment\nregistry:\n  url: postgresql+psycopg://recsys:s3cr%40t@db.internal/recsys"
            "\n  artifact_root: /mnt/shared\ntrain:\n  epochs: 3\n")
    (tmp_path / "params.yaml").write_text(text)
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"prepare": {"cmd": "x"}}}))
    (tmp_path / WARM).parent.mkdir(parents=True)
    (tmp_path / WARM).write_text('{"source": null}\n')
    shipped = fanout.work_order(tmp_path, "sasrec", SHA).parameters()["files"]["params.yaml"]
    assert "s3cr" not in shipped and "recsys:***@db.internal" in shipped
    assert shipped == text.replace("s3cr%40t", "***")
    for url in ("sqlite:///registry/registry.db", "postgresql+psycopg://recsys@db/recsys"):  # no password
        plain = f"registry:\n  url: {url}\n"
        assert fanout.without_registry_password(plain) == plain
    quoted = 'registry: {url: "postgresql://u:p\\x41w@h/d"}  # escaped\ntrain: {lr: 1e-3, progress: off}\n'
    assert fanout.without_registry_password(quoted) == (  # only the URL's own text changed
        'registry: {url: "postgresql://u:***@h/d"}  # escaped\ntrain: {lr: 1e-3, progress: off}\n')
    # libpq takes the password as a query parameter too: SQLAlchemy hands it to the driver.
    for query in ("password=PW", "sslmode=require&PassWord=PW"):
        shipped = fanout.without_registry_password(f"registry:\n  url: postgresql://u@db/recsys?{query}\n")
        assert "PW" not in shipped and "password=%2a%2a%2a" in shipped.lower(), shipped  # *** in a URL
    # A port that is no number (RECSYS_REGISTRY_URL may override it on the coordinator) was a ValueError
    shipped = fanout.without_registry_password("registry:\n  url: postgresql://u:PW@db:port/r?password=PW2\n")
    assert shipped == "registry:\n  url: postgresql://u:***@db:port/r?password=***\n"


def test_a_worker_that_cannot_fetch_the_commit_names_its_origin_without_its_token(tmp_path):
    """Prefect's git_clone with an access token clones from a URL that carries it: the run's Failed state (and
    the coordinator's line) showed the token."""
    repo = _committed_repo(tmp_path / "worker")
    git(repo, "remote", "add", "origin", "https://x-access-token:ghp_SECRET@127.0.0.1:9/team/recsys.git")
    order = fanout.WorkOrder(model="sasrec", commit=SHA, files={"params.yaml": "", WARM: "{}"})
    with pytest.raises(fanout.FanOutError) as refused:
        fanout.check_out(repo, order)
    said = str(refused.value)
    assert "SECRET" not in said and said.startswith(
        f"commit {SHA[:12]} is not in the repository this worker clones (https://127.0.0.1:9/team/recsys.git): "
        "push it before fanning out"), said


def test_head_commit_outside_git_is_a_user_error(tmp_path):
    with pytest.raises(ConfigError, match="git checkout"):
        fanout.head_commit(tmp_path)


class FakeRuns:
    """Stands in for run_deployment + the API: each submitted run takes the next entry of its model's script —
    a final state, or a list of states the run goes through, one per read (the last one stays)."""

    def __init__(self, scripts: dict[str, list]):
        self.scripts, self.submitted, self.states, self.cancelled = scripts, [], {}, []

    def submit(self, deployment, order, attempt):
        from types import SimpleNamespace
        from uuid import uuid4

        run = SimpleNamespace(id=uuid4())
        self.submitted.append((order.model, attempt))
        entry = self.scripts[order.model].pop(0)
        self.states[run.id] = list(entry) if isinstance(entry, list) else [entry]
        return run

    def read(self, run_id):
        from types import SimpleNamespace

        states = self.states[run_id]
        return SimpleNamespace(state=states.pop(0) if len(states) > 1 else states[0])

    def set_state(self, run_id, state):
        self.cancelled.append(run_id)
        self.states[run_id] = [state]

    def client(self, sync_client=True):
        import contextlib
        from types import SimpleNamespace

        reader = SimpleNamespace(read_flow_run=self.read, set_flow_run_state=self.set_state,
                                 read_deployment_by_name=lambda name: SimpleNamespace(work_pool_name="recsys-gpu"))
        return contextlib.nullcontext(reader)


@pytest.fixture
def fake_runs(monkeypatch):
    import logging

    import prefect.client.orchestration

    import flows.fanout

    def install(scripts):
        fake = FakeRuns(scripts)
        monkeypatch.setattr(flows.fanout, "submit", fake.submit)
        monkeypatch.setattr(flows.fanout, "get_run_logger", lambda: logging.getLogger("fanout-test"))
        monkeypatch.setattr(prefect.client.orchestration, "get_client", fake.client)
        return fake
    return install


def orders(*models):
    return [fanout.WorkOrder(m, SHA, {"params.yaml": "", fanout.warm_source_file(m): ""}) for m in models]


def test_a_crashed_run_is_handed_out_again_and_a_failed_one_is_not(fake_runs):
    from prefect.states import Completed, Crashed, Failed

    from flows.fanout import wait_for

    fake = fake_runs({"sasrec": [Crashed(message="no heartbeat"), Completed()], "mostpop": [Completed()]})
    assert len(wait_for(orders("mostpop", "sasrec"), "train-model/worker", poll=0)) == 2
    assert sorted(fake.submitted) == [("mostpop", 1), ("sasrec", 1), ("sasrec", 2)]

    fake = fake_runs({"sasrec": [Failed(message="Flow run encountered an exception: StageError: train@sasrec: "
                                                 "train.lr must be > 0")]})
    with pytest.raises(fanout.FanOutError, match=r"sasrec failed on a worker: .*train\.lr must be > 0"):
        wait_for(orders("sasrec"), "train-model/worker", poll=0)
    assert fake.submitted == [("sasrec", 1)]  # deterministic: never resubmitted


def test_a_model_whose_runs_keep_crashing_stops_the_fan_out(fake_runs):
    from prefect.states import Crashed

    from flows.fanout import wait_for

    fake = fake_runs({"sasrec": [Crashed(message="lost")] * 3})
    with pytest.raises(fanout.WorkerLostError, match="crashed 3 times"):
        wait_for(orders("sasrec"), "train-model/worker", resubmits=2, poll=0)
    assert fake.submitted == [("sasrec", 1), ("sasrec", 2), ("sasrec", 3)]


def test_the_fan_out_gives_up_when_no_worker_takes_its_runs_and_cancels_them(fake_runs):
    from prefect.states import Scheduled

    from flows.fanout import wait_for

    fake = fake_runs({"sasrec": [Scheduled()], "mostpop": [Scheduled()]})
    with pytest.raises(fanout.FanOutError) as err:
        wait_for(orders("mostpop", "sasrec"), "train-model/worker", poll=0.01, idle_minutes=0.002)
    message = str(err.value)
    assert "no worker of pool recsys-gpu took any of train-model/worker's runs for 0.002 min" in message
    assert "mostpop, sasrec waiting; cancelled" in message and "--fan-out-idle-minutes" in message
    assert len(fake.cancelled) == 2 and all(s[0].is_cancelled() for s in fake.states.values())


def test_a_failed_model_cancels_the_runs_still_out_and_says_which(fake_runs):
    """The retrain stops when one model fails, so nothing it handed out goes on training for nobody: a waiting
    run is cancelled, one a worker is on is asked to stop (Cancelling); a finished one is left alone."""
    from prefect.states import Completed, Failed, Running, Scheduled

    from flows.fanout import wait_for

    fake = fake_runs({"sasrec": [Failed(message="train.lr must be > 0")], "mostpop": [Scheduled()],
                      "bert4rec": [Running()], "mojito": [Completed()]})
    with pytest.raises(fanout.FanOutError) as err:
        wait_for(orders("sasrec", "mostpop", "bert4rec", "mojito"), "train-model/worker", poll=0)
    assert "sasrec failed on a worker" in str(err.value)
    assert "(cancelled the other runs still out: mostpop, bert4rec)" in str(err.value)
    final = {model: fake.states[run_id][0]
             for model, run_id in zip(("sasrec", "mostpop", "bert4rec", "mojito"), fake.states)}
    assert final["mostpop"].is_cancelled() and final["bert4rec"].type.name == "CANCELLING"
    assert final["sasrec"].is_failed() and final["mojito"].is_completed() and len(fake.cancelled) == 2


def test_runs_that_keep_crashing_or_an_interrupted_coordinator_leave_nothing_running(fake_runs, monkeypatch):
    from prefect.states import Crashed, Running

    import flows.fanout
    from flows.fanout import wait_for

    fake = fake_runs({"sasrec": [Crashed(message="lost")] * 2, "mostpop": [Running()]})
    with pytest.raises(fanout.WorkerLostError,
                       match=r"crashed 2 times.*\(cancelled the other runs still out: mostpop\)"):
        wait_for(orders("sasrec", "mostpop"), "train-model/worker", resubmits=1, poll=0)
    assert len(fake.cancelled) == 1

    fake = fake_runs({"sasrec": [Running()], "mostpop": [Running()]})
    polls = []

    def interrupted(seconds):  # Ctrl-C (or Prefect cancelling the coordinator) on the second poll
        polls.append(seconds)
        if len(polls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(flows.fanout.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        wait_for(orders("sasrec", "mostpop"), "train-model/worker", poll=0)
    assert len(fake.cancelled) == 2 and all(s[0].type.name == "CANCELLING" for s in fake.states.values())


def test_a_run_a_worker_is_on_is_waited_for_however_long_it_trains(fake_runs):
    from prefect.states import Completed, Running, Scheduled

    from flows.fanout import wait_for

    # sasrec trains for many idle windows while mostpop waits its turn (one worker): no give-up.
    fake = fake_runs({"sasrec": [[Scheduled()] + [Running()] * 30 + [Completed()]],
                      "mostpop": [[Scheduled()] * 31 + [Running(), Completed()]]})
    assert len(wait_for(orders("sasrec", "mostpop"), "train-model/worker", poll=0.01, idle_minutes=0.001)) == 2
    assert fake.cancelled == []


def test_the_zombie_automation_refuses_a_window_live_runs_fall_into_and_a_temporary_server():
    from flows import zombies

    zombies.check_within(60, "http://127.0.0.1:4200/api")  # what the README and the e2e test use
    for short in (zombies.HEARTBEAT_SECONDS, 2 * zombies.HEARTBEAT_SECONDS - 1):
        with pytest.raises(ConfigError, match="must be at least two of the workers' heartbeat intervals"):
            zombies.check_within(short, "http://127.0.0.1:4200/api")
    with pytest.raises(ConfigError, match="PREFECT_API_URL is not set"):
        zombies.check_within(90, None)


def test_the_zombie_command_says_one_line_and_exits_nonzero(tmp_path):
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path), DO_NOT_TRACK="1", PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "flows.zombies", "--within", "20"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    # a usage error, as `--within 0` is
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [(
        "error: python -m flows.zombies: --within 20: must be at least two of the workers' heartbeat "
        "intervals (30 s, prefect-fanout.yaml), or a live run whose heartbeat is late once is marked "
        "Crashed; use 60 or more (see 'python -m flows.zombies --help')")]
    done = subprocess.run([sys.executable, "-m", "flows.zombies", "--within", "60"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr  # what no command line fixes
    assert done.stderr.strip().splitlines()[-1].startswith("error: PREFECT_API_URL is not set"), done.stderr


@pytest.mark.parametrize("module", ["flows.retrain", "flows.pipeline"])
@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf", "soon"])
def test_the_idle_limit_is_parsed_strictly(module, bad, capsys):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as done:
        main(["--fan-out", "train-model/worker", "--fan-out-idle-minutes", bad])
    assert done.value.code == 2
    err = capsys.readouterr().err  # the option's own refusal, not argparse's "unrecognized arguments"
    assert "argument --fan-out-idle-minutes: " in err and repr(bad) in err, err


@pytest.mark.parametrize("module", ["flows.retrain", "flows.pipeline"])
@pytest.mark.parametrize("argv, refusal", [
    (["--fan-out", "worker"], "argument --fan-out: fan_out must name a deployment as <flow>/<deployment>"),
    (["--fan-out", "train-model/"], "argument --fan-out: fan_out must name a deployment as <flow>/<deployment>"),
    (["--fan-out", "train-model/worker", "--force"], "--force cannot be combined with --fan-out"),
    # alone it was read as nothing, and the whole flow ran here
    (["--fan-out-idle-minutes", "5"], "--fan-out-idle-minutes applies to --fan-out only (give both, or leave it out)"),
])
def test_what_the_command_line_shows_fan_out_cannot_do_is_refused_before_a_flow_run(module, argv, refusal,
                                                                                   capsys, monkeypatch):
    """As a command line that does not parse (exit 2): no flow run is created to fail on the server."""
    import importlib

    imported = importlib.import_module(module)
    monkeypatch.setattr(imported, "run_main", lambda *a, **k: pytest.fail("a flow run was started"))
    with pytest.raises(SystemExit) as done:
        imported.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert refusal in err and f"python -m {module} --help" in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("module", ["flows.retrain", "flows.pipeline"])
@pytest.mark.parametrize("bad", ["0", "-3", "2.0", "²", "soon"])
def test_the_epochs_override_is_parsed_strictly(module, bad, capsys):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as done:
        main(["--epochs", bad])
    assert done.value.code == 2
    assert f"argument --epochs: expected a whole number of at least 1, got {bad!r}" in capsys.readouterr().err


@pytest.mark.parametrize("flow_name", ["retrain", "pipeline"])
def test_the_run_parameters_are_checked_before_anything_runs(flow_name, tmp_path):
    """A UI run's parameters bypass argparse: each flow refuses them first (the pipeline before it ingests;
    an override of 0 epochs was taken for none). The repo root does not even exist: nothing was read."""
    import importlib

    flow = getattr(importlib.import_module(f"flows.{flow_name}"), flow_name)
    missing = str(tmp_path / "no-repo")
    with pytest.raises(ConfigError, match="fan_out_idle_minutes must be a finite number > 0, got 0"):
        flow.fn(repo_root=missing, fan_out="train-model/worker", fan_out_idle_minutes=0)
    for bad in (0, -2, 2.5, True, 10**20):
        with pytest.raises(ConfigError, match=rf"epochs override must be a whole number from 1 to 1,000,000 "
                                              rf".*got {bad!r}"):
            flow.fn(repo_root=missing, epochs=bad)
    # An empty form field must not mean "everything" (models) or "no fan-out" (fan_out); Prefect's own check
    # of a deployment name was a traceback.
    with pytest.raises(ConfigError, match="models is an empty list: leave it unset"):
        flow.fn(repo_root=missing, models=[])
    for bad in ("", "bad", "train-model/", "a/b/c"):
        with pytest.raises(ConfigError,
                           match=rf"fan_out must name a deployment as <flow>/<deployment>.*{bad!r}"):
            flow.fn(repo_root=missing, fan_out=bad)
    # A deployment of another flow got runs with parameters it does not take (the server accepted them)
    with pytest.raises(ConfigError, match="fan_out must name a deployment of the train-model flow "
                                          r"\(flows/train_model.py\), e.g. train-model/worker; 'retrain/manual' "
                                          "is a deployment of 'retrain'"):
        flow.fn(repo_root=missing, fan_out="retrain/manual")
    assert not (tmp_path / "no-repo").exists()


def test_the_pipeline_refuses_a_fan_out_the_retrain_would_refuse_before_it_ingests(tmp_path, write_params):
    """`pipeline(force=True, fan_out=...)` from the UI, or fan-out with warm starts from a workspace artifact
    store, ingested the batch (data.dvc changed, the file moved to processed/) and then failed in retrain."""
    from flows.pipeline import pipeline

    write_params({"train": {"init": "auto"}}, tmp_path / "params.yaml")
    (tmp_path / "inbox").mkdir()
    batch = tmp_path / "inbox" / "b.csv"
    batch.write_text("user_id,item_id,timestamp\nu1,i1,1700000000\n")
    with pytest.raises(ConfigError, match="--force cannot be combined with fan_out"):
        pipeline.fn(repo_root=str(tmp_path), force=True, fan_out="train-model/worker")
    with pytest.raises(ConfigError, match="fan_out with train.init warm or auto"):
        pipeline.fn(repo_root=str(tmp_path), fan_out="train-model/worker")
    assert batch.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["inbox", "params.yaml"]


@pytest.mark.parametrize("module", ["flows.retrain", "flows.pipeline"])
def test_models_without_names_is_a_usage_error(module, capsys):
    import importlib

    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main(["--models"])
    assert (
        done.value.code == 2
        and "argument --models: expected at least one argument" in capsys.readouterr().err
    )


def test_workers_cloning_another_repository_than_origin_are_named(tmp_path):
    """`committed_head` checks the commit against `origin`; the workers clone the deployment's pull-step
    repository (RECSYS_GIT_URL at deploy time). The same repository spelled another way (file:// URL, .git,
    a trailing slash) is the same; another one is named, with what to do; unknown either way, nothing."""
    seed = _committed_repo(tmp_path / "seed")

    def clone(url: str) -> list[dict]:  # a deployment's pull steps, as Prefect stores them
        return [{"prefect.deployments.steps.git_clone": {"id": "clone", "repository": url}}]

    assert fanout.clone_mismatch(seed, SHA, clone("git@git.internal:team/recsys.git")) is None  # no origin
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(tmp_path / "team.git"))
    git(tmp_path, "clone", "-q", str(tmp_path / "team.git"), str(tmp_path / "mine"))
    mine = tmp_path / "mine"
    for same in (f"file://{tmp_path / 'team.git'}", f"{tmp_path / 'team'}/", str(tmp_path / "team.git")):
        assert fanout.clone_mismatch(mine, SHA, clone(same)) is None, same
    assert fanout.clone_mismatch(mine, SHA, []) is None  # no clone step: its runs use the worker's folder
    git(mine, "remote", "set-url", "origin", "../team.git")  # relative, as git reads it: from the checkout
    assert fanout.clone_mismatch(mine, SHA, clone(f"file://{tmp_path / 'team.git'}")) is None
    git(mine, "remote", "set-url", "origin", str(tmp_path / "team.git"))
    # A clone URL carrying a token (Prefect's git_clone with an access token, a CI job's origin) is the same
    # repository, and its token is never said
    token = "https://ci-token:glcbt-SECRET@git.internal/team/recsys.git"
    assert fanout.clone_mismatch(mine, SHA, clone(token.replace("ci-token:glcbt-SECRET@", ""))) is not None
    git(mine, "remote", "set-url", "origin", token)
    assert fanout.clone_mismatch(mine, SHA, clone("https://git.internal/team/recsys")) is None
    said = fanout.clone_mismatch(mine, SHA, clone("https://x-access-token:ghp_TOKEN@git.internal/team/other.git"))
    assert said is not None and "SECRET" not in said and "TOKEN" not in said, said
    assert "clone https://git.internal/team/other.git (the deployment's pull step" in said, said
    assert "origin is https://git.internal/team/recsys.git:" in said, said
    assert fanout.without_credentials("git@git.internal:team/recsys.git") == "git@git.internal:team/recsys.git"
    git(mine, "remote", "set-url", "origin", str(tmp_path / "team.git"))
    said = fanout.clone_mismatch(mine, SHA, clone("git@git.internal:team/recsys.git"))
    assert said == (f"the workers clone git@git.internal:team/recsys.git (the deployment's pull step) but this "
                    f"checkout's origin is {tmp_path / 'team.git'}: HEAD {SHA[:12]} was checked against origin "
                    "only; push it to git@git.internal:team/recsys.git too (or redeploy with RECSYS_GIT_URL "
                    "set to origin's URL)")
