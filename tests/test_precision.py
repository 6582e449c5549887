"""`train.precision` (recsys/device.py, recsys/train.py): what a training step computes in, on which device,
and that scoring never leaves float32."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.device import DeviceError, cpu_has_native_bf16, precision_name, training_autocast
from recsys.models import build_model
from recsys.models.losses import linear_cross_entropy
from recsys.sequences import SequenceData, TrainingTensors, micro_batches
from recsys.train import optimiser_step, train_model

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


@pytest.mark.parametrize("flags, native", [
    ("fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni", True),  # AMD Zen 4, Intel Cooper Lake
    ("fpu sse2 avx2 avx512f amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
    ("fpu sse2 avx2 avx512f avx512bw", False),  # AVX-512 without bf16 products: torch would emulate them
    ("Features: fp asimd evtstrm aes sha3 sve i8mm bf16 rng", True),  # Arm Neoverse V1 (Graviton 3)
    ("Features: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics", False),  # Arm Neoverse N1 (Graviton 2)
])
def test_native_bf16_is_read_from_the_cpus_flags(tmp_path, flags, native):
    info = tmp_path / "cpuinfo"
    line = flags if flags.startswith("Features") else f"flags\t\t: {flags}"
    info.write_text(f"processor\t: 0\nmodel name\t: Some CPU\n{line}\n\nprocessor\t: 1\n")
    assert cpu_has_native_bf16.__wrapped__(str(info)) is native
    assert cpu_has_native_bf16.__wrapped__(str(tmp_path / "absent")) is False  # not Linux: no bf16 by auto


def test_precision_resolves_per_device(monkeypatch):
    assert training_autocast("fp32", CPU) is None
    assert training_autocast("bf16", CPU) is torch.bfloat16
    assert training_autocast("auto", CPU) is None  # a CPU asks for bf16 by name (its quality is being measured)
    assert training_autocast("bf16", torch.device("meta")) is None  # no autocast off CPU and CUDA
    assert (precision_name(torch.bfloat16), precision_name(None)) == ("bf16", "fp32")
    if not torch.cuda.is_available():  # what auto and bf16 mean on a CUDA device without bfloat16
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla P100")
        assert training_autocast("auto", torch.device("cuda")) is None
        with pytest.raises(DeviceError, match=r"^train.precision is 'bf16' but Tesla P100 has no bfloat16 "
                                              r"support: set train.precision to auto or fp32$"):
            training_autocast("bf16", torch.device("cuda"))
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        assert training_autocast("auto", torch.device("cuda")) is torch.bfloat16


def test_bf16_on_a_cpu_that_would_emulate_it_says_so(monkeypatch, caplog):
    """A hardware fact this machine may not have: the flag reader is replaced, nothing else."""
    monkeypatch.setattr("recsys.device.cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="recsys.device"):
        assert training_autocast("bf16", CPU) is torch.bfloat16
    assert "emulates bfloat16 there, slower than float32; set train.precision to auto or fp32" in caplog.text


def _one_batch(name, config, tiny_prepared):
    data = SequenceData.from_prepared(tiny_prepared)
    model = build_model(name, config, n_items=data.n_items, n_users=data.n_users)
    model.fit_statistics(data.train_items())
    tensors = TrainingTensors(data, data.train_spans(int(config.max_len), "last"), CPU)
    order = np.argsort(tensors.lengths, kind="stable")  # a step's rows sorted by span length, as the trainer's
    rows = torch.from_numpy(order)
    micro = micro_batches(tensors.lengths[order], 1, model.loss_terms(tensors.lengths)[order])
    return model, tensors, rows, micro


@pytest.mark.parametrize("autocast, dtype", [(torch.bfloat16, torch.bfloat16), (None, torch.float32)])
def test_a_step_computes_its_products_in_the_precision_and_keeps_float32_weights(
        tiny_prepared, tiny_sasrec_config, autocast, dtype):
    model, tensors, rows, micro = _one_batch("sasrec", tiny_sasrec_config, tiny_prepared)
    seen = []
    model.blocks[0].ffn.fc1.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = optimiser_step(model, model.loss, optimizer, tensors, rows, micro, autocast=autocast)
    assert seen == [dtype]
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # the step moved them


def test_the_chunked_softmax_runs_its_products_in_the_cpus_autocast_dtype():
    """Under CPU autocast `linear_cross_entropy` multiplies in bf16 and normalises in float32: its loss is
    the float32 loss to bf16's precision, not float32's, and its gradients come back float32."""
    torch.manual_seed(0)
    h = torch.randn(50, 16, requires_grad=True)
    w = torch.randn(300, 16, requires_grad=True)
    y = torch.randint(0, 300, (50,))
    exact = linear_cross_entropy(h, w, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = linear_cross_entropy(h, w, y)
    low.backward()
    assert low.dtype == torch.float32 and h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    gap = abs(low.item() - exact.item())
    assert 0 < gap < 0.05 * exact.item()  # bf16 products (an 8-bit mantissa): close, and not float32's value
    bf = (h.detach().bfloat16() @ w.detach().bfloat16().T).float()
    assert low.item() == pytest.approx(torch.nn.functional.cross_entropy(bf, y).item(), rel=1e-4)


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "mojito"])
def test_a_bf16_run_trains_records_its_precision_and_scores_in_float32(
        name, tiny_prepared, tiny_sasrec_config, fast_train_config, tmp_path, caplog, monkeypatch):
    from recsys.checkpoint import load_model
    from recsys.config import load_params
    from recsys.train import validate, validation_inputs

    config = tiny_sasrec_config if name == "sasrec" else dataclasses.replace(
        load_params(ROOT / "params.yaml").model_config(name), dim=16, max_len=20, n_layers=1)
    cfg = dataclasses.replace(fast_train_config, precision="bf16", epochs=4)
    import recsys.train

    under_autocast = []
    real_validate = recsys.train.validate

    def watched(model, inputs):  # the trainer's own validation, each epoch: never under autocast
        under_autocast.append(torch.is_autocast_enabled("cpu"))
        return real_validate(model, inputs)

    monkeypatch.setattr(recsys.train, "validate", watched)
    with caplog.at_level(logging.INFO, logger="recsys.device"):
        result = train_model(name, config, cfg, tiny_prepared, tmp_path / "m", curve_path=tmp_path / "c.csv",
                             resume_root=tmp_path / "resume")
    monkeypatch.undo()
    assert under_autocast == [False] * 4
    assert f"model={name} device=cpu precision=bf16 (train.precision=bf16)" in caplog.text
    losses = [float(line.split(",")[1]) for line in (tmp_path / "c.csv").read_text().splitlines()[1:]]
    assert len(losses) == 4 and losses[-1] < losses[0]  # it learns
    model, meta = load_model(tmp_path / "m")
    assert meta["train_config"]["precision"] == "bf16" and meta["precision"] == "bf16"
    assert all(t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point())
    data = SequenceData.from_prepared(tiny_prepared)
    seen = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    model.eval()
    inputs = validation_inputs(model, data, cfg, CPU)
    assert validate(model, inputs)["ndcg@10"] == pytest.approx(result.best_valid["ndcg@10"], abs=1e-6)
    assert seen and set(seen) == {torch.float32}  # ranking never in bf16 (its 8-bit mantissa ties scores)


def test_rows_stored_before_the_key_read_as_what_ran_then(tmp_path):
    """A CPU row without `precision` trained float32 and a GPU row bf16: a bf16 CPU row may not join the first
    under its run string, an fp32 one may; an `auto` GPU row may join the second."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_models import merge

    path = tmp_path / "rows.json"
    run = "sasrec:ce@patience=20"
    cpu = {"dataset": "ml-100k", "run": run, "seed": 42, "test_ndcg@10": 0.11, "config": {"dim": 64},
           "machine": "AMD EPYC, 2 cores", "train": {"device": "auto", "seed": 42, "max_minutes": 0.0}}
    merge([cpu], path)
    bf16 = {**cpu, "seed": 43, "train": {**cpu["train"], "seed": 43, "precision": "bf16"}}
    with pytest.raises(SystemExit, match=r"seed 42 trained with other settings — precision='fp32' \(now 'bf16'\)"):
        merge([bf16], path)
    assert [r["seed"] for r in merge([{**bf16, "train": {**bf16["train"], "precision": "fp32"}}], path)] == [42, 43]
    auto = {**cpu, "seed": 44, "train": {**cpu["train"], "seed": 44, "precision": "auto"}}  # fp32 on a CPU
    assert [r["seed"] for r in merge([auto], path)] == [42, 43, 44]
    gpu_path = tmp_path / "gpu.json"
    gpu = {**cpu, "machine": "NVIDIA H100 80GB HBM3", "train": {**cpu["train"], "device": "cuda"}}
    merge([gpu], gpu_path)
    later = {**gpu, "seed": 43, "train": {**gpu["train"], "seed": 43, "precision": "auto"}}
    named = {**gpu, "seed": 44, "train": {**gpu["train"], "seed": 44, "precision": "bf16"}}
    assert [r["seed"] for r in merge([later, named], gpu_path)] == [42, 43, 44]
    assert json.loads(gpu_path.read_text())[1]["train"]["precision"] == "auto"
    fp32 = {**gpu, "seed": 45, "train": {**gpu["train"], "seed": 45, "precision": "fp32"}}
    with pytest.raises(SystemExit, match=r"precision='bf16' \(now 'fp32'\)"):
        merge([fp32], gpu_path)


def test_a_state_saved_before_the_key_keeps_its_run_key(tiny_sasrec_config, fast_train_config):
    """`auto` is what every run did before `train.precision` existed: an interrupted run resumes across the
    upgrade (its key is the key of the same settings without the field); a named precision is another run."""
    from recsys.train_state import run_key

    keys = {p: run_key("sasrec", tiny_sasrec_config, dataclasses.replace(fast_train_config, precision=p), "f")
            for p in ("auto", "bf16", "fp32")}
    assert len(set(keys.values())) == 3
    fields = [(f.name, f.type) for f in dataclasses.fields(fast_train_config) if f.name != "precision"]
    Before = dataclasses.make_dataclass("TrainConfigBeforePrecision", fields)  # the settings a state then had
    before = Before(**{name: getattr(fast_train_config, name) for name, _ in fields})
    assert run_key("sasrec", tiny_sasrec_config, before, "f") == keys["auto"]


def test_the_fixed_shape_step_runs_in_the_precision_too(tiny_prepared, tiny_sasrec_config, fast_train_config,
                                                         tmp_path, monkeypatch):
    """`train.cuda_graph`'s step (eager on a CPU) takes `train.precision` as the micro-batched step does."""
    from recsys.step_graph import FixedShapeStep

    seen = []
    original = FixedShapeStep._step

    def spy(self):  # the real step, watched
        hook = self.model.blocks[0].ffn.fc1.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        try:
            original(self)
        finally:
            hook.remove()

    monkeypatch.setattr(FixedShapeStep, "_step", spy)
    for precision, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        seen.clear()
        cfg = dataclasses.replace(fast_train_config, precision=precision, cuda_graph=True, epochs=2)
        result = train_model("sasrec", tiny_sasrec_config, cfg, tiny_prepared, tmp_path / precision,
                             resume_root=tmp_path / f"resume-{precision}")
        assert result.epochs_run == 2 and seen and set(seen) == {dtype}


def test_attention_weights_are_normalised_in_float32_under_cpu_autocast(monkeypatch):
    """CPU autocast leaves softmax in bf16 (CUDA's runs it in float32): the CPU dropout path normalises the
    scores in float32, so each row of weights sums to 1 to float32's precision before the dropout."""
    from recsys.models import blocks

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 8).bfloat16() for _ in range(3))
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    caught = []
    monkeypatch.setattr(blocks, "dropout", lambda w, p, training: caught.append(w) or w)  # the weights, kept
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = blocks.attend_with_dropout(q, k, v, mask, 0.1)
    assert caught[0].dtype == torch.float32
    assert torch.allclose(caught[0].sum(-1), torch.ones(2, 2, 7), atol=1e-6)
    assert out.dtype == torch.bfloat16  # the weighted sum is a product: bf16 under autocast
