"""Training: (prepared dataset, config, initial weights) → checkpoint. No other state is read.

Seeded; early stopping on validation NDCG@10 (full ranking) — validation selects, the test split is never
touched here. Each epoch writes one `key=value` log line and one row of the training curve (for
`dvc plots show`). The best model is checkpointed as safetensors + JSON. Resumable: after each epoch the
trainer saves its full state (weights, optimizer, RNG, counters) under a key made of the dataset fingerprint
and the configuration, so an interrupted run continues where it stopped — and a run with other data or
other hyperparameters can never pick up a stale state. The initial weights are fresh (`train.init: cold`)
or the registry champion's, handed in as the stage's `artifacts/warm/<model>` input (recsys/warm.py).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recsys.atomic import write_text_atomic
from recsys.checkpoint import save_checkpoint
from recsys.config import ConfigError
from recsys.device import (out_of_memory_as_error, precision_name, retain_cpu_memory, step_autocast,
                           step_precision)
from recsys.distributed import current_world
from recsys.entry import model_stage_args
from recsys.faults import fault_point
from recsys.held_out import weights_until
from recsys.layout import RESUME, SELECTION_METRIC, VALID_COLUMN, Layout
from recsys.metrics import per_user_metrics
from recsys.model_configs import TrainConfig, cuda_graph_message, cuda_graph_refusal
from recsys.models import build_model, check_fits
from recsys.prepare import Prepared, load
from recsys.ranking import RankingInputs, scoring_batch_size, scoring_memory, summarise
from recsys.sequences import SequenceData, TrainingTensors, batch_rows, micro_batch_count, micro_batches
from recsys.step_graph import FixedShapeStep, current_rate, set_rate
from recsys.train_state import Resume, WeightAverage, early_stop_epoch, improves, run_key, stops
from recsys.warm import start as initialise

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """A run that cannot go on as configured (its loss diverged): the same settings fail the same way, so a
    flow does not retry it; the message names the setting to change."""

    transient = False


@dataclass(frozen=True)
class TrainResult:
    model: str
    best_epoch: int
    best_valid: dict[str, float]
    epochs_run: int
    seconds: float
    seconds_to_best: float
    sequences_per_second: float
    checkpoint: Path
    stopped_by: str
    # Process CPU seconds (all threads; on CUDA the host's share only): robust to other load on a shared
    # machine, where wall seconds are not — benchmarks compare runs with these.
    cpu_seconds: float = 0.0
    cpu_seconds_to_best: float = 0.0


def _progress(enabled: str, total: int, desc: str):
    show = enabled == "on" or (enabled == "auto" and sys.stderr.isatty())
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, unit="batch")


def validate(model, inputs: RankingInputs) -> dict[str, float]:
    """Validation NDCG@10 / HR@10 over every validation target, ranked on the training device."""
    return summarise(per_user_metrics(inputs.ranks(model).cpu(), (10,)))


def training_memory(model_name: str, config: TrainConfig, device, max_len: int, parts: int, fixed: bool):
    """Out of memory in a training step → one line naming `train.batch_size` (and `micro_batches`)."""
    on = torch.device(device).type
    split = "" if fixed else f" or raise train.micro_batches (now {parts} a step on {on})"
    return out_of_memory_as_error(
        device, f"training {model_name} ({config.batch_size} sequences of up to {max_len} events a step)",
        f"lower train.batch_size (now {config.batch_size}){split}")


def validation_memory(model, config: TrainConfig, device):
    """Out of memory while ranking the validation split → one line naming `train.eval_batch_size`."""
    return scoring_memory(model, config.eval_batch_size, "train.eval_batch_size", device, "validation")


def validation_inputs(model, data: SequenceData, config: TrainConfig, device, mask_seen=True) -> RankingInputs:
    return RankingInputs(data, "valid", int(getattr(model.config, "max_len", 1)), device=device,
                         batch_size=scoring_batch_size(config.eval_batch_size, model, device), mask_seen=mask_seen)


def optimiser_step(model, loss_fn, optimizer, tensors: TrainingTensors, rows: torch.Tensor, micro: list,
                   *, grad_clip: float = 0.0, autocast: torch.dtype | None = None) -> torch.Tensor:
    """One optimiser step on the spans `rows` (on the device, sorted by length) run as the micro-batches
    `micro` (`recsys.sequences.micro_batches`): their weighted losses' gradients add up to the whole step's.
    Returns the step's mean loss, detached and left on the device (no host sync). The forward pass and loss
    run under `autocast` (`train.precision`: `recsys.device.training_autocast`; None = float32)."""
    device = rows.device
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for start, stop, width, weight in micro:
        batch = tensors.batch(rows[start:stop], width)
        with step_autocast(device, autocast):
            loss = loss_fn(batch)
        (loss * weight).backward()
        total += loss.detach() * weight
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return total


def train_model(
    model_name: str,
    model_config: Any,
    train_config: TrainConfig,
    prepared: Prepared | str | Path,
    out_dir: str | Path,
    *,
    curve_path: str | Path | None = None,
    resume_root: str | Path | None = None,
    warm_dir: str | Path | None = None,
    on_epoch=None,
    keep_final_state: bool = False,
    adopt_from: Sequence[Path] = (),
    mask_seen: bool = True,
) -> TrainResult:
    """Train `model_name` and write its best (by validation NDCG@10) checkpoint to `out_dir`.

    `warm_dir` is the warm source `train.init: warm | auto` starts from (recsys/warm.py; unread when cold).
    `on_epoch(epoch, row)` is called after every epoch (the flow uses it to report progress).
    `keep_final_state`: a finished run's resume state is kept, marked finished, instead of cleared, so that a
    caller with more to do after training (a benchmark scoring the test split) can be killed and rerun without
    training again: the rerun returns the same result at once — unless `train.max_minutes` stopped the run
    and now allows more (raised, or 0): then it trains on from its last epoch. That caller clears the state
    (`prune_resume_state`). `adopt_from`: other runs' resume roots, whose kept final state of this run key
    (the same run but for early stopping's settings, `recsys.train_state.STOPPING_FIELDS`) this run may start
    from, with the best checkpoint the state keeps, when it has no state of its own — one whose epochs are
    this run's first ones, so a larger patience trains only its extra epochs. `mask_seen`: evaluate.mask_seen."""
    started, cpu_started = time.perf_counter(), time.process_time()
    prepared = load(prepared) if not isinstance(prepared, Prepared) else prepared
    cfg = train_config
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    world = current_world()  # one process, or this rank under torchrun (recsys.distributed)
    device = world.device(cfg.device)
    retain_cpu_memory(cfg.cpu_allocator, device)  # on a CPU; speed only: the same numbers either way
    data = SequenceData.from_prepared(prepared)
    fingerprint = prepared.fingerprint["fingerprint"]
    check_fits(model_name, model_config, data.n_items, data.n_users, device)  # before allocating it
    model = build_model(model_name, model_config, n_items=data.n_items, n_users=data.n_users).to(device)
    model.fit_statistics(data.train_items().to(device))
    item_ids = prepared.items["item_id"].tolist()
    user_ids = prepared.users["user_id"].tolist()
    # Before the optimiser exists, so a warm start always gets a fresh one.
    init = initialise(model, model_name, model_config, cfg, Path(warm_dir) if warm_dir else None, item_ids,
                      user_ids, held_out_from=prepared.fingerprint.get("held_out_from"),
                      split=prepared.fingerprint.get("config"))
    out_dir = Path(out_dir)
    curve_rows: list[dict] = []

    curve_path = curve_path if world.is_main else None  # only rank 0 writes
    scored = model  # what validation, the checkpoint and so the test score (train.ema: the weights' average)
    autocast = step_precision(model_name, cfg.precision, device) if model.trainable else None  # None: fp32

    def checkpoint(epoch: int, valid: dict) -> None:
        if not world.is_main:
            return
        extra = {"best_epoch": epoch, "valid_metrics": valid, "train_config": dataclasses.asdict(cfg),
                 "prepare": prepared.fingerprint.get("config"),  # how its data was split (warm_source.py)
                 "train_until": weights_until(prepared.fingerprint.get("train_until"), init),  # (held_out.py)
                 "precision": precision_name(autocast), "mask_seen": mask_seen}  # its steps' dtype; ranking rule
        if init is not None:
            extra["init"] = init
        save_checkpoint(out_dir, scored, dataset_fingerprint=fingerprint, item_ids=item_ids,
                        user_ids=user_ids, extra=extra)

    with validation_memory(model, cfg, device):
        valid_inputs = validation_inputs(model, data, cfg, device, mask_seen)
    if not model.trainable:
        with validation_memory(model, cfg, device):
            valid = validate(model, valid_inputs)
        checkpoint(0, valid)
        row = {"epoch": 0, "loss": float("nan"), VALID_COLUMN: valid[SELECTION_METRIC],
               "valid_hr@10": valid["hr@10"], "seconds": time.perf_counter() - started}
        _write_curve(curve_path, [row])
        log.info("epoch=0 model=%s valid_ndcg@10=%.4f valid_hr@10=%.4f (counting model: no training)",
                 model_name, valid[SELECTION_METRIC], valid["hr@10"])
        elapsed = time.perf_counter() - started
        return TrainResult(model_name, 0, valid, 0, elapsed, elapsed, 0.0, out_dir, "not_trainable")

    max_len = int(model_config.max_len)
    spans = data.train_spans(max_len, cfg.windows)
    if len(spans) == 0:
        raise ValueError("no user has two or more training events; nothing to train on")
    parts = micro_batch_count(cfg.micro_batches, device)
    with training_memory(model_name, cfg, device, max_len, parts, cfg.cuda_graph):
        tensors = TrainingTensors(data, spans, device)  # resident on the device: batches are cut there
    lr = cfg.effective_lr
    optimizer = make_optimizer(model, cfg, device)
    fixed = fixed_shape_step(model, model_name, model_config, cfg, optimizer, tensors, device,
                             world.active, autocast)  # or refused
    average = WeightAverage(model, cfg.ema, cfg.ema_warmup) if cfg.ema > 0 else None
    if average is not None:
        scored = average.module
    generator = torch.Generator().manual_seed(cfg.seed)
    resume = Resume(Path(resume_root or RESUME), model_name,
                     run_key(model_name, model_config, cfg, fingerprint, init, mask_seen))
    state = {"epoch": 0, "best": -math.inf, "best_epoch": 0, "best_valid": {}, "bad_epochs": 0,
             "curve": [], "seconds": 0.0, "seconds_to_best": 0.0, "sequences": 0, "since_decay": 0, "steps": 0,
             "lr": lr, "cpu_seconds": 0.0, "cpu_seconds_to_best": 0.0}
    warm = (init or {}).get("mode") == "warm"
    floor = cfg.warm_min_epochs if warm else cfg.min_epochs  # early stopping's
    patience = (cfg.warm_patience or cfg.patience) if warm else cfg.patience
    if adopt_from:
        if world.is_main and (adopted := resume.adopt(adopt_from, patience, floor, VALID_COLUMN)):
            log.info("model=%s starts from the kept final state in %s (the same run under other "
                     "early-stopping settings)", model_name, adopted)
        world.barrier()  # every rank reads the state rank 0 may have copied in
    saved = resume.peek()
    stop_at = early_stop_epoch(saved["curve"], patience, floor, VALID_COLUMN) if saved else None
    if saved and stop_at is not None and stop_at < saved["epoch"]:
        # Saved under a larger patience or floor, it trained on past where this run stops: not this run's.
        log.info("model=%s: the saved state (epoch %d) went past epoch %d, where patience=%d, min_epochs=%d "
                 "stop this run; training from the start", model_name, saved["epoch"], stop_at, patience,
                 floor)
        saved = None
    restored = resume.load(model, optimizer, generator, device, average) if saved else None
    if restored:
        state.update(restored)
        log.info("resumed model=%s from epoch=%d (best epoch %d)", model_name, state["epoch"], state["best_epoch"])
        if world.is_main and resume.restore_best(out_dir, state["best_epoch"], dataclasses.asdict(cfg)):
            log.info("model=%s: put back the best checkpoint (epoch %d) from the saved state", model_name,
                     state["best_epoch"])
        if state.get("stopped_by") == "time_limit" and within_budget(cfg, state["seconds"]):
            # A kept final state of a run the clock stopped, now given more time: train on from its last epoch
            # (the kept state is that epoch's weights, optimiser and generator, not the best checkpoint's).
            del state["stopped_by"]
            log.info("model=%s was stopped by train.max_minutes after %.0f s; going on under max_minutes=%g",
                     model_name, state["seconds"], cfg.max_minutes)
        elif state.get("stopped_by") == "early_stopping" and stop_at is None:
            del state["stopped_by"]  # a kept final state, and a larger patience or floor: train on, as above
            log.info("model=%s was stopped early at epoch %d; going on under patience=%d, min_epochs=%d",
                     model_name, state["epoch"], patience, floor)
    loss_fn = world.loss_fn(model, device)
    terms = model.loss_terms(tensors.lengths)  # per span: the weights of a step's micro-batches
    positions = model.loss_positions(tensors.lengths) if fixed is not None else None  # their bound
    curve_rows = state["curve"]
    # A state saved at the epoch where early stopping ends this run (killed before it stopped, or saved under
    # a larger patience, or stopped there by the clock or the epoch cap): no epoch more, and early stopping
    # says why, as in one uninterrupted run (whose check after an epoch comes before those). Else a kept
    # final state's own reason, nothing left to train.
    stop_now = stop_at is not None and stop_at == state["epoch"]
    if stop_now and state.get("stopped_by", "early_stopping") != "early_stopping":
        del state["stopped_by"]  # (so a kept final state is saved again, with the reason this run gives)
    stopped_by = "early_stopping" if stop_now else state.get("stopped_by", "max_epochs")
    if fixed is not None and not fixed.graphed:
        log.info("model=%s train.cuda_graph on %s: the fixed-shape step runs eagerly (a graph needs CUDA)",
                 model_name, device.type)
    time_offset = state["seconds"] - (time.perf_counter() - started)
    cpu_offset = state["cpu_seconds"] - (time.process_time() - cpu_started)

    while "stopped_by" not in state and not stop_now and state["epoch"] < cfg.epochs:
        # Checked before an epoch starts, so a run resumed under a budget it has already spent stops where it
        # is, and one whose last epoch ends past the limit is stopped by max_epochs.
        if not within_budget(cfg, state["seconds"]):
            stopped_by = "time_limit"
            break
        epoch = state["epoch"] + 1
        model.train()
        world.seed_epoch(cfg.seed, epoch)
        # The epoch's batch plan is made on the host from span lengths and sent to the device in one copy;
        # inside the loop nothing waits for the device (the loss is summed there and read once per epoch).
        whole = batch_rows(tensors.lengths, cfg.batch_size, generator, cfg.batching)
        plan = world.shard(whole)
        steps = [micro_batches(tensors.lengths[rows], world.micro_batch_count(parts, len(full)), terms[rows])
                 for rows, full in zip(plan, whole)] if fixed is None else [None] * len(plan)
        if fixed is not None:
            fixed.plan_epoch(plan, positions)  # the loss positions its steps compute, from the plan
        # per step: (start, stop, width, weight) per micro-batch (the fixed-shape step takes the rows whole)
        flat = torch.from_numpy(np.concatenate(plan)).to(device, non_blocking=True)
        bounds = np.cumsum([0] + [len(rows) for rows in plan])
        bar = _progress(cfg.progress if world.is_main else "off", len(plan), f"{model_name} epoch {epoch}")
        total_loss, epoch_start = torch.zeros((), device=device), time.perf_counter()
        # The epoch's rate: state["lr"] (lr_decay's, kept by the resume state) along train.lr_schedule.
        rate = state["lr"] * cfg.schedule_factor(epoch)
        set_rate(optimizer, rate)
        with training_memory(model_name, cfg, device, max_len, parts, fixed is not None):
            for b, micro in enumerate(steps):
                if cfg.warmup_steps and state["steps"] < cfg.warmup_steps:
                    # The last warm-up step sets the rate itself, not lr·w/w, which can be a float away from it.
                    done = state["steps"] + 1 == cfg.warmup_steps
                    set_rate(optimizer, rate if done else rate * (state["steps"] + 1) / cfg.warmup_steps)
                rows = flat[bounds[b] : bounds[b + 1]]
                if fixed is not None:
                    total_loss += fixed(rows)
                else:
                    total_loss += optimiser_step(model, loss_fn, optimizer, tensors, rows, micro,
                                                 grad_clip=cfg.grad_clip, autocast=autocast)
                if average is not None:
                    average.update(state["steps"] + 1)
                state["steps"] += 1
                if bar is not None:
                    bar.update(1)
        epoch_loss = float(world.mean(total_loss)) / len(plan)  # the epoch's one host sync
        if bar is not None:
            bar.set_postfix(loss=f"{epoch_loss:.4f}")
            bar.close()
        if not math.isfinite(epoch_loss):
            rate = f"{cfg.lr:g}" + (f", {lr:g} after lr_scaling" if lr != cfg.lr else "")
            raise TrainingError(f"{model_name}: the training loss became {epoch_loss} at epoch {epoch}: "
                                f"lower train.lr (now {rate}) or set train.grad_clip (now {cfg.grad_clip:g})")
        state["sequences"] += len(spans)
        train_seconds = time.perf_counter() - epoch_start
        with validation_memory(model, cfg, device):
            valid = validate(scored, valid_inputs)
        valid_seconds = time.perf_counter() - epoch_start - train_seconds
        now = time.perf_counter() - started + time_offset
        cpu_now = time.process_time() - cpu_started + cpu_offset  # this rank's
        valid, now = world.from_rank0((valid, now))  # every rank decides (improved, stop) from rank 0's
        score = valid[SELECTION_METRIC]
        improved = improves(score, state["best"])
        row = {"epoch": epoch, "loss": epoch_loss, VALID_COLUMN: score,
               "valid_hr@10": valid["hr@10"], "seconds": round(now, 3), "lr": current_rate(optimizer)}
        curve_rows.append(row)
        # train_s + valid_s against the curve's `seconds` steps: what an epoch spends saving and logging.
        log.info("epoch=%d model=%s loss=%.4f valid_ndcg@10=%.4f valid_hr@10=%.4f best=%s train_s=%.3g "
                 "valid_s=%.3g seq_per_s=%.0f", epoch, model_name, row["loss"], score, valid["hr@10"],
                 "yes" if improved else "no", train_seconds, valid_seconds, len(spans) / max(train_seconds, 1e-9))
        if improved:
            state.update(best=score, best_epoch=epoch, best_valid=valid, bad_epochs=0, seconds_to_best=now,
                         cpu_seconds_to_best=cpu_now, since_decay=0)
            checkpoint(epoch, valid)
        else:
            state["bad_epochs"] += 1
            state["since_decay"] += 1
            if cfg.lr_decay < 1.0 and state["since_decay"] >= cfg.lr_decay_patience:
                # state["lr"] (kept by the resume state) is the rate after decay, before the warm-up and
                # lr_schedule factors; the next epoch's start sets the optimiser's rate from it.
                state["lr"] *= cfg.lr_decay
                state["since_decay"] = 0
                log.info("epoch=%d model=%s lr decayed to %.3g", epoch, model_name, state["lr"])
        state.update(epoch=epoch, seconds=now, cpu_seconds=cpu_now, curve=curve_rows)
        _write_curve(curve_path, curve_rows)
        if world.is_main:
            resume.save(model, optimizer, generator, state, average, best=out_dir)
        # An epoch ends on every rank once rank 0's state is on disk: a rank that stops here (a caller's
        # on_epoch) and trains again must not read the state before it is written (ranks that resumed from
        # different epochs would wait on each other's collectives forever). One barrier an epoch; none alone.
        world.barrier()
        fault_point("after_epoch_saved")
        if on_epoch is not None:
            on_epoch(epoch, row)
        if stops(state["bad_epochs"], epoch, patience, floor):
            stopped_by = "early_stopping"
            break
    seconds = time.perf_counter() - started + time_offset
    cpu_seconds = time.process_time() - cpu_started + cpu_offset
    if world.is_main and keep_final_state and "stopped_by" not in state:
        resume.save(model, optimizer, generator,
                    {**state, "stopped_by": stopped_by, "seconds": seconds, "cpu_seconds": cpu_seconds},
                    average, best=out_dir)
    elif world.is_main and not keep_final_state:
        resume.clear()
    return TrainResult(
        model=model_name, best_epoch=state["best_epoch"], best_valid=state["best_valid"], epochs_run=state["epoch"],
        seconds=seconds, seconds_to_best=state["seconds_to_best"],
        sequences_per_second=state["sequences"] / max(seconds, 1e-9), checkpoint=out_dir, stopped_by=stopped_by,
        cpu_seconds=cpu_seconds, cpu_seconds_to_best=state["cpu_seconds_to_best"],
    )


def make_optimizer(model, cfg: TrainConfig, device: torch.device) -> torch.optim.Adam:
    """The trainer's Adam: fused on CUDA, and capturable there under `train.cuda_graph` (a captured step)."""
    cuda = device.type == "cuda"
    return torch.optim.Adam(model.parameters(), lr=cfg.effective_lr, betas=(0.9, 0.98),
                            weight_decay=cfg.weight_decay, fused=cuda, capturable=cfg.cuda_graph and cuda)


def fixed_shape_step(model, model_name: str, model_config, cfg: TrainConfig, optimizer,
                     tensors: TrainingTensors, device: torch.device,
                     distributed: bool = False, autocast: torch.dtype | None = None) -> FixedShapeStep | None:
    """`train.cuda_graph`'s step for this run (recsys/step_graph.py), or None when the setting is off. Refused,
    before any training, where it cannot run: a model whose loss has a data-dependent shape, a data-parallel
    run, micro-batches."""
    if not cfg.cuda_graph:
        return None
    message = cuda_graph_refusal(model_name, model_config, cfg)
    if message is None and distributed:
        message = cuda_graph_message(model_name, "a data-parallel run (torchrun) all-reduces gradients outside "
                                                 "a graph")
    if message is not None:
        raise ConfigError(message)
    return FixedShapeStep(model, optimizer, tensors, cfg.batch_size, grad_clip=cfg.grad_clip, device=device,
                          autocast=autocast)


def within_budget(cfg: TrainConfig, seconds: float) -> bool:
    """Whether a run that has trained `seconds` may start another epoch under `train.max_minutes` (0: no
    limit)."""
    return not cfg.max_minutes or seconds <= cfg.max_minutes * 60


def _write_curve(path: str | Path | None, rows: list[dict]) -> None:
    if path is None or not rows:
        return
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue(), Path(path).parent)  # a kill leaves the last epoch's curve whole


def main(argv: list[str] | None = None) -> None:
    name, params, root = model_stage_args("recsys.train", "train stage: prepared dataset → best checkpoint",
                                          argv)
    paths = Layout(root)
    result = train_model(
        name, params.model_config(name), params.train_config(name), paths.prepared, paths.model_dir(name),
        curve_path=paths.curve(name), resume_root=paths.resume, warm_dir=paths.warm_dir(name),
        mask_seen=params.evaluate.mask_seen,
    )
    log.info("trained model=%s best_epoch=%d valid_ndcg@10=%.4f seconds=%.1f stopped_by=%s", name,
             result.best_epoch, result.best_valid.get(SELECTION_METRIC, float("nan")), result.seconds,
             result.stopped_by)


if __name__ == "__main__":
    from recsys.distributed import torchrun_session
    from recsys.entry import run_entry

    # `torchrun --nproc_per_node N -m recsys.train ...` trains data-parallel (a no-op without torchrun).
    run_entry(torchrun_session()(main))
