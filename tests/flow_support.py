"""Helpers shared by the tests (no tests here): params merging, a fresh clone of the repository in miniature,
running commands and flows in it. Fixtures live in conftest.py; ingest and registry helpers in their own
test_*_support modules."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# The end of the one line that refuses an inbox that is no inbox (the repository, a folder the system owns).
NOT_AN_INBOX = ("a run would take every file there for a batch and move it into the inbox's processed/ or "
                "rejected/ folder; set ingest.inbox in params.yaml (or --inbox) to a folder of its own, such "
                "as inbox")

# Small enough to train in seconds, structured enough that SASRec clearly beats MostPop.
FLOW_PARAMS = {
    "models": ["mostpop", "sasrec"],
    "generate": {"n_users": 80, "n_items": 40, "mean_events_per_user": 20, "n_clusters": 4, "days": 60, "seed": 3},
    "prepare": {"min_user_interactions": 3, "min_item_interactions": 3},
    "train": {"epochs": 12, "patience": 4, "batch_size": 32, "lr": 0.01, "device": "cpu", "progress": "off",
              "eval_batch_size": 128},
    "sasrec": {"dim": 16, "n_layers": 1, "n_heads": 1, "dropout": 0.1, "max_len": 20},
}


def sigint_as_in_a_terminal() -> None:
    """`preexec_fn` for a process a test interrupts: Ctrl-C's default disposition, as a terminal gives it.
    A suite started in the background (`cmd &`, nohup, some CI runners) hands its processes SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: the interrupt would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_when(cmd: list[str], ready, seconds: float, poll: float, **popen) -> None:
    """Run `cmd` (Ctrl-C as in a terminal), wait up to `seconds` until `ready()` holds, send SIGINT, and check
    that it ended by the interrupt saying only `interrupted`, with no traceback."""
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=sigint_as_in_a_terminal, **popen)  # noqa: PLW1509 (one signal call)
    try:
        deadline = time.monotonic() + seconds
        while not ready() and time.monotonic() < deadline:
            time.sleep(poll)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGINT, err[-2000:]
    assert err.rstrip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err[-2000:]


def merge_params(base: dict, override: dict) -> dict:
    """`base` with `override` merged in: nested mappings merge, anything else replaces. `base` is not changed."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_params(out[key], value)
        else:
            out[key] = value
    return out


def subprocess_env(prefect_home: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DO_NOT_TRACK": "1",
           "GX_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "OMP_NUM_THREADS": "1",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    if prefect_home is not None:
        env["PREFECT_HOME"] = str(prefect_home)
    env.pop("PREFECT_API_URL", None)
    return env


def train_stage(root: Path, params: Path, extra_env: dict[str, str] | None = None,
                timeout: float = 600) -> subprocess.CompletedProcess:
    """SASRec's train stage in `root` as `dvc repro` runs it (`python -m recsys.train`): one torch thread, and
    no injected fault (`RECSYS_FAULT`) unless `extra_env` sets one."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RECSYS_FAULT", None)
    return subprocess.run([sys.executable, "-m", "recsys.train", "--model", "sasrec", "--params", str(params),
                           "--root", str(root)], cwd=root, env={**env, **(extra_env or {})},
                          capture_output=True, text=True, timeout=timeout)


TELEMETRY_ENV = ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED", "GX_ANALYTICS_ENABLED")


def flow_env(home: Path) -> dict[str, str]:
    """A user's shell: the venv on PATH and nothing else — no telemetry switches, no timeouts of ours."""
    env = subprocess_env(home / "prefect-home")
    for name in (*TELEMETRY_ENV, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "RECSYS_VERBOSE"):
        env.pop(name, None)
    return env


# What running the pipeline in this checkout changes (the demo, a user's runs, a committed ingest): a
# workspace's run state, not code. A test's clone has none of them — `recsys bootstrap` writes data.dvc for
# the seed store it generates — so `bash scripts/demo.sh` before the tests in the same checkout, or a
# data.dvc committed after an ingest, changes no test's starting point.
RUN_STATE_ABSENT = ("data.dvc", "dvc.lock", "ingest_manifest.jsonl")


def clone_repo(target: Path) -> Path:
    """Copy the working tree (what a commit would hold, tests and run state excluded), `git init` it and point
    DVC at a private local remote beside it — a fresh clone in miniature, nothing bootstrapped yet."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in listed:
        if name and not name.startswith("tests/") and name not in RUN_STATE_ABSENT and (REPO_ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, target / name)
    env = subprocess_env()
    for cmd in (["git", "init", "-q"], ["dvc", "remote", "add", "-d", "-f", "--local", "local",
                                         str(remote_of(target))]):
        subprocess.run(cmd, cwd=target, env=env, check=True, capture_output=True)
    return target


def remote_of(repo: Path) -> Path:
    return repo.parent / f"{repo.name}-remote"


def make_repo(target: Path, overrides: dict | None = None, bootstrap: bool = True) -> Path:
    """`clone_repo`, small params (FLOW_PARAMS + `overrides`), and (unless told not to) the raw store
    bootstrapped."""
    clone_repo(target)
    params = merge_params(merge_params(yaml.safe_load((REPO_ROOT / "params.yaml").read_text()), FLOW_PARAMS),
                          overrides or {})
    (target / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if not bootstrap:
        return target
    done = subprocess.run(["recsys", "bootstrap", "--root", str(target)], cwd=target, env=subprocess_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def drop_batch(repo: Path, index: int = 1) -> Path:
    env = subprocess_env()
    out = repo / "inbox" / f"batch-{index:04d}.csv"
    done = subprocess.run(["recsys", "data", "batch", str(index), "--out", str(out), "--params",
                           str(repo / "params.yaml")], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def registry_for(repo: Path):
    from recsys.config import load_params
    from recsys.registry import open_registry

    params = load_params(repo / "params.yaml")
    return open_registry(params.registry, repo, params.gate)


def sh(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> str:
    """Run a command (the venv's `dvc`, `recsys`, … first on PATH); its combined output, asserting success."""
    done = subprocess.run(args, cwd=cwd, env=env or subprocess_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{output}"
    return output


def run_python(code: str, cwd: Path = REPO_ROOT, env: dict | None = None) -> tuple[set[str], str]:
    """Run `code` in a fresh interpreter, asserting success: the modules it had imported by the end (what a
    process pays for at start-up) and its combined output."""
    probe = f"{code}\nimport json, sys\nprint('MODULES=' + json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env or subprocess_env(), capture_output=True,
                          text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    line = [line for line in done.stdout.splitlines() if line.startswith("MODULES=")][-1]
    return set(json.loads(line[len("MODULES="):])), output


def modules_loaded_by(code: str, cwd: Path = REPO_ROOT, env: dict | None = None) -> set[str]:
    return run_python(code, cwd, env)[0]


def running_stages(dvc_output: str) -> set[str]:
    """The stages a `dvc repro` ran (its "Running stage '<name>':" lines)."""
    return {line.split("'")[1] for line in dvc_output.splitlines() if line.startswith("Running stage '")}


def run_flow_process(cmd: list[str], cwd: Path, env: dict, log: Path, timeout: int = 900) -> tuple[int, str]:
    """Run a flow in its own process group, output to a file (not a pipe: a process killed at a fault point
    leaves its ephemeral API server orphaned, holding any pipe open), then end whatever it left behind."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return code, log.read_text()
