"""Retrain flow: rebuild the dataset and train + evaluate each model through DVC, then gate and register.

    python -m flows.retrain            # every model in params.yaml, only what changed
    python -m flows.retrain --force    # retrain even if DVC says nothing changed

`dvc repro` owns the graph (prepare → train@m → evaluate@m); this flow decides what happens after: it picks
the candidate by *validation* NDCG@10 (the test split stays a one-time measurement), asks the registry's
gate to compare it with the champion on the same test set, and publishes tables, curves and the decision
as Prefect artifacts. Every step is idempotent, so a crashed run is simply run again.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                               update_progress_artifact)

from recsys.config import ConfigError, Params, load_params, validate_name
from recsys.workspace import DvcError, dvc_command, fault_point, run_dvc, subprocess_env, workspace_lock

ROOT = Path(".")  # flows run from the repository root (deployments set it in their pull step)
BASELINE = "mostpop"


def _params(root: Path, params_file: str) -> Params:
    return load_params(root / params_file)


def _read_curve(path: Path) -> list[dict[str, float]]:
    import csv

    if not path.is_file():
        return []
    try:
        with path.open() as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    except (OSError, ValueError):
        return []  # being rewritten right now; the next poll reads it


@task(name="dvc-status")
def stale_stages(root: str, targets: list[str]) -> list[str]:
    """Stages `dvc repro` would run (empty when nothing changed)."""
    done = run_dvc(Path(root), "status", "--json", "--with-deps", *targets)
    return sorted(json.loads(done.stdout or "{}"))


@task(name="dvc-repro", retries=1, retry_delay_seconds=10)
def reproduce(root: str, targets: list[str], force: bool, epochs: int | None, models: list[str],
              params_file: str) -> list[str]:
    """`dvc repro` the targets under the workspace lock, reporting training progress as it goes."""
    logger = get_run_logger()
    root_path = Path(root)
    params = _params(root_path, params_file)
    args = ["repro", *(["--force"] if force else []), *targets]
    progress_id = create_progress_artifact(0.0, key="training-progress", description="dvc repro: starting")
    with workspace_lock(root_path), _epochs_override(root_path / params_file, epochs, models):
        started, started_wall = time.monotonic(), time.time()
        proc = subprocess.Popen(dvc_command(*args), cwd=root_path, env=subprocess_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        import threading

        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        budget = {m: max(params.train_config(m).epochs, 1) for m in models}
        while proc.poll() is None:
            time.sleep(2.0)
            done = []
            for m in models:
                curve = root_path / "plots" / f"{m}.csv"
                # DVC deletes a stage's outputs before running it: a file older than this run is stale.
                fresh = curve.is_file() and curve.stat().st_mtime >= started_wall
                done.append(min(len(_read_curve(curve)) / budget[m], 1.0) if fresh else 0.0)
            fraction = sum(done) / max(len(done), 1)
            update_progress_artifact(progress_id, 100.0 * min(fraction, 0.99),
                                     description=f"dvc repro running for {time.monotonic() - started:.0f}s")
        reader.join(timeout=10)
    output = "".join(lines)
    if proc.returncode != 0:
        raise DvcError(f"`dvc {' '.join(args)}` failed:\n{output[-3000:]}")
    update_progress_artifact(progress_id, 100.0, description="dvc repro finished")
    ran = [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]
    logger.info("dvc repro ran %d stage(s): %s", len(ran), ", ".join(ran) or "none (up to date)")
    return ran


class _epochs_override:
    """Temporarily set `train.epochs` (and per-model `train.epochs`) in params.yaml for one `dvc repro`.

    DVC records the override in dvc.lock, so the next normal run retrains with the real value. The original
    file is kept beside the lock and restored on exit — also by the next run if this one was killed.
    """

    def __init__(self, params_path: Path, epochs: int | None, models: list[str]):
        self.path, self.epochs, self.models = params_path, epochs, models
        self.backup = params_path.parent / ".ingest" / f"{params_path.name}.orig"

    def __enter__(self):
        restore_params(self.path)
        if self.epochs is None:
            return self
        if self.epochs < 1:
            raise ConfigError(f"epochs override must be ≥ 1, got {self.epochs}")
        import yaml  # PyYAML both ways (a YAML 1.2 writer would emit `off` unquoted, which 1.1 reads as false)

        original = self.path.read_text(encoding="utf-8")
        data = yaml.safe_load(original)
        data["train"]["epochs"] = self.epochs
        for m in self.models:
            if isinstance(data.get(m), dict) and isinstance(data[m].get("train"), dict):
                data[m]["train"]["epochs"] = self.epochs
        self.backup.parent.mkdir(parents=True, exist_ok=True)
        self.backup.write_text(original, encoding="utf-8")
        # Comments are lost only for the duration of the run: the original bytes are restored on exit.
        self.path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return self

    def __exit__(self, *exc):
        restore_params(self.path)
        return False


def restore_params(params_path: Path) -> None:
    backup = params_path.parent / ".ingest" / f"{params_path.name}.orig"
    if backup.is_file():
        params_path.write_text(backup.read_text(encoding="utf-8"), encoding="utf-8")
        backup.unlink()


@task(name="collect-results")
def collect_results(root: str, models: list[str]) -> dict[str, dict[str, Any]]:
    """Each model's test metrics (from the evaluate stage) and its validation metrics (from training)."""
    out = {}
    for m in models:
        metrics_path = Path(root) / "metrics" / f"{m}.json"
        if not metrics_path.is_file():
            raise FileNotFoundError(f"{metrics_path} missing after dvc repro")
        out[m] = json.loads(metrics_path.read_text())
    return out


def choose_candidate(results: dict[str, dict[str, Any]]) -> str | None:
    """The best model by validation NDCG@10 — never by test, which is only measured."""
    scored = {m: (r.get("valid") or {}).get("ndcg@10") for m, r in results.items() if m != BASELINE}
    scored = {m: s for m, s in scored.items() if isinstance(s, (int, float)) and s == s}
    return max(scored, key=scored.get) if scored else None


@task(name="promote", retries=2, retry_delay_seconds=3)
def promote_candidate(root: str, candidate: str, params_file: str) -> dict[str, Any]:
    from recsys.promotion import promote_candidate as promote

    decision = promote(Path(root), _params(Path(root), params_file), candidate, baseline=BASELINE)
    return {**dataclasses.asdict(decision), "model": candidate}


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("—" if value is None else str(value))


def publish(results: dict[str, dict], decision: dict | None, curves: dict[str, list[dict]], ran: list[str]) -> None:
    rows = []
    for m, r in sorted(results.items()):
        rows.append({"model": m, "valid ndcg@10": _fmt((r.get("valid") or {}).get("ndcg@10")),
                     "test ndcg@10": _fmt(r.get("ndcg@10")), "test hr@10": _fmt(r.get("hr@10")),
                     "test mrr": _fmt(r.get("mrr")), "best epoch": _fmt(r.get("best_epoch")),
                     "candidate": "yes" if decision and decision["model"] == m else ""})
    if decision and decision.get("baseline_metric") is not None:
        rows.append({"model": f"{decision['baseline_kind']} v{decision['baseline_version'] or ''}".strip(),
                     "valid ndcg@10": "—", "test ndcg@10": _fmt(decision["baseline_metric"]), "test hr@10": "—",
                     "test mrr": "—", "best epoch": "—", "candidate": "baseline (same test set)"})
    create_table_artifact(rows, key="model-metrics", description="Test metrics of every model vs the baseline")
    if decision:
        verdict = "✅ promoted" if decision["promoted"] else "⛔ not promoted"
        md = [f"# Promotion decision: {verdict}", "",
              f"**Candidate:** `{decision['model']}` (registry version {decision['version']})", "",
              f"**Reason:** {decision['reason']}", "",
              "| | value |", "|---|---|",
              f"| metric | {decision['metric']} |",
              f"| candidate | {_fmt(decision['candidate_metric'])} |",
              f"| baseline ({decision['baseline_kind']}) | {_fmt(decision['baseline_metric'])} |",
              f"| delta | {_fmt(decision['delta'])} |", f"| p-value | {_fmt(decision['p_value'])} |",
              f"| evaluation set | `{(decision['eval_fingerprint'] or '')[:16]}` |",
              f"| replayed from an earlier run | {decision['replayed']} |"]
        create_markdown_artifact("\n".join(md), key="promotion-decision", description="Gate decision and reason")
    create_markdown_artifact(curves_markdown(curves, ran), key="training-curves", description="Validation curves")


def curves_markdown(curves: dict[str, list[dict]], ran: list[str]) -> str:
    lines = ["# Training curves (validation NDCG@10 by epoch)", "",
             f"Stages run this time: {', '.join(ran) or 'none — everything was up to date'}", ""]
    png = _curves_png(curves)
    if png:
        lines += [f"![validation NDCG@10](data:image/png;base64,{base64.b64encode(png).decode()})", ""]
    for m, rows in sorted(curves.items()):
        if not rows:
            continue
        best = max(rows, key=lambda r: r.get("valid_ndcg@10", float("-inf")))
        lines.append(f"- **{m}**: {len(rows)} epoch(s), best epoch {int(best['epoch'])} "
                     f"(valid NDCG@10 {best['valid_ndcg@10']:.4f}); `dvc plots show` renders plots/{m}.csv")
    return "\n".join(lines)


def _curves_png(curves: dict[str, list[dict]]) -> bytes | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    drawable = {m: rows for m, rows in curves.items() if len(rows) > 1}
    if not drawable:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=80)
    for m, rows in sorted(drawable.items()):
        ax.plot([r["epoch"] for r in rows], [r["valid_ndcg@10"] for r in rows], label=m)
    ax.set_xlabel("epoch")
    ax.set_ylabel("valid NDCG@10")
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


@flow(name="retrain", log_prints=True)
def retrain(
    models: list[str] | None = None,
    force: bool = False,
    epochs: int | None = None,
    repo_root: str = str(ROOT),
    params_file: str = "params.yaml",
) -> dict[str, Any]:
    """Rebuild the prepared dataset, train + evaluate `models` (default: all in params.yaml) through DVC,
    then gate the best candidate (by validation NDCG@10) against the champion.

    Args:
        models: models to train; each must be listed in params.yaml `models`. MostPop is always evaluated
            too, as the baseline a first champion must beat.
        force: retrain even when DVC finds nothing changed.
        epochs: override `train.epochs` for this run only (DVC records it; the next normal run retrains).
        repo_root: the repository (DVC workspace) to run in.
        params_file: params file name inside the repository.
    """
    logger = get_run_logger()
    root = Path(repo_root).resolve()
    params = _params(root, params_file)
    selected = [validate_name(m, "model name") for m in (models or list(params.models))]
    unknown = [m for m in selected if m not in params.models]
    if unknown:
        raise ConfigError(f"model(s) {unknown} are not in params.yaml `models` {list(params.models)}")
    if BASELINE in params.models and BASELINE not in selected:
        selected = [BASELINE, *selected]
    targets = [f"evaluate@{m}" for m in selected]
    stale = stale_stages(str(root), targets)
    logger.info("stale stages: %s", ", ".join(stale) or "none")
    ran = reproduce(str(root), targets, force, epochs, selected, params_file) if (stale or force or epochs) else []
    results = collect_results(str(root), selected)
    curves = {m: _read_curve(root / "plots" / f"{m}.csv") for m in selected}
    candidate = choose_candidate(results)
    decision = None
    if candidate is None:
        logger.warning("no trainable candidate among %s; nothing to promote", selected)
    else:
        fault_point("before_promote")
        decision = promote_candidate(str(root), candidate, params_file)
        logger.info("gate: %s %s — %s", candidate, decision["decision"], decision["reason"])
    publish(results, decision, curves, ran)
    return {
        "stages_run": ran,
        "models": {m: {"test_ndcg@10": r.get("ndcg@10"), "valid_ndcg@10": (r.get("valid") or {}).get("ndcg@10")}
                   for m, r in results.items()},
        "candidate": candidate,
        "decision": decision,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run the retrain flow")
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--repo-root", default=str(ROOT))
    args = parser.parse_args(argv)
    summary = retrain(models=args.models, force=args.force, epochs=args.epochs, repo_root=args.repo_root)
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
