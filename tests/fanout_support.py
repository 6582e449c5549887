"""The distributed setup of README *Scaling out*, in miniature, for tests/test_fanout_e2e.py and
benchmarks/bench_fanout.py: a real `prefect server start` (own PREFECT_HOME, 127.0.0.1, a free port), a bare
git repository the workers clone, the S3 test server as the DVC remote, a process work pool with the
`train-model/worker` deployment of prefect-fanout.yaml, and `prefect worker start` processes, each in its own
clone with its own temp dir. Everything started here is stopped by the context managers."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import yaml

from flow_support import make_repo, sh
from server_support import get_json, prefect_server, stop_tree
from s3 import S3Server, isolated_aws_env

GIT = ["git", "-c", "user.name=recsys-tests", "-c", "user.email=tests@example.invalid", "-c", "commit.gpgsign=false"]
POOL = "recsys-gpu"
WORKER_DEPLOYMENT = "train-model/worker"
SILENT_SECONDS = 60  # no heartbeat for this long (prefect-fanout.yaml: one every 30 s): marked Crashed


@dataclass
class Cluster:
    """The team's setup: where the code lives (a bare repo), the bucket, the server, the pool's workers."""

    base: Path
    api: str
    env: dict[str, str]  # PREFECT_API_URL, no AWS settings of this machine
    s3: S3Server
    bucket: str
    bare: Path
    workers: list[subprocess.Popen] = field(default_factory=list)
    worker_tmp: list[Path] = field(default_factory=list)

    def clone(self, name: str, registry_url: str | None = None) -> Path:
        """A teammate's checkout: `git clone`, the remote's endpoint and keys in `--local` config."""
        target = self.base / name
        sh(["git", "clone", "-q", str(self.bare), str(target)], self.base, self.env)
        for option, value in self.remote_options().items():
            sh(["dvc", "remote", "modify", "--local", "storage", option, value], target, self.env)
        if registry_url:
            params = yaml.safe_load((target / "params.yaml").read_text())
            params["registry"]["url"] = registry_url
            (target / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        return target

    def remote_options(self) -> dict[str, str]:
        return {"endpointurl": self.s3.endpoint_url, "access_key_id": self.s3.access_key_id,
                "secret_access_key": self.s3.secret_access_key}

    def start_worker(self, name: str) -> subprocess.Popen:
        """`prefect worker start` in its own clone; its flow runs clone again into its own temp dir. The
        DVC remote's credentials come from the worker machine's global DVC config (a run's clone has no
        `.dvc/config.local`)."""
        home = self.base / f"{name}-home"
        tmp = home / "tmp"
        tmp.mkdir(parents=True)
        checkout = self.base / name
        sh(["git", "clone", "-q", str(self.bare), str(checkout)], self.base, self.env)
        env = {**self.worker_env(home), "TMPDIR": str(tmp)}
        log = (home / "worker.log").open("w")
        proc = subprocess.Popen(["prefect", "worker", "start", "--pool", POOL, "--limit", "1", "--name", name],
                                cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers.append(proc)
        self.worker_tmp.append(tmp)
        return proc

    def worker_env(self, home: Path) -> dict[str, str]:
        # No PREFECT_FLOWS_HEARTBEAT_FREQUENCY here: the deployment's job variables set it (prefect-fanout.yaml).
        env = {**self.env, "PREFECT_HOME": str(home / "prefect-home"), "DVC_GLOBAL_CONFIG_DIR": str(home / "dvc"),
               "PREFECT_WORKER_QUERY_SECONDS": "2"}  # pick up a scheduled run within 2 s, not 10
        if not (home / "dvc" / "config").exists():
            (home / "dvc").mkdir(parents=True, exist_ok=True)
            sh(["dvc", "remote", "add", "--global", "storage", f"s3://{self.bucket}/dvc"], home, env)
            for option, value in self.remote_options().items():
                sh(["dvc", "remote", "modify", "--global", "storage", option, value], home, env)
        return env

    def flow_runs(self, deployment: str = WORKER_DEPLOYMENT, flow: str | None = None) -> list[dict]:
        """The runs of a deployment (or, with `flow`, of a flow by name), newest first."""
        if flow is not None:
            query = {"flows": {"name": {"any_": [flow]}}}
        else:
            found = get_json(f"{self.api}/deployments/name/{deployment}")
            query = {"flow_runs": {"deployment_id": {"any_": [found["id"]]}}}
        return get_json(f"{self.api}/flow_runs/filter", {**query, "sort": "EXPECTED_START_TIME_DESC", "limit": 200})

    def stop(self) -> None:
        for proc in self.workers:
            stop_tree(proc)


def seed_repository(base: Path, params: dict, s3: S3Server, env: dict[str, str]) -> tuple[Path, str]:
    """A repository with small params and a raw store in a new bucket, pushed, as a bare repo (what the
    team clones). Returns (bare repo, bucket)."""
    bucket = s3.create_bucket()
    seed = make_repo(base / "seed", params, bootstrap=False)
    sh(["dvc", "config", "--local", "--unset", "core.remote"], seed, env)  # make_repo's private local remote
    sh(["dvc", "remote", "add", "-d", "storage", f"s3://{bucket}/dvc"], seed, env)
    for option, value in {"endpointurl": s3.endpoint_url, "access_key_id": s3.access_key_id,
                          "secret_access_key": s3.secret_access_key}.items():
        sh(["dvc", "remote", "modify", "--local", "storage", option, value], seed, env)
    sh(["recsys", "bootstrap", "--root", str(seed)], seed, env)  # generates, `dvc add`s and pushes the store
    sh(["git", "add", "-A"], seed, env)
    sh([*GIT, "commit", "-qm", "seed"], seed, env)
    bare = base / "recsys.git"
    sh(["git", "clone", "-q", "--bare", str(seed), str(bare)], base, env)
    return bare, bucket


@contextlib.contextmanager
def cluster(base: Path, params: dict, s3: S3Server) -> Iterator[Cluster]:
    """Server, bare repo, pool, worker deployment and the zombie automation; workers are started by the caller."""
    with prefect_server(base / "server", keep_pythonpath=False) as (api, env):
        env = isolated_aws_env(env)
        bare, bucket = seed_repository(base, params, s3, env)
        the = Cluster(base, api, env, s3, bucket, bare)
        deployer = the.clone("deployer")
        sh(["prefect", "work-pool", "create", POOL, "--type", "process"], deployer, env)
        sh(["prefect", "--no-prompt", "deploy", "--prefect-file", "prefect-fanout.yaml", "--name",
            WORKER_DEPLOYMENT], deployer, {**env, "RECSYS_GIT_URL": f"file://{bare}"})
        said = sh(["python", "-m", "flows.zombies", "--within", str(SILENT_SECONDS)], deployer, env)
        assert said.strip().splitlines()[-1].startswith("automation ") and "HTTP Request" not in said, said
        try:
            yield the
        finally:
            the.stop()


def run_retrain(repo: Path, env: dict[str, str], *args: str, timeout: int = 1200) -> tuple[float, dict, str]:
    """`python -m flows.retrain ARGS` in `repo`: (wall seconds, its JSON summary, its output)."""
    started = time.perf_counter()
    done = subprocess.run(["python", "-m", "flows.retrain", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)
    elapsed = time.perf_counter() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return elapsed, json.loads(done.stdout[done.stdout.index("{"): done.stdout.rindex("}") + 1]), output


__all__ = ["Cluster", "cluster", "run_retrain"]
