"""Builders shared by the registry tests: tiny fake checkpoints and evaluation results (no torch needed).

Kept in a test_* module (with no tests of its own) so the racing child processes can import it by name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import GateConfig, Params, RegistryConfig

FP_A = hashlib.sha256(b"eval set A").hexdigest()
FP_B = hashlib.sha256(b"eval set B").hexdigest()
N_USERS = 80


@dataclass
class FakeEval:
    metrics: dict[str, float]
    per_user: pd.DataFrame | None
    eval_fingerprint: str
    split: str = "test"


def user_ids(n: int = N_USERS) -> list[str]:
    return [f"u{i:03d}" for i in range(n)]


def base_ndcg(n: int = N_USERS) -> np.ndarray:
    """Per-user 'difficulty' shared by every model, so paired differences are what the test sees."""
    return np.random.default_rng(12345).uniform(0.0, 0.4, n)


def make_eval(
    shift: float, fp: str = FP_A, *, noise: float = 0.005, seed: int = 0, n: int = N_USERS,
    metric_override: float | None = None, per_user: bool = True,
) -> FakeEval:
    """Per-user ndcg@10 = shared base + shift + small model-specific noise; metrics are their means."""
    rng = np.random.default_rng(seed)
    values = np.clip(base_ndcg(n) + shift + rng.normal(0.0, noise, n), 0.0, 1.0)
    frame = pd.DataFrame({"user_id": user_ids(n), "ndcg@10": values, "hr@10": (values > 0.2).astype(float)})
    mean = float(values.mean()) if metric_override is None else metric_override
    metrics = {"ndcg@10": mean, "hr@10": float(frame["hr@10"].mean())}
    return FakeEval(metrics, frame if per_user else None, fp)


def eval_from_values(values: np.ndarray, fp: str = FP_A) -> FakeEval:
    frame = pd.DataFrame({"user_id": user_ids(len(values)), "ndcg@10": values})
    return FakeEval({"ndcg@10": float(values.mean())}, frame, fp)


def make_checkpoint(root: Path, name: str, *, model: str = "sasrec", payload: bytes | None = None) -> Path:
    """A checkpoint-shaped directory; `payload` makes its weights (and so its sha256) distinct."""
    out = root / name
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(payload if payload is not None else name.encode() * 64)
    meta = {
        "model": model,
        "config": {"dim": 8, "n_layers": 1, "max_len": 5},
        "n_items": 3,
        "n_users": 2,
        "dataset_fingerprint": hashlib.sha256(b"data").hexdigest(),
        "best_epoch": 1,
        "format_version": 1,
    }
    (out / "model.json").write_text(json.dumps(meta))
    (out / "items.json").write_text(json.dumps([None, "a", "b", "c"]))
    (out / "users.json").write_text(json.dumps([None, "x", "y"]))
    return out


def registry_config(tmp_path: Path, url: str | None = None) -> RegistryConfig:
    return RegistryConfig(
        url=url or f"sqlite:///{tmp_path / 'reg' / 'registry.db'}",
        artifact_root=str(tmp_path / "artifacts"),
        model_name="next_item",
    )


def make_params(tmp_path: Path, url: str | None = None, **gate: object) -> Params:
    return Params(
        models=("sasrec",),
        model_configs={},
        model_train={},
        registry=registry_config(tmp_path, url),
        gate=GateConfig(**gate),  # type: ignore[arg-type]
    )


@dataclass
class CountingEvaluate:
    """A deterministic re-scoring function: returns a fixed result and records each checkpoint it scored."""

    result: FakeEval
    calls: list[Path] = field(default_factory=list)

    def __call__(self, checkpoint_dir: Path) -> FakeEval:
        self.calls.append(Path(checkpoint_dir))
        return self.result


# --- racing promoters (run in spawned processes) --------------------------------------------------------

RACE_SHIFTS = [0.06, 0.14, 0.02, 0.10, 0.00, 0.12, 0.04, 0.08]  # candidate i's gain; best is index 1


def race_worker(url: str, root: str, index: int, ready, start, out_dir: str) -> None:  # type: ignore
    """One retraining run: wait for the start signal, then open the registry and promote a candidate."""
    from recsys.registry import open_registry

    root_path = Path(root)
    ckpt = make_checkpoint(root_path / "ckpts", f"cand{index}", payload=f"weights {index}".encode() * 32)
    result = make_eval(RACE_SHIFTS[index], seed=100 + index)
    mostpop = make_eval(-0.2, seed=99)
    ready.release()
    start.wait(60)  # everyone imported and ready: now all open + promote at once
    with open_registry(registry_config(root_path, url), root_path, GateConfig()) as registry:
        decision = registry.promote(ckpt, result, baseline_result=mostpop, baseline_kind="mostpop")
    (Path(out_dir) / f"{index}.json").write_text(
        json.dumps({"index": index, "version": decision.version, "promoted": decision.promoted,
                    "metric": decision.candidate_metric, "reason": decision.reason})
    )


def run_race(url: str, root: Path, n: int = 8) -> list[dict]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, start = ctx.Semaphore(0), ctx.Event()
    out_dir = root / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = [ctx.Process(target=race_worker, args=(url, str(root), i, ready, start, str(out_dir)))
             for i in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        assert ready.acquire(timeout=120), "a racing process did not start"
    start.set()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [json.loads((out_dir / f"{i}.json").read_text()) for i in range(n)]
