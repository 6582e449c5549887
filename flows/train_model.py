"""One model's train + evaluate on a worker of a pool: the unit of work the retrain flow fans out.

Deployed as `train-model/worker` (prefect.yaml) with a `git_clone` pull step, so every run starts from a
clean clone; the retrain flow calls it through `run_deployment` with a `recsys.fanout.WorkOrder`'s
parameters. The run checks out the coordinator's commit, writes its params.yaml and dvc.lock, pulls the
prepared dataset from the DVC remote, puts the model's warm source in place (the checkpoint the shipped
record names, copied from the shared `registry.artifact_root`), reproduces `train@<model>` and
`evaluate@<model>`, and pushes the outputs and DVC's run-cache, from which the coordinator restores them.
The worker needs the DVC remote's credentials (README, *Scaling out*) and, for warm starts, the artifact
root's mount; never the registry database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from flows.errors import quiet_console, retry_if_transient
from recsys import fanout


@task(name="check-out")
def check_out(root: str, order: fanout.WorkOrder) -> None:
    fanout.check_out(Path(root), order)


@task(name="reproduce", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_if_transient)
def reproduce(root: str, model: str, warm_source: str) -> list[str]:
    return fanout.reproduce(Path(root), model, warm_source)


@task(name="push", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_if_transient)
def push(root: str, model: str) -> None:
    fanout.push(Path(root), model)


@flow(name="train-model", log_prints=True)
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
