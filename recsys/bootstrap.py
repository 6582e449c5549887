"""Make sure the raw store exists before anything reads it: `dvc pull` it, or — when nothing was ever
ingested — generate the default dataset and version it.

`recsys bootstrap`, `scripts/demo.sh` and every flow go through `ensure_raw_store`, so a fresh clone works
from any of them. (`dvc repro` alone cannot: DVC checks `data.dvc` before running any code, so the README
says to run `recsys bootstrap` first.)
"""

from __future__ import annotations

from pathlib import Path

import yaml

from recsys.faults import fault_point
from recsys.layout import Layout
from recsys.workspace import dvc_error_line, run_dvc, workspace_lock

SEED_FILES = 2  # what `recsys.data.write_store` writes: the seed part and items.csv


class BootstrapError(RuntimeError):
    """The raw store is missing and cannot be recreated here; the message says what to run."""


def _remove_seed(paths: Layout) -> None:
    """Undo a generated seed that `dvc add` did not record: what `write_store` writes (the interactions
    folder, which held no part before it, and items.csv), then the marker that says so."""
    import shutil

    shutil.rmtree(paths.data / "interactions", ignore_errors=True)
    (paths.data / "items.csv").unlink(missing_ok=True)
    paths.seeding.unlink(missing_ok=True)


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
    replacing someone's data with the synthetic default must never happen silently.
    Returns one line saying which of the three happened.
    """
    root = Path(root)
    paths = Layout(root)
    if store_has_data(root) and not paths.seeding.exists():
        return "raw store present"
    with workspace_lock(root):
        if paths.seeding.exists():  # killed between generating a seed and `dvc add` recording it: start over
            _remove_seed(paths)
        if store_has_data(root):  # another process bootstrapped while we waited
            return "raw store present"
        pulled = None
        if paths.data_dvc.is_file():
            # (never --quiet on a DVC command: it hides DVC's ERROR line, the one our error quotes)
            pulled = run_dvc(root, "pull", paths.data_dvc.name, check=False)
            if pulled.returncode == 0 and store_has_data(root):
                return "raw store pulled from the DVC remote"
        recorded = _recorded_files(paths.data_dvc)
        if recorded is not None and recorded > SEED_FILES:
            why = dvc_error_line(pulled.stderr or pulled.stdout) if pulled else ""
            raise BootstrapError(
                f"{paths.data_dvc.name} records {recorded} files of ingested data that `dvc pull` could not "
                f"fetch ({why}); point DVC at the remote that holds them (`dvc remote list`) and run `dvc pull`"
            )
        from recsys.config import IngestConfig, load_params
        from recsys.data import generate, write_store
        from recsys.ingest.commit import mark_push_pending
        from recsys.ingest.layout import paths as ingest_paths

        generated = generate(load_params(params_path or paths.params).generate)
        # From writing the seed until data.dvc records it and its push is marked, `seeding` says the store
        # is not versioned: a failure removes the seed at once, a kill leaves the marker for the next run.
        paths.seeding.parent.mkdir(parents=True, exist_ok=True)
        paths.seeding.touch()
        try:
            write_store(generated, paths.data)
            fault_point("seed_written")
            run_dvc(root, "add", paths.data.name)
            # Ingest's push marker, from the add until the push succeeds: if the push fails, this run fails
            # (DvcError, one line at the entry point) and the next ingest run, which sees the marker, pushes
            # the seed first. (After the add: a marker without data.dvc has nothing to push.)
            config = IngestConfig()
            where = ingest_paths(root, config)
            mark_push_pending(where, config)
        except BaseException:
            _remove_seed(paths)
            raise
        paths.seeding.unlink()
        run_dvc(root, "push", paths.data_dvc.name)
        where.push_marker.unlink()
    return "generated the default dataset into data/ and versioned it with DVC"
