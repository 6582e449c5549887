"""The `python -m` entry points' argument parsing (recsys/entry.py ArgumentParser): strict, one line a refusal."""

import subprocess
import sys
from pathlib import Path

import pytest

from recsys.entry import ArgumentParser, nonempty_path

REPO_ROOT = Path(__file__).resolve().parent.parent


def parser() -> ArgumentParser:
    p = ArgumentParser("recsys.example")
    p.add_argument("--params", "-p", type=nonempty_path, default="params.yaml")
    p.add_argument("--verbose", "-v", action="store_true")
    p.add_argument("--tag", action="append", default=[])
    return p


def refusal(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line
    return err.strip()


@pytest.mark.parametrize("argv, message", [
    (["--par", "x.yaml"], "unrecognized arguments: --par x.yaml"),  # no abbreviations
    (["--params", "a.yaml", "--params=b.yaml"], "--params given twice: give it once"),
    (["-v", "--verbose"], "--verbose given twice (also as -v): give it once"),
    (["-pa.yaml", "--params", "b.yaml"], "--params given twice (also as -p): give it once"),  # a value attached
    (["-vpa.yaml", "-v"], "-v given twice: give it once"),  # a cluster: a flag, then an option and its value
    (["-vv"], "-v given twice: give it once"),
    (["--params="], "argument --params/-p: '' is empty: name a path"),
    (["--params", " "], "argument --params/-p: ' ' is empty: name a path"),
])
def test_an_ambiguous_or_empty_option_is_one_usage_line(argv, message, capsys):
    assert refusal(argv, capsys) == (f"error: python -m recsys.example: {message} "
                                     "(see 'python -m recsys.example --help')")


def test_options_meant_to_repeat_and_operands_after_a_double_dash_still_parse():
    args = parser().parse_args(["--tag", "a", "--tag", "b", "--params", "p.yaml"])
    assert (args.tag, args.params, args.verbose) == (["a", "b"], Path("p.yaml"), False)
    p = parser()
    p.add_argument("rest", nargs="*")
    assert p.parse_args(["-v", "--", "--verbose"]).rest == ["--verbose"]  # after --, an operand


@pytest.mark.parametrize("argv", [["--out="], ["--out", "a", "--out", "b"], ["--sto", "data"]])
def test_the_prepare_stage_refuses_before_reading_anything(argv, tmp_path):
    """`python -m recsys.prepare --out=` once ended in `ValueError: PosixPath('.') has an empty name`."""
    done = subprocess.run([sys.executable, "-m", "recsys.prepare", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: python -m recsys.prepare: ") and done.stderr.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("argv, command", [
    (["-m", "recsys.cli", "data", "generate", "--out", b"bad\xff"], "recsys data generate"),
    (["-m", "recsys.cli", "recommend", "--user", b"u\xff"], "recsys recommend"),
    (["-m", "flows.ingest", b"inbox/b\xff.csv"], "python -m flows.ingest"),
    (["-m", "recsys.prepare", "--out", b"out\xff"], "python -m recsys.prepare"),
])
def test_an_argument_that_is_not_utf8_is_refused_before_anything_is_written(argv, command, tmp_path):
    """Python carries such bytes as surrogates, and the first write of one failed midway: a Parquet path with a
    UnicodeEncodeError traceback after `data generate` had made its folder."""
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, timeout=120,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "DO_NOT_TRACK": "1"})
    err = done.stderr.decode()
    bad = next(a for a in argv if isinstance(a, bytes))
    assert done.returncode == 2, err
    assert err == (f"error: {command}: argument {bad!r} is not UTF-8 text: give names, ids and paths in UTF-8 "
                   f"(see '{command} --help')\n")
    assert not any(tmp_path.iterdir())
