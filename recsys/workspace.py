"""The repository workspace as the pipeline sees it: running `dvc`, one writer at a time, fault points.

DVC runs as a subprocess with `cwd` at the repository root (its Python API misbehaves when the process's
cwd is elsewhere), using the `dvc` next to the running interpreter so a virtualenv needs no activation.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import yaml

log = logging.getLogger(__name__)

STATE_DIR = ".ingest"  # git-ignored; shared with recsys.ingest, whose journal lives here too
FAULT_ENV = "RECSYS_FAULT"


class DvcError(RuntimeError):
    pass


def fault_point(name: str) -> None:
    """Crash here (no cleanup, like `kill -9`) when RECSYS_FAULT names this point. Used by crash tests."""
    if os.environ.get(FAULT_ENV) == name:
        log.error("injected fault at %s", name)
        os._exit(1)


def subprocess_env() -> dict[str, str]:
    """PATH with this interpreter's bin first, so `python -m recsys...` inside dvc.yaml finds our packages."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def dvc_command(*args: str) -> list[str]:
    executable = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    return [executable, *args] if executable else [sys.executable, "-m", "dvc", *args]


def run_dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(dvc_command(*args), cwd=root, env=subprocess_env(), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise DvcError(f"`dvc {' '.join(args)}` failed:\n{(done.stderr or done.stdout).strip()[-2000:]}")
    return done


LOCK_HOLDER_ENV = "RECSYS_WORKSPACE_LOCK_HOLDER"  # "<pid>:<state dir>" while a process holds the lock


@contextlib.contextmanager
def workspace_lock(root: Path) -> Iterator[None]:
    """Exclusive, crash-safe (flock) lock: only one DVC writer per workspace. Not re-entrant.

    A process started by the holder (the retrain flow's `dvc repro` running `prepare`, which recovers
    the store first) shares the lock: the holder puts its pid in the environment its children inherit,
    and a child that finds a living holder for the same workspace other than itself does not wait for it.
    """
    state = (Path(root) / STATE_DIR).resolve()
    if _held_by_ancestor(state):
        yield
        return
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        previous = os.environ.get(LOCK_HOLDER_ENV)
        os.environ[LOCK_HOLDER_ENV] = f"{os.getpid()}:{state}"
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(LOCK_HOLDER_ENV, None)
            else:
                os.environ[LOCK_HOLDER_ENV] = previous
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _held_by_ancestor(state: Path) -> bool:
    pid, _, where = os.environ.get(LOCK_HOLDER_ENV, "").partition(":")
    if not pid.isdigit() or int(pid) == os.getpid() or where != str(state):
        return False
    try:
        os.kill(int(pid), 0)  # the holder is still alive (a dead one has released its flock)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def data_version(root: Path, dvc_file: str = "data.dvc") -> str | None:
    """The md5 DVC recorded for the raw store (`<md5>.dir`), i.e. the dataset version."""
    path = Path(root) / dvc_file
    if not path.is_file():
        return None
    outs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("outs") or []
    return outs[0].get("md5") if outs else None


def code_version(root: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None
