"""Retrain flow: rebuild the dataset and train + evaluate each model through DVC, then gate and register.

    python -m flows.retrain            # every model in params.yaml, only what changed
    python -m flows.retrain --force    # retrain even if DVC says nothing changed
    python -m flows.retrain --fan-out train-model/worker   # each model on a worker of a pool (README)

`dvc repro` owns the graph (prepare → train@m → evaluate@m); this flow decides what goes in — each
model's warm source, the champion a `train.init: warm | auto` run starts from (`recsys.warm_source`, a
dvc.yaml dependency) — and what happens after: the candidate (best by *validation* NDCG@10,
`recsys.retraining`), the registry's gate against the champion on the same test set, and the Prefect
artifacts (`flows.artifacts`). Every step is idempotent, so a crashed run is simply run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

from pydantic import StrictBool, StrictInt
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from flows.artifacts import publish_decision, publish_retrain
from flows.errors import add_verbose_flag, quiet_console, retry_if_transient, run_main
from flows.ingest import bootstrap
from recsys.config import ConfigError, Params, load_params, workspace_root
from recsys.layout import Layout, prune_resume_state
from recsys.retraining import (check_epochs, choose_candidate, epochs_override, read_curve,
                               read_results, restore_left_override, select_models, check_models_given,
                               training_progress, training_status)
from recsys.faults import fault_point
from recsys.entry import ArgumentParser, positive_float, positive_int
from recsys.model_configs import BASELINE, MAX_EPOCHS
from recsys.fanout import IDLE_MINUTES, check_deployment_name, check_fan_out, committed_head, force_refused
from recsys.workspace import run_dvc, workspace_lock

ROOT = Path(".")  # flows run from the repository root (deployments set it in their pull step)
PROGRESS_LOG_S = 30.0  # at most one training-progress line in the run's log this often


@task(name="warm-sources", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_if_transient)
def warm_sources(root: str) -> list[str]:
    """Write every model's `artifacts/warm/<model>` from the registry before `dvc repro` reads it."""
    from recsys.warm_source import resolve_warm_sources

    return resolve_warm_sources(Path(root), load_params(Layout(Path(root)).params))


@task(name="dvc-status", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_if_transient)
def stale_stages(root: str, targets: list[str]) -> list[str]:
    """Stages `dvc repro` would run (empty when nothing changed). Under the workspace lock: `dvc status`
    takes DVC's own lock, which an ingest's `dvc add` (another deployment's run) held — the status failed."""
    with workspace_lock(Path(root)):
        done = run_dvc(Path(root), "status", "--json", "--with-deps", *targets)
    return sorted(json.loads(done.stdout or "{}"))


@task(name="dvc-repro", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_if_transient)
def reproduce(root: str, targets: list[str], force: bool, epochs: int | None, models: list[str]) -> list[str]:
    """`dvc repro` the targets under the workspace lock, reporting training progress as it goes."""
    logger = get_run_logger()
    paths = Layout(Path(root))
    params = load_params(paths.params)
    args = ["repro", *(["--force"] if force else []), *targets]
    progress_id = create_progress_artifact(0.0, key="training-progress", description="dvc repro: starting")
    started, started_wall = time.monotonic(), time.time()
    logged = {"at": started, "line": ""}

    def report(trained: Params) -> None:  # (trained: params.yaml as the stages read it, --epochs applied)
        status = training_status(paths.root, trained, models, since=started_wall)
        update_progress_artifact(progress_id, 100.0 * min(training_progress(status, len(models)), 0.99),
                                 description=f"dvc repro running for {time.monotonic() - started:.0f}s")
        # The run's log (the console of `python -m flows.pipeline`, the UI's log tab) says where training is,
        # every PROGRESS_LOG_S while anything moved, instead of nothing until `dvc repro` ends.
        line = "; ".join(map(str, status))
        if line and line != logged["line"] and time.monotonic() - logged["at"] >= PROGRESS_LOG_S:
            logger.info("training (%.0f s): %s", time.monotonic() - started, line)
            logged.update(at=time.monotonic(), line=line)

    with workspace_lock(paths.root), epochs_override(paths.params, epochs, models):
        from recsys.warm_source import MOVED_ON, moved_under_lock

        for line in moved_under_lock(paths.root, params):
            logger.warning(MOVED_ON, line)
        done = run_dvc(paths.root, *args, watch=functools.partial(report, load_params(paths.params)))
        fault_point("after_repro")  # a kill here leaves an --epochs override for the next run to put back
    update_progress_artifact(progress_id, 100.0, description="dvc repro finished")
    for stale in prune_resume_state(paths.resume, models):  # outputs complete, however DVC got them
        logger.info("removed resume state %s", stale)
    ran = [line.split("'")[1] for line in done.stdout.splitlines() if line.startswith("Running stage '")]
    logger.info("dvc repro ran %d stage(s): %s", len(ran), ", ".join(ran) or "none (up to date)")
    return ran


@task(name="collect-results")
def collect_results(root: str, models: list[str]) -> dict[str, dict[str, Any]]:
    return read_results(Path(root), models)


@task(name="promote", retries=2, retry_delay_seconds=3, retry_condition_fn=retry_if_transient)
def promote_candidate(root: str, candidate: str, params_path: str | None = None) -> dict[str, Any]:
    """The one promotion path (`recsys.promotion.promote_candidate`, also behind `recsys registry promote`).
    `params_path` (relative to `root`) defaults to the repository's params.yaml (tests point it at a second
    registry)."""
    from recsys.promotion import promote_candidate as promote

    root_path = Path(root)
    params = load_params(root_path / params_path if params_path else Layout(root_path).params)
    decision = promote(root_path, params, candidate, baseline=BASELINE, trained_by_dvc=True)
    return {**dataclasses.asdict(decision), "model": candidate}


@task(name="fan-out")
def fan_out_stages(root: str, models: list[str], deployment: str, commit: str, epochs: int | None,
                   idle_minutes: float) -> list[str]:
    """Train + evaluate each stale model on a worker of `deployment`'s pool, at `commit` (the HEAD the flow's
    checks found committed and pushed); restore them here (flows.fanout)."""
    from flows.fanout import reproduce_on_workers

    ran = reproduce_on_workers(Path(root), models, deployment, commit, epochs, idle_minutes)
    prune_resume_state(Layout(Path(root)).resume, models)
    return ran


def check_run_parameters(epochs: int | None, fan_out: str | None, fan_out_idle_minutes: float,
                         models: list[str] | None = None) -> None:
    """A UI or API run's parameters are not argparse-checked: refuse impossible ones before anything runs."""
    check_epochs(epochs)
    check_models_given(models)
    if fan_out is not None:
        check_deployment_name(fan_out)
    if fan_out and not (fan_out_idle_minutes > 0 and math.isfinite(fan_out_idle_minutes)):
        raise ConfigError(f"fan_out_idle_minutes must be a finite number > 0, got {fan_out_idle_minutes}")


@flow(name="retrain", log_prints=True)
def retrain(
    models: list[str] | None = None,
    force: StrictBool = False,
    epochs: StrictInt | None = None,
    repo_root: str = str(ROOT),
    fan_out: str | None = None,
    fan_out_idle_minutes: float = IDLE_MINUTES,
) -> dict[str, Any]:
    """Rebuild the prepared dataset, train + evaluate `models` (default: all in params.yaml) through DVC,
    then gate the best candidate (by validation NDCG@10) against the champion.

    Args:
        models: models to train; each must be listed in params.yaml `models` (unset: all; an empty list is
            refused). MostPop is always evaluated too, as the baseline a first champion must beat.
        force: retrain even when DVC finds nothing changed.
        epochs: override `train.epochs` for this run only (DVC records it; the next normal run retrains).
        repo_root: the repository (DVC workspace) to run in; its params.yaml is the one every stage reads.
        fan_out: a deployment of the `train-model` flow, `<flow>/<deployment>` (e.g. `train-model/worker`):
            train + evaluate each model as a run of it on a worker of its pool, sharing results through the
            DVC remote. Default (none): one `dvc repro` here.
        fan_out_idle_minutes: with `fan_out`, give up (cancelling the runs still waiting) when no worker has
            taken any of the runs for this long; training itself is not time-limited.
    """
    quiet_console()
    check_run_parameters(epochs, fan_out, fan_out_idle_minutes, models)
    root = workspace_root(repo_root)
    logger = get_run_logger()
    paths = Layout(root)
    if restore_left_override(paths.params):  # before anything reads params.yaml or asks DVC what is stale
        logger.warning("params.yaml: put back the original that an interrupted --epochs run left rewritten")
    params = load_params(paths.params)
    selected = select_models(params, models)
    commit = fan_out_ready(root, params, selected, force, fan_out) if fan_out else None
    bootstrap(str(root))
    for line in warm_sources(str(root)):
        logger.info("warm source %s", line)
    targets = [f"evaluate@{m}" for m in selected]
    if epochs is None:
        stale = stale_stages(str(root), targets)
        logger.info("stale stages: %s%s", ", ".join(stale) or "none",
                    " (--force reruns every selected model)" if force else "")
    else:  # what is stale then depends on the override, which only the run applies (under the lock)
        stale = []
        logger.info("--epochs %d: %s", epochs, "--force reruns every selected model" if force else
                    "DVC reruns each selected model whose last run had other epochs or other inputs")
    ran = []
    if stale or force or epochs is not None:
        ran = (fan_out_stages(str(root), selected, fan_out, commit, epochs, fan_out_idle_minutes) if fan_out
               else reproduce(str(root), targets, force, epochs, selected))
    results = collect_results(str(root), selected)
    candidate = choose_candidate(results)
    decision = None
    if candidate is None:
        logger.warning("no trainable candidate among %s; nothing to promote", selected)
    else:
        fault_point("before_promote")
        decision = promote_candidate(str(root), candidate)
        verdict = (decision["decision"] if decision["promoted"] or decision["decision"] != "promoted"
                   else "not champion")
        replayed = " (already decided earlier; nothing changed)" if decision["replayed"] else ""  # as the CLI
        logger.info("gate: %s %s%s — %s", candidate, verdict, replayed, decision["reason"])
    if ran or (decision is not None and not decision["replayed"]):
        publish_retrain(results, decision, {m: read_curve(paths.curve(m)) for m in selected}, ran)
    elif decision is not None:  # nothing changed: the last change's table and curves still hold
        publish_decision(decision)
    return {
        "stages_run": ran,
        "models": {m: {"test_ndcg@10": r.get("ndcg@10"), "valid_ndcg@10": (r.get("valid") or {}).get("ndcg@10")}
                   for m, r in results.items()},
        "candidate": candidate,
        "decision": decision,
    }


def fan_out_ready(root: Path, params: Any, selected: list[str], force: bool, fan_out: str,
                  warn: bool = True) -> str:
    """Refuse what fan-out cannot do, before anything runs (the one home of these checks: this flow's start,
    and the pipeline's before it ingests); returns the commit the workers will check out. `warn`: say what
    only may go wrong (no worker online, workers cloning elsewhere) — once a run, where the fan-out starts."""
    from flows.fanout import check_deployment

    check_fan_out(params, selected, force, root)
    commit = committed_head(root)
    check_deployment(fan_out, root, commit, warn=warn)
    return commit


def check_command_line(repo_root: str, models: list[str] | None,
                       fan_out: str | None = None) -> tuple[Path, Any, list[str]]:
    """`run_main`'s precheck for this flow's and the pipeline's command lines: the repository, its params.yaml
    and the models the flow's first steps would refuse (`workspace_root`, `load_params`, `select_models`),
    and a `--fan-out` without a Prefect server to find its deployment on — one line before Prefect's
    server starts and a failed flow run is recorded. Returns (root, params, the selected models)."""
    root = workspace_root(repo_root)
    params = load_params(Layout(root).params)
    selected = select_models(params, models)
    if fan_out:
        from prefect.settings import get_current_settings

        if not get_current_settings().api.url:  # the temporary server has no deployments and no workers
            raise ConfigError(f"--fan-out {fan_out} needs the Prefect server its workers poll, and PREFECT_API_URL "
                              "is not set: this run would go to a temporary server with no deployments and no "
                              "workers; set PREFECT_API_URL=http://HOST:4200/api (README, Scaling out)")
    return root, params, selected


def epochs_argument(text: str) -> int:
    """argparse type of `--epochs` (this flow's and the pipeline's): refused as a command line that does not
    parse (exit 2), before a flow run is created; the flow checks again what a UI or API run passes."""
    epochs = positive_int(text)
    if epochs > MAX_EPOCHS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_EPOCHS:,} epochs, got {text!r}")
    return epochs


def deployment_name(text: str) -> str:
    """argparse type of `--fan-out`: refused as a command line that does not parse (exit 2), before a flow run
    is created, rather than as a run that fails (the flow checks again what a UI or API run passes)."""
    try:
        check_deployment_name(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def check_fan_out_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the command line alone shows fan-out cannot do, refused before a flow run is created."""
    if args.fan_out and args.force:
        parser.error(force_refused("--fan-out"))
    if args.fan_out_idle_minutes is not None and not args.fan_out:  # it was read as nothing, and ran the flow
        parser.error("--fan-out-idle-minutes applies to --fan-out only (give both, or leave it out)")
    if args.fan_out_idle_minutes is None:
        args.fan_out_idle_minutes = IDLE_MINUTES


def add_fan_out_arguments(parser: argparse.ArgumentParser) -> None:
    """`--fan-out` and `--fan-out-idle-minutes`, for this flow's command line and the pipeline's (which then
    call `check_fan_out_arguments`)."""
    parser.add_argument("--fan-out", metavar="DEPLOYMENT", type=deployment_name,
                        help="train each model as a run of this train-model deployment on a worker pool")
    parser.add_argument("--fan-out-idle-minutes", type=positive_float, default=None, metavar="MINUTES",
                        help=f"with --fan-out: give up when no worker has taken any run for this long "
                             f"(default {IDLE_MINUTES:g})")


def main(argv: list[str] | None = None) -> None:
    parser = add_verbose_flag(ArgumentParser("flows.retrain", description="run the retrain flow"))
    parser.add_argument("--models", nargs="+", help="models to train (default: all in params.yaml)")
    parser.add_argument("--force", action="store_true", help="retrain even when nothing changed")
    parser.add_argument("--epochs", type=epochs_argument, help="override train.epochs for this run only")
    parser.add_argument("--repo-root", default=str(ROOT),
                        help="the repository to work in: params.yaml, dvc.yaml, data/ (default: the current folder)")
    add_fan_out_arguments(parser)
    args = parser.parse_args(argv)
    check_fan_out_arguments(parser, args)
    summary = run_main(lambda: retrain(models=args.models, force=args.force, epochs=args.epochs,
                                       repo_root=args.repo_root, fan_out=args.fan_out,
                                       fan_out_idle_minutes=args.fan_out_idle_minutes), args.verbose,
                       precheck=lambda: check_command_line(args.repo_root, args.models, args.fan_out))
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
