#!/usr/bin/env python3
"""CPU seconds (process time, one torch thread) of 16 SASRec training steps and one full validation on
ml-1m-half, through the trainer path of whichever checkout is first on sys.path — for comparing commits on a
shared box, where process time barely depends on other load and wall time does. Same configuration on both
sides (pre-LN blocks, 1 head, the newest window per user).

    python benchmarks/cpu_cost.py                                   # this checkout
    git worktree add /tmp/old COMMIT && (cd /tmp/old && PYTHONPATH=/tmp/old python $PWD/benchmarks/cpu_cost.py)
"""
import argparse
import dataclasses
import time

import torch

argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
torch.set_num_threads(1)
from pathlib import Path
from recsys.config import load_params
from recsys.data import read_movielens_1m
from recsys.prepare import prepare
from recsys.sequences import SequenceData
from recsys.models import build_model
import recsys.train as T
p = load_params("params.yaml")
prep = prepare(read_movielens_1m(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ml-1m-half"), p.prepare)
d = SequenceData.from_prepared(prep)
mc = p.model_config("sasrec")
kw = {"residual": "pre_ln"} if hasattr(mc, "residual") else {}
mc = dataclasses.replace(mc, n_heads=1, **kw)
tc = dataclasses.replace(p.train_config("sasrec"), device="cpu", progress="off", batch_size=128)
torch.manual_seed(0)
m = build_model("sasrec", mc, d.n_items, d.n_users)
opt = torch.optim.Adam(m.parameters(), lr=1e-3)
spans = d.train_spans(200)
g = torch.Generator().manual_seed(0)
new = hasattr(T, "validation_inputs")
if new:
    from recsys.sequences import TrainingTensors, bucketed_batch_rows
    tt = TrainingTensors(d, spans)
    plan = bucketed_batch_rows(tt.lengths, 128, g)[:16]
    batches = [lambda r=r: tt.batch(torch.from_numpy(r), int(tt.lengths[r].max()) - 1) for r in plan]
else:
    from recsys.sequences import bucketed_batches, train_batch
    plan = bucketed_batches(spans, 128, g)[:16]
    batches = [lambda r=r: train_batch(d, r) for r in plan]
t0, w0 = time.process_time(), time.perf_counter()
for make in batches:
    loss = m.loss(make()); opt.zero_grad(); loss.backward(); opt.step(); loss.item() if not new else None
t1 = time.process_time()
if new:
    inputs = T.validation_inputs(m, d, tc, "cpu")
    t2 = time.process_time(); T.validate(m, inputs)
else:
    t2 = time.process_time(); T.validate(m, d, tc, "cpu")
t3 = time.process_time()
print(f"{'new' if new else 'old'} train_cpu_s={t1 - t0:.2f} valid_cpu_s={t3 - t2:.2f}")
