"""The pipeline's promotion step: the one path from the `evaluate` stage's outputs into the registry.

Both the retrain flow and `recsys registry promote` call `promote_candidate`, so a model records the same
lineage (params, code version, dataset version, evaluation settings) and its champion is re-scored the same
way whichever of them promoted it. The step:

1. reads the candidate's and the baseline's stage outputs (`metrics/<m>.json`, per-user results,
   `artifacts/models/<m>`) and captures their lineage (`recsys.lineage`);
2. validates both registrations before anything is copied into the artifact store;
3. installs the baseline (MostPop, trained on the same data) as the champion while no model has passed the
   gate, so there is always something to serve;
4. gates the candidate against the champion, re-scoring it on the candidate's test set when the data changed
   — except the baseline itself while it is (now) the champion: installing it is the decision.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsys.config import Params, validate_name
from recsys.digest import CHECKPOINT_SHA256, DigestError, directory_digest
from recsys.held_out import late_data_leak
from recsys.layout import PREPARED_FINGERPRINT, Layout
from recsys.lineage import Lineage, capture, split_otherwise, trained_data_version
from recsys.model_configs import BASELINE, TRAINABLE
from recsys.registry import PromotionDecision, RegistryError, database_errors, open_registry, registry_url
from recsys.registry.evaluations import RescoreFn
from recsys.registry.records import read_meta
from recsys.warm import COLD_TRIES, COLD_TRY_OF
from recsys.workspace import workspace_lock


class PromotionError(RegistryError):
    """The promotion step cannot run (missing stage outputs); the message says which command fixes it."""


@dataclass(frozen=True)
class StoredEval:
    """An evaluation read back from the `evaluate` stage's outputs (same fields the gate uses). The per-user
    table is read on first use: a replayed decision (every run with nothing new) never needs it, and reading
    it loads pandas."""

    metrics: dict[str, float]
    per_user_path: Path
    eval_fingerprint: str
    checkpoint_sha256: str | None = None  # the digest of the checkpoint scored (None: not recorded)

    @functools.cached_property
    def per_user(self) -> Any:
        import pandas as pd

        return pd.read_parquet(self.per_user_path)


def checkpoint_dir(repo_root: Path, model: str) -> Path:
    return Layout(repo_root).model_dir(validate_name(model, "model name"))


def prepared_dir(repo_root: Path) -> Path:
    return Layout(repo_root).prepared


def read_eval_outputs(repo_root: Path, model: str) -> StoredEval | None:
    """`metrics/<model>.json` + `artifacts/eval/<model>/per_user.parquet`, or None when either is absent.

    Reusing the stage's outputs keeps the test split scored once; the fingerprint inside the metrics file
    says which evaluation set the numbers belong to.
    """
    validate_name(model, "model name")
    paths = Layout(repo_root)
    metrics_path, per_user_path = paths.metrics(model), paths.per_user(model)
    if not metrics_path.is_file() or not per_user_path.is_file():
        return None
    try:
        raw = json.loads(metrics_path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise PromotionError(f"{metrics_path} is not valid JSON: {err}") from err
    fingerprint = raw.pop("eval_fingerprint", None) if isinstance(raw, dict) else None
    if not isinstance(fingerprint, str) or not fingerprint:
        raise PromotionError(f"{metrics_path} has no eval_fingerprint; re-run the evaluate stage")
    scored = raw.pop(CHECKPOINT_SHA256, None)
    metrics = {k: v for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return StoredEval(metrics, per_user_path, fingerprint, scored if isinstance(scored, str) else None)


def check_scored(root: Path, directory: Path, evaluation: StoredEval, model: str) -> None:
    """The metrics are of the checkpoint in `directory`: the digest the evaluate stage recorded of what it
    scored is the directory's now. A checkpoint retrained or resumed since (`recsys train` by hand), or
    damaged, was registered and gated with another checkpoint's numbers (a truncated one became champion).
    The refusal names both ways on: score the checkpoint as it is (`recsys evaluate`; `dvc repro` would first
    put back the one dvc.lock records, discarding a checkpoint trained by hand), or go back to that one."""
    paths = Layout(root)
    params = "" if root.resolve() == Path.cwd().resolve() else f" --params {paths.params}"
    again = (f"score the checkpoint as it is with `recsys evaluate --model {model}{params}`, or go back to the "
             f"one dvc.lock records with `dvc repro evaluate@{model}`; then promote")
    metrics = paths.metrics(model)
    if evaluation.checkpoint_sha256 is None:
        raise PromotionError(f"{metrics} does not say which checkpoint it scored (written before that was "
                             f"recorded): {again}")
    try:
        now = directory_digest(directory)
    except (OSError, DigestError) as err:
        raise PromotionError(f"cannot read the checkpoint {directory}: {err}") from err
    if now != evaluation.checkpoint_sha256:
        raise PromotionError(f"{metrics} scored another checkpoint (sha256 "
                             f"{evaluation.checkpoint_sha256[:12]}) than {directory} holds now ({now[:12]}): it "
                             f"was trained again, resumed or changed since: {again}")


def rescore_on(params: Params, prepared: Path) -> RescoreFn:
    """Re-score a champion checkpoint on `prepared`'s test split, with the candidate's evaluation settings,
    on the device its model's evaluate stage uses (its `train.device`, with `train.cpu_allocator`): the
    champion's number is then measured where the candidate's was. `cuda` where this
    process sees none — the coordinator of a pool of GPU workers (`--fan-out`) — is the CPU here."""

    def rescore(checkpoint: Path) -> Any:
        from recsys.checkpoint import read_meta  # lazy: pulls in torch and the models
        from recsys.evaluate import score_test_split

        return score_test_split(checkpoint, prepared, params, str(read_meta(checkpoint)["model"]),
                                cuda_absent_is_cpu=True)

    return rescore


def _stage_outputs(
    root: Path, params: Params, model: str, dataset_version: str | None
) -> tuple[Path, StoredEval | None, Lineage | None]:
    directory = checkpoint_dir(root, model)
    result = read_eval_outputs(root, model)
    if result is None:
        return directory, None, None
    return directory, result, capture(root, params, model, read_meta(directory), dataset_version)


def promote_candidate(
    repo_root: Path,
    params: Params,
    model: str,
    *,
    baseline: str = BASELINE,
    dataset_version: str | None = None,
    rescore: RescoreFn | None = None,
    trained_by_dvc: bool = False,
) -> PromotionDecision:
    """Register `model`'s checkpoint with its lineage and gate it against the champion (see the module
    docstring). `dataset_version` overrides the DVC version of the raw store (data.dvc's); `trained_by_dvc`
    (the retrain flow, whose stages only `dvc repro` runs) takes the version dvc.lock says `prepare` ran on
    instead, which an ingest since has not moved on as it has data.dvc. `rescore` overrides the default
    re-scoring on `artifacts/prepared`. The decision's `champion_rescored_metric` is the champion's value
    the gate compared."""
    root = Path(repo_root)
    params.model_config(validate_name(model, "model name"))  # unknown: the known ones, not a stage to run
    # an unknown baseline was ignored, or the candidate gated against nothing: refused as an unknown model is
    params.model_config(validate_name(baseline, "baseline model name"))
    check_baseline(baseline)
    # Under the workspace lock: a `dvc repro` or an ingest in this workspace (another deployment's run) cannot
    # replace a model's checkpoint or metrics, or move data.dvc on, between reading them and registering them.
    with workspace_lock(root), database_errors(f"cannot promote {model!r}", registry_url(params.registry)):
        if trained_by_dvc and dataset_version is None:
            dataset_version = trained_data_version(root)  # None without a record: data.dvc's
        return _promote_locked(root, params, model, baseline, dataset_version, rescore)


def check_baseline(name: str) -> None:
    """A baseline becomes champion without passing the gate, so only a model that learns by counting may be
    one: any other (`--baseline sasrec`) would let a model the gate refused serve."""
    if TRAINABLE.get(name, True):
        counting = ", ".join(sorted(m for m, trainable in TRAINABLE.items() if not trainable))
        raise PromotionError(f"{name} cannot be the baseline: a baseline is champion without passing the gate, "
                             f"so it must be a model that learns by counting ({counting}; the default is "
                             f"{BASELINE})")


def _promote_locked(
    root: Path, params: Params, model: str, baseline: str, dataset_version: str | None,
    rescore: RescoreFn | None,
) -> PromotionDecision:
    candidate_dir, candidate, lineage = _stage_outputs(root, params, model, dataset_version)
    if candidate is None or lineage is None:
        raise PromotionError(
            f"no evaluation for {model!r} (metrics/{model}.json, artifacts/eval/{model}/per_user.parquet); "
            f"run `dvc repro evaluate@{model}` first"
        )
    check_scored(root, candidate_dir, candidate, model)
    if tries := cold_tries(root, params):
        lineage = dataclasses.replace(lineage, params={**lineage.params, COLD_TRIES: tries})
    baseline_dir, baseline_result, baseline_lineage = _stage_outputs(root, params, baseline, dataset_version)
    test_from = _test_from(prepared_dir(root))
    with open_registry(params.registry, root, params.gate) as registry:
        # Refuse before anything is copied: neither artifact lands in the store if either is invalid.
        registry.check_registration(candidate_dir, candidate, **lineage.as_kwargs())
        if baseline_result is not None and baseline_lineage is not None:
            check_scored(root, baseline_dir, baseline_result, baseline)
            registry.check_registration(baseline_dir, baseline_result, **baseline_lineage.as_kwargs())
            before = registry.champion_version() if model == baseline else None
            installed = registry.install_baseline(baseline_dir, baseline_result,
                                                  **baseline_lineage.as_kwargs())
            if model == baseline and installed is not None:
                # Promoting the baseline itself while no model has passed the gate: installing it is the whole
                # answer (gating it against itself recorded a second, `rejected`, event for the same version).
                return _baseline_installed(registry.get_version(installed), candidate, registry.gate.metric,
                                           replayed=before == installed)
        return registry.promote(
            candidate_dir, candidate, **lineage.as_kwargs(),
            baseline_result=baseline_result, baseline_kind=baseline,
            rescore=rescore or rescore_on(params, prepared_dir(root)),
            incomparable=lambda champion: _untrustworthy(champion, params, test_from),
        )


def cold_tries(root: Path, params: Params) -> list[dict[str, Any]]:
    """The periodic cold tries (recsys/warm.py's `cold_try_of`) among the workspace's checkpoints of the
    models params.yaml lists, as {"model", "version", "artifact_sha256"} of the source each stood in for. The
    gated version records them: only the best by validation is gated, so when it loses, each of them lost
    with it, and the next data version warm-starts again (recsys/warm_source.py's `cold_tried`)."""
    tries = []
    for m in params.models:
        if not TRAINABLE.get(m, False):
            continue
        try:
            init = read_meta(checkpoint_dir(root, m)).get("init")
        except RegistryError:  # not trained in this workspace (yet)
            continue
        tried = init.get(COLD_TRY_OF) if isinstance(init, dict) else None
        if isinstance(tried, dict) and isinstance(tried.get("artifact_sha256"), str):
            tries.append({"model": m, "version": tried.get("version"),
                          "artifact_sha256": tried["artifact_sha256"]})
    return tries


def _untrustworthy(champion: Any, params: Params, test_from: float | None) -> str | None:
    """Why the champion's score on today's test split cannot be trusted, or None: trained under other split
    settings, or on events from today's global_time test cut on (late-arriving data moved it earlier), it may
    have learnt today's test events, and its re-scored figure would be inflated."""
    changed = split_otherwise(champion, params.prepare)
    if changed is not None:
        return (f"was trained on data prepared otherwise ({changed}), so today's test events may be among "
                "those it learnt")
    return late_data_leak((champion.params or {}).get("train_until"), test_from, "test")


def _test_from(prepared: Path) -> float | None:
    """Today's global_time test cut from the prepared dataset's fingerprint.json (None: loo, or none written)."""
    try:
        value = json.loads((prepared / PREPARED_FINGERPRINT).read_text(encoding="utf-8")).get("test_from")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _baseline_installed(
    version: Any, evaluation: StoredEval, metric: str, replayed: bool
) -> PromotionDecision:
    """The decision `promote_candidate` reports for the baseline model when it is (now) the champion."""
    return PromotionDecision(
        promoted=True, decision="promoted",
        reason=f"v{version.version} ({version.architecture}) is the baseline champion: it serves until a "
               "model passes the gate (a baseline is installed, not gated against itself)",
        version=version.version, artifact_sha256=version.artifact_sha256,
        eval_fingerprint=evaluation.eval_fingerprint, metric=metric,
        candidate_metric=evaluation.metrics.get(metric), baseline_metric=None, baseline_version=None,
        baseline_kind=None, delta=None, p_value=None, replayed=replayed,
    )
