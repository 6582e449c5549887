"""Mark a flow run `Crashed` when its heartbeats stop: how a fan-out learns that a worker died mid-run.

A process worker killed with `kill -9` (or a machine that lost power) leaves its flow run `Running` for
ever. Flow runs started by a worker send a heartbeat event every `PREFECT_FLOWS_HEARTBEAT_FREQUENCY`
seconds (≥ 30; set it in the workers' environment); this creates, once per server, the automation from
Prefect's "detect zombie flows" guide: no heartbeat nor final state within `--within` seconds of the last
heartbeat marks the run `Crashed` — only runs tagged `fan-out`, the ones the retrain flow hands out, which
then hands that model to another worker.

    PREFECT_API_URL=http://HOST:4200/api python -m flows.zombies --within 90
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

from flows.errors import add_verbose_flag, run_main
from recsys.config import ConfigError
from recsys.entry import ArgumentParser, positive_int

NAME = "recsys: crash fan-out runs whose heartbeats stopped"
TAG = "fan-out"  # flows/fanout.py tags every run it hands out
HEARTBEAT_SECONDS = 30  # prefect-fanout.yaml: PREFECT_FLOWS_HEARTBEAT_FREQUENCY of the workers' runs


def within_problem(within_seconds: int) -> str | None:
    """Why a window is too short (None when it is not): a live run could fall silent in it."""
    if within_seconds >= 2 * HEARTBEAT_SECONDS:
        return None
    return (f"--within {within_seconds}: must be at least two of the workers' heartbeat intervals "
            f"({HEARTBEAT_SECONDS} s, prefect-fanout.yaml), or a live run whose heartbeat is late once is "
            f"marked Crashed; use {2 * HEARTBEAT_SECONDS} or more")


def check_within(within_seconds: int, api_url: str | None) -> None:
    """Refuse a window a live run could fall silent in, and a server that dies with this process."""
    problem = within_problem(within_seconds)
    if problem:
        raise ConfigError(problem)
    if not api_url:
        raise ConfigError("PREFECT_API_URL is not set: the automation would go to a temporary server that stops "
                          "with this command; set PREFECT_API_URL=http://HOST:4200/api (the server your workers "
                          "use)")


def crash_silent_runs(within_seconds: int = 90) -> str:
    """Create the automation (replacing one of the same name); returns its id."""
    from prefect.settings import PREFECT_API_URL

    check_within(within_seconds, PREFECT_API_URL.value() or os.environ.get("PREFECT_API_URL"))
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(NAME):
            client.delete_automation(old.id)
    automation = Automation(
        name=NAME,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            # Only the fan-out's runs (tagged by it): other flow runs may beat at another frequency, or
            # be the coordinator itself, whose process is not on a worker.
            match_related=ResourceSpecification({"prefect.resource.role": "tag",
                                                 "prefect.resource.id": f"prefect.tag.{TAG}"}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_seconds),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {within_seconds} s: its worker was lost")],
    ).create()
    return str(automation.id)


def main(argv: list[str] | None = None) -> None:
    parser = add_verbose_flag(ArgumentParser("flows.zombies", description=__doc__,
                                              formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--within", type=positive_int, default=90,
                        help=f"seconds without a heartbeat before a run is marked Crashed (at least "
                             f"{2 * HEARTBEAT_SECONDS}: two heartbeat intervals; default 90)")
    args = parser.parse_args(argv)
    problem = within_problem(args.within)
    if problem:  # the command line's own value out of its range: a usage error (exit 2), as `--within 0` is
        parser.error(problem)
    automation = run_main(lambda: crash_silent_runs(args.within), args.verbose,
                          temporary_server=False)  # (it refuses one: one line at once, not a server first)
    print(f"automation {automation}: {NAME} (within {args.within} s)")


if __name__ == "__main__":
    main()
