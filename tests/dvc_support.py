"""Throw-away git + DVC repositories for tests (no tests here): made once per module, copied per test.

`make_dvc_repo` runs `git init` + `dvc init` (seconds each on a loaded box); `copy_repo` copies a made one.
The `dvc_template` / `dvc_repo` fixtures in conftest.py build on these.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, f"{cmd} failed: {result.stderr}"
    return result.stdout


def dvc_command() -> list[str]:
    return [str(VENV_BIN / "dvc")] if (VENV_BIN / "dvc").exists() else [sys.executable, "-m", "dvc"]


def make_dvc_repo(root: Path, remote: Path) -> Path:
    """A throw-away git + DVC repository (with an `inbox/`) and a local default remote named `local`."""
    (root / "inbox").mkdir(parents=True, exist_ok=True)
    run(["git", "init", "-q"], root)
    run(["git", "config", "user.email", "t@example.com"], root)
    run(["git", "config", "user.name", "t"], root)
    dvc = dvc_command()
    run([*dvc, "init", "-q"], root)
    run([*dvc, "config", "core.analytics", "false"], root)
    remote.mkdir(parents=True, exist_ok=True)
    run([*dvc, "remote", "add", "-d", "local", str(remote)], root)
    return root


def copy_repo(template: Path, target: Path) -> Path:
    shutil.copytree(template, target, symlinks=True)
    return target


def copy_with_its_remote(template: Path, tmp_path: Path) -> Path:
    """`tmp_path/repo`, a copy of `template` whose remote is a copy of the template's (`template.parent/remote`:
    what the template pushed is there), set in `.dvc/config` as `dvc remote modify` sets it, so that a test
    can point it elsewhere and back the same way."""
    repo = copy_repo(template, tmp_path / "repo")
    remote = tmp_path / "remote"
    run(["cp", "-r", str(template.parent / "remote"), str(remote)], tmp_path)
    run([str(VENV_BIN / "dvc"), "remote", "modify", "local", "url", str(remote)], repo)
    return repo


def point_remote(repo: Path, remote: Path) -> Path:
    """Give a copied repository its own (empty) remote, through `.dvc/config.local` (no `dvc` process)."""
    remote.mkdir(parents=True, exist_ok=True)
    (repo / ".dvc" / "config.local").write_text(f"['remote \"local\"']\n    url = {remote}\n")
    return repo


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under `root` — the sha256 of each file's bytes, "folder" for a folder — to show
    that a refused command locked, moved and wrote nothing."""
    import hashlib

    def state(path: Path) -> str:
        if path.is_symlink():
            return f"link to {os.readlink(path)}"
        return "folder" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()

    return {str(p.relative_to(root)): state(p) for p in sorted(root.rglob("*"))}
