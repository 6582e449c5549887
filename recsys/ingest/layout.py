"""Where ingest keeps things: inbox, store, quarantine, reports, manifest, and its state in `.ingest/`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recsys.config import REGISTRY_URL_ENV, ConfigError, IngestConfig, RegistryConfig
from recsys.digest import file_sha256  # noqa: F401 (recsys.ingest exports it from here)
from recsys.ingest.errors import BatchRejected, IngestError
from recsys.layout import (
    CURVE,
    EVAL_DIR,
    EXPECTATIONS,
    METRICS,
    MODEL_DIR,
    PARAMS,
    PREPARED,
    RESUME,
    SCRATCH,
    WARM_DIR,
)
from recsys.workspace import STATE_DIR

PROCESSED, REJECTED = "processed", "rejected"  # where a run files its batches, inside the inbox


@dataclass(frozen=True)
class Paths:
    root: Path
    inbox: Path
    store: Path
    quarantine: Path
    reports: Path
    manifest: Path
    state: Path
    params: Path  # the params.yaml whose registry section says where the model registry is (`check_inbox`)

    @property
    def pending(self) -> Path:
        """Journals of commits in progress (one per batch)."""
        return self.state / "pending"

    @property
    def scratch(self) -> Path:
        """The one place ingest creates temp files; emptied when the next run (or recovery) starts."""
        return self.state / SCRATCH

    @property
    def push_marker(self) -> Path:
        """Present while the DVC remote may lack committed data (removed after a successful push)."""
        return self.state / "push-pending.json"

    @property
    def dvc_file(self) -> Path:
        return self.root / f"{self.store.relative_to(self.root)}.dvc"


def paths(repo_root: str | Path, config: IngestConfig, inbox: str | Path | None = None,
          params: str | Path | None = None) -> Paths:
    """`params`: the params.yaml `config` came from (`recsys ingest --params`); the repository's by default."""
    root = Path(repo_root).resolve()
    return Paths(
        root=root,
        inbox=Path(inbox).resolve() if inbox is not None else (root / config.inbox).resolve(),
        store=root / config.store,
        quarantine=root / config.quarantine,
        reports=root / config.reports,
        manifest=root / config.manifest,
        state=root / STATE_DIR,
        params=Path(params).resolve() if params is not None else root / PARAMS,
    )


def check_inbox(where: Paths, config: IngestConfig) -> Paths:
    """Refuse an inbox whose files are not batches: a run takes every file there for one and moves it to
    `processed/` or `rejected/` — with `ingest.inbox: ''` or `--inbox .`, the repository's README.md,
    params.yaml and data.dvc. Called before anything is locked, moved or written, by every run (the CLI, both
    flows); `config` is params.yaml's section, whose inbox's filing folders are no inbox either."""
    why = _not_an_inbox(where, config)
    if why is not None:
        raise ConfigError(
            f"inbox {where.inbox} {why}: a run would take every file there for a batch and move it into the "
            f"inbox's {PROCESSED}/ or {REJECTED}/ folder; set ingest.inbox in {where.params.name} (or --inbox) "
            f"to a folder of its own, such as {IngestConfig.inbox}")
    _check_outputs(where)
    return where


def _check_outputs(where: Paths) -> None:
    """Refuse quarantine, reports and manifest paths a run cannot or must not write: a file where a folder
    goes, or a place inside the versioned raw store (`dvc add` would version a report as data), DVC's or
    git's folders, or the expectation suites."""
    root = where.root
    kept = _kept(where)
    for key, path, folder in (("quarantine", where.quarantine, True), ("reports", where.reports, True),
                              ("manifest", where.manifest, False)):
        resolved = path.resolve()
        for place, what in kept.items():
            if resolved.is_relative_to(place.resolve()):
                raise ConfigError(f"ingest.{key} ({path}) lies in {_shown(place, root)}, {what}: set "
                                  f"ingest.{key} in {where.params.name} to a path of its own, such as "
                                  f"{getattr(IngestConfig, key)}")
        if folder and path.exists() and not path.is_dir():
            raise ConfigError(f"ingest.{key} ({path}) is a file, not a folder: set ingest.{key} in "
                              f"{where.params.name} to a folder, such as {getattr(IngestConfig, key)}")
    # A quarantine file and a store part are written in the scratch folder and renamed into place in one
    # step, which cannot cross file systems: refused here, before anything runs, not as a failed rename at
    # the first bad row that then holds the inbox at that batch on every run.
    if _apart(where.quarantine, where.scratch):
        raise ConfigError(f"ingest.quarantine ({where.quarantine}) is on another file system than the "
                          f"workspace's {_shown(where.state, root)} (where ingest writes each quarantine file "
                          "before one rename puts it in place): set ingest.quarantine in "
                          f"{where.params.name} to a folder on the repository's disk, such as "
                          f"{IngestConfig.quarantine}")
    if _apart(where.store, where.scratch):
        raise ConfigError(f"the raw store {where.store} is on another file system than the workspace's "
                          f"{_shown(where.state, root)} (where ingest writes each part before one rename puts "
                          "it in the store): keep both on one disk")


def _apart(path: Path, scratch: Path) -> bool:
    """Whether `path` is on another file system than `scratch` (False where either cannot be told)."""
    devices = _device(path), _device(scratch)
    return None not in devices and devices[0] != devices[1]


def _device(path: Path) -> int | None:
    """The file system `path` is (or, not there yet, would be created) on: its nearest existing folder's;
    None where that cannot be told (a folder on the way that may not be read), which the check then skips."""
    for existing in (path, *path.parents):
        try:
            return existing.stat().st_dev
        except (FileNotFoundError, NotADirectoryError):  # not there (yet): the folder it would be made in
            continue
        except OSError:
            return None
    return None


def _not_an_inbox(where: Paths, config: IngestConfig) -> str | None:
    inbox, root = where.inbox, where.root
    if inbox == root:
        return "is the repository root"
    if root.is_relative_to(inbox):
        return f"is a folder above the repository {root}"
    filing = _filing((root / config.inbox).resolve())
    for folder, what in {**_owned(where), **filing}.items():
        if inbox.is_relative_to(folder):
            return f"{'is' if inbox == folder else 'lies in'} {_shown(folder, root)}, {what}"
        if folder.is_relative_to(inbox) and folder not in filing:
            return f"holds {_shown(folder, root)}, {what}"
    if where.manifest.resolve().parent == inbox:
        return f"holds the ingest manifest {where.manifest.name} (ingest.manifest)"
    return None


def _kept(where: Paths) -> dict[Path, str]:
    """The folders no ingest path may be or lie in: the versioned store, DVC's and git's, the suites. One
    wording for both checks (`_check_outputs`, `_not_an_inbox`)."""
    root = where.root
    return {where.store: "the raw store data.dvc versions", root / ".dvc": "DVC's cache and configuration",
            root / ".git": "git's repository",
            root / EXPECTATIONS: "the expectation suites the batches are validated with"}


def _owned(where: Paths) -> dict[Path, str]:
    """The folders the system writes: no inbox may be, lie in, or hold one."""
    root = where.root
    owned = {where.quarantine: "ingest's quarantine (ingest.quarantine)",
             where.reports: "ingest's reports (ingest.reports)", where.state: "ingest's state and locks",
             **_kept(where)}
    for output in (PREPARED, MODEL_DIR, WARM_DIR, EVAL_DIR, METRICS, CURVE, RESUME):
        owned.setdefault(root / Path(output).parts[0], "the pipeline's outputs")
    # The embedded registry's folder (registry.url's SQLite file, registry.artifact_root) by its defaults,
    # and where the run's params file puts them (in this repository or not).
    owned.setdefault(root / Path(RegistryConfig.artifact_root).parts[0],
                     "the model registry (registry.url, registry.artifact_root)")
    for path, what in _registry_paths(root, where.params).items():
        owned.setdefault(path, what)
    return {folder.resolve(): what for folder, what in owned.items()}


def _filing(inbox: Path) -> dict[Path, str]:
    """The inbox's filing folders, where a run moves the batches it has read."""
    return {inbox / PROCESSED: "where a run files the batches it ingested",
            inbox / REJECTED: "where a run files the batches it rejected"}


def system_place(where: Paths, target: Path, seed: bool = False) -> str | None:
    """Which folder the system writes `target` is or lies in ("lies in data/, the raw store data.dvc
    versions"), or None: where `recsys data batch --out` may not write a batch (a CSV planted as a store part,
    a batch in the inbox's filing folders) and, with `seed`, where `data generate | import --out` may not write
    a seed — the raw store itself aside, which is where a seed goes, but the inbox too (its files would be
    taken for batches)."""
    resolved = Path(target).resolve()
    if seed and resolved == where.store.resolve():
        return None
    for folder, what in _owned(where).items():
        if resolved.is_relative_to(folder):
            return f"{'is' if resolved == folder else 'lies in'} {_shown(folder, where.root)}, {what}"
    inbox = where.inbox.resolve()
    if seed and resolved.is_relative_to(inbox):
        return f"{'is' if resolved == inbox else 'lies in'} the inbox (ingest.inbox), whose files are batches"
    for folder in _filing(inbox):
        if resolved.is_relative_to(folder):
            return f"lies in the inbox's {folder.name}/, where ingest files the batches it has read"
    return None


def _registry_paths(root: Path, params: Path) -> dict[Path, str]:
    """registry.artifact_root and a SQLite registry.url's database file (RECSYS_REGISTRY_URL first), as
    `params` (the run's params.yaml) sets them. Read leniently — ingest needs nothing else of the registry, and
    a section it cannot read here is refused by whatever opens the registry — so only paths come back."""
    import os

    import yaml

    try:
        raw = yaml.safe_load(params.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, yaml.YAMLError):
        raw = None
    section = raw.get("registry") if isinstance(raw, dict) else None
    section = section if isinstance(section, dict) else {}
    found: dict[Path, str] = {}
    artifacts = section.get("artifact_root", RegistryConfig.artifact_root)
    if isinstance(artifacts, str) and artifacts.strip() and "://" not in artifacts:
        found[root / artifacts] = "the model registry's artifacts (registry.artifact_root)"
    url = os.environ.get(REGISTRY_URL_ENV) or section.get("url", RegistryConfig.url)
    if isinstance(url, str) and url.startswith("sqlite:///"):
        database = url.removeprefix("sqlite:///").split("?")[0]
        if database and database != ":memory:":
            found[root / database] = "the model registry's database (registry.url)"
    return found


def _shown(folder: Path, root: Path) -> str:
    if not folder.is_relative_to(root):
        return str(folder)
    return f"{folder.relative_to(root)}{'' if folder.is_file() or folder.suffix else '/'}"  # (a database file)


def named_batches(names: Sequence[str | Path], where: Paths) -> list[Path] | None:
    """The batch files a command line names, checked before anything is locked or moved; None when it names
    the inbox itself, which means every file in it. Each must be a file inside the inbox (a subfolder's too):
    anything else is a mistake on the command line, refused as one line, not a rejected batch. A file named
    twice (`inbox/a.csv ./inbox/a.csv`, or through a link) is one batch, named as it was first: the second
    name found it already moved to processed/ and was rejected as a missing file."""
    files, whole_inbox, seen = [], False, set()
    for name in names:
        path = Path(name)
        resolved = path.resolve()
        if resolved == where.inbox:
            whole_inbox = True
            continue
        if not resolved.exists():
            raise IngestError(f"{path} does not exist{_filed(where, path.name)}; {_inbox_holds(where)}")
        if not resolved.is_relative_to(where.inbox):
            link = f" (a link to {resolved})" if path.is_symlink() else ""
            raise IngestError(f"{path}{link} is outside the inbox {where.inbox}: move the file into the "
                              "inbox, then ingest it from there")
        if resolved.is_dir():
            raise IngestError(f"{path} is a folder: ingest reads one file per batch (CSV, JSON lines or "
                              "Parquet); name its files, or move them into the inbox itself")
        if not resolved.is_file():
            raise IngestError(f"{path} is not a regular file: ingest reads one file per batch (CSV, JSON "
                              "lines or Parquet)")
        if resolved not in seen:
            seen.add(resolved)
            files.append(path)
    return None if whole_inbox else files


def _filed(where: Paths, name: str) -> str:
    """Where a run filed a batch of that name, if one did: a batch ingested or rejected before is named again
    (`recsys ingest inbox/b.csv` after the run that moved it); the inbox alone does not say why it is gone."""
    for folder, what in ((REJECTED, "rejected"), (PROCESSED, "ingested")):
        filed = where.inbox / folder / name
        if filed.is_file():
            return (f" (a batch of that name was {what} before and filed as {filed}"
                    f"{': its report says why' if folder == REJECTED else ''})")
    return ""


def _inbox_holds(where: Paths, shown: int = 5) -> str:
    if not where.inbox.is_dir():
        return f"the inbox {where.inbox} does not exist"
    names = [f"{p.name}/" if p.is_dir() else p.name for p in inbox_files(where)]
    if not names:
        return f"the inbox {where.inbox} is empty"
    more = f", … ({len(names)} in all)" if len(names) > shown else ""
    return f"the inbox {where.inbox} holds {', '.join(names[:shown])}{more}"


def inbox_files(where: Paths) -> list[Path]:
    """The batches waiting in the inbox, sorted by name (hidden files and the filing folders are not). A
    folder counts, to be refused (`check_inside_inbox`): skipped, it would wait there unread for ever while
    every run said the inbox was empty."""
    if not where.inbox.is_dir():
        return []
    return sorted(p for p in where.inbox.iterdir()
                  if not p.name.startswith(".") and not (p.is_dir() and p.name in (PROCESSED, REJECTED)))


def needs_recovery(where: Paths) -> bool:
    """Whether a crash left something for `recovery.recover` to finish: a commit journal, or a file in the
    scratch folder. (A torn manifest line always has its journal beside it: the journal is removed only after
    the line is written. `.tmp-*` parts an older version left in the store wait for the next run that ingests
    or recovers: no reader lists them.)"""
    journals = where.pending.glob("*.json") if where.pending.is_dir() else iter(())
    scratch = where.scratch.iterdir() if where.scratch.is_dir() else iter(())
    return next(journals, None) is not None or next(scratch, None) is not None


NOTHING_TO_INGEST = "nothing to ingest: the inbox is empty and no commit or push is unfinished"


def push_owed(where: Paths, config: IngestConfig) -> bool:
    """Whether a run with these settings would push: the marker says the remote may lack committed data and
    `ingest.dvc_push` is on. With it off the marker stays (`recovery.complete_push`): the push is owed to the
    first run that has it on, not forgotten — and not a reason for every nothing-new run to start."""
    return config.dvc_push and where.push_marker.exists()


def has_work(where: Paths, config: IngestConfig) -> bool:
    """Whether an ingest run would find anything to do: a batch in the inbox, an interrupted commit, or a push
    not yet done. A few stats, no data read and no lock taken — a scheduled run checks this before it loads
    the ingest code; a run that starts anyway takes the lock and checks everything again."""
    return bool(inbox_files(where)) or needs_recovery(where) or push_owed(where, config)


def check_inside_inbox(path: Path, inbox: Path) -> Path:
    """Resolve symlinks and `..`; only regular files inside the inbox are accepted."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(inbox):
        raise BatchRejected(f"{path} is outside the inbox {inbox}; copy the file into the inbox first")
    if resolved.is_dir():
        raise BatchRejected(f"{path} is a folder: ingest reads one file per batch (CSV, JSON lines or "
                            "Parquet); move its files into the inbox one by one and remove the folder")
    if not resolved.is_file():
        raise BatchRejected(f"{path} does not exist or is not a regular file")
    return resolved

