"""The repository workspace as the pipeline sees it: running `dvc`, one writer at a time, fault points.

DVC runs as a subprocess with `cwd` at the repository root (its Python API misbehaves when the process's
cwd is elsewhere), using the `dvc` next to the running interpreter so a virtualenv needs no activation.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import yaml

from recsys.atomic import process_running, write_text_atomic
from recsys.layout import DATA_DVC, STATE, Layout

if TYPE_CHECKING:
    import psutil

log = logging.getLogger(__name__)

STATE_DIR = STATE  # git-ignored; shared with recsys.ingest, whose journal lives here too


class DvcError(RuntimeError):
    """A `dvc` command failed. Transient by default (a lock held by another run, an unreachable remote); not
    when DVC's own configuration is wrong (no remote, not a DVC repository: `stage_error`)."""

    transient = True


class StageError(DvcError):
    """A stage of `dvc repro` failed; the message is the stage's own `error:` line when it printed one.
    Deterministic: running the same stage on the same inputs fails the same way."""

    transient = False


def dvc_error_line(output: str) -> str:
    """DVC's own sentence from a failed command's output — its first `ERROR:` line, else the last line that is
    not its "Having any troubles?" hint — as one line (`run_dvc` logs the whole output at debug level:
    `--verbose`)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [at for at, line in enumerate(lines) if line.startswith("ERROR:")]
    if errors:
        # A sentence DVC ends on the next lines ("'data' is busy, it is being blocked by:", then the holder's
        # pid and command line): those lines with it (its advice after the blank line stays out).
        said = [lines[errors[0]]]
        if said[0].endswith(":"):
            told = output.split(said[0], 1)[1].split("\n\n", 1)[0]
            said += [line.strip() for line in told.splitlines() if line.strip()]
        return " ".join(said)[:400]
    told = [line for line in lines if not line.startswith("Having any troubles?")]
    return told[-1][:400] if told else "no output"


# The last line of a Python traceback: the exception a crashed stage died of.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def stage_error(args: tuple[str, ...], output: str) -> DvcError:
    """The error for a failed `dvc` run, in one line: a stage's `error:` line (a user error it reported), or
    DVC's sentence (with the exception a crashed stage died of)."""
    lines = output.splitlines()
    stage_lines = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    failed = [line for line in lines if "failed to reproduce" in line]
    if stage_lines:
        stage = failed[-1].split("'")[1] if failed and "'" in failed[-1] else "a stage"
        return StageError(f"{stage}: {stage_lines[-1]}")
    said = f"`dvc {' '.join(args)}` failed: {dvc_error_line(output)}"
    if failed:
        died = [line.strip() for line in lines if _EXCEPTION_LINE.match(line.strip())]
        return StageError(said + (f" ({died[-1][:300]})" if died else "")
                          + "; run with --verbose (RECSYS_VERBOSE=1 for `dvc repro`) for its traceback")
    error = DvcError(said)
    error.transient = dvc_may_pass(output)
    return error


DETERMINISTIC_DVC_ERRORS = ("config file error", "not inside of a DVC repository")


def dvc_may_pass(output: str) -> bool:
    """Whether a failed `dvc` command may pass when run again: not when DVC's configuration is wrong (no
    remote, a missing one, not a DVC repository); anything else (a lock, an unreachable remote) may."""
    return not any(sign in output for sign in DETERMINISTIC_DVC_ERRORS)


def inside_dvc_stage() -> bool:
    """Whether this process is a stage `dvc repro` runs (DVC sets DVC_STAGE for each): DVC then holds the
    stage's dependencies locked (`data`, for `prepare`), so a `dvc add` of them can only fail."""
    return bool(os.environ.get("DVC_STAGE"))


def subprocess_env() -> dict[str, str]:
    """PATH with this interpreter's bin first, so `python -m recsys...` inside dvc.yaml finds our packages."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("DVC_NO_ANALYTICS", "1")  # (DVC 3 reads this and core.analytics, not DO_NOT_TRACK)
    return env


def dvc_command(*args: str) -> list[str]:
    executable = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    return [executable, *args] if executable else [sys.executable, "-m", "dvc", *args]


def run_dvc(root: Path, *args: str, check: bool = True, watch: Callable[[], None] | None = None,
            interval: float = 2.0) -> subprocess.CompletedProcess[str]:
    """Run `dvc ARGS` at `root`; with `check`, a failure raises `DvcError` (`StageError` when a stage failed).

    `watch()` is called every `interval` seconds while it runs (the retrain flow reports training progress
    this way; a failing `watch` is logged, never the end of the run); stdout and stderr then arrive merged,
    in order, in `stdout`.

    When the caller is interrupted while DVC runs — Ctrl-C, or the SIGTERM of a cancelled Prefect run, which
    Prefect raises as an exception — DVC and the stages it started are stopped with it (`stop_process_tree`):
    none trains on for nobody, holding DVC's lock against the next run. (They stay in the caller's process
    group, so a worker that kills the group outright reaches them too.) Every process DVC starts inherits a
    mark of this call (`RUN_MARK_ENV`), so a stage that outlives DVC — DVC killed or crashed first, its stage
    handed to init, out of the tree — is found and stopped when DVC has ended (`stop_marked`; Linux: where a
    process's environment cannot be read, as on macOS, nothing is found).
    """
    import uuid

    merged = watch is not None
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(dvc_command(*args), cwd=root, env={**subprocess_env(), RUN_MARK_ENV: mark},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                            text=True)
    dvc_argv = list(map(str, proc.args))  # (the forks DVC leaves to wait on its daemons end with it)
    record = _record_running(root, proc, mark, dvc_argv)
    what = f"`dvc {' '.join(args)}`"
    try:
        if not merged:
            ended = None
            while True:
                try:
                    stdout, stderr = proc.communicate(timeout=interval)
                    break
                except subprocess.TimeoutExpired as waited:
                    if proc.poll() is None:
                        continue
                    if ended is None:  # DVC has ended, and what it left running holds its output open
                        ended = time.monotonic()
                        stop_marked(mark, what, dvc_argv)
                    elif time.monotonic() - ended > OUTPUT_GRACE_S:
                        log.error("%s ended, but a process it started without this run's mark (one given a "
                                  "clean environment: env -i, sudo) still holds its output open after %.0f s; "
                                  "going on with the output so far", what, OUTPUT_GRACE_S)
                        stdout, stderr = (_text(waited.output), _text(waited.stderr))
                        for pipe in (proc.stdout, proc.stderr):
                            with contextlib.suppress(OSError):
                                pipe.close()  # type: ignore[union-attr]
                        break
        else:
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
            reader.start()
            while proc.poll() is None:
                time.sleep(interval)
                try:
                    watch()
                except Exception as err:  # progress reporting is an API call: a hiccup must not end training
                    log.warning("while `dvc %s` runs: %s", " ".join(args), err)
            stop_marked(mark, what, dvc_argv)  # (what DVC left running would hold its output open)
            reader.join(timeout=10)
            stdout, stderr = "".join(lines), ""
    finally:
        try:
            try:
                if proc.poll() is None:
                    stop_process_tree(proc)
            finally:  # (also after a second Ctrl-C: stop_process_tree has killed DVC's tree by then)
                stop_marked(mark, what, dvc_argv)
        finally:  # (a third must not leave the note behind)
            _forget(record)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if done.returncode != 0:  # the one-line errors quote a line of it; --verbose shows it all
        log.debug("`dvc %s` output:\n%s\n%s", " ".join(args), done.stdout, done.stderr)
    if check and done.returncode != 0:
        raise stage_error(args, f"{done.stdout}\n{done.stderr}")
    return done


def stop_process_tree(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop `proc` and every process under it: SIGINT first (as Ctrl-C: a stage's Python may clean up, though
    nothing waits for it), SIGKILL to what is left after `grace` seconds — also when a second interrupt
    arrives — and to `proc` itself whatever the process table said (a child that vanished while the tree
    was read must not leave `proc` running and this call waiting on it)."""
    import psutil

    try:
        with contextlib.suppress(psutil.Error):  # (our child: its pid stays its own until we wait for it)
            _stop_tree(psutil.Process(proc.pid), grace)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        log.warning("stopped `%s` (pid %d) and the processes it started", " ".join(map(str, proc.args[1:])),
                    proc.pid)


def _stop_tree(leader: psutil.Process, grace: float) -> None:
    """SIGINT to a process and all under it, SIGKILL to what is left after `grace` seconds (or at a second
    interrupt). Once `leader` has ended nothing is signalled in its name (`is_running` compares the start
    time too, so a process later given its pid is never taken for it)."""
    import psutil

    def tree() -> list[psutil.Process]:
        if not leader.is_running():
            return []
        try:
            return [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return [leader]

    _interrupt_then_kill(tree, grace)


def _interrupt_then_kill(find: Callable[[], list[psutil.Process]], grace: float) -> list[psutil.Process]:
    """SIGINT to the processes `find()` lists, SIGKILL after `grace` seconds (or at a second interrupt) to
    what is left of them and to what `find()` lists then (what started meanwhile); returns the first list."""
    import signal

    import psutil

    found = find()
    try:
        for process in found:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGINT)
        psutil.wait_procs(found, timeout=grace)
    finally:
        for process in [*found, *find()]:
            with contextlib.suppress(psutil.Error):
                process.kill()
    return found


RUNNING = "dvc-running"  # inside STATE: one note per `dvc` process `run_dvc` started and has not seen end
RUN_MARK_ENV = "RECSYS_DVC_RUN"  # in the environment of every process one `run_dvc` call's DVC starts
OUTPUT_GRACE_S = 30.0  # how long `run_dvc` waits, after DVC ended, for an unmarked holder of its output
TORN_AFTER_S = 60.0  # a note that does not parse is a torn one (its writer was killed) once this old


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def marked(mark: str, dvc_argv: list[str] | None = None) -> list[psutil.Process]:
    """The processes, other than this one and its ancestors, that carry `run_dvc`'s mark `mark` in their
    environment (readable for this user's processes, on Linux) — DVC's own daemons aside: those DVC starts
    with DVC_DAEMON set (its updater and analytics, which end by themselves), and the forks of DVC that wait
    on them (a fork keeps DVC's environment and command line, which ends with DVC's argv `dvc_argv`: after
    the interpreter, for a script)."""
    import psutil

    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    daemons_marked = not os.environ.get("DVC_DAEMON")  # (else every process carries it: DVC starts no daemon)
    found = []
    for process in psutil.process_iter():
        if process.pid in mine:
            continue
        with contextlib.suppress(psutil.Error, OSError):  # (ended meanwhile, another user's, or unreadable)
            env = process.environ()
            if env.get(RUN_MARK_ENV) != mark or (daemons_marked and env.get("DVC_DAEMON")):
                continue
            line = process.cmdline()
            if dvc_argv and line[-len(dvc_argv):] == dvc_argv:
                continue
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def stop_marked(mark: str, what: str, dvc_argv: list[str] | None = None, grace: float = 10.0) -> list[int]:
    """Stop whatever the processes of `run_dvc`'s call `mark` left running when its DVC ended (SIGINT, then
    SIGKILL after `grace` seconds): a stage DVC was running when it died, or a process a stage left behind;
    returns their pids."""
    pids = sorted(p.pid for p in _interrupt_then_kill(lambda: marked(mark, dvc_argv), grace))
    if pids:
        log.warning("stopped %d process(es) that %s left running when it ended (pids %s)", len(pids), what,
                    ", ".join(map(str, pids)))
    return pids


def _process(pid: int, started: float | None):
    """The psutil.Process with this pid and start time — alive, not a zombie — or None (ended, or another
    process that has since been given the same pid)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if started is not None and process.create_time() != started:
            return None
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except psutil.Error:
        return None


def _record_running(root: Path, proc: subprocess.Popen, mark: str, dvc_argv: list[str]) -> Path | None:
    """Note the `dvc` process `run_dvc` started, and its caller, until it ends: if the caller is killed
    outright (SIGKILL, the OOM killer), nothing stops DVC and its stages, and the next writer of this
    workspace stops them (`stop_orphaned_dvc`). None when the note cannot be written (a read-only state
    folder): the run goes on without it."""
    import json

    dvc, caller = _process(proc.pid, None), _process(os.getpid(), None)
    if dvc is None or caller is None:  # already ended
        return None
    layout = Layout(Path(root))
    record = layout.state / RUNNING / f"{proc.pid}.json"
    note = {"pid": proc.pid, "started": dvc.create_time(), "caller": os.getpid(),
            "caller_started": caller.create_time(), "args": list(map(str, proc.args[1:])), "mark": mark,
            "argv": dvc_argv}
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(record, json.dumps(note), layout.scratch)  # whole or absent: never half a note
    except OSError as err:
        log.debug("could not note `dvc` pid %d: %s", proc.pid, err)
        return None
    return record


def _forget(record: Path | None) -> None:
    if record is not None:
        with contextlib.suppress(OSError):
            record.unlink(missing_ok=True)


def stop_orphaned_dvc(root: Path, grace: float = 10.0) -> list[str]:
    """Stop every `dvc` process a killed caller left running in this workspace (with the stages under it),
    and forget the notes of those that ended; returns what was stopped. A note whose caller lives (its pid
    with the same start time, not a zombie) is left alone: that run is someone's, still in progress. Never
    raises for the notes' sake: what cannot be read or stopped is logged and left for the next holder."""
    import json
    import time

    import psutil

    stopped = []
    try:
        records = sorted((Path(root) / STATE_DIR / RUNNING).glob("*.json"))
    except OSError as err:
        log.warning("could not read the notes of running dvc processes: %s", err)
        return stopped
    for record in records:
        try:
            note = json.loads(record.read_text(encoding="utf-8"))
            pid, started = int(note["pid"]), float(note["started"])
            caller, caller_started = int(note["caller"]), float(note["caller_started"])
        except FileNotFoundError:
            continue  # its run ended meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                if time.time() - record.stat().st_mtime > TORN_AFTER_S:
                    record.unlink()  # (notes are written whole: this one is not a note)
            continue
        if _process(caller, caller_started) is not None:
            continue  # its caller is alive: not an orphan
        leader, mark = _process(pid, started), note.get("mark")
        if (leader is not None and pid in {process.pid for process in psutil.Process().parents()}) or (
                mark and os.environ.get(RUN_MARK_ENV) == mark):
            continue  # this process runs under it (a stage of that `dvc repro`): the next holder stops it
        what = f"`dvc {' '.join(map(str, note.get('args', [])))}` (pid {pid})"
        if leader is not None:
            _stop_tree(leader, grace)
            with contextlib.suppress(psutil.Error):
                psutil.wait_procs([leader], timeout=5)  # (a SIGKILL is delivered, not waited for)
            if _process(pid, started) is not None:  # (a process we may not signal: another user's)
                log.error("could not stop %s, which a killed run left running; it may hold DVC's lock: stop "
                          "it by hand (kill %d)", what, pid)
                continue
            log.warning("stopped %s and its stages: a run killed before it ended left it running", what)
            stopped.append(what)
        if mark and stop_marked(mark, what, note.get("argv"), grace):  # what outlived DVC (it died first)
            stopped.append(f"what {what} left running")
        _forget(record)
    return stopped


LOCK_HOLDER_ENV = "RECSYS_WORKSPACE_LOCK_HOLDER"  # "<pid>:<state dir>" while a process holds the lock


@contextlib.contextmanager
def workspace_lock(root: Path) -> Iterator[None]:
    """Exclusive, crash-safe (flock) lock: only one DVC writer per workspace. Not re-entrant.

    A process started by the holder (the retrain flow's `dvc repro` running `prepare`, which recovers
    the store first) shares the lock: the holder puts its pid in the environment its children inherit,
    and a child that finds a living holder for the same workspace other than itself does not wait for it.
    A holder killed outright releases the flock but not the `dvc` it started: the next holder stops that
    first (`stop_orphaned_dvc`).
    """
    state = (Path(root) / STATE_DIR).resolve()
    if _held_by_ancestor(state):
        yield
        return
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        previous = os.environ.get(LOCK_HOLDER_ENV)
        os.environ[LOCK_HOLDER_ENV] = f"{os.getpid()}:{state}"
        try:
            stop_orphaned_dvc(Path(root))  # a killed holder's DVC would hold DVC's lock against this one
            yield
        finally:
            if previous is None:
                os.environ.pop(LOCK_HOLDER_ENV, None)
            else:
                os.environ[LOCK_HOLDER_ENV] = previous
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _held_by_ancestor(state: Path) -> bool:
    pid, _, where = os.environ.get(LOCK_HOLDER_ENV, "").partition(":")
    if not pid.isdigit() or int(pid) == os.getpid() or where != str(state):
        return False
    return process_running(int(pid))  # the holder is still alive (a dead one has released its flock)


def data_version(root: Path, dvc_file: str = DATA_DVC) -> str | None:
    """The md5 DVC recorded for the raw store (`<md5>.dir`), i.e. the dataset version."""
    path = Path(root) / dvc_file
    if not path.is_file():
        return None
    outs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("outs") or []
    return outs[0].get("md5") if outs else None
