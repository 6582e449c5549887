"""How a flow fails: user errors as one line (no traceback unless `--verbose`), retries only when it may help.

A user error (bad params, too little data, a stage's own `error:` line …; see `recsys.entry`) is
deterministic — retrying gives the same answer — so `retry_if_transient` refuses it; other failures (a DVC
lock held by another run, a flaky disk, a remote) are retried as each task declares.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable
from urllib.parse import urlsplit

from recsys.entry import (
    VERBOSE_ENV,
    die_of_the_interrupt,
    end_by_sigint_when_interrupted,
    error_line,
    is_transient,
    is_user_error,
    verbose_requested,
)


def _exception_of(state: Any) -> BaseException | None:
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception as err:  # the stored result may itself be unreadable
        return err
    return result if isinstance(result, BaseException) else None


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry unless the failure is a (deterministic) user error."""
    exc = _exception_of(state)
    return exc is None or is_transient(exc)


# Set by `run_main`: this process ends by printing the flow's error as its last line, so the console needs no
# copy of Prefect's own report of it (the API keeps that report for the UI).
_FINAL_LINE_FOLLOWS = False
_FLOW_FAILED = "Encountered exception during execution"  # prefect.flow_engine's report of a flow's exception


class _HideUserErrorTracebacks(logging.Filter):
    """Keeps Prefect's 'task failed' lines but drops their traceback when the exception is a user error; under
    `run_main`, also Prefect's ERROR report of the flow's own user error, which `run_main` prints last (the
    'Finished in state Failed(…)' lines stay: they say which run and task failed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_user_error(exc):
            if _FINAL_LINE_FOLLOWS and record.name == "prefect.flow_runs" and str(record.msg).startswith(
                    _FLOW_FAILED):
                return False
            record.exc_info, record.exc_text = None, None
        return True


def hide_user_error_tracebacks() -> None:
    """On the console handlers Prefect and the root logger write to (not the API's: the UI keeps them)."""
    hider = _HideUserErrorTracebacks()
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not any(
                    isinstance(f, _HideUserErrorTracebacks) for f in handler.filters):
                handler.addFilter(hider)


def quiet_console() -> None:
    """Each flow's first step: a user error is one line on the console of whatever process runs the flow —
    a served deployment's or a worker's run process too, which `run_main` never sees — unless asked for
    tracebacks (`--verbose`, RECSYS_VERBOSE=1)."""
    if not verbose_requested():
        hide_user_error_tracebacks()


def add_verbose_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--verbose", "-v", action="store_true", help="tracebacks on errors, debug logs")
    return parser


def unreachable_server(err: BaseException) -> str | None:
    """The one line for a Prefect API that does not answer — nothing listening at PREFECT_API_URL, or a
    server that is not its API (the address without `/api`) — found in `err`'s chain of causes; None for any
    other failure."""
    import httpx
    from prefect.settings import get_current_settings

    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and all(cause is not seen for seen in chain):
        chain.append(cause)
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    url = get_current_settings().api.url
    refused = next((c for c in chain if isinstance(c, (httpx.ConnectError, httpx.ConnectTimeout))), None)
    if refused is not None:  # first: Prefect wraps a refused connection in "Failed to reach API" too
        if not url:  # Prefect's temporary server (no PREFECT_API_URL) did not come up
            return (f"error: Prefect's temporary API server did not answer ({refused}): start one with "
                    "`prefect server start` and set PREFECT_API_URL to it")
        return (f"error: cannot reach the Prefect server at {url} ({refused}): is `prefect server start` "
                "running, and is PREFECT_API_URL its address?")
    not_found = next((c for c in chain if isinstance(c, httpx.HTTPStatusError)
                      and c.response.status_code == 404), None)
    if not_found is not None and url and "/api" not in urlsplit(str(url)).path:  # a server, not its API
        return (f"error: PREFECT_API_URL={url} reaches a server but not its API ({_short(not_found)}): the "
                f"API is under /api, e.g. PREFECT_API_URL={str(url).rstrip('/')}/api")
    return None


def _short(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:200]


def run_main(run: Callable[[], Any], verbose: bool = False, temporary_server: bool = True,
             precheck: Callable[[], object] | None = None) -> Any:
    """A flow's `__main__`: run it; a user error ends the process with one `error:` line and exit code 1.

    `precheck` runs first: what the command line names that the flow would refuse in its first steps (a
    repository that is none, a model params.yaml does not list, an inbox that is no inbox) is refused there,
    in a second, before a temporary server starts and a failed flow run is recorded (the flow checks again
    what a UI or API run passes, which no command line has checked).

    The line is printed at interpreter exit by a handler registered before the flow starts Prefect's
    temporary API server: exit handlers run last-registered first, so the server's shutdown message comes
    before it and the error is the last line a person sees (stopping the server early instead races the
    run's own log and event workers). That server is started here, out of the terminal's process group
    (`flows.ephemeral`; not for `temporary_server=False`, `flows.serve`, which refuses to run on one): a
    Ctrl-C stops the run — and the `dvc repro` it runs — and the run reports it to a server that is still
    there, says so in one line and ends by the SIGINT (`recsys.entry.die_of_the_interrupt`)."""
    import atexit
    import os
    import traceback

    from flows.ephemeral import start_in_own_session

    if precheck is not None:
        try:
            precheck()
        except Exception as err:
            if not is_user_error(err):
                raise
            if verbose:
                traceback.print_exception(err)
            print(error_line(err), file=sys.stderr, flush=True)
            sys.exit(1)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO)
    if not verbose:  # every API request at INFO (`flows.zombies` printed them as its output)
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # the stages dvc runs print their tracebacks too
    else:
        global _FINAL_LINE_FOLLOWS
        _FINAL_LINE_FOLLOWS = True
        hide_user_error_tracebacks()
    end_by_sigint_when_interrupted()  # (first: it runs after the last words and the server's stop)
    last_words: list[str] = []
    atexit.register(lambda: [print(line, file=sys.stderr, flush=True) for line in last_words])
    try:
        if temporary_server:
            start_in_own_session()
        return run()
    except KeyboardInterrupt:
        if verbose:
            traceback.print_exc()
        last_words.append("interrupted: the run stopped, and what it had started with it; run it again to go "
                          "on (a training resumes from its last saved epoch)")
        die_of_the_interrupt()
    except Exception as err:
        line = error_line(err) if is_user_error(err) else unreachable_server(err)
        if line is None:
            raise
        if verbose:
            traceback.print_exception(err)
        last_words.append(line)
        sys.exit(1)
