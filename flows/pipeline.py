"""The retraining loop end to end: ingest the inbox, then retrain + gate + register.

    python -m flows.pipeline     # the README's main job; prints the champion and a sample recommendation

A rejected batch (moved aside) does not stop the run: it retrains and gates on the accepted data, then fails
with the ingest flow's line naming each rejected file (`flows.ingest.ingest_outcome`). A run with no new data
retrains nothing (DVC finds every stage up to date) and the gate replays its earlier decision, so the nightly
schedule is cheap when nothing arrived: with an empty inbox and no unfinished ingest commit or push
(`recsys.ingest.layout.has_work`, a few stats) it starts no ingest subflow at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import StrictBool, StrictInt
from prefect import flow, get_run_logger

from flows.errors import add_verbose_flag, quiet_console, run_main
from flows.ingest import has_batches_or_unfinished_work, ingest, ingest_config, ingest_outcome, summarise
from flows.retrain import (
    add_fan_out_arguments,
    check_command_line,
    check_fan_out_arguments,
    check_run_parameters,
    epochs_argument,
    fan_out_ready,
    retrain,
)
from recsys.entry import ArgumentParser
from recsys.fanout import IDLE_MINUTES
from recsys.ingest.errors import BatchesRejected
from recsys.ingest.layout import NOTHING_TO_INGEST
from recsys.recommend import describe_champion

ROOT = Path(".")  # flows run from the repository root (deployments set it in their pull step)


@flow(name="pipeline", log_prints=True)
def pipeline(
    models: list[str] | None = None,
    force: StrictBool = False,
    epochs: StrictInt | None = None,
    inbox: str | None = None,
    repo_root: str = str(ROOT),
    fan_out: str | None = None,
    fan_out_idle_minutes: float = IDLE_MINUTES,
) -> dict[str, Any]:
    """Ingest new batches, then retrain what changed and gate the best candidate.

    Args:
        models: models to train (default: all in params.yaml; an empty list is refused).
        force: retrain even when nothing changed.
        epochs: override `train.epochs` for this run only.
        inbox: inbox folder (default: params.yaml `ingest.inbox`); a given one must be an existing folder.
        repo_root: the repository (DVC workspace); its params.yaml is the one every stage reads.
        fan_out: a `train-model` deployment, `<flow>/<deployment>`, to train each model on a worker of its
            pool (see flows.retrain).
        fan_out_idle_minutes: with `fan_out`, give up when no worker has taken any run for this long.
    """
    # before ingest: retrain would refuse them (a UI or API run's models too, against params.yaml)
    quiet_console()
    check_run_parameters(epochs, fan_out, fan_out_idle_minutes, models)
    root, params, selected = check_command_line(repo_root, models)
    if fan_out:  # a fan-out the retrain would refuse (--force, the code not pushed, no such deployment)
        fan_out_ready(root, params, selected, force, fan_out, warn=False)
    rejected = None
    if has_batches_or_unfinished_work(repo_root, ingest_config(repo_root, inbox)):  # (a bad inbox: refused)
        # A rejected batch is moved aside: retrain on what was accepted, then fail as the ingest flow did.
        ingested, rejected = ingest_outcome(ingest(inbox=inbox, repo_root=repo_root, return_state=True))
    else:  # the nightly run when nothing arrived: no ingest subflow run (a second of Prefect bookkeeping)
        get_run_logger().info(NOTHING_TO_INGEST)
        ingested = summarise({"summaries": [], "actions": []})
    try:
        retrained = retrain(models=models, force=force, epochs=epochs, repo_root=repo_root, fan_out=fan_out,
                            fan_out_idle_minutes=fan_out_idle_minutes)
    except Exception:
        if rejected is not None:  # the retrain's error ends the run: the rejection is said before it, not lost
            get_run_logger().error("%s", rejected)
        raise
    summary = {"ingest": {k: v for k, v in ingested.items() if k != "summaries"}, "retrain": retrained}
    if rejected is not None:
        rejected.result = summary
        raise rejected
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = add_verbose_flag(ArgumentParser("flows.pipeline",
                                             description="run the pipeline flow (ingest → retrain → gate)"))
    parser.add_argument("--models", nargs="+", help="models to train (default: all in params.yaml)")
    parser.add_argument("--force", action="store_true", help="retrain even when nothing changed")
    parser.add_argument("--epochs", type=epochs_argument, help="override train.epochs for this run only")
    parser.add_argument("--inbox", help="inbox folder (default: params.yaml ingest.inbox)")
    parser.add_argument("--repo-root", default=str(ROOT),
                        help="the repository to work in: params.yaml, dvc.yaml, data/ (default: the current folder)")
    add_fan_out_arguments(parser)
    args = parser.parse_args(argv)
    check_fan_out_arguments(parser, args)

    def run() -> dict[str, Any]:
        try:
            summary = pipeline(models=args.models, force=args.force, epochs=args.epochs, inbox=args.inbox,
                               repo_root=args.repo_root, fan_out=args.fan_out,
                               fan_out_idle_minutes=args.fan_out_idle_minutes)
        except BatchesRejected as rejected:  # retrained and gated on the rest: say so, then its one line
            report(rejected.result)
            raise
        report(summary)
        return summary

    def report(summary: dict[str, Any]) -> None:
        print(json.dumps(summary, indent=2, default=str))
        changed = bool(summary["ingest"].get("batches") or summary["retrain"].get("stages_run"))
        # A sample of what the champion recommends when something changed (scoring loads torch and the model).
        print(describe_champion(Path(args.repo_root), summary["retrain"].get("decision"), k=5 if changed else 0))

    def precheck() -> None:
        check_command_line(args.repo_root, args.models, args.fan_out)
        ingest_config(args.repo_root, args.inbox)

    run_main(run, args.verbose, precheck=precheck)


if __name__ == "__main__":
    main()
