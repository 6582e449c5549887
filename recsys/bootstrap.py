"""Make sure the raw store exists before anything reads it: `dvc pull` it, or — when nothing was ever
ingested — generate the default dataset and version it.

`recsys bootstrap`, `scripts/demo.sh` and every flow go through `ensure_raw_store`, so a fresh clone works
from any of them. (`dvc repro` alone cannot: DVC checks `data.dvc` before running any code, so the README
says to run `recsys bootstrap` first.)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from recsys.atomic import write_text_atomic
from recsys.faults import fault_point
from recsys.layout import Layout
from recsys.workspace import dvc_error_line, run_dvc, workspace_lock

if TYPE_CHECKING:
    from collections.abc import Callable

    from recsys.config import Params


class BootstrapError(RuntimeError):
    """The raw store is missing and cannot be recreated here; the message says what to run."""


def _seed_names() -> tuple[str, str]:
    """What `write_store` writes, relative to the store: the seed part and items.csv."""
    from recsys.data import SEED_PART

    return f"interactions/{SEED_PART}", "items.csv"


def _seed_files(paths: Layout) -> dict[str, str]:
    """The seed's files as they are on disk now: relative path -> sha256 ("" for a missing file)."""
    import hashlib

    found = {}
    for name in _seed_names():
        path = paths.data / name
        found[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
    return found


def _remove_seed(paths: Layout) -> None:
    """Undo a generated seed that `dvc add` did not record — its two files, only while the store holds no
    other part — then the marker that says so."""
    for name in _seed_names():
        (paths.data / name).unlink(missing_ok=True)
    interactions = paths.data / "interactions"
    if interactions.is_dir() and not any(interactions.iterdir()):
        interactions.rmdir()
    paths.seeding.unlink(missing_ok=True)


def _settle_seeding(root: Path, paths: Layout, params: Params) -> str:
    """A bootstrap stopped between writing its seed and marking the seed's push (the `seeding` marker holds
    the seed files' sha256 once they were whole): finish it, or undo a seed it had not finished writing —
    never touching what another command wrote since. Returns what it did."""
    text = paths.seeding.read_text(encoding="utf-8").strip()
    written = json.loads(text) if text else None
    seed = _seed_files(paths)
    parts = (paths.data / "interactions").glob("*.parquet")
    others = [p for p in parts if f"interactions/{p.name}" not in seed]
    if others or (written is not None and seed != written):
        paths.seeding.unlink()  # another command wrote the store since (an import, an ingest): theirs
        return "left"
    if written is None:  # killed while writing it: a part that may be torn
        _remove_seed(paths)
        return "removed"
    _version_seed(root, params)  # the whole seed, maybe added already (adding again changes nothing)
    paths.seeding.unlink()
    return "versioned"


def _ingest_side(root: Path, params: Params):
    """Ingest's layout and settings as params.yaml gives them: the seed's push marker and push are ingest's
    (one home: `ingest.dvc_push: false` means no push from bootstrap either)."""
    from recsys.ingest.layout import paths as ingest_paths

    return ingest_paths(root, params.ingest), params.ingest


def _version_seed(root: Path, params: Params) -> None:
    """`dvc add` the store and mark its push pending (ingest's marker, until a push succeeds: if this run's
    push fails, the next ingest run, which sees the marker, pushes the seed first)."""
    from recsys.ingest.commit import mark_push_pending

    run_dvc(root, "add", Layout(root).data.name)
    mark_push_pending(_ingest_side(root, params)[0])


_NOT_PUSHED = " (not pushed: ingest.dvc_push is false)"


def _push_seed(root: Path, params: Params) -> bool:
    """Ingest's push of a marked store (`recsys.ingest.recovery.complete_push`): a failure raises its
    sentence and leaves the marker, so the next ingest run pushes the seed first. False: not pushed, as
    `ingest.dvc_push: false` says."""
    from recsys.ingest.recovery import complete_push

    return complete_push(*_ingest_side(root, params)) is not None


PRESENT = "raw store present"


def _left_undone(root: Path, params: Callable[[], Params]) -> bool:
    """Whether a killed ingest or bootstrap left a commit or a push unfinished (`recsys.ingest.layout`'s few
    stats; where ingest keeps its state does not depend on the settings, so they are read only for a push
    marker: with `ingest.dvc_push: false` the push waits, as in an ingest run)."""
    from recsys.config import IngestConfig
    from recsys.ingest.layout import needs_recovery, push_owed
    from recsys.ingest.layout import paths as ingest_paths

    where = ingest_paths(root, IngestConfig())
    return needs_recovery(where) or (where.push_marker.exists() and push_owed(where, params().ingest))


def _present(root: Path, params: Params) -> str:
    """The store is here: finish what a killed ingest or bootstrap left (its commit, its push: a push killed
    midway left the remote without the data), as the next ingest run would, in one line."""
    if not _left_undone(root, lambda: params):
        return PRESENT
    from recsys.ingest.recovery import finish_interrupted

    return "; ".join([PRESENT, *finish_interrupted(*_ingest_side(root, params))])


def store_has_data(root: Path) -> bool:
    interactions = Layout(root).data / "interactions"
    return interactions.is_dir() and any(interactions.glob("*.parquet"))


def _recorded_files(data_dvc: Path) -> int | None:
    """How many files `data.dvc` says the store holds (None when there is no data.dvc)."""
    if not data_dvc.is_file():
        return None
    outs = (yaml.safe_load(data_dvc.read_text(encoding="utf-8")) or {}).get("outs") or [{}]
    return int(outs[0].get("nfiles") or 0)


def ensure_raw_store(root: Path = Path("."), params_path: Path | None = None) -> str:
    """The raw store under `root`: present, pulled from the DVC remote, or generated and `dvc add`ed.

    Generating is refused when `data.dvc` records ingested batches the remote could not give back:
    replacing someone's data with the synthetic default must never happen silently. A store to pull,
    generate or version where `root` is no DVC repository is refused before anything is locked or written
    (it was written, then `dvc add` failed, on every run); a present store needs no DVC, as for ingest.
    Returns one line saying which of the three happened (and, for a present store, what a killed ingest or
    bootstrap had left undone that it finished: a commit, a push).
    """
    root = Path(root)
    paths = Layout(root)

    @functools.cache
    def params() -> Params:  # read once, and only on the paths that need it (a pull does not)
        from recsys.config import load_params

        return load_params(params_path or paths.params)

    if store_has_data(root) and not paths.seeding.exists() and not _left_undone(root, params):
        return PRESENT
    from recsys.ingest.dvc import dvc_enabled

    if (paths.seeding.exists() or not store_has_data(root)) and not dvc_enabled(root):
        raise BootstrapError(f"{root.resolve()} is not a DVC repository (no .dvc/): the raw store is pulled, "
                             "or generated and `dvc add`ed, with DVC; run this in a clone of the project, or "
                             "`dvc init` there first")

    with workspace_lock(root):
        if paths.seeding.exists() and _settle_seeding(root, paths, params()) == "versioned":
            if _push_seed(root, params()):
                return "versioned and pushed the default dataset an interrupted bootstrap had generated"
            return f"versioned the default dataset an interrupted bootstrap had generated{_NOT_PUSHED}"
        if store_has_data(root):  # another process bootstrapped while we waited, or a killed run left work
            return _present(root, params())
        pulled = None
        if paths.data_dvc.is_file():
            # (never --quiet on a DVC command: it hides DVC's ERROR line, the one our error quotes)
            pulled = run_dvc(root, "pull", paths.data_dvc.name, check=False)
            if pulled.returncode == 0 and store_has_data(root):
                return "raw store pulled from the DVC remote"
        recorded = _recorded_files(paths.data_dvc)
        if recorded is not None and recorded > len(_seed_names()):  # more than the seed
            why = dvc_error_line(pulled.stderr or pulled.stdout) if pulled else ""
            raise BootstrapError(
                f"{paths.data_dvc.name} records {recorded} files of ingested data that `dvc pull` could not "
                f"fetch ({why}); point DVC at the remote that holds them (`dvc remote list`) and run `dvc pull`"
            )
        from recsys.data import generate, write_store

        generated = generate(params().generate)
        # From writing the seed until data.dvc records it and its push is marked, `seeding` says so (with the
        # seed files' sha256 once they are whole): a failure while writing removes the seed at once; after
        # that a failure or a kill leaves the marker, and the next run versions the seed (`_settle_seeding`).
        paths.seeding.parent.mkdir(parents=True, exist_ok=True)
        paths.seeding.write_text("", encoding="utf-8")
        whole = False
        try:
            write_store(generated, paths.data)
            fault_point("seed_writing")  # (as if killed before its files were whole: the marker is empty)
            write_text_atomic(paths.seeding, json.dumps(_seed_files(paths)), paths.scratch)
            whole = True
            fault_point("seed_written")
            _version_seed(root, params())
        except BaseException:
            if not whole:  # a whole seed stays, with its marker: the next run versions it (`_settle_seeding`)
                _remove_seed(paths)
            raise
        paths.seeding.unlink()
        pushed = _push_seed(root, params())
    return f"generated the default dataset into data/ and versioned it with DVC{'' if pushed else _NOT_PUSHED}"
