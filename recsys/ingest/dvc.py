"""The DVC steps of a commit: `dvc add` of the store (the new data version) and `dvc push`; and the
`dvc add` a person runs after writing a seed store by hand (`recsys data import`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from recsys import workspace
from recsys.ingest.errors import DvcAddFailed
from recsys.ingest.layout import Paths


def dvc_enabled(root: Path) -> bool:
    """DVC steps run when the repository has been `dvc init`-ed; unit tests without DVC skip them."""
    return (root / ".dvc").is_dir()


def dvc_add_hint(store: Path) -> str:
    """How to version a store just written: `dvc add` it from inside the DVC repository that holds it (run
    from elsewhere, DVC refuses "Cached output(s) outside of DVC project"), or say that none does. Paths as
    DVC takes them (absolute, links not followed) and quoted for a shell."""
    import os
    import shlex

    absolute = Path(os.path.abspath(store))
    root = next((p for p in (absolute, *absolute.parents) if dvc_enabled(p)), None)
    if root is None:
        return (f"{store} is in no DVC repository (no .dvc/ in it or above it): import into a repository's "
                "data/ to version it with `dvc add`")
    if absolute == root:
        return f"{store} is a DVC repository's root, which `dvc add` cannot version: import into its data/"
    try:
        inside = Path(os.path.abspath(Path.cwd())).is_relative_to(root)
    except OSError:  # the current folder was removed: outside any repository
        inside = False
    if inside:
        return f"run `dvc add {shlex.quote(str(store))}` to version them"
    relative = shlex.quote(str(absolute.relative_to(root)))
    return f"run `dvc add {relative}` in {shlex.quote(str(root))} to version them"


def data_version(paths: Paths) -> str | None:
    """The md5 recorded in `data.dvc` (for a directory, DVC writes '<md5>.dir')."""
    return workspace.data_version(paths.root, paths.dvc_file.name)


def dvc_add(paths: Paths) -> str | None:
    if not dvc_enabled(paths.root):
        return None
    result = workspace.run_dvc(paths.root, "add", str(paths.store.relative_to(paths.root)), check=False)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise DvcAddFailed(f"`dvc add {paths.store.name}` failed: {workspace.dvc_error_line(output)}",
                           transient="Unable to acquire lock" in output or "is busy" in output)
    return data_version(paths)


def store_recorded(paths: Paths) -> bool:
    """Whether data.dvc records the store exactly as it is on disk (`dvc status`, which reads, never writes:
    it runs inside a stage of `dvc repro`, where a `dvc add` cannot)."""
    import json

    result = workspace.run_dvc(paths.root, "status", "--json", paths.dvc_file.name, check=False)
    try:
        return result.returncode == 0 and json.loads(result.stdout or "{}") == {}
    except ValueError:  # not DVC's JSON (a warning on stdout): not known to be recorded
        return False


def dvc_push(paths: Paths) -> PushFailure | None:
    """Push the store to the default remote; returns why it failed, or None."""
    if not dvc_enabled(paths.root):
        return None
    result = workspace.run_dvc(paths.root, "push", paths.dvc_file.name, check=False)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        return PushFailure(f"`dvc push {paths.dvc_file.name}` failed ({workspace.dvc_error_line(output)})",
                           transient=workspace.dvc_may_pass(output))
    return None


class PushFailure(NamedTuple):
    """Why a push failed, and whether running it again may succeed (an unreachable remote may come back; no
    remote configured will not)."""

    message: str
    transient: bool
