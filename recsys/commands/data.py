"""`recsys data …` — datasets: generate the embedded default, download MovieLens, import a seed, write a
follow-up batch. recsys/cli.py registers this group as `recsys data`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from recsys.atomic import file_in_the_way
from recsys.config import DEFAULT_PARAMS, load_params, params_root
from recsys.layout import DATA

app = typer.Typer(no_args_is_help=True, help="Datasets: generate, download, import into the raw store.")
PARAMS = typer.Option(DEFAULT_PARAMS, "--params", help="params.yaml to read")


def folder_option(value: str, option: str = "--out") -> Path:
    """A folder to write into, named on the command line: not empty (Path("") is the current folder, so an
    empty value wrote the store into whatever folder the command ran in) and not an existing file."""
    path = Path(value)
    if not value.strip():
        raise typer.BadParameter("empty: name a folder", param_hint=f"'{option}'")
    if path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{value} is a file: name a folder", param_hint=f"'{option}'")
    _no_file_above(path, option)
    return path


def _no_file_above(path: Path, option: str) -> None:
    """A file where a folder above `path` goes (`--out README.md/sub`): refused here, not a traceback."""
    above = file_in_the_way(path.parent)
    if above is not None:
        raise typer.BadParameter(f"{above} is a file where a folder of {path} goes", param_hint=f"'{option}'")


def file_option(value: str, option: str = "--out") -> Path:
    """A file to write, named on the command line: not empty and not an existing folder."""
    path = Path(value)
    if not value.strip():
        raise typer.BadParameter("empty: name a file", param_hint=f"'{option}'")
    if path.is_dir():
        raise typer.BadParameter(f"{value} is a folder: name a file in it", param_hint=f"'{option}'")
    if path.parent.exists() and not path.parent.is_dir():
        raise typer.BadParameter(f"its folder {path.parent} is a file", param_hint=f"'{option}'")
    _no_file_above(path.parent, option)
    return path


@app.command("generate")
def data_generate(
    out: str | None = typer.Option(None, help="raw store directory to write (default: data/ of the params "
                                              "file's repository)"),
    params: Path = PARAMS,
) -> None:
    """Write the deterministic synthetic dataset (params.yaml `generate`) as the store's seed part; refused
    when the store holds ingested batches."""
    from recsys.data import generate, write_store

    store = folder_option(out) if out is not None else params_root(params, relative=True) / DATA
    loaded = load_params(params)
    if out is not None:
        refuse_system_place(store, params, loaded, seed=True)
    part = write_store(generate(loaded.generate), store)
    typer.echo(f"wrote {part}")


@app.command("batch")
def data_batch(
    index: str = typer.Argument("1", help="batch number (1, 2, …): later batches cover later periods"),
    out: Optional[str] = typer.Option(None, help="file to write (default: generated-NNNN.csv, the index "
                                                 "zero-padded to four digits, in the ingest.inbox of the params "
                                                 "file's repository)"),
    params: Path = PARAMS,
) -> None:
    """Write a follow-up batch of generated interactions (CSV) — new data for the inbox."""
    from recsys.atomic import write_text_atomic
    from recsys.data import DataError, batch_index_problem, generate_batch

    if not re.fullmatch(r"-?(0|[1-9][0-9]*)", index):  # Click's int took "1.0", "+1", " 3" and "1_0" (as 10)
        raise typer.BadParameter(f"{index!r} is not a whole number written plainly (1, 2, …)",
                                 param_hint="'INDEX'")
    # Past 18 digits a number is out of every range (and past 4,300 int() refuses it with a traceback)
    digits = len(index.lstrip("-"))
    long = digits > 18
    number = (-1 if index.startswith("-") else 10**18) if long else int(index)
    chosen = file_option(out) if out is not None else None
    loaded = load_params(params)
    problem = batch_index_problem(loaded.generate, number,
                                  said=f"a number of {digits:,} digits" if long else None)
    if problem:  # a value of the command line's, out of its range: a usage error, before anything is created
        raise typer.BadParameter(problem.removeprefix("batch index "), param_hint="'INDEX'")
    # The inbox of the repository whose params.yaml this is, as `recsys ingest --params` reads it: from
    # another folder, the current folder's inbox/ got the batch, which that repository's ingest never saw.
    inbox = params_root(params) / loaded.ingest.inbox
    if chosen is None and inbox.is_relative_to(Path.cwd()):
        inbox = inbox.relative_to(Path.cwd())  # said as before: `wrote … to inbox/generated-0001.csv`
    target = chosen or inbox / f"generated-{number:04d}.csv"
    if chosen is not None:
        refuse_system_place(chosen, params, loaded)
    frame = generate_batch(loaded.generate, number)
    text = frame.to_csv(index=False, lineterminator="\n")
    same = target.is_file() and target.read_bytes() == text.encode()
    if target.exists() and not same:
        # The same batch again is a no-op; anything else there (params.yaml, another batch) is not replaced.
        raise DataError(f"{target} exists with other contents: `recsys data batch` never replaces a file; "
                        "name a new one with --out, or move that one away")
    if not same:
        target.parent.mkdir(parents=True, exist_ok=True)
        # whole or absent: an ingest that finds the file in the inbox never reads half a batch
        write_text_atomic(target, text, target.parent)
    typer.echo(f"wrote {len(frame)} interactions to {target}")
    future_batch_warning(frame, loaded.ingest, number)


def future_batch_warning(frame, config, number: int) -> None:  # type: ignore[no-untyped-def]
    """Say so when a generated batch's times lie beyond what ingest accepts today (now + its future skew):
    batch 6 of the default dataset, dated 2026-12 on and after, was written and then rejected whole."""
    import time
    from datetime import datetime, timezone

    limit = time.time() + config.max_future_skew_seconds
    ahead = int((frame["timestamp"] > limit).sum())
    if ahead:
        last = datetime.fromtimestamp(int(frame["timestamp"].max()), timezone.utc).date()
        typer.echo(f"warning: {ahead} of its {len(frame)} events are dated after now + "
                   f"ingest.max_future_skew_seconds ({config.max_future_skew_seconds}), up to {last}: ingest "
                   f"rejects them; take an earlier batch than {number}, or an earlier generate.start", err=True)


def refuse_system_place(out: Path, params: Path, loaded, seed: bool = False) -> None:  # type: ignore[no-untyped-def]
    """An `--out` in a folder the system writes (`recsys.ingest.layout.system_place`; with `seed`, a seed's)
    is refused before anything is written, as `--inbox` there is."""
    from recsys.ingest.layout import paths as ingest_paths
    from recsys.ingest.layout import system_place

    place = system_place(ingest_paths(params_root(params), loaded.ingest, params=params), out, seed)
    if place:
        raise typer.BadParameter(f"{out} {place}: write it to a place of its own", param_hint="'--out'")


@app.command("download")
def data_download(
    name: str = typer.Argument(..., help="movielens-1m | movielens-100k"),
    dest: str = typer.Option(..., help="folder to extract into (the archive's own folder there is replaced; "
                                       "nothing else in it is touched)"),
    url: Optional[str] = typer.Option(None, help="mirror or file:// URL (default: the official archive)"),
    sha256: Optional[str] = typer.Option(None, help="expected sha256 (default: the official MD5 is checked)"),
) -> None:
    """Download a MovieLens archive and verify its checksum before extracting."""
    from recsys.data import MOVIELENS, download_movielens, url_problem

    if name not in MOVIELENS:  # a command line that does not parse: before anything is fetched
        raise typer.BadParameter(f"{name!r} is not one of {' | '.join(MOVIELENS)}", param_hint="'NAME'")
    if url is not None and not url.strip():  # "" fell back to the official archive
        raise typer.BadParameter("is empty: leave it out for the official archive", param_hint="'--url'")
    if url is not None and (problem := url_problem(url)):  # a value of the wrong kind
        raise typer.BadParameter(problem, param_hint="'--url'")
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):  # "" fell back to MD5; a typo
        # was found only after the whole download
        raise typer.BadParameter(f"{sha256!r} is not a sha256 (64 hex digits)", param_hint="'--sha256'")
    folder = folder_option(dest, "--dest")
    typer.echo(f"extracted into {download_movielens(name, folder, url=url, sha256=sha256)}")


def column_mapping(columns: list[str]) -> dict[str, str]:
    """`--column canonical=source` options as a mapping; each must name a canonical column, once, and no
    source column may be read as two (`recsys.schema.mapping_problem`, as for `ingest.column_mapping`)."""
    from recsys.schema import CANONICAL_COLUMNS as known
    from recsys.schema import mapping_problem

    mapping: dict[str, str] = {}
    for option in columns:
        canonical, _, source = option.partition("=")
        if canonical not in known or not source or canonical in mapping:
            raise typer.BadParameter(f"{option!r}: use canonical=source once per canonical column, with "
                                     f"canonical one of {', '.join(known)} (e.g. --column user_id=customer)",
                                     param_hint="'--column'")
        mapping[canonical] = source
    problem = mapping_problem(mapping)
    if problem:
        raise typer.BadParameter(problem, param_hint="'--column'")
    return mapping


SOURCES = ("movielens-1m", "movielens-100k", "table")


@app.command("import")
def data_import(
    source: str = typer.Argument(..., help="movielens-1m | movielens-100k | table"),
    path: Path = typer.Argument(..., help="dataset folder or file"),
    out: str | None = typer.Option(None, help="raw store directory to (re)write (default: data/ of the "
                                              "params file's repository)"),
    column: list[str] = typer.Option([], help="column mapping for `table`: canonical=source, repeatable "
                                              "(default: params.yaml ingest.column_mapping)"),
    params: Path = PARAMS,
) -> None:
    """Replace the raw store's seed with a real dataset (MovieLens or a CSV/Parquet table). Its rows get the
    checks every ingested batch gets (params.yaml `ingest`): one failing row refuses the import; an event
    listed twice is kept once."""
    from recsys.data import (DataError, Generated, check_no_batches, check_seed, read_movielens_1m,
                             read_movielens_100k, read_movielens_titles, read_table, write_store)
    from recsys.ingest.dvc import dvc_add_hint

    if source not in SOURCES:  # a command line that does not parse: before anything is read
        raise typer.BadParameter(f"{source!r} is not one of {' | '.join(SOURCES)}", param_hint="'SOURCE'")
    if column and source != "table":  # MovieLens files have fixed columns: a mapping was silently ignored
        raise typer.BadParameter(f"{column[0]!r}: a column mapping is for `table` only; {source} has fixed "
                                 "columns (leave --column out)", param_hint="'--column'")
    mapping = column_mapping(column) if source == "table" else None
    store = folder_option(out) if out is not None else params_root(params, relative=True) / DATA
    loaded = load_params(params)
    config = loaded.ingest
    if out is not None:
        refuse_system_place(store, params, loaded, seed=True)
    from_params = source == "table" and not column and bool(config.column_mapping)
    if from_params:  # the mapping later batches use (README, Bring your own data)
        mapping = dict(config.column_mapping)
    check_no_batches(store)  # before reading the dataset (write_store checks again)

    if source == "movielens-1m":
        frame, titles = read_movielens_1m(path), read_movielens_titles(path)
    elif source == "movielens-100k":
        frame, titles = read_movielens_100k(path), read_movielens_titles(path)
    else:
        try:
            frame, titles = read_table(path, mapping, config.extra_columns), None
        except DataError as err:  # say where a mapping the command line did not give came from
            if not from_params:
                raise
            raise DataError(f"{err} (the mapping is params.yaml's ingest.column_mapping; --column options "
                            "replace it)") from err
    import pandas as pd

    try:
        frame, duplicates = check_seed(frame, config)
    except DataError as err:
        raise DataError(f"{path}: {err}") from err
    no_titles = pd.DataFrame(columns=["item_id", "title"])
    part = write_store(Generated(frame, titles if titles is not None else no_titles), store)
    dropped = f" ({duplicates} repeated events kept once)" if duplicates else ""
    typer.echo(f"wrote {len(frame)} interactions{dropped} to {part}; {dvc_add_hint(Path(store))}")
