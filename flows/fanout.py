"""The retrain flow's fan-out: each stale model's train + evaluate as a run of the `train-model` deployment,
on whichever worker of its pool is free; then one local `dvc repro --pull` that restores them all from the
DVC run-cache (`recsys.fanout` says why the keys match).

A run that ends `Crashed` — its worker died; with flow-run heartbeats and the automation of
`flows/zombies.py` the server marks a silent run so — is handed out again, up to `resubmits` times, and a
surviving worker picks it up. A `Failed` run is not: the worker already retried what may pass, so what is
left is deterministic (a stage's own error) and is reported as one line. Whenever the coordinator stops
short, it cancels every run it handed out that has not finished: nothing trains on for nobody.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from flows.zombies import TAG
from recsys import fanout
from recsys.config import ConfigError, load_params
from recsys.layout import Layout
from recsys.retraining import epochs_override
from recsys.workspace import run_dvc, workspace_lock

POLL_SECONDS = 5.0
RESUBMITS = 2  # a model's run is handed out at most 1 + RESUBMITS times when its workers keep crashing
STARTED = {"PENDING", "RUNNING", "CANCELLING"}  # state types of a run some worker has taken


def check_deployment(deployment: str, root: Path, commit: str, warn: bool = True) -> None:
    """The deployment exists on this API (else one line saying how to create it) and its pull step names a
    repository (a `{{ $RECSYS_GIT_URL }}` deployed unset stays a template no worker can clone); with `warn`,
    warn when its pool has no worker online (the runs then wait, Scheduled, until one starts), and when its
    workers clone another repository than `origin`, against which `commit` was found pushed
    (`fanout.clone_mismatch`)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(deployment)
        except ObjectNotFound as err:
            raise ConfigError(_no_deployment(deployment)) from err
        pool = found.work_pool_name
        online = [w for w in client.read_workers_for_work_pool(pool) if str(w.status).upper().endswith("ONLINE")] \
            if pool else []
    unresolved = [url for url in fanout.clone_urls(found.pull_steps) if "{{" in url]
    if unresolved:
        raise ConfigError(f"fan_out: deployment {deployment!r} clones {unresolved[0]!r}, a template left "
                          "unresolved (RECSYS_GIT_URL was not set when it was deployed); redeploy with "
                          "`RECSYS_GIT_URL=<the repository's URL> prefect deploy --prefect-file prefect-fanout.yaml "
                          "--all`")
    if not warn:
        return
    elsewhere = fanout.clone_mismatch(root, commit, found.pull_steps)
    if elsewhere:
        get_run_logger().warning("fan-out: %s", elsewhere)
    if not online:
        get_run_logger().warning("fan-out: no worker of pool %s is online; the runs wait until one starts "
                                 "(`prefect worker start --pool %s --limit 1`)", pool, pool)


def _no_deployment(deployment: str) -> str:
    return (f"fan_out: no deployment {deployment!r} on this Prefect API; create it with `prefect deploy "
            "--prefect-file prefect-fanout.yaml --all` (README, Scaling out) and set PREFECT_API_URL to that server")


def submit(deployment: str, order: fanout.WorkOrder, attempt: int) -> Any:
    """A flow run of `deployment` for `order`, scheduled now, linked to the calling flow as a subflow."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    try:
        return run_deployment(name=deployment, parameters=order.parameters(), timeout=0,
                              flow_run_name=f"{order.model}-{order.commit[:8]}-try{attempt}",
                              tags=[TAG, order.model])
    except ObjectNotFound as err:
        raise ConfigError(_no_deployment(deployment)) from err


def wait_for(orders: list[fanout.WorkOrder], deployment: str, resubmits: int = RESUBMITS,
             poll: float = POLL_SECONDS, idle_minutes: float = fanout.IDLE_MINUTES) -> list[str]:
    """Hand out every order and wait until each has completed once; returns the models' final run ids.

    Training may take hours, so only idleness is bounded: when for `idle_minutes` no run still out has
    been taken by a worker and none has ended (all Scheduled or Late: no worker online, or the pool busy
    with other work), the runs still Scheduled are cancelled and the fan-out stops with one line. Whenever
    it stops short (a failed or crashing model, an interrupt, an API error), every run not yet final is
    cancelled (`cancel_unfinished`)."""
    from prefect.client.orchestration import get_client

    logger = get_run_logger()
    attempts = {o.model: 1 for o in orders}
    running: dict[str, Any] = {}
    by_model = {o.model: o for o in orders}
    done: list[str] = []
    try:
        for order in orders:  # inside the try: an interrupt mid-way cancels the runs already handed out
            running[order.model] = submit(deployment, order, 1).id
        idle_since = time.monotonic()
        logger.info("fan-out: %d run(s) of %s scheduled: %s", len(orders), deployment, ", ".join(running))
        while running:
            time.sleep(poll)
            with get_client(sync_client=True) as client:
                states = {m: client.read_flow_run(run_id).state for m, run_id in running.items()}
            if any(s is not None and (s.type.name in STARTED or s.is_final()) for s in states.values()):
                idle_since = time.monotonic()  # a worker is on it, or something just ended: progress
            elif time.monotonic() - idle_since > idle_minutes * 60:
                cancel_unfinished(running, "fan-out gave up: no worker took it")
                pool = _pool_of(deployment)
                raise fanout.FanOutError(
                    f"fan-out: no worker of pool {pool} took any of {deployment}'s runs for "
                    f"{idle_minutes:g} min ({', '.join(running)} waiting; cancelled): start one "
                    f"(`prefect worker start --pool {pool} --limit 1`) or raise fan_out_idle_minutes "
                    "(--fan-out-idle-minutes)")
            for model, state in states.items():
                if state is None or not state.is_final():
                    continue
                if state.is_completed():
                    done.append(str(running.pop(model)))
                    logger.info("fan-out: %s done on a worker", model)
                elif state.is_crashed():
                    if attempts[model] > resubmits:
                        raise fanout.WorkerLostError(
                            f"fan-out: {model}'s run crashed {attempts[model]} times "
                            f"(last: {state.message}); check the workers of {deployment}'s pool")
                    attempts[model] += 1
                    logger.warning("fan-out: %s's run crashed (%s); handing it out again (attempt %d)", model,
                                   state.message, attempts[model])
                    running[model] = submit(deployment, by_model[model], attempts[model]).id
                else:  # Failed or Cancelled: deterministic, or a person's decision
                    raise fanout.FanOutError(f"fan-out: {model} {state.name.lower()} on a worker: "
                                             f"{_short(state.message)}")
    except (fanout.FanOutError, fanout.WorkerLostError) as err:
        # The retrain stops here, so nothing it handed out may go on: a worker would train it for nobody.
        stopped = cancel_unfinished(running, "fan-out stopped: " + _short(str(err)))
        if stopped:
            raise type(err)(f"{err} (cancelled the other runs still out: {', '.join(stopped)})") from err
        raise
    except BaseException:  # interrupted (Ctrl-C, the coordinator cancelled) or the API failed
        cancel_unfinished(running, "fan-out stopped: its coordinator ended")
        raise
    return done


def cancel_unfinished(running: dict[str, Any], why: str) -> list[str]:
    """Cancel each run not yet final: a waiting one at once, one a worker is on through Cancelling (its worker
    stops it). Returns the models cancelled. Best effort: a failure here is logged, never raised over the
    error that stopped the fan-out."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    stopped = []
    try:
        with get_client(sync_client=True) as client:
            for model, run_id in running.items():
                state = client.read_flow_run(run_id).state
                if state is not None and state.is_final():
                    continue
                started = state is not None and state.type.name in STARTED
                client.set_flow_run_state(run_id,
                                          Cancelling(message=why) if started else Cancelled(message=why))
                stopped.append(model)
    except Exception as err:  # noqa: BLE001 - the error that stopped the fan-out is the one to report
        get_run_logger().warning("fan-out: could not cancel the runs still out (%s): %s",
                                 ", ".join(running), err)
    return stopped


def _pool_of(deployment: str) -> str:
    """The deployment's work pool, for messages."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(deployment).work_pool_name or "?"


def reproduce_on_workers(root: Path, models: list[str], deployment: str, commit: str, epochs: int | None,
                         idle_minutes: float = fanout.IDLE_MINUTES) -> list[str]:
    """Prepare here, train + evaluate each stale model on a worker at `commit` (`fanout.committed_head`, after
    `fanout.check_fan_out`: the retrain flow runs both before anything else), restore everything here from
    the run-cache. Returns the stages that ran (here or on a worker), like the serial `dvc repro`."""
    logger = get_run_logger()
    paths = Layout(root)
    targets = [f"evaluate@{m}" for m in models]
    with workspace_lock(paths.root), epochs_override(paths.params, epochs, models):
        from recsys.warm_source import MOVED_ON, moved_under_lock

        for line in moved_under_lock(paths.root, load_params(paths.params)):  # the work orders ship these
            logger.warning(MOVED_ON, line)
        ran = fanout.running_stages(run_dvc(root, "repro", "prepare").stdout)
        run_dvc(root, "push", "prepare")
        stale = fanout.stale_models(root, models)
        orders = [fanout.work_order(root, m, commit) for m in stale]
        if orders:
            wait_for(orders, deployment, idle_minutes=idle_minutes)
        ran += [stage for m in stale for stage in fanout.model_stages(m)]
        restored = run_dvc(root, "repro", "--pull", *targets).stdout
        here = [s for s in fanout.running_stages(restored) if s != "prepare"]
        if here:  # a run-cache miss: correct results, but the work was done twice
            logger.warning("fan-out: %s ran here too: the workers' run-cache did not match this workspace "
                           "(params.yaml or code differing from the workers'?)", ", ".join(here))
            ran += here
    return list(dict.fromkeys(ran))


def _short(message: str | None) -> str:
    lines = [line for line in (message or "no message").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
