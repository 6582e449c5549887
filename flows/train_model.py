"""One model's train + evaluate on a worker of a pool: the unit of work the retrain flow fans out.

Deployed as `train-model/worker` (prefect-fanout.yaml) with a `git_clone` pull step, so every run starts from a
clean clone; the retrain flow calls it through `run_deployment` with a `recsys.fanout.WorkOrder`'s
parameters. The run checks out the coordinator's commit, writes its params.yaml and dvc.lock, pulls the
prepared dataset from the DVC remote, puts the model's warm source in place (the checkpoint the shipped
record names, copied from the shared `registry.artifact_root`), reproduces `train@<model>` and
`evaluate@<model>`, and pushes the outputs and DVC's run-cache, from which the coordinator restores them.
The worker needs the DVC remote's credentials (README, *Scaling out*) and, for warm starts, the artifact
root's mount; never the registry database.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from flows.errors import quiet_console, retry_if_transient
from recsys import fanout
from recsys.entry import ArgumentParser


@task(name="check-out")
def check_out(root: str, order: fanout.WorkOrder) -> None:
    fanout.check_out(Path(root), order)


@task(name="reproduce", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_if_transient)
def reproduce(root: str, model: str, warm_source: str) -> list[str]:
    return fanout.reproduce(Path(root), model, warm_source)


@task(name="push", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_if_transient)
def push(root: str, model: str) -> None:
    fanout.push(Path(root), model)


@flow(name=fanout.WORKER_FLOW, log_prints=True)
def train_model(model: str, commit: str, files: dict[str, str], repo_root: str = ".") -> dict[str, Any]:
    """Reproduce one model's train + evaluate stages at `commit` and share them through the DVC remote.

    Args:
        model: the model (a name in params.yaml `models`).
        commit: the coordinator's git commit (full sha); fetched when the clone's HEAD differs.
        files: params.yaml, dvc.lock and the model's warm source record as the coordinator has them (what the
            commit lacks).
        repo_root: the clean checkout (the deployment's pull step makes it the working directory).
    """
    quiet_console()
    logger = get_run_logger()
    order = fanout.WorkOrder(model=model, commit=commit, files=files)
    root = str(Path(repo_root).resolve())
    check_out(root, order)
    ran = reproduce(root, model, order.files[fanout.warm_source_file(model)])
    push(root, model)
    logger.info("%s: ran %s; outputs and run-cache pushed", model, ", ".join(ran) or "nothing (up to date)")
    return {**fanout.summary(Path(root), model), "stages_run": ran}


NOT_BY_HAND = ("this flow runs on a pool's worker, as a run of the train-model/worker deployment the "
               "retrain flow's --fan-out hands out (README, Scaling out): `python -m flows.retrain "
               "--fan-out train-model/worker`; to train a model on this machine, `python -m "
               "flows.retrain --models MODEL`")


def main(argv: list[str] | None = None) -> None:
    """`python -m flows.train_model`: its help says what it is; anything else is refused (exit 2) with the
    commands that start it — a work order's `files` come from the coordinator, not from a command line."""
    how = textwrap.fill(f"{NOT_BY_HAND[0].upper()}{NOT_BY_HAND[1:]}.", 110, break_on_hyphens=False)
    parser = ArgumentParser("flows.train_model", description=f"{__doc__.strip()}\n\n{how}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)  # --help prints the above and exits 0; an argument is refused
    parser.error(NOT_BY_HAND)


if __name__ == "__main__":
    main()
