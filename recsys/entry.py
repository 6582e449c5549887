"""Entry points: the per-model stage arguments, and errors a user can fix (bad config, bad input, missing
files) reported as one clear line with exit code 1 — no traceback unless asked for (`--verbose` on the CLI
and the flows, `RECSYS_VERBOSE=1` for the stages `dvc repro` runs).

The same classification decides what the flows retry: a user error is deterministic (running it again
gives the same error), so only other failures — and DVC failures marked `transient` — are retried."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn

from recsys.layout import PARAMS

_USER_ERRORS = [
    ("recsys.config", "ConfigError"), ("recsys.data", "DataError"), ("recsys.prepare", "PrepareError"),
    ("recsys.checkpoint", "CheckpointError"), ("recsys.ingest", "IngestError"),
    ("recsys.registry", "RegistryError"), ("recsys.registry", "ArtifactError"),
    ("recsys.workspace", "DvcError"),
    ("recsys.bootstrap", "BootstrapError"), ("recsys.recommend", "RecommendError"),
    ("recsys.distributed", "DistributedError"), ("recsys.device", "DeviceError"),
    ("recsys.train", "TrainingError"), ("recsys.model_configs", "SettingError"),
    ("recsys.atomic", "NotAFolderError"), ("recsys.store", "StoreError"), ("recsys.digest", "DigestError"),
]
VERBOSE_ENV = "RECSYS_VERBOSE"


def first_line(err: BaseException) -> str:
    """An exception's first line for a one-line message (Arrow's and torch's carry several), or its type where
    it has no text."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def user_errors() -> tuple[type[BaseException], ...]:
    """The user-error classes of the modules loaded so far (a module never imported raised nothing), so
    checking costs no imports."""
    errors: list[type[BaseException]] = [FileNotFoundError]
    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", None)
    for module, name in _USER_ERRORS:
        # `python -m recsys.prepare` runs the module as `__main__`: its classes live there, not under its name.
        for loaded in (sys.modules.get(module), main if main_name == module else None):
            cls = getattr(loaded, name, None)
            if cls is not None:
                errors.append(cls)
    return tuple(errors)


def is_user_error(err: BaseException) -> bool:
    return isinstance(err, user_errors())


def is_transient(err: BaseException) -> bool:
    """Worth retrying: anything but a user error, or one that says it may pass (a DVC lock, a remote)."""
    return bool(getattr(err, "transient", not is_user_error(err)))


def verbose_requested() -> bool:
    return os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")


def error_line(err: BaseException) -> str:
    """The one line a person acts on."""
    return f"error: {err}"


def usage_line(prog: str | None, message: str) -> str:
    """A command line refused before anything ran, as one line: what was wrong and where the help is (argparse
    and Click print a usage block first; the help command says the same, on request)."""
    if not prog:
        return f"error: {message}"
    message = message.strip()
    if message.endswith(".") and not message.endswith(".."):  # a sentence's full stop, not an ellipsis
        message = message[:-1]
    return f"error: {prog}: {message} (see '{prog} --help')"


def not_utf8(args: list[str]) -> str | None:
    """The refusal of a command line holding an argument that is not UTF-8 (Python carries its bytes as
    surrogates, which every file, log, SQL and Parquet write then fails on midway), or None."""
    for arg in args:
        if any("\udc80" <= c <= "\udcff" for c in arg):
            return f"argument {os.fsencode(arg)!r} is not UTF-8 text: give names, ids and paths in UTF-8"
    return None


_REPEATABLE = (argparse._HelpAction, argparse._VersionAction, argparse._AppendAction, argparse._AppendConstAction,
               argparse._CountAction, argparse._ExtendAction)


def option_words(args: list[str], lookup: Callable[[str], tuple | None],
                 on_word: Callable[[str], None] = lambda word: None) -> Iterator[tuple[int, str, tuple | None]]:
    """Each option given in `args` before `--`, as (index of its word, option as spelled, `lookup(option)`).
    `lookup(option)` says what an option string is — (key, may repeat, how many values it takes) — or None
    for no option; its values are skipped (`--out --x` names a folder `--x`, `--user -v` a user `-v`),
    attached ones too (`-n3`, `--out=a`), and a cluster of short flags (`-vn 3`) yields each. `on_word` hears
    every other word before `--` (a subcommand's name changes what the options are)."""
    skip = 0
    for index, arg in enumerate(args):
        if skip:
            skip -= 1
            continue
        if arg == "--":
            return
        if not arg.startswith("-") or arg == "-":
            on_word(arg)
            continue
        if arg.startswith("--"):
            spelled = arg.split("=", 1)[0]
            options = [(spelled, lookup(spelled), "=" in arg)]
        else:  # -x, -xVALUE, or flags clustered: -vx
            options = []
            for i, char in enumerate(arg[1:], 1):
                found = lookup(f"-{char}")
                options.append((f"-{char}", found, i < len(arg) - 1))
                if found is None or found[2]:  # no such option, or it takes a value: the rest of the word
                    break
        for spelled, found, attached in options:
            skip = 0 if found is None or attached or not found[2] else found[2]
            yield index, spelled, found


def repeated_option(args: list[str], lookup: Callable[[str], tuple | None],
                    on_word: Callable[[str], None] = lambda word: None) -> str | None:
    """The refusal of an option given twice in `args` (spelled alike or not: `-v --verbose`), or None;
    `lookup` and `on_word` as `option_words` takes them (options meant to repeat may)."""
    return first_repeat(option_words(args, lookup, on_word))


def first_repeat(words: Iterable[tuple[int, str, tuple | None]]) -> str | None:
    """The refusal of the first option `option_words` yields twice that may not repeat, or None."""
    given: dict[Any, str] = {}
    for _, spelled, found in words:
        if found is None:
            continue
        key, repeatable, _ = found
        if repeatable:
            continue
        if key in given:
            also = "" if given[key] == spelled else f" (also as {given[key]})"
            return f"{spelled} given twice{also}: give it once"
        given[key] = spelled
    return None


class ArgumentParser(argparse.ArgumentParser):
    """argparse for `python -m MODULE` (its usage and refusals name that command, not the module's file), with
    its refusals as one line (`usage_line`), exit code 2 as argparse's. Strict, as the Typer CLI is: an option
    is spelled out (no `--par` for `--params`), and one given twice is refused rather than the last one
    silently winning."""

    def __init__(self, module: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(prog=f"python -m {module}", allow_abbrev=False, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        args = sys.argv[1:] if args is None else list(args)
        if refusal := not_utf8(args) or repeated_option(args, self._option):
            self.error(refusal)
        return super().parse_known_args(args, namespace)

    def _option(self, option: str) -> tuple | None:
        """`repeated_option`'s view of an option string: (dest, may repeat, values taken), or None."""
        action = self._option_string_actions.get(option)
        if action is None:
            return None
        nargs = action.nargs  # None: one value; a count; or "?", "*", "+": not skipped (argparse's own rules)
        values = 1 if nargs is None else nargs if isinstance(nargs, int) else 0
        return action.dest, isinstance(action, _REPEATABLE), values

    def error(self, message: str):  # type: ignore[override]
        print(usage_line(self.prog, message), file=sys.stderr)
        sys.exit(2)


def report_user_error(err: BaseException, verbose: bool = False) -> None:
    """The one line a person acts on (after the traceback, when asked for one)."""
    if verbose:
        traceback.print_exception(err)
    print(error_line(err), file=sys.stderr)


def nonempty_path(text: str) -> Path:
    """argparse type: a path that names something (`--out=` would be the current folder, or no name at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty: name a path")
    return Path(text)


def positive_int(text: str) -> int:
    """argparse type: a whole number ≥ 1 in ASCII digits ("2", not "2.0", "0", "-1", "²" or "٢": str.isdigit
    alone takes the last two, and int() then fails on "²" with argparse's generic message)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (`nan`, `inf`, `0` and `-1` are refused by argparse)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


_INTERRUPTED: list[bool] = []


def end_by_sigint_when_interrupted() -> None:
    """Register, before any other exit handler (they run last-registered first), the one that ends an
    interrupted process by SIGINT once the others have run (`die_of_the_interrupt`)."""
    import atexit

    atexit.register(_end_by_sigint)


def _end_by_sigint() -> None:
    if _INTERRUPTED:
        import signal

        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def die_of_the_interrupt() -> NoReturn:
    """Called in an `except KeyboardInterrupt:` whose one line is said: exit, and (with
    `end_by_sigint_when_interrupted`) end by SIGINT after the exit handlers, as a shell loop or `make` expects
    of an interrupted command — they stop; an exit code of 130 lets them go on to the next one. (Python does
    this itself for a KeyboardInterrupt left unhandled, but not reliably once a training has run, and with
    the traceback.) 130 where the signal cannot end the process."""
    _INTERRUPTED.append(True)
    sys.exit(130)


def stop_interrupted() -> NoReturn:
    """An interrupted command's one line, `interrupted` (after the traceback, when asked for), and its end by
    the SIGINT (`die_of_the_interrupt`)."""
    if verbose_requested() and sys.exc_info()[0] is not None:  # (none where Typer caught it: `recsys`)
        traceback.print_exc()
    print("interrupted", file=sys.stderr)
    die_of_the_interrupt()


def run_entry(main: Callable[[], None], log_format: str = "%(levelname)s %(name)s: %(message)s") -> None:
    """Run a stage's `main()` (what `dvc repro` calls; the benchmarks' too, in their own log format) with
    logging set up and user errors reported plainly."""
    logging.basicConfig(level=logging.INFO, format=log_format)
    end_by_sigint_when_interrupted()
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C, or `run_dvc` stopping the stages of an interrupted run: no traceback
        stop_interrupted()
    except Exception as err:
        if not is_user_error(err):
            raise
        report_user_error(err, verbose_requested())
        sys.exit(1)


def model_stage_args(module: str, description: str, argv: list[str] | None = None):
    """`--model NAME [--params params.yaml] [--root DIR]` → (validated model name, Params, repo root); the
    root defaults to the params file's repository (`recsys.config.params_root`), not the current folder."""
    from recsys.config import load_params, params_root, validate_name

    parser = ArgumentParser(module, description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--params", default=PARAMS)
    parser.add_argument("--root", help="repository root (default: the params file's folder)")
    args = parser.parse_args(argv)
    name, params = validate_name(args.model, "model name"), load_params(args.params)
    params.model_config(name)  # an unknown model is one line naming the known ones, in every stage alike
    return name, params, Path(args.root) if args.root is not None else params_root(args.params, relative=True)
