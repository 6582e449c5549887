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
from typing import Iterator

import typer

from recsys.config import load_params, params_root, validate_name, workspace_root
from recsys.entry import (
    VERBOSE_ENV, first_repeat, not_utf8, option_words, report_user_error, usage_line, user_errors,
    verbose_requested,
)
from recsys.commands.data import app as data_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
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
