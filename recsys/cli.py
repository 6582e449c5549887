"""`recsys` command line. Arguments carry names and paths only; hyperparameters live in params.yaml.

Errors the user can fix (bad config, bad input, missing files) print one clear line and exit 1 — no traceback
unless `--verbose` (`recsys --verbose COMMAND ...`) asks for one.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import logging
import os
import re
import sys
from pathlib import Path
from typing import Iterator, Optional

import typer

from recsys.atomic import file_in_the_way
from recsys.config import load_params, params_root, validate_name, workspace_root
from recsys.entry import (
    VERBOSE_ENV, first_repeat, not_utf8, option_words, report_user_error, usage_line, user_errors,
    verbose_requested,
)
from recsys.layout import DATA

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
data_app = typer.Typer(no_args_is_help=True, help="Datasets: generate, download, import into the raw store.")
app.add_typer(data_app, name="data")

PARAMS = typer.Option(Path("params.yaml"), "--params", help="params.yaml to read")


@app.callback()
def _options(verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logs, and tracebacks on errors")):
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # also reaches the stages `dvc` runs for us
        logging.getLogger().setLevel(logging.DEBUG)
        for name in SAID_BY_THE_COMMAND:
            logging.getLogger(name).setLevel(logging.NOTSET)


# The registry's audit records of what a registry command then prints itself (registered, gated, rolled back):
# a flow's log keeps them; on this console each would be said twice.
SAID_BY_THE_COMMAND = ("recsys.registry.core", "recsys.registry.rollback")


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "great_expectations", "httpx", *SAID_BY_THE_COMMAND):
        logging.getLogger(noisy).setLevel(logging.WARNING)


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


@data_app.command("generate")
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


@data_app.command("batch")
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


@data_app.command("download")
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


@data_app.command("import")
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


@app.command()
def bootstrap(root: str = typer.Option(".", help="repository root (a clone of the project)")) -> None:
    """Make sure the raw store exists (`dvc pull` it, or generate the default dataset and version it) and
    write each model's warm source (as `recsys warm`): what `dvc repro` needs before it can run. A folder
    that is no DVC repository is refused before anything is written there, unless its store is present."""
    from recsys.bootstrap import ensure_raw_store
    from recsys.layout import Layout
    from recsys.warm_source import resolve_warm_sources

    if not root.strip():  # Path("") is the current folder: `--root "$UNSET"` bootstrapped wherever it ran
        raise typer.BadParameter("empty: name the repository, or leave --root out for the current folder",
                                 param_hint="'--root'")
    repo = workspace_root(root, "--root")  # before the lock: nothing is created in a wrong folder
    typer.echo(ensure_raw_store(repo))
    for line in resolve_warm_sources(repo, load_params(Layout(repo).params)):
        typer.echo(f"warm source {line}")


@app.command()
def warm(
    model: list[str] = typer.Option([], "--model", help="model(s) to resolve (default: all in params.yaml)"),
    params: Path = PARAMS,
) -> None:
    """Write artifacts/warm/<model>: the registry champion a `train.init: warm | auto` run starts from
    (nothing for `cold`). Run it before `dvc repro`; the retrain flow and `recsys bootstrap` do."""
    from recsys.warm_source import resolve_warm_sources

    names = [validate_name(m, "model name") for m in model] or None
    for line in resolve_warm_sources(params_root(params), load_params(params), names):
        typer.echo(f"warm source {line}")


@app.command()
def prepare(params: Path = PARAMS) -> None:
    """The `prepare` stage (same function `dvc repro` runs), on the repository of the params file: its data/
    in, its artifacts/prepared out, wherever the command runs."""
    from recsys import prepare as stage
    from recsys.ingest import recover

    stage.main(["--params", str(params)], before_read=recover)  # as `dvc repro` runs it


@app.command()
def train(model: str = typer.Option(..., help="model name from params.yaml"), params: Path = PARAMS) -> None:
    """The `train@<model>` stage, in the repository of the params file (its artifacts/, plots/, .resume/)."""
    from recsys import train as stage

    stage.main(["--model", validate_name(model, "model name"), "--params", str(params)])


@app.command()
def evaluate(model: str = typer.Option(..., help="model name from params.yaml"), params: Path = PARAMS) -> None:
    """The `evaluate@<model>` stage (test split, once), in the repository of the params file (its artifacts/,
    metrics/)."""
    from recsys import evaluate as stage

    stage.main(["--model", validate_name(model, "model name"), "--params", str(params)])


def _wire_optional_commands() -> None:
    """Sub-commands whose modules may be absent in a partial checkout stay out of the way. A module's Typer of
    one command (ingest, recommend) joins as that command, so its usage line names no sub-command; one of
    several (registry) joins as a group."""
    for module, name in [("recsys.commands.ingest", "ingest"), ("recsys.commands.registry", "registry"),
                         ("recsys.commands.recommend", "recommend")]:
        try:
            sub = importlib.import_module(module).app
        except ImportError:
            continue
        if len(sub.registered_commands) == 1 and not sub.registered_groups and sub.registered_callback is None:
            command = copy.copy(sub.registered_commands[0])  # every setting of its own, under this name
            command.name = name
            app.registered_commands.append(command)
        else:
            app.add_typer(sub, name=name)


_wire_optional_commands()


def _reflowed(text: str) -> str:
    """Docstring paragraphs as single lines: Typer's help keeps a docstring's line breaks, which the terminal
    then wraps again into ragged lines."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _reflow_help(typer_app: typer.Typer) -> None:
    """Every help text of `typer_app`, its commands and its groups, reflowed (`_reflowed`)."""
    if isinstance(typer_app.info.help, str):
        typer_app.info.help = _reflowed(typer_app.info.help)
    for info in typer_app.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback else None)
        if text:
            info.help = _reflowed(text)
    for group in typer_app.registered_groups:
        if isinstance(group.help, str):
            group.help = _reflowed(group.help)
        if group.typer_instance is not None:
            _reflow_help(group.typer_instance)


_reflow_help(app)


@functools.cache
def _click_tree() -> typer.core.TyperGroup:
    """recsys's commands as Click builds them, read (never changed) by the checks before a command runs; built
    once a process (every command is registered when this module is imported)."""
    return typer.main.get_command(app)


def _option_words(args: list[str]) -> Iterator[tuple[int, str, tuple | None]]:
    """recsys.entry.option_words over recsys's Click tree: each option word in `args` (a value is skipped:
    `--user -v` names a user `-v`), looked up on the command the words before it name."""
    command = [_click_tree()]

    def enter(word: str) -> None:  # a subcommand's name (a value is skipped before it gets here)
        command[0] = getattr(command[0], "commands", {}).get(word, command[0])

    def lookup(option: str) -> tuple | None:
        param = next((p for p in command[0].params if option in (*p.opts, *p.secondary_opts)), None)
        if param is None:
            return None
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        repeatable = getattr(param, "multiple", False) or getattr(param, "count", False)
        return (command[0].name, param.name), repeatable, 0 if flag else max(param.nargs, 1)

    return option_words(args, lookup, enter)


def _repeated_option(args: list[str]) -> str | None:
    """The refusal of an option given twice (`--user a --user b`: Click keeps the last one silently), as
    `python -m` entry points refuse it (recsys.entry.repeated_option); options meant to repeat (`--column`)
    may."""
    return first_repeat(_option_words(args))


def _command_path(args: list[str]) -> str:
    """The command `args` name (`recsys registry history` for `registry history -n`), for a usage error Click
    raises without its context (an option given no value): the leading words that are commands."""
    command, path = _click_tree(), ["recsys"]
    for arg in args:
        if arg.startswith("-"):
            continue  # a group's own option (`--verbose`)
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        command, path = sub, [*path, arg]
    return " ".join(path)


VERBOSE_FLAGS = ("--verbose", "-v")


def verbose_first(args: list[str]) -> list[str]:
    """`recsys registry history --verbose` as `recsys --verbose registry history`: the flag belongs to the
    group (no command has an option of that name), and Click refused it after the command ("No such option");
    the `python -m` entry points take it anywhere. A value stays where it is: after `--`, or an option's
    (`--user -v`)."""
    moved = {index for index, _, _ in _option_words(args) if args[index] in VERBOSE_FLAGS}
    return [*(args[i] for i in sorted(moved)), *(arg for i, arg in enumerate(args) if i not in moved)]


def negative_number_hint(message: str, command: str) -> str:
    """Click reads `-1` as an option (`recsys data batch -1`: "No such option: -1"); say how a value that
    starts with '-' is given."""
    match = re.fullmatch(r"No such option: (-[0-9][0-9.]*)", message.strip())
    if match is None:
        return ""
    return f": a value that starts with '-' goes after '--' ({command} -- {match.group(1)})"


INTERRUPTED = 130  # what Typer returns for a command a Ctrl-C stopped (no command of ours returns it)


def main() -> None:
    from recsys.entry import end_by_sigint_when_interrupted, stop_interrupted

    _setup_logging()
    end_by_sigint_when_interrupted()
    # before any command runs; --verbose counted where Click reads it, on the group (`train -v -v` too)
    args = verbose_first(sys.argv[1:])
    if refusal := not_utf8(sys.argv[1:]) or _repeated_option(args):
        print(usage_line(_command_path(sys.argv[1:]), refusal), file=sys.stderr)
        sys.exit(2)
    try:
        # the console script, also in-process (tests)
        code = app(args=args, prog_name="recsys", standalone_mode=False)
    except user_errors() as err:
        report_user_error(err, verbose_requested())
        sys.exit(1)
    except KeyboardInterrupt:
        stop_interrupted()
    except (typer.Exit, SystemExit) as done:
        sys.exit(getattr(done, "exit_code", getattr(done, "code", 0)))
    except Exception as err:
        # Usage errors arrive here with standalone_mode=False; typer bundles its own click, whose exception
        # classes are not click's, so recognise them by what they can do.
        exit_code = getattr(err, "exit_code", None)
        if callable(getattr(err, "format_message", None)) and isinstance(exit_code, int):
            message = err.format_message()
            if message.strip():  # (a group run without a command printed its help: nothing to add)
                context = getattr(err, "ctx", None)
                command = getattr(context, "command_path", None) or _command_path(sys.argv[1:])
                print(usage_line(command, message + negative_number_hint(message, command)), file=sys.stderr)
            sys.exit(exit_code)
        raise
    if code == INTERRUPTED:  # a Ctrl-C: Typer caught its KeyboardInterrupt and returns 130 without a word
        stop_interrupted()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
