"""Run many command lines of the benchmark scripts as separate processes that pay the imports once.

`python tests/script_runner.py` reads a JSON list of command lines (`[script, arg, ...]`, the script a file in
benchmarks/) on stdin, imports what those scripts import (torch, pandas, the recsys package), then runs each
command in a child forked from that process — its own process, exit code, stderr and stdout, as `python
benchmarks/<script> <args>` — and prints one JSON list of `{"code", "stdout", "stderr"}`. A refusal test of
thirty command lines took thirty interpreter starts with torch's import (~2 s each on the 2-core box); forked
from one warm process each costs milliseconds. Used only where each command is checked for what it says and
leaves (tests/test_benchmarks.py); a command that does real work belongs in a subprocess of its own.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _child(script: Path, args: list[str], out: Path, err: Path) -> None:
    """In the forked child: stdout and stderr to files, then the script as `__main__`; never returns."""
    code = 0
    try:
        for stream, path, fd in ((sys.stdout, out, 1), (sys.stderr, err, 2)):
            stream.flush()
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = [str(script), *args]
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, (int, type(None))):
            print(done.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 — as the interpreter would: the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run_all(commands: list[list[str]]) -> list[dict]:
    sys.path.insert(0, str(BENCHMARKS))
    for script in sorted({command[0] for command in commands}):
        importlib.import_module(Path(script).stem)  # its imports, once (`main` runs only as __main__)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (script, *args) in enumerate(commands):
            out, err = Path(tmp) / f"{i}.out", Path(tmp) / f"{i}.err"
            pid = os.fork()
            if pid == 0:
                _child(BENCHMARKS / script, args, out, err)
            _, status = os.waitpid(pid, 0)
            results.append({"code": os.waitstatus_to_exitcode(status), "stdout": out.read_text(),
                            "stderr": err.read_text()})
    return results


if __name__ == "__main__":
    print(json.dumps(run_all(json.loads(sys.stdin.read()))))
