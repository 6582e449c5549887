"""Serve the deployments from this process (no work pool needed): nightly schedule + manual runs.

    prefect server start                     # in another terminal (schedules need a running server)
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.serve

Retraining deployments are limited to one run at a time; the DVC workspace lock serialises the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from prefect import serve

from flows.errors import add_verbose_flag, run_main
from flows.ingest import ingest
from flows.pipeline import pipeline
from flows.retrain import retrain
from recsys.config import ConfigError
from recsys.entry import ArgumentParser

NIGHTLY_CRON = "0 2 * * *"


def deployments(cron: str = NIGHTLY_CRON) -> list:
    return [
        pipeline.to_deployment(name="nightly", cron=cron, concurrency_limit=1, tags=["retraining"],
                               description="Ingest the inbox, retrain what changed, gate and register."),
        pipeline.to_deployment(name="manual", concurrency_limit=1, tags=["retraining"]),
        retrain.to_deployment(name="manual", concurrency_limit=1, tags=["retraining"]),
        ingest.to_deployment(name="manual", concurrency_limit=1),
    ]


def cron_expression(text: str) -> str:
    """argparse type: a cron expression Prefect accepts (five fields, e.g. "0 2 * * *"), else one usage line."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        if len(text.split()) != 5:  # Prefect's parser also takes a sixth (seconds) field
            raise ValueError(text)
        CronSchedule(cron=text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a cron expression: {text!r} (five fields, e.g. "
                                         f"{NIGHTLY_CRON!r}: minute hour day month weekday)") from None
    return text


def serve_deployments(cron: str) -> None:
    """Serve `deployments(cron)` against the Prefect server PREFECT_API_URL names."""
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        # Without a server, Prefect serves against a temporary one that lives and dies with this process: no UI
        # to reach, no schedule that outlives it. Say what to do instead of appearing to work.
        raise ConfigError("flows.serve needs a running Prefect server, and PREFECT_API_URL is not set: run "
                          "`prefect server start` in another terminal, then `export "
                          "PREFECT_API_URL=http://127.0.0.1:4200/api` (or `prefect config set PREFECT_API_URL=...`)")
    import warnings

    # Prefect 3.8's SIGTERM handler calls the runner's async stop without awaiting it (the shutdown goes on
    # regardless): not a warning a person stopping the process can act on.
    warnings.filterwarnings("ignore", message="coroutine 'Runner.astop' was never awaited",
                            category=RuntimeWarning)
    with private_temp_dir():
        serve(*deployments(cron))


@contextlib.contextmanager
def private_temp_dir() -> Iterator[Path]:
    """This process's temporary folders in one of its own, removed on the way out: Prefect's runner makes
    `<temp>/runner_storage/<uuid>` and left it behind whenever the serve was stopped (Ctrl-C, SIGTERM). A
    SIGTERM before the runner takes the signal over (while the deployments register) ends the process
    through here too, and Ctrl-C takes the SIGTERM path (`_stop_on_sigint`); a folder a killed process
    (SIGKILL, the OOM killer) left is removed by the next serve."""
    import os
    import signal
    import threading

    remove_orphans(Path(tempfile.gettempdir()))
    private = Path(tempfile.mkdtemp(prefix=f"{SERVE_TEMP_PREFIX}{os.getpid()}-"))
    before, tempfile.tempdir = tempfile.tempdir, str(private)
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        handlers = {signal.SIGTERM: signal.signal(signal.SIGTERM, _exit_on_sigterm),
                    signal.SIGINT: signal.signal(signal.SIGINT, _stop_on_sigint)}
    try:
        yield private
    finally:
        if main_thread:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        tempfile.tempdir = before
        shutil.rmtree(private, ignore_errors=True)


SERVE_TEMP_PREFIX = "recsys-serve-"


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop_on_sigint(signum: int, frame: object) -> None:
    """Ctrl-C stops the serve as a SIGTERM does: once Prefect's runner holds SIGTERM, its graceful stop (pause
    the deployments, end the flow runs, exit 0); before that, the usual KeyboardInterrupt. Left to asyncio.run,
    a first Ctrl-C only cancels the runner's main task, and once, in a full test run on a loaded box, a served
    process sent SIGINT went on serving for two minutes without a line (then stopped at once on SIGTERM)."""
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    if callable(handler) and handler is not _exit_on_sigterm:
        from prefect.logging import get_logger

        get_logger("serve").info("Ctrl-C: stopping as on SIGTERM")
        handler(signal.SIGTERM, frame)
        return
    raise KeyboardInterrupt


def remove_orphans(temp: Path) -> None:
    """Remove the private temp folders (`recsys-serve-<pid>-…`) of serve processes that are gone."""
    from recsys.atomic import process_running

    for folder in temp.glob(f"{SERVE_TEMP_PREFIX}*-*"):
        pid = folder.name.removeprefix(SERVE_TEMP_PREFIX).split("-", 1)[0]
        if pid.isdigit() and folder.is_dir() and not folder.is_symlink() and not process_running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = add_verbose_flag(
        ArgumentParser("flows.serve", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--cron", default=NIGHTLY_CRON, type=cron_expression,
                        help=f"schedule of the nightly deployment (UTC; default {NIGHTLY_CRON!r})")
    args = parser.parse_args(argv)
    run_main(lambda: serve_deployments(args.cron), args.verbose, temporary_server=False)


if __name__ == "__main__":
    main()
