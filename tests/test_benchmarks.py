"""The benchmark's names for runs stay true to params.yaml (the RESULTS tables are read through them)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import curves  # noqa: E402
from bench_models import configs_for, cpu_name  # noqa: E402

from recsys.config import ConfigError, load_params  # noqa: E402
from recsys.sequences import SequenceData  # noqa: E402


def test_the_default_sasrec_run_is_what_params_yaml_trains():
    params = load_params(ROOT / "params.yaml")
    assert configs_for(curves.SASREC_DEFAULT_RUN, params) == configs_for("sasrec", params)


def test_the_default_mojito_run_is_what_params_yaml_trains():
    params = load_params(ROOT / "params.yaml")
    assert configs_for(curves.MOJITO_DEFAULT_RUN, params) == configs_for("mojito", params)
    # the sessions 10-28 defaults, whose rows (MOJITO_LONG) hold lr 1e-3: a new run at them spells it out
    old = configs_for(f"{curves.MOJITO_LONG},lr=0.001", params)
    assert old[2].lr == 0.001 and old != configs_for("mojito", params)


def test_the_readmes_mojito_gpu_recipe_is_the_run_that_met_the_gpu_aims(tmp_path):
    """README's MOJITO GPU setting, applied to params.yaml as written there, trains exactly the run whose rows
    met the GPU aims (curves.MOJITO_WIDE_GRAPHED, RESULTS.md session 28)."""
    import yaml

    recipe = "mojito: {dim: 128, train: {cuda_graph: true}}"
    assert f"`{recipe}`" in (ROOT / "README.md").read_text()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for key, value in yaml.safe_load(recipe)["mojito"].items():
        params["mojito"][key] = {**params["mojito"][key], **value} if isinstance(value, dict) else value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert configs_for("mojito", load_params(tmp_path / "params.yaml")) == configs_for(
        curves.MOJITO_WIDE_GRAPHED, load_params(ROOT / "params.yaml"))


def test_bert4recs_best_measured_run_is_what_params_yaml_trains():
    """params.yaml's BERT4Rec is the measured run (curves.BERT4REC_AD0_E400, early stopping off over its budget)
    but for early stopping's settings, which on every stored row of that run stop after its best epoch — the
    trainer's rule replayed on the row's curve — so params.yaml trains the same best checkpoint; a run that
    stops improving early stops before the budget (small data, a warm start) instead of training all of it."""
    from recsys.train_state import STOPPING_FIELDS, early_stop_epoch

    params = load_params(ROOT / "params.yaml")
    name, model, train = configs_for(curves.BERT4REC_DEFAULT_RUN, params)
    got_name, got_model, got_train = configs_for("bert4rec", params)
    assert (name, model) == (got_name, got_model)
    ours = {f: getattr(got_train, f) for f in STOPPING_FIELDS}
    assert dataclasses.replace(train, **ours) == got_train and train.lr_schedule == "constant"
    flat = [{"epoch": e, "v": 0.5} for e in range(1, train.epochs + 1)]  # never improves after epoch 1
    assert early_stop_epoch(flat, train.patience, train.min_epochs, "v") is None  # the measured run: no stop
    rows = [row for path in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
            for row in json.loads(path.read_text()) if isinstance(row, dict)
            and row.get("run") == curves.BERT4REC_DEFAULT_RUN]
    assert {row["dataset"] for row in rows} == {"ml-100k", "ml-1m-half"} and len(rows) >= 6
    for row in rows:
        assert len(row["curve"]) == train.epochs  # the whole budget was validated
        stop = early_stop_epoch(row["curve"], got_train.patience, got_train.min_epochs, "valid_ndcg@10")
        kept = row["curve"][:stop or train.epochs]
        best = max(kept, key=lambda epoch: epoch["valid_ndcg@10"])  # the first of equal scores, as the trainer
        assert best["epoch"] == row["best_epoch"], (row["dataset"], row["seed"], stop)
    assert early_stop_epoch(flat, got_train.patience, got_train.min_epochs, "v") < train.epochs
    assert early_stop_epoch(flat, got_train.warm_patience, got_train.warm_min_epochs, "v") < train.epochs


def test_every_ablation_row_names_a_run_that_parses_and_a_base_in_the_table():
    params = load_params(ROOT / "params.yaml")
    runs = {run for run, _, _ in curves.ABLATION}
    for run, base, change in curves.ABLATION:
        configs_for(run, params)  # raises ConfigError on an unknown key
        assert base is None or base in runs, base
        assert change


def _row(run: str, seed: int, ndcg: float, wall: float, cpu: float | None) -> dict:
    row = {"run": run, "seed": seed, "test_ndcg@10": ndcg, "seconds_to_best": wall, "stopped_by": "early_stopping"}
    return row if cpu is None else {**row, "cpu_seconds_to_best": cpu}


def test_claims_compare_cpu_seconds_when_both_runs_recorded_them_else_wall_seconds():
    base = curves.SASREC_DEFAULT_RUN
    rows = {"mojito": [_row("mojito", 42, 0.11, 900.0, 200.0)], base: [_row(base, 42, 0.10, 300.0, 100.0)]}
    line = curves.compare("ml-100k", "mojito", base, 1.00, 3.0, rows)
    assert "| 200 / 100 CPU s | 2.0 × |" in line and line.endswith("| met |")  # wall alone would say 3.0 ×
    rows["mojito"] = [_row("mojito", 42, 0.11, 900.0, None)]  # a row from before session 7
    line = curves.compare("ml-100k", "mojito", base, 1.00, 3.0, rows)
    assert "| 900 / 300 s | 3.0 × |" in line


def test_a_time_ratio_across_machines_says_so():
    """CPU seconds on an AMD EPYC and on an Intel Xeon (or wall seconds on an H200 and an H100) are not the
    same clock: a ratio of the two names both machines, and the time aim is not judged on it."""
    base = curves.SASREC_DEFAULT_RUN
    amd = "AMD EPYC, 2 cores, 1 torch threads (torch 2.13.0+cpu)"
    intel = "Intel(R) Xeon(R) Processor, 2 cores, 1 torch threads (torch 2.13.0+cpu)"
    rows = {"mojito": [{**_row("mojito", 42, 0.11, 900.0, 200.0), "machine": intel}],
            base: [{**_row(base, 42, 0.10, 300.0, 100.0), "machine": amd}]}
    line = curves.compare("ml-100k", "mojito", base, 1.00, 3.0, rows)
    assert "| 200 / 100 CPU s (on different machines: AMD EPYC / Intel(R) Xeon(R) Processor) | 2.0 × |" in line
    assert line.endswith("| NDCG met; time across machines, not judged |"), line
    rows["mojito"][0]["test_ndcg@10"] = 0.09  # below the quality aim: not met, whatever the clocks
    assert curves.compare("ml-100k", "mojito", base, 1.00, 3.0, rows).endswith("| not met |")
    rows["mojito"][0]["test_ndcg@10"] = 0.11
    rows[base][0]["machine"] = intel.replace("1 torch threads", "2 torch threads")  # the same CPU
    line = curves.compare("ml-100k", "mojito", base, 1.00, 3.0, rows)
    assert "| 200 / 100 CPU s | 2.0 × |" in line and line.endswith("| met |"), line


@pytest.mark.parametrize("flags, name", [
    ("flags\t\t: fpu sse2 avx avx2 fma", "AMD EPYC (AVX2)"),
    ("flags\t\t: fpu sse2 avx avx2 avx512f avx512bw", "AMD EPYC (AVX-512)"),
    ("flags\t\t: fpu sse2", "AMD EPYC"),  # no vector unit it names
])
def test_a_rows_cpu_names_its_vector_unit_so_two_cpus_of_one_name_are_told_apart(tmp_path, flags, name):
    """Two VMs' "AMD EPYC" trained BERT4Rec 2.3 x apart an epoch (AVX2 only against AVX-512): the unit is part
    of the processor, so a ratio between such rows, or with a row from before the unit was recorded, says so."""
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\n{flags}\n\nprocessor\t: 1\n")
    assert cpu_name(str(info)) == name
    base = curves.SASREC_DEFAULT_RUN
    old = "AMD EPYC, 2 cores, 1 torch threads (torch 2.13.0+cpu)"
    rows = {"bert4rec": [{**_row("bert4rec", 42, 0.10, 900.0, 300.0), "machine": f"{cpu_name(str(info))}, 2 cores"}],
            base: [{**_row(base, 42, 0.11, 300.0, 100.0), "machine": old}]}
    line = curves.compare("ml-100k", "bert4rec", base, 0.90, 3.0, rows)
    assert ("(on different machines" in line) is (name != "AMD EPYC")


def test_a_time_ratio_across_the_cpu_dropout_change_says_so():
    """Session 33's CPU dropout made a CPU epoch 11-18 % cheaper: a ratio of a row trained with it (its
    `dropout_masks`) and one from before (no key: torch's) names both; rows alike in it say nothing."""
    base = curves.SASREC_DEFAULT_RUN
    rows = {"bert4rec": [{**_row("bert4rec", 42, 0.10, 900.0, 200.0), "dropout_masks": "16-bit lanes"}],
            base: [_row(base, 42, 0.11, 300.0, 100.0)]}
    line = curves.compare("ml-100k", "bert4rec", base, 0.90, 3.0, rows)
    assert "| 200 / 100 CPU s (dropout masks: 16-bit lanes / torch) | 2.0 × |" in line
    rows[base][0]["dropout_masks"] = "16-bit lanes"
    assert "| 200 / 100 CPU s | 2.0 × |" in curves.compare("ml-100k", "bert4rec", base, 0.90, 3.0, rows)


def test_the_same_machine_table_puts_a_claims_two_sides_on_one_machine():
    """results/same-machine.json holds base rows re-trained on the model's machine: the same-machine table
    shows a claim again with them in place of the rows of their (dataset, run, seed), and only a claim whose
    ratio paired two machines and now does not."""
    base, mojito, bert = curves.SASREC_DEFAULT_RUN, curves.MOJITO_DEFAULT_RUN, curves.BERT4REC_DEFAULT_RUN
    amd = "AMD EPYC, 2 cores, 1 torch threads (torch 2.13.0+cpu)"
    intel = "Intel(R) Xeon(R) Processor, 2 cores, 1 torch threads (torch 2.13.0+cpu)"
    rows = [{**_row(mojito, s, 0.12, 600.0, 500.0), "dataset": "ml-100k", "machine": intel} for s in (42, 43)]
    rows += [{**_row(base, s, 0.11, 300.0, 100.0), "dataset": "ml-100k", "machine": amd} for s in (42, 43)]
    rows += [{**_row(bert, 42, 0.10, 300.0, 300.0), "dataset": "ml-100k", "machine": amd}]  # on one machine
    same = [{**_row(base, 42, 0.10, 300.0, 250.0), "dataset": "ml-100k", "machine": intel}]
    assert curves.same_machine_table(rows, same).splitlines()[2:] == []  # seed 43's base is still the AMD row
    same.append({**_row(base, 43, 0.10, 300.0, 250.0), "dataset": "ml-100k", "machine": intel})
    lines = curves.same_machine_table(rows, same).splitlines()[2:]
    assert len(lines) == 1
    assert lines[0].startswith(f"| ml-100k | {mojito} vs {base} | 2 | 0.1200 ± 0.0000 / 0.1000")
    assert "| 500 ± 0 / 250 ± 0 CPU s | 2.0 × |" in lines[0]  # 5.0 × in the aims table, across machines


def test_the_same_code_table_compares_a_claims_sides_retrained_at_one_commit():
    """results/same-code.json holds both sides of a claim re-trained at one commit: a claim shows once both
    sides have a shared seed there, compared on those rows alone, naming the commit."""
    base, bert = curves.SASREC_DEFAULT_RUN, curves.BERT4REC_P80
    same = [{**_row(bert, 42, 0.18, 900.0, 600.0), "dataset": "ml-1m-half", "commit": "2a9df9e"}]
    assert curves.same_code_table(same).splitlines()[2:] == []  # one side only
    same.append({**_row(base, 42, 0.19, 300.0, 250.0), "dataset": "ml-1m-half", "commit": "2a9df9e"})
    lines = curves.same_code_table(same).splitlines()[2:]
    assert len(lines) == 1
    assert lines[0].startswith(f"| ml-1m-half | {bert} vs {base} (at 2a9df9e; on unknown) | 1 | 0.1800 / 0.1900 |")
    assert "| 600 / 250 CPU s | 2.4 × | ≥ 0.90 × NDCG, ≤ 3 × time | met |" in lines[0]
    # both sides again on another box (results/same-code-<box>.json, keys shared with same-code.json's):
    # compared among themselves, on a line of their own that names that box
    box = [{**r, "machine": "Intel(R) Xeon(R) Processor, 2 cores", "commit": "e38df61",
            "cpu_seconds_to_best": r["cpu_seconds_to_best"] * 2} for r in same]
    lines = curves.same_code_table(same, box).splitlines()[2:]
    assert len(lines) == 2 and lines[0].startswith(f"| ml-1m-half | {bert} vs {base} (at 2a9df9e; on unknown) |")
    assert lines[1].startswith(f"| ml-1m-half | {bert} vs {base} (at e38df61; on Intel(R) Xeon(R) Processor) |")
    assert "| 1200 / 500 CPU s | 2.4 × |" in lines[1]


def _gpu_row(run: str, seed: int, ndcg: float, wall: float, cpu: float, batch: int, minutes: float) -> dict:
    return {**_row(run, seed, ndcg, wall, cpu), "dataset": "ml-1m-half",
            "model": run.split("@")[0].split(":")[0],
            "train": {"batch_size": batch, "max_minutes": minutes}, "machine": "GPU", "test_hr@10": 0.3,
            "best_epoch": 9, "epochs_run": 9, "seconds_total": wall, "eval_seconds_all_users": 0.01,
            "stopped_by": "time_limit" if minutes else "early_stopping"}


def test_gpu_tables_judge_the_budget_scoring_and_time_ratio_targets_on_wall_seconds():
    """Issue 11's GPU targets from measured rows: the 10-s budget's best batch size against the quality
    target (the gap said), each model's all-users scoring against 0.05 s, the claims on wall time (a GPU
    process's CPU seconds are the host's, not the device's)."""
    base, mojito = curves.SASREC_DEFAULT_RUN, curves.MOJITO_LONG
    rows = [_gpu_row(base, 42, 0.188, 70.0, 70.0, 128, 0.0),
            _gpu_row(mojito, 42, 0.20, 140.0, 400.0, 128, 0.0),
            _gpu_row(f"{base},batch_size=512", 42, 0.13, 10.0, 10.0, 512, 0.1667),
            _gpu_row(f"{base},batch_size=2048", 42, 0.10, 10.0, 10.0, 2048, 0.1667)]
    steps = [{"dataset": "ml-1m-half", "model": "sasrec", "commit": "c", "device": "cuda",
              "validation_seconds": 0.014, "train_sequences_per_second": 1e4},
             {"dataset": "ml-1m-half", "model": "mojito", "commit": "c", "device": "cuda",
              "validation_seconds": 0.07, "train_sequences_per_second": 3e3},
             {"dataset": "ml-1m-half", "model": "sasrec", "commit": "c", "validation_seconds": 1.4,
              "train_sequences_per_second": 300}]  # a CPU row: not a GPU target's
    text = curves.gpu_tables(rows, steps)
    assert ("batch 512: 0.1300 (1 seed); batch 2048: 0.1000 (1 seed) "
            "| **not met**: 0.058 short (best: batch 512) |") in text
    scoring = [line for line in text.splitlines() if "all-users scoring" in line]
    assert len(scoring) == 2  # the CPU step row is not judged
    assert scoring[1].startswith("| ml-1m-half sasrec: all-users scoring ≤ 0.05 s (c) | 0.014 s")
    assert scoring[1].endswith("| met |")
    assert scoring[0].startswith("| ml-1m-half mojito: all-users scoring ≤ 0.05 s (c) | 0.070 s")
    assert scoring[0].endswith("| **not met** (1.4 × the aim) |")
    claim = next(line for line in text.splitlines() if line.startswith(f"| ml-1m-half | {mojito} vs"))
    assert "| 140 / 70 s | 2.0 × |" in claim and claim.endswith("| met |")  # CPU seconds would say 5.7 ×
    cut = {**_gpu_row(mojito, 43, 0.10, 60.0, 60.0, 128, 1.0), "stopped_by": "time_limit"}
    cut_base = _gpu_row(base, 43, 0.19, 70.0, 70.0, 128, 0.0)
    again = curves.gpu_tables([*rows, cut, cut_base], steps)
    claim = next(line for line in again.splitlines() if line.startswith(f"| ml-1m-half | {mojito} vs"))
    assert "| 1 | 0.2000 / 0.1880 |" in claim  # seed 43's clock-stopped MOJITO is not in the claim
    assert f"| `{mojito}` | 43 |" in again  # but it is in the rows table


def test_rows_trained_on_a_shared_gpu_count_for_quality_but_not_for_time():
    """bench_models.py --shared-device N: several claim seeds trained at once on one GPU measure NDCG; their
    wall times (N processes time-sliced on one device) never enter a time ratio."""
    base, mojito = curves.SASREC_DEFAULT_RUN, curves.MOJITO_LONG
    alone = [_gpu_row(base, 42, 0.19, 40.0, 40.0, 128, 0.0), _gpu_row(mojito, 42, 0.20, 100.0, 100.0, 128, 0.0)]
    shared = [{**_gpu_row(mojito, s, 0.21, 900.0, 900.0, 128, 0.0), "shared_device": 3} for s in (43, 44)]
    shared_base = [_gpu_row(base, s, 0.19, 40.0, 40.0, 128, 0.0) for s in (43, 44)]
    text = curves.gpu_tables([*alone, *shared, *shared_base], [])
    claim = next(line for line in text.splitlines() if line.startswith(f"| ml-1m-half | {mojito} vs"))
    assert "| 3 | 0.2067 ± 0.0058 / 0.1900 ± 0.0000 |" in claim  # quality over all three seeds
    assert "| 100 / 40 s (seeds 42; the others shared the device) | 2.5 × |" in claim  # time over seed 42 only
    assert claim.endswith("| met |")
    assert f"| `{mojito}` | 43 | GPU, 3 processes at once |" in text
    only_shared = curves.gpu_tables([*shared, *shared_base], [])
    claim = next(line for line in only_shared.splitlines() if line.startswith(f"| ml-1m-half | {mojito} vs"))
    assert claim.endswith("| — (every seed shared the device) | — | ≥ 1.00 × NDCG, ≤ 3 × time "
                          "| NDCG met; time not measured alone |")


def test_a_gpu_step_row_with_the_loss_at_every_position_says_so():
    """bench_step.py --all-positions rows sit beside the same commit's rows at the plan's bound: the scoring
    lines tell them apart."""
    step = {"dataset": "ml-1m-half", "model": "sasrec", "commit": "c", "device": "cuda", "batch_size": 128,
            "fixed_shape": True, "cuda_graph": True, "loss_rows": 19200, "validation_seconds": 0.016,
            "train_sequences_per_second": 28532.0}
    text = curves.gpu_tables([], [step, {**step, "loss_rows": "all", "train_sequences_per_second": 25296.0}])
    lines = [line for line in text.splitlines() if "all-users scoring" in line]
    assert len(lines) == 2
    assert sum("loss at every position" in line for line in lines) == 1
    assert "loss at every position" in next(line for line in lines if "25296 sequences/s" in line)


def test_shared_device_is_a_whole_number_of_processes():
    from bench_models import positive_int

    assert positive_int("3") == 3
    for bad in ("0", "-1", "2.0", "two", "", "²", "٢", " 2"):
        with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
            positive_int(bad)


def test_gpu_budget_rows_with_a_cuda_graph_are_a_setting_of_their_own():
    """A graphed budget run (train.cuda_graph) at batch 512 is not averaged with the eager one at 512; a graph
    that reaches the target turns the verdict; a graphed step row says so beside its scoring time."""
    base = curves.SASREC_DEFAULT_RUN
    eager = _gpu_row(f"{base},batch_size=512", 42, 0.13, 10.0, 10.0, 512, 0.1667)
    graphed = _gpu_row(f"{base},batch_size=512,cuda_graph=true", 42, 0.19, 10.0, 10.0, 512, 0.1667)
    graphed["train"]["cuda_graph"] = True
    step = {"dataset": "ml-1m-half", "model": "sasrec", "commit": "c", "device": "cuda", "batch_size": 128,
            "loss_chunk_elements": 1 << 26, "fixed_shape": True, "cuda_graph": True,
            "validation_seconds": 0.014, "train_sequences_per_second": 9e4}
    text = curves.gpu_tables([eager, graphed], [step])
    assert ("batch 512: 0.1300 (1 seed); batch 512, cuda_graph: 0.1900 (1 seed) | **not met yet**: batch 512, "
            "cuda_graph reaches it on 1 of the 3 seeds a target needs |") in text  # a mean of three seeds
    more = [{**graphed, "seed": s, "test_ndcg@10": v} for s, v in ((43, 0.189), (44, 0.186))]
    text = curves.gpu_tables([eager, graphed, *more], [step])
    assert "batch 512, cuda_graph: 0.1883 ± 0.0021 | met (batch 512, cuda_graph, 3 seeds) |" in text
    wide = {**graphed, "run": f"{graphed['run']},dim=128", "config": {"dim": 128}}  # the width tells runs apart
    assert "batch 512, cuda_graph, dim 128: 0.1900 (1 seed)" in curves.gpu_tables([graphed, wide], [step])
    # Another rate or an lr_schedule at the same batch is a run of its own, named by what differs.
    fast = _gpu_row(f"{base},batch_size=512,lr=0.003,lr_schedule=cosine,epochs=40", 42, 0.15, 10.0, 10.0, 512,
                    0.1667)
    fast["train"].update(lr=0.003, lr_schedule="cosine", epochs=40)
    text = curves.gpu_tables([eager, fast], [step])
    assert ("batch 512: 0.1300 (1 seed); batch 512, lr 0.003, cosine over 40 epochs: 0.1500 (1 seed) "
            "| **not met**: 0.038 short (best: batch 512, lr 0.003, cosine over 40 epochs) |") in text
    assert "(c, batch 128, loss chunk 64M, CUDA graph) | 0.014 s" in text
    assert "step profiled" not in text  # no profile measured, no table
    step["profile"] = {"clock": "device", "ms_per_step": 4.5, "steps": 5,
                       "top": [{"op": "aten::mm", "share": 0.41}, {"op": "aten::exp_", "share": 0.12}]}
    text = curves.gpu_tables([eager], [{**step, "run": "sasrec@dim=128"}])
    assert "| ml-1m-half sasrec@dim=128 (c, batch 128, fixed shape) | 4.50 ms | mm 41%, exp_ 12% |" in text
    assert "| ml-1m-half sasrec@dim=128: all-users scoring" in text


def test_a_gpu_step_row_does_not_replace_the_same_commits_cpu_row():
    import bench_step

    cpu = {"dataset": "ml-1m-half", "model": "sasrec", "commit": "c"}  # rows from before the device field
    assert bench_step.step_key(cpu) != bench_step.step_key({**cpu, "device": "cuda"})
    assert bench_step.step_key(cpu) == bench_step.step_key({**cpu, "device": "cpu"})


def test_bench_step_sweeps_batch_size_and_loss_chunk_into_rows_of_their_own(tmp_path, monkeypatch,
                                                                             tiny_prepared):
    """The GPU lease's first measurement (gpu_session.sh quick): one row per (batch size, loss chunk), so a
    sweep keeps every point; the chunk setting is the loss's own, and what it was is recorded."""
    import bench_step

    from recsys.models import losses

    monkeypatch.setattr(bench_step, "prepare_dataset", lambda dataset, root, params: tiny_prepared)
    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", losses._CHUNK_ELEMENTS)  # restored after the test
    results = tmp_path / "step.json"

    def bench(*extra: str) -> None:
        monkeypatch.setattr(sys, "argv", ["bench_step.py", "--dataset", "ml-100k", "--models", "sasrec",
                                          "--batches", "2", "--device", "cpu", "--results", str(results), *extra])
        bench_step.main()

    bench("--batch-size", "4", "--loss-chunk-elements", "640")
    assert losses._CHUNK_ELEMENTS == 640
    bench("--batch-size", "8", "--loss-chunk-elements", "640")
    rows = json.loads(results.read_text())
    assert [(r["batch_size"], r["loss_chunk_elements"], r["device"]) for r in rows] == [(4, 640, "cpu"),
                                                                                      (8, 640, "cpu")]
    assert all(r["train_sequences_per_second"] > 0 and r["validation_seconds"] > 0 for r in rows)
    bench("--batch-size", "8", "--loss-chunk-elements", "640", "--cuda-graph")  # the fixed-shape step's own row
    rows = json.loads(results.read_text())
    assert [(r["batch_size"], r["fixed_shape"]) for r in rows] == [(4, False), (8, False), (8, True)]
    assert rows[-1]["cuda_graph"] is False and rows[-1]["train_sequences_per_second"] > 0  # no graph on a CPU
    from recsys.sequences import SequenceData

    targets = len(SequenceData.from_prepared(tiny_prepared).eval_targets("valid"))
    assert rows[-1]["scoring_batch_size"] == min(512, targets)  # params.yaml's eval_batch_size 0: 512 on a CPU
    monkeypatch.setattr(sys, "argv", ["bench_step.py", "--dataset", "ml-100k", "--loss-chunk-elements", "-1"])
    with pytest.raises(SystemExit):
        bench_step.main()


def test_bench_step_takes_run_strings_and_profiles_where_a_step_goes(tmp_path, monkeypatch, tiny_prepared,
                                                                     capsys):
    """A run string's settings reach the model (its row keyed by the run, beside the plain model's), and
    `--profile` says which operators a step's time goes to: shares of the profiled total, largest first."""
    import bench_step

    monkeypatch.setattr(bench_step, "prepare_dataset", lambda dataset, root, params: tiny_prepared)
    results = tmp_path / "step.json"
    monkeypatch.setattr(sys, "argv", ["bench_step.py", "--dataset", "ml-100k", "--models", "sasrec",
                                      "sasrec@dim=32,n_heads=2", "--batches", "2", "--device", "cpu",
                                      "--batch-size", "8", "--cuda-graph", "--profile", "2",
                                      "--results", str(results)])
    bench_step.main()
    plain, wide = json.loads(results.read_text())
    assert "run" not in plain and wide["run"] == "sasrec@dim=32,n_heads=2" and wide["model"] == "sasrec"
    assert bench_step.step_key(plain) != bench_step.step_key(wide)
    params = load_params(ROOT / "params.yaml")
    setup = bench_step.step_setup("sasrec@dim=32", SequenceData.from_prepared(tiny_prepared), params, 1,
                                  torch.device("cpu"))
    assert setup[1].item_emb.weight.shape[1] == 32 != params.model_config("sasrec").dim
    prof = wide["profile"]
    assert prof["clock"] == "cpu" and prof["steps"] == 2 and prof["ms_per_step"] > 0
    times = [op["ms_per_step"] for op in prof["top"]]
    assert times == sorted(times, reverse=True) and 0 < sum(op["share"] for op in prof["top"]) <= 1.0 + 1e-6
    assert any(op["op"] in ("aten::mm", "aten::addmm", "aten::bmm") for op in prof["top"])  # the products
    assert "profile sasrec@dim=32,n_heads=2:" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["bench_step.py", "--dataset", "ml-100k", "--models", "sasrec@wdith=3"])
    with pytest.raises(ConfigError, match="'wdith' is neither"):  # a misspelt setting, before anything runs
        bench_step.main()


def test_batching_cost_times_a_whole_epoch_of_the_trainers_step_and_counts_its_padding(tiny_prepared):
    """benchmarks/batching_cost.py: one epoch of each batching on the trainer's own set-up; length-sorted
    micro-batches pad fewer positions than whole uniform batches, and no step pads a negative share."""
    import batching_cost

    from recsys.sequences import SequenceData

    params, data = load_params(ROOT / "params.yaml"), SequenceData.from_prepared(tiny_prepared)
    whole = batching_cost.epoch_cpu_seconds(data, params, "random", 1)
    split = batching_cost.epoch_cpu_seconds(data, params, "random", 8)
    assert whole[0] > 0 and split[0] > 0
    assert 0 <= split[1] < whole[1] < 1


def test_step_ops_counts_the_loss_chunk_loops_operators(monkeypatch, tiny_prepared):
    """benchmarks/step_ops.py: a smaller loss chunk means more chunks, each a few more operators; the
    optimiser's operators are counted apart and do not change with it."""
    import step_ops

    from recsys.models import losses
    from recsys.sequences import SequenceData

    params, data = load_params(ROOT / "params.yaml"), SequenceData.from_prepared(tiny_prepared)
    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", None)
    whole = step_ops.count("sasrec", data, params, 8, steps=1)
    items = tiny_prepared.n_items
    monkeypatch.setattr(losses, "_CHUNK_ELEMENTS", items * 4)  # 4 rows a chunk
    chunked = step_ops.count("sasrec", data, params, 8, steps=1)
    assert whole["loss_chunk_elements"] == 1 << 22 and chunked["loss_chunk_elements"] == items * 4
    chunks = -(-chunked["target_positions_per_step"] // 4)
    assert chunks > 2
    extra = chunked["forward_backward_ops_per_step"] - whole["forward_backward_ops_per_step"]
    assert 10 * (chunks - 1) <= extra <= 100 * (chunks - 1)  # each further chunk: tens of operators
    assert chunked["optimizer_ops_per_step_cpu"] == whole["optimizer_ops_per_step_cpu"] > 0


def test_a_kept_work_dir_survives_the_run_and_a_temporary_one_does_not(tmp_path):
    from bench_models import work_area

    kept = tmp_path / "kept" / "work"
    with work_area(str(kept)) as work:
        (work / "state").write_text("epoch 3")
    assert (kept / "state").read_text() == "epoch 3"  # a rerun of the same command finds it and resumes
    with work_area("") as work:
        temporary = work
        assert temporary.is_dir()
    assert not temporary.exists()


def test_a_budget_run_that_trained_its_whole_schedule_counts_as_converged():
    """The claims mark a comparison "not converged" when a side might have gone on learning: a constant rate
    cut by train.epochs or the clock; a rate annealed to its end over train.epochs is a finished schedule."""
    row = {"stopped_by": "max_epochs", "train": {"lr_schedule": "cosine"}}
    assert curves.converged(row)
    assert curves.converged({**row, "train": {"lr_schedule": "linear"}})
    assert not curves.converged({**row, "train": {"lr_schedule": "constant"}})
    assert not curves.converged({**row, "train": {}})  # rows stored before the key trained a constant rate
    assert not curves.converged({"stopped_by": "time_limit", "train": {"lr_schedule": "cosine"}})
    assert curves.converged({"stopped_by": "early_stopping", "train": {}})


def test_a_long_run_string_gets_a_work_dir_name_a_file_system_takes(tmp_path):
    """A budget run on BERT4Rec's long string made a 258-byte temporary directory name (OSError 36, session 44):
    long names are cut and end in a hash of the whole string; short ones keep their names (kept work dirs)."""
    import tempfile

    from bench_models import run_dir_name, safe_name

    assert safe_name("sasrec:ce@patience=20") == "sasrec-ce-patience-20"
    long_run = curves.BERT4REC_B64_COS350
    other = long_run.replace("epochs=350", "epochs=351")
    name = run_dir_name(long_run, 42)
    assert len(safe_name(long_run)) == 200 and name != run_dir_name(other, 42)
    # The same string finds its resume state again in any process: the hash is the string's sha256, not
    # Python's salted hash() (a value pinned here, so a change of the naming is a decision, not an accident).
    pinned = "bert4rec@" + ",".join(f"k{i}=v{i}" for i in range(40))
    cut = "bert4rec-" + "-".join(f"k{i}-v{i}" for i in range(24)) + "-k2"  # the first 183 characters
    assert safe_name(pinned) == f"{cut}-3aaad96b53ea704f"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=tmp_path))  # what bench_models' save does
    (tmp / f"{name}.csv").write_text("epoch\n")  # (raised OSError 36 with the long name)


def test_a_finished_row_is_reused_only_for_the_same_dataset_and_settings(tmp_path):
    from bench_models import check_finished, run_configs

    params = load_params(ROOT / "params.yaml")
    run = "sasrec:ce@patience=3"
    _, model_config, train_config = run_configs(run, params, 0.0, "cpu", 1)
    row = json.loads(json.dumps({"dataset": "ml-100k", "config": dataclasses.asdict(model_config),
                                 "train": dataclasses.asdict(train_config)}))
    path = tmp_path / "finished" / "x.json"
    check_finished(row, path, run, "ml-100k", params, 0.0, "cpu", 1)  # the same: reused, no error
    with pytest.raises(SystemExit, match=r"train: .*patience=3 \(now 4\)"):
        check_finished(row, path, "sasrec:ce@patience=4", "ml-100k", params, 0.0, "cpu", 1)
    with pytest.raises(SystemExit, match=r"dataset: 'ml-100k' \(now 'ml-1m-half'\)"):
        check_finished(row, path, run, "ml-1m-half", params, 0.0, "cpu", 1)
    with pytest.raises(SystemExit, match=r"max_minutes=0.0 \(now 5.0\)"):
        check_finished(row, path, run, "ml-100k", params, 5.0, "cpu", 1)
    # A row stored before a train key existed reads it at the value that trained as before; any other value
    # of the key is another setting.
    older = {**row, "train": {k: v for k, v in row["train"].items() if k != "warm_patience"}}
    check_finished(older, path, run, "ml-100k", params, 0.0, "cpu", 1)
    with pytest.raises(SystemExit, match=r"warm_patience=0 \(now 5\)"):
        check_finished(older, path, f"{run},warm_patience=5", "ml-100k", params, 0.0, "cpu", 1)


def test_a_row_never_replaces_one_of_its_key_that_trained_other_settings(tmp_path):
    """A run string is read against params.yaml as it is: after SASRec's default width changed, the string of
    the old defaults trains the new ones. Its rows keep their configuration, and merge refuses to put a row
    of other settings under a stored row's key or beside its rows at other seeds (one sentence, the file
    untouched); a longer budget may."""
    from bench_models import configs_for, merge

    params = load_params(ROOT / "params.yaml")
    assert configs_for(curves.SASREC_D64, params)[1].dim == 128  # what the old string builds today
    path = tmp_path / "rows.json"
    old = {"dataset": "ml-100k", "run": curves.SASREC_D64, "seed": 42, "test_ndcg@10": 0.113,
           "config": {"dim": 64, "n_heads": 2}, "train": {"lr": 0.001, "max_minutes": 0.0, "seed": 42}}
    merge([old], path)
    before = path.read_text()
    again = {**old, "test_ndcg@10": 0.115, "config": {"dim": 128, "n_heads": 2},
             "train": {"lr": 0.002, "max_minutes": 0.0, "seed": 42}}
    with pytest.raises(SystemExit, match=r"already holds ml-100k `sasrec:ce@.*` seed 42 trained with other "
                                         r"settings — dim=64 \(now 128\), lr=0.001 \(now 0.002\)"):
        merge([again], path)
    assert path.read_text() == before
    longer = {**old, "test_ndcg@10": 0.114, "train": {**old["train"], "max_minutes": 90.0}}
    assert merge([longer], path)[0]["test_ndcg@10"] == 0.114  # the same settings under a larger budget
    # nor may it join the string's rows at other seeds: one run string, one setting (the seed aside)
    before = path.read_text()
    other_seed = {**again, "seed": 43, "train": {**again["train"], "seed": 43}}
    with pytest.raises(SystemExit, match=r"already holds ml-100k `sasrec:ce@.*` seed 42 trained with other "
                                         r"settings — dim=64 \(now 128\), lr=0.001 \(now 0.002\)"):
        merge([other_seed], path)
    assert path.read_text() == before
    same = {**old, "seed": 43, "test_ndcg@10": 0.117, "train": {**old["train"], "seed": 43}}
    assert [r["seed"] for r in merge([same], path)] == [42, 43]


def test_a_row_of_a_new_setting_cannot_join_rows_stored_before_the_key_existed(tmp_path):
    """Rows stored before `train.ema_warmup` existed record no such key: they are read at the value that
    trains as before (False), so a row of the same string with the warm-up is refused beside them, and one
    without it joins them."""
    from bench_models import merge

    path = tmp_path / "rows.json"
    run = curves.BERT4REC_EMA_GRAPHED
    old = {"dataset": "ml-1m-half", "run": run, "seed": 42, "test_ndcg@10": 0.1687, "config": {"dim": 64},
           "train": {"ema": 0.999, "max_minutes": 0.0, "seed": 42}}
    merge([old], path)
    before = path.read_text()
    warmed = {**old, "seed": 45, "train": {**old["train"], "seed": 45, "ema_warmup": True}}
    with pytest.raises(SystemExit, match=r"seed 42 trained with other settings — ema_warmup=False \(now True\)"):
        merge([warmed], path)
    assert path.read_text() == before
    plain = {**warmed, "train": {**warmed["train"], "ema_warmup": False}}
    assert [r["seed"] for r in merge([plain], path)] == [42, 45]


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_a_run_its_results_file_would_refuse_is_refused_before_it_trains(tmp_path):
    """The refusal above, hours sooner: bench_models checks every run and seed it is asked for against the
    rows of its --results file before it prepares the data, and stops with the same sentence."""
    from bench_models import as_json, check_mergeable, run_configs

    params = load_params(ROOT / "params.yaml")
    path = tmp_path / "rows.json"
    _, model_config, train_config = run_configs(curves.SASREC_D64, params, 0.0, "auto", 0)
    stored = {"dataset": "ml-100k", "run": curves.SASREC_D64, "seed": 42, "test_ndcg@10": 0.113,
              "config": {**as_json(model_config), "dim": 64},
              "train": {**as_json(train_config), "lr": 0.001}}
    path.write_text(json.dumps([stored]))
    refusal = (r"already holds ml-100k `sasrec:ce@.*` seed 42 trained with other settings — dim=64 \(now 128\), "
               r"lr=0.001 \(now 0.002\)")
    for offset in (0, 1):  # its own key, and its string at another seed
        with pytest.raises(SystemExit, match=refusal):
            check_mergeable([curves.SASREC_D64], [offset], "ml-100k", params, 0.0, "auto", path)
    # the old settings spelled out, another dataset, or a budget: nothing to refuse
    check_mergeable([f"{curves.SASREC_D64},dim=64,lr=0.001"], [0], "ml-100k", params, 0.0, "auto", path)
    check_mergeable([curves.SASREC_D64], [0], "ml-1m-half", params, 0.0, "auto", path)
    stored["config"]["dim"], stored["train"]["lr"] = 128, 0.002
    path.write_text(json.dumps([stored]))
    check_mergeable([curves.SASREC_D64], [0, 1], "ml-100k", params, 30.0, "cpu", path)
    stored["config"]["dim"] = 64
    path.write_text(json.dumps([stored]))
    before = path.read_text()
    # the command line stops before it reads any data (this data root does not exist) and writes nothing
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_models.py"), "--dataset", "ml-100k",
         "--data-root", str(tmp_path / "no-data"), "--results", str(path), "--runs", curves.SASREC_D64],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert got.returncode != 0
    assert got.stderr.startswith(f"error: {path} already holds ml-100k") and "dim=64 (now 128)" in got.stderr
    assert "Traceback" not in got.stderr and got.stderr.count("\n") == 1
    assert path.read_text() == before


@pytest.mark.parametrize("script", ["bench_models.py", "bench_step.py"])
def test_a_missing_dataset_is_one_sentence_not_a_traceback(tmp_path, script):
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--dataset", "ml-100k", "--data-root",
         str(tmp_path), *(["--results", str(tmp_path / "rows.json")] if script == "bench_models.py" else [])],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert got.returncode == 1
    assert got.stderr.strip().splitlines() == [
        (f"error: {tmp_path / 'ml-100k'} is not a folder: --data-root names the one that holds ml-100k/ "
         "(../shared/data/README.md describes the files)")]
    assert not (tmp_path / "rows.json").exists()


def test_targets_are_judged_on_the_current_defaults_cpu_and_gpu_rows_with_the_previous_ones_beside():
    def row(run: str, seed: int, ndcg: float, dataset: str = "ml-1m-half", minutes: float = 0.0) -> dict:
        return {"dataset": dataset, "run": run, "seed": seed, "test_ndcg@10": ndcg, "test_hr@10": 0.3,
                "stopped_by": "early_stopping", "train": {"max_minutes": minutes}}

    gpu = [row(curves.SASREC_DEFAULT_RUN, s, v) for s, v in ((42, 0.194), (43, 0.196), (44, 0.196))]
    gpu.append(row(curves.SASREC_DEFAULT_RUN, 45, 0.10, minutes=0.1667))  # a 10-s budget row: not a target's
    cpu = [row(curves.SASREC_D64, s, 0.188) for s in (42, 43, 44)]
    cpu.append(row(curves.SASREC_DEFAULT_RUN, 42, 0.19))
    lines = curves.targets_table(cpu, gpu).splitlines()
    mine = [line for line in lines if line.startswith("| ml-1m-half | defaults: ")]
    assert len(mine) == 2  # CPU (one seed) and GPU (three)
    assert "| CPU | 1 | 0.1900 |" in mine[0] and mine[0].endswith("| not met (1 of 3 seeds); 1.041 × peer |")
    assert "| GPU | 3 | 0.1953 ± 0.0012 |" in mine[1] and mine[1].endswith("| met; 1.070 × peer |")
    old = [line for line in lines if line.startswith("| ml-1m-half | defaults of sessions 6–20")]
    assert len(old) == 1 and "| CPU | 3 | 0.1880 ± 0.0000 |" in old[0]
    assert any(line.startswith("| ml-100k | defaults: ") and line.endswith("| not run |") for line in lines)
    # a claim seed (gpu_session.sh: early stopping under a cap of minutes) is a target's row; a 10-s budget's is not
    capped = [row(curves.SASREC_D64, s, 0.187, minutes=2.5) for s in (42, 43, 44)]
    gpu_old = [line for line in curves.targets_table([], capped).splitlines()
               if line.startswith("| ml-1m-half | defaults of sessions 6–20")]
    assert len(gpu_old) == 1 and "| GPU | 3 | 0.1870 ± 0.0000 |" in gpu_old[0]


def test_the_ablation_table_says_what_each_run_trained_not_what_its_string_builds_today():
    rows = [{"dataset": "ml-100k", "run": curves.SASREC_D64, "seed": s, "test_ndcg@10": 0.11, "test_hr@10": 0.2,
             "valid_ndcg@10": 0.12, "best_epoch": 100, "config": {"dim": 64}, "train": {"lr": 0.001}}
            for s in (42, 43)]
    rows += [{**rows[0], "run": curves.SASREC_DEFAULT_RUN, "test_ndcg@10": 0.12, "config": {"dim": 128},
              "train": {"lr": 0.002}}]
    table = curves.ablation_table(rows)
    line = next(x for x in table.splitlines() if x.startswith(f"| ml-100k | `{curves.SASREC_DEFAULT_RUN}` |"))
    assert "| 128, 0.002 | 42 | 0.1200 |" in line and line.endswith("| +0.0100 (seeds 42) |")
    base = next(x for x in table.splitlines() if x.startswith(f"| ml-100k | `{curves.SASREC_D64}` |"))
    assert "| 64, 0.001 | 42, 43 |" in base


def test_a_time_limited_row_trains_on_only_under_a_larger_budget():
    from bench_models import more_time

    limited = {"stopped_by": "time_limit", "train": {"max_minutes": 45.0}}
    assert more_time(limited, 60.0) and more_time(limited, 0.0)  # more time, or no limit
    assert not more_time(limited, 45.0) and not more_time(limited, 30.0)  # the same row again, or refused
    assert not more_time({"stopped_by": "early_stopping", "train": {"max_minutes": 45.0}}, 60.0)


def test_each_run_and_seed_keeps_its_trainer_state_apart(tmp_path):
    from bench_models import resume_root

    runs = ("mojito", "mojito@patience=20")
    roots = {resume_root(tmp_path, run, seed) for run in runs for seed in (42, 43)}
    assert len(roots) == 4 and all(root.parent == tmp_path / "resume" for root in roots)


def test_the_same_command_with_more_minutes_trains_time_limited_runs_on_and_reuses_the_rest(
        tiny_prepared, write_params, tmp_path, monkeypatch):
    """`bench_models.py --work-dir W` run again with a larger `--max-minutes`: the run the clock stopped goes
    on from its kept state; a run that ended before its limit (MostPop) is reused, neither refused nor
    retrained."""
    import bench_models

    monkeypatch.setattr(bench_models, "prepare_dataset", lambda dataset, root, params: tiny_prepared)
    params, work = write_params(), tmp_path / "work"
    results = tmp_path / "models.json"  # not the repository's models.json
    tables = (ROOT / "benchmarks" / "RESULTS.md").read_text()

    def bench(minutes: str) -> dict[str, dict]:
        monkeypatch.setattr(sys, "argv", ["bench_models.py", "--dataset", "ml-100k", "--params", str(params),
                                          "--device", "cpu", "--work-dir", str(work),
                                          "--results", str(results),
                                          "--max-minutes", minutes, "--runs", "mostpop", "sasrec"])
        results.unlink(missing_ok=True)
        bench_models.main()
        return {row["run"]: row for row in json.loads(results.read_text())}

    first = bench("1e-9")
    assert (first["sasrec"]["stopped_by"], first["sasrec"]["epochs_run"]) == ("time_limit", 1)
    assert first["sasrec"]["dropout_masks"] == "16-bit lanes"  # a CPU row says how it drew them (curves.py)
    kept = work / "resume" / f"sasrec-seed{first['sasrec']['seed']}"
    assert any(kept.iterdir())  # the clock stopped it: its state stays for a longer rerun
    second = bench("0")
    assert second["mostpop"] == first["mostpop"]
    assert (second["sasrec"]["stopped_by"], second["sasrec"]["epochs_run"]) == ("max_epochs", 3)
    assert [c["epoch"] for c in second["sasrec"]["curve"]] == [1.0, 2.0, 3.0]
    assert not any(kept.iterdir())  # finished: its state goes
    assert bench("0")["sasrec"] == second["sasrec"]  # and the same command again reuses it
    # rows merged into another file (a GPU session's) leave the tables built from models.json alone
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == tables


def test_a_run_with_a_larger_patience_trains_on_from_the_one_early_stopping_ended(
        tiny_prepared, write_params, tmp_path, monkeypatch, caplog):
    """`...,patience=3` after `...,patience=1` in the same work dir: the second starts from the first's kept
    final state (early stopping ended it at epoch 2) and trains epochs 3–4 only; its row says 4 epochs, as a
    straight patience-3 run would."""
    import bench_models

    import recsys.train

    monkeypatch.setattr(bench_models, "prepare_dataset", lambda dataset, root, params: tiny_prepared)
    # a flat validation curve: epoch 1 stays the best, so patience p stops at epoch p + 1
    flat = {"ndcg@10": 0.5, "hr@10": 0.5, "mrr": 0.5}
    monkeypatch.setattr(recsys.train, "validate", lambda model, inputs: flat)
    params, work, results = write_params(), tmp_path / "work", tmp_path / "models.json"

    def bench(run: str) -> dict:
        monkeypatch.setattr(sys, "argv", ["bench_models.py", "--dataset", "ml-100k", "--params", str(params),
                                          "--device", "cpu", "--work-dir", str(work), "--results",
                                          str(results), "--max-minutes", "0", "--runs", run])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="recsys.train"):
            bench_models.main()
        return next(row for row in json.loads(results.read_text()) if row["run"] == run)

    settings = "sasrec@epochs=10,min_epochs=0"
    short = bench(f"{settings},patience=1")
    assert (short["epochs_run"], short["stopped_by"]) == (2, "early_stopping")
    kept = work / "resume" / f"{bench_models.run_dir_name(f'{settings},patience=1', short['seed'])}"
    assert any(kept.iterdir())  # early stopping ended it: its state stays for a larger patience
    longer = bench(f"{settings},patience=3")
    trained = [r.getMessage().split()[0] for r in caplog.records if r.getMessage().startswith("epoch=")]
    assert trained == ["epoch=3", "epoch=4"], trained
    assert "starts from the kept final state in" in caplog.text
    assert (longer["epochs_run"], longer["stopped_by"], longer["best_epoch"]) == (4, "early_stopping", 1)
    # the best checkpoint (epoch 1, the shorter run's) came with the state, recording this run's settings
    checkpoint = work / bench_models.run_dir_name(f"{settings},patience=3", longer["seed"]) / "model.json"
    assert json.loads(checkpoint.read_text())["train_config"]["patience"] == 3
    assert longer["test_ndcg@10"] == short["test_ndcg@10"]
    assert [c["epoch"] for c in longer["curve"]] == [1.0, 2.0, 3.0, 4.0]
    assert any(kept.iterdir())  # a copy was taken: the shorter run's state is still there


def test_the_gpu_session_script_trains_todays_defaults():
    """The first GPU session runs benchmarks/gpu_session.sh as written: its run strings must be the current
    defaults, not those of the session that wrote it."""
    script = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    assert f"\nSASREC_D64='{curves.SASREC_D64}'\n" in script
    # every GPU training row goes to results/models-gpu.json, never over the CPU rows in models.json
    commands = script.replace("\\\n", " ").splitlines()  # backslash-continued lines joined
    gpu_args = next(c for c in commands if c.strip().startswith("gpu=("))
    assert "--results benchmarks/results/models-gpu.json" in gpu_args
    trains = [c for c in commands if "benchmarks/bench_models.py" in c]
    assert len(trains) >= 4
    for command in trains:
        assert "--results benchmarks/results/models-gpu.json" in command or '"${gpu[@]}"' in command, command
    lines = [line for line in script.splitlines()
             if line.split("=")[0] in {"SASREC_D64", "SASREC", "BERT4REC_LIS01", "BERT4REC", "MOJITO_LONG",
                                       "MOJITO"}]
    # the bash twins of curves.py's strings: today's SASRec defaults, and the other two models at its width
    sasrec = subprocess.run(["bash", "-c", "\n".join([*lines, 'echo "$SASREC"'])], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert sasrec == curves.SASREC_DEFAULT_RUN
    mojito = subprocess.run(["bash", "-c", "\n".join([*lines, 'echo "$MOJITO"'])], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert mojito == curves.MOJITO_DEFAULT_RUN
    bert4rec = subprocess.run(["bash", "-c", "\n".join([*lines, 'echo "$BERT4REC"'])], capture_output=True,
                              text=True, check=True).stdout.strip()
    assert bert4rec == curves.BERT4REC_DEFAULT_RUN
    for name in ("MOJITO_WIDE", "MOJITO_GRAPHED", "MOJITO_WIDE_GRAPHED", "MOJITO_LR2_GRAPHED", "SASREC_GRAPHED",
                 "BERT4REC_GRAPHED", "BERT4REC_MASK02_GRAPHED", "BERT4REC_PEER_GRAPHED", "BERT4REC_MASK04_GRAPHED",
                 "BERT4REC_WIDE_D03_GRAPHED", "BERT4REC_EMA_GRAPHED", "BERT4REC_EMA9995_GRAPHED",
                 "BERT4REC_MASK04_EMA_GRAPHED", "BERT4REC_EMA_WARMUP_GRAPHED", "BERT4REC_EMA_WARMUP_P80_GRAPHED",
                 "BERT4REC_AD0_E400_LIN6"):
        defs = [line for line in script.splitlines()
                if line.split("=")[0] in {"MOJITO_WIDE", "BERT4REC_GRAPHED", "BERT4REC_EMA_GRAPHED",
                                          "BERT4REC_MASK04_GRAPHED", "BERT4REC_EMA_WARMUP_GRAPHED", name}]
        got = subprocess.run(["bash", "-c", "\n".join([*lines, *defs, f'echo "${name}"'])],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert got == getattr(curves, name)
    quick = script.split("\n  quick)")[1].split(";;")[0]
    # quick's shared runs are (run, seed offset) pairs: the defaults, MOJITO at SASRec's width, BERT4Rec's
    # candidates; its timed runs, alone on the device, the two sides of BERT4Rec's GPU time ratio
    assert all(f'"${name} ' in quick for name in ("MOJITO", "BERT4REC", "BERT4REC_EMA_WARMUP_GRAPHED",
                                                  "MOJITO_WIDE_GRAPHED"))
    assert '"$SASREC_GRAPHED"' in quick and '"$BERT4REC_EMA_WARMUP_GRAPHED"' in quick
    assert '"$MOJITO_WIDE_STEP"' in quick
    assert "\nMOJITO_WIDE_STEP='mojito@dim=128'\n" in script
    assert f"\nMOJITO_LONG='{curves.MOJITO_LONG}'\n" in script
    assert f"\nBERT4REC_LIS01='{curves.BERT4REC_LIS01}'\n" in script
    for phase in ("claims", "quick"):  # both phases that train the claims, from those two definitions
        claims = script.split(f"\n  {phase})")[1].split(";;")[0]
        assert '"$MOJITO' in claims and '"$BERT4REC' in claims
        assert "mojito@" not in claims and "bert4rec@" not in claims  # no copy of a run string to go stale


def test_zero_or_takes_zero_or_what_the_positive_type_takes():
    """The benchmarks' options where 0 means 'none' or 'the default' (--threads, --max-minutes, ...)."""
    import argparse

    from bench_models import zero_or

    from recsys.entry import positive_float, positive_int

    whole, minutes = zero_or(positive_int, "the default"), zero_or(positive_float, "no limit")
    assert (whole("0"), whole("3"), minutes("0"), minutes("0.0"), minutes("1.5")) == (0, 3, 0.0, 0.0, 1.5)
    assert isinstance(minutes("0"), float) and isinstance(whole("0"), int)
    for parse, bad in ((whole, "-1"), (whole, "0.0"), (whole, "٠"), (whole, "x"), (minutes, "-1"),
                       (minutes, "nan"), (minutes, "inf"), (minutes, "")):
        with pytest.raises(argparse.ArgumentTypeError, match=r"\(or 0: "):
            parse(bad)


_NO_DATA = ["--dataset", "ml-100k", "--data-root", "{tmp}/no-data"]
_MODELS = ["bench_models.py", *_NO_DATA, "--results", "{tmp}/rows.json", "--work-dir", "{tmp}/work"]
_STEP = ["bench_step.py", *_NO_DATA, "--results", "{tmp}/step.json"]
_STREAM = ["bench_stream.py", *_NO_DATA, "--out", "{tmp}/stream.json", "--work-dir", "{tmp}/work"]
_STEP_OPS = ["step_ops.py", *_NO_DATA]
_FANOUT = ["bench_fanout.py", "--out", "{tmp}/fanout.json"]
_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where torch sees no CUDA")
_WHOLE = "expected a whole number of at least"
# (command, what its one error line says). The data root does not exist: a command that got past its checks
# would stop on it instead, with another line.
_REFUSALS = [
    (["batching_cost.py", "--data-root", "{tmp}/no-data"], "no-data/ml-100k is not a folder: --data-root"),
    ([*_MODELS, "--runs", "sasrec@dim=abc"], "run 'sasrec@dim=abc': sasrec.dim: expected an integer, got"),
    ([*_MODELS, "--runs", "sasrec@bogus=1"], "error: run 'sasrec@bogus=1': 'bogus' is neither a sasrec nor"),
    ([*_MODELS, "--runs", "sasrec:nosuchloss"], "sasrec.loss: 'nosuchloss' is not one of ['ce', 'bce',"),
    ([*_MODELS, "--runs", "sasrec@dim=31"], "error: run 'sasrec@dim=31': sasrec.n_heads must be a divisor"),
    ([*_MODELS, "--runs", "sasrec@lr=true"], "sasrec.train.lr: expected a number, got True"),
    ([*_MODELS, "--runs", "nosuch"], "error: run 'nosuch': unknown model 'nosuch'"),
    ([*_MODELS, "--threads", "-1"], f"argument --threads: {_WHOLE} 1, got '-1' (or 0: torch's default)"),
    ([*_MODELS, "--device", "nosuch"], "argument --device: invalid choice: 'nosuch'"),
    pytest.param([*_MODELS, "--device", "cuda"], "error: train.device is 'cuda' but torch", marks=_NO_CUDA),
    ([*_MODELS, "--max-minutes", "-1"], "argument --max-minutes: must be a number > 0, got '-1' (or 0: no"),
    ([*_MODELS, "--seed-offset", "-100"],
     "error: run 'mostpop' with --seed-offset -100 would train with seed -"),
    ([*_STEP, "--batches", "0"], f"argument --batches: {_WHOLE} 1, got '0'"),
    ([*_STEP, "--models", "sasrec@wdith=3"], "error: run 'sasrec@wdith=3': 'wdith' is neither"),
    ([*_STEP, "--models", "mostpop"], "error: run 'mostpop': mostpop takes no training step"),
    ([*_STEP, "--device", "nosuch"], "argument --device: invalid choice: 'nosuch'"),
    ([*_STREAM, "--batches", "0"], f"argument --batches: {_WHOLE} 1, got '0'"),
    ([*_STREAM, "--history-share", "1.5"], "argument --history-share: must be a number between 0 and 1"),
    ([*_STREAM, "--history-share", "0"], "argument --history-share: must be a number between 0 and 1"),
    ([*_STREAM, "--models", "nosuch"], "error: run 'nosuch': unknown model 'nosuch'"),
    ([*_STREAM, "--seed", "-1"], f"argument --seed: {_WHOLE} 1, got '-1'"),
    ([*_STEP_OPS, "--steps", "0"], f"argument --steps: {_WHOLE} 1, got '0'"),
    ([*_STEP_OPS, "--model", "nosuch"], "error: run 'nosuch': unknown model 'nosuch'"),
    ([*_STEP_OPS, "--batch-size", "-3"], f"argument --batch-size: {_WHOLE} 1, got '-3'"),
    (["bench_flow.py", "--runs", "0"], f"argument --runs: {_WHOLE} 1, got '0'"),
    (["bench_ingest.py", "big", "--rows", "-5"], f"argument --rows: {_WHOLE} 1, got '-5'"),
    (["bench_ingest.py", "scaling", "--batches", "0"], f"argument --batches: {_WHOLE} 1, got '0'"),
    (["bench_ingest.py", "scaling", "--batch-rows", "50"], f"argument --batch-rows: {_WHOLE} 100"),
    ([*_FANOUT, "--epochs", "0"], f"argument --epochs: {_WHOLE} 1, got '0'"),
    ([*_FANOUT, "--threads", "0"], f"argument --threads: {_WHOLE} 1, got '0'"),
]


def _command(case) -> list[str]:  # type: ignore[no-untyped-def]
    """A `_REFUSALS` entry's command line (an entry may be a `pytest.param`)."""
    return case.values[0] if hasattr(case, "values") else case[0]


def run_forked(commands: list[list[str]]) -> list[dict]:
    """tests/script_runner.py: each command line its own process, forked from one warm interpreter. In a
    process group of its own, so that a timeout (a refusal regressed into real training) stops the forked
    commands too, not only the runner."""
    runner = subprocess.Popen([sys.executable, str(ROOT / "tests" / "script_runner.py")], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        stdout, stderr = runner.communicate(json.dumps(commands), timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.communicate()
        raise
    assert runner.returncode == 0, stderr
    return json.loads(stdout)


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Every `_REFUSALS` command line run once, each as its own process forked from one that imported the
    scripts' modules (tests/script_runner.py: thirty interpreter starts with torch cost a minute of the fast
    loop), in a folder of its own (by the command line's text); with the results folder before and after."""
    results = ROOT / "benchmarks" / "results"
    before = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    folders = {" ".join(_command(case)): tmp_path_factory.mktemp("refusal") for case in _REFUSALS}
    outcomes = run_forked([[part.format(tmp=folders[" ".join(_command(case))]) for part in _command(case)]
                           for case in _REFUSALS])
    after = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    return dict(zip(folders, outcomes)), folders, before, after


@pytest.mark.parametrize(("command", "says"), _REFUSALS)
def test_a_benchmark_refuses_a_bad_value_in_one_line_before_any_work(refused, command, says):
    """Each benchmark's input is checked before anything is prepared, started, trained or written: one
    `error:` line naming the option or run and the value (argparse's, after its usage, for a bad option
    value: exit 2; one of ours: exit 1), never a traceback."""
    outcomes, folders, before, after = refused
    got = outcomes[" ".join(command)]
    lines = got["stderr"].strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert "Traceback" not in got["stderr"], got["stderr"]
    assert len(errors) == 1 and says in errors[0], got["stderr"]
    if got["code"] == 2:  # argparse's refusal: its usage, then `prog: error: argument --option: ...`
        assert errors[0] == lines[-1] and ": error: argument --" in errors[0], got["stderr"]
    else:
        assert got["code"] == 1 and lines == errors and errors[0].startswith("error: "), got["stderr"]
    assert not any(folders[" ".join(command)].iterdir())  # no results, work dir or data written
    assert after == before


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_the_script_runner_gives_each_command_its_own_process_code_and_output():
    """tests/script_runner.py stands in for `python benchmarks/<script>` in the refusal test above: the same
    exit codes and stderr as a real interpreter start, and a command's changes stay in its own process."""
    forked = run_forked([["step_ops.py", "--steps", "0"], ["step_ops.py", "--help"],
                         ["step_ops.py", "--steps", "0"]])
    real = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_ops.py"), "--steps", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert forked[0]["code"] == real.returncode == 2 and forked[0]["stderr"] == real.stderr
    assert forked[1]["code"] == 0 and "usage:" in forked[1]["stdout"] and forked[1]["stderr"] == ""
    assert forked[2] == forked[0]


def test_a_rows_seed_is_its_own_field_or_its_train_configs():
    """A row that records its seed needs no train config (results/same-machine.json's rows hold none); a
    row from before `--seeds` has it only in the train config."""
    from bench_models import row_key

    assert row_key({"dataset": "ml-100k", "run": "sasrec", "seed": 43}) == ("ml-100k", "sasrec", 43)
    old = {"dataset": "ml-100k", "run": "sasrec", "train": {"seed": 42}}
    assert row_key(old) == ("ml-100k", "sasrec", 42)


def test_results_sections_are_replaced_in_one_write_and_the_rest_kept(tmp_path):
    """bench_models, bench_stream and curves.py rewrite their generated RESULTS.md tables through one
    results_md.update_sections: named sections replaced, prose and other tables kept, an absent section
    appended, nothing left beside the file but its (ignored) lock."""
    from results_md import update_sections

    md = tmp_path / "RESULTS.md"
    md.write_text("# R\nprose\n<!-- aims:begin -->\nold aims\n<!-- aims:end -->\nmore prose\n"
                  "<!-- stream:begin -->\nold stream\n<!-- stream:end -->\n")
    update_sections(md, {"aims": "new aims", "gpu": "gpu rows"})
    assert md.read_text() == ("# R\nprose\n<!-- aims:begin -->\nnew aims\n<!-- aims:end -->\nmore prose\n"
                              "<!-- stream:begin -->\nold stream\n<!-- stream:end -->\n"
                              "\n<!-- gpu:begin -->\ngpu rows\n<!-- gpu:end -->\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RESULTS.lock", "RESULTS.md"]
    fresh = tmp_path / "new" / "RESULTS.md"
    update_sections(fresh, {"models": "rows"})
    assert fresh.read_text() == "# Benchmark results\n\n<!-- models:begin -->\nrows\n<!-- models:end -->\n"
