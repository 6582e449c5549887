"""The model registry: versions, the `champion` alias, and the compare-and-promote transaction.

`promote` in three steps, each safe to repeat after a crash:
1. store the checkpoint content-addressed (`ArtifactStore.put`, idempotent);
2. register the version under the model's write lock — its number is allocated inside that locked
   transaction (max + 1, backed by a unique constraint), and the same artifact always maps to the same
   version, so a re-run never mints a second one;
3. gate + alias move + event in one locked transaction. The champion is re-scored on the candidate's
   evaluation set *before* taking the lock (evaluation is slow; holding a write lock through it would
   stall every other writer); inside the lock the champion is re-read and, if it changed meanwhile, the
   transaction is abandoned and step 3 retried against the new champion. A decision already recorded for
   (this artifact, this evaluation fingerprint) is returned as is, never decided twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from recsys.config import ConfigError, GateConfig, RegistryConfig, validate_name
from recsys.gate import GateDecision, Scores, decide
from recsys.registry import migrate
from recsys.registry.db import (
    CHAMPION,
    Alias,
    Evaluation,
    ModelVersion,
    PromotionEvent,
    RegisteredModel,
    locked_session,
    make_engine,
    read_session,
    resolve_url,
    session_scope,
    utcnow,
)
from recsys.registry.store import ArtifactStore, StoredArtifact

log = logging.getLogger(__name__)

EvaluateFn = Callable[..., Any]
_MAX_ATTEMPTS = 20
_NON_METRIC_COLUMNS = {"user_id", "user", "rank"}


class RegistryError(Exception):
    """A registry operation cannot be done; the message says why."""


class NotFoundError(RegistryError):
    pass


class RollbackError(RegistryError):
    pass


class _ChampionChanged(Exception):
    """Internal: the champion moved between scoring it and taking the lock; decide again."""


@dataclass(frozen=True)
class PromotionDecision:
    promoted: bool
    decision: str  # "promoted" | "rejected"
    reason: str
    version: int
    artifact_sha256: str
    eval_fingerprint: str | None
    metric: str
    candidate_metric: float | None
    baseline_metric: float | None
    baseline_version: int | None
    baseline_kind: str | None
    delta: float | None
    p_value: float | None
    # True when this decision had already been recorded by an earlier run and was only read back.
    replayed: bool = False


@dataclass(frozen=True)
class VersionInfo:
    version: int
    architecture: str
    status: str
    is_champion: bool
    metrics: dict[str, Any]
    eval_fingerprint: str | None
    artifact_uri: str
    artifact_sha256: str
    dataset_version: str | None
    dataset_fingerprint: str | None
    code_version: str | None
    params: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class EventInfo:
    id: int
    decision: str
    candidate_version: int
    baseline_version: int | None
    baseline_kind: str | None
    metric: str
    candidate_metric: float | None
    baseline_metric: float | None
    delta: float | None
    p_value: float | None
    eval_fingerprint: str | None
    reason: str
    created_at: datetime


@dataclass(frozen=True)
class _Champion:
    version_id: int
    version: int
    artifact_sha256: str


# --- conversions -----------------------------------------------------------------------------------------


def _as_utc(moment: datetime) -> datetime:
    """SQLite hands timestamps back without a zone; every stored time is UTC."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def _finite_or_none(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _clean_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float | None]:
    """JSON-safe metrics: NaN/inf become null (PostgreSQL JSON rejects NaN; null reads as 'missing')."""
    return {str(k): _finite_or_none(v) for k, v in (metrics or {}).items()}


def _metric_value(metrics: Mapping[str, Any] | None, metric: str) -> float | None:
    if not metrics or metric not in metrics or metrics[metric] is None:
        return None
    try:
        return float(metrics[metric])  # NaN stays NaN: the gate reports it as such
    except (TypeError, ValueError):
        return None


def _per_user_columns(per_user: Any) -> dict[str, list[Any]] | None:
    """A per-user DataFrame as column lists keyed by raw `user_id` (metric columns only)."""
    if per_user is None or not hasattr(per_user, "columns") or "user_id" not in per_user.columns:
        return None
    columns: dict[str, list[Any]] = {"user_id": [str(u) for u in per_user["user_id"].tolist()]}
    for name in per_user.columns:
        if name in _NON_METRIC_COLUMNS:
            continue
        values = per_user[name]
        if values.dtype.kind not in "fiub":
            continue
        columns[str(name)] = [_finite_or_none(v) for v in values.tolist()]
    return columns


def _per_user_map(columns: Mapping[str, list[Any]] | None, metric: str) -> dict[str, float] | None:
    if not columns or metric not in columns or "user_id" not in columns:
        return None
    users = columns["user_id"]
    if len(set(users)) != len(users):
        return None  # ambiguous pairing; the gate reports per-user values as unusable
    return {u: (math.nan if v is None else float(v)) for u, v in zip(users, columns[metric])}


def _read_meta(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "model.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise RegistryError(f"{checkpoint} is not a checkpoint: model.json is missing") from err
    except ValueError as err:
        raise RegistryError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(meta, dict):
        raise RegistryError(f"{path}: expected a JSON object")
    return meta


def git_code_version(repo_root: Path) -> str | None:
    """The commit the code was at (with '-dirty' if tracked files changed); None outside a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo_root, capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _default_evaluate_fn() -> EvaluateFn:
    from recsys.evaluate import evaluate_checkpoint  # lazy: pulls in torch and the models

    return evaluate_checkpoint


def _decision_from_event(
    event: PromotionEvent, version: ModelVersion, baseline_version: int | None, replayed: bool = False
) -> PromotionDecision:
    """The decision as callers see it — read from the event row, whether just written or replayed."""
    return PromotionDecision(
        promoted=event.decision == "promoted",
        decision=event.decision,
        reason=event.reason,
        version=version.version,
        artifact_sha256=version.artifact_sha256,
        eval_fingerprint=event.eval_fingerprint,
        metric=event.metric,
        candidate_metric=event.candidate_metric,
        baseline_metric=event.baseline_metric,
        baseline_version=baseline_version,
        baseline_kind=event.baseline_kind,
        delta=event.delta,
        p_value=event.p_value,
        replayed=replayed,
    )


# --- the registry ----------------------------------------------------------------------------------------


class Registry:
    def __init__(
        self,
        engine: Engine,
        store: ArtifactStore,
        model_name: str,
        gate: GateConfig | None = None,
        repo_root: Path | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.model_name = validate_name(model_name, "model name")
        self.gate = gate or GateConfig()
        self.repo_root = Path(repo_root) if repo_root is not None else Path.cwd()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- model row --

    def _ensure_model(self) -> None:
        with read_session(self.engine) as session:
            exists = session.scalar(select(RegisteredModel.id).where(RegisteredModel.name == self.model_name))
            if exists is not None:
                return
        try:
            with session_scope(self.engine) as session:
                session.add(RegisteredModel(name=self.model_name))
        except IntegrityError:
            pass  # another process created it first; that is all we wanted

    def _model_id(self, session: Session) -> int | None:
        return session.scalar(select(RegisteredModel.id).where(RegisteredModel.name == self.model_name))

    # -- registration --

    def register(
        self,
        candidate_dir: Path,
        eval_result: Any,
        *,
        params: Mapping[str, Any] | None = None,
        dataset_version: str | None = None,
        code_version: str | None = None,
    ) -> tuple[int, StoredArtifact]:
        """Store the checkpoint and register it as a version, or find the existing one.

        Returns (version number, stored artifact).
        """
        stored = self.store.put(Path(candidate_dir))
        meta = _read_meta(stored.path)
        architecture = validate_name(str(meta.get("model")), "architecture")
        if dataset_version is not None and len(dataset_version) > 128:
            raise RegistryError("dataset_version is longer than 128 characters")
        fingerprint = getattr(eval_result, "eval_fingerprint", None) or None
        metrics = _clean_metrics(getattr(eval_result, "metrics", None))
        per_user = _per_user_columns(getattr(eval_result, "per_user", None))
        version_params = json.loads(json.dumps(dict(params) if params else {"model": meta.get("config")}))
        dataset_fp = meta.get("dataset_fingerprint")
        self._ensure_model()
        with locked_session(self.engine, self.model_name) as (session, model):
            version = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.model_id == model.id, ModelVersion.artifact_sha256 == stored.sha256
                )
            ).one_or_none()
            if version is None:
                last = session.scalar(
                    select(func.max(ModelVersion.version)).where(ModelVersion.model_id == model.id)
                )
                version = ModelVersion(
                    model_id=model.id,
                    version=(last or 0) + 1,
                    architecture=architecture,
                    params=version_params,
                    artifact_uri=stored.uri,
                    artifact_sha256=stored.sha256,
                    dataset_version=dataset_version,
                    dataset_fingerprint=str(dataset_fp) if dataset_fp is not None else None,
                    code_version=code_version,
                    metrics=metrics,
                    eval_fingerprint=fingerprint,
                    status="registered",
                )
                session.add(version)
                session.flush()
                log.info("registered model=%s version=%d sha256=%s", self.model_name, version.version,
                         stored.sha256[:12])
            if fingerprint is not None:
                self._add_evaluation(session, version.id, fingerprint, metrics, per_user, "registration")
            return version.version, stored

    @staticmethod
    def _add_evaluation(
        session: Session,
        version_id: int,
        fingerprint: str,
        metrics: dict[str, Any],
        per_user: dict[str, Any] | None,
        source: str,
    ) -> None:
        exists = session.scalar(
            select(Evaluation.id).where(
                Evaluation.version_id == version_id, Evaluation.eval_fingerprint == fingerprint
            )
        )
        if exists is None:
            session.add(
                Evaluation(
                    version_id=version_id,
                    eval_fingerprint=fingerprint,
                    metrics=metrics,
                    per_user=per_user,
                    source=source,
                )
            )

    # -- promotion --

    def promote(
        self,
        candidate_dir: Path,
        eval_result: Any,
        *,
        params: Mapping[str, Any] | None = None,
        mostpop_result: Any = None,
        dataset_version: str | None = None,
        evaluate_fn: EvaluateFn | None = None,
        prepared_dir: Path | None = None,
        code_version: str | None = None,
    ) -> PromotionDecision:
        number, stored = self.register(
            candidate_dir, eval_result, params=params, dataset_version=dataset_version,
            code_version=code_version,
        )
        metric = self.gate.metric
        fingerprint = getattr(eval_result, "eval_fingerprint", None) or None
        candidate = Scores(
            _metric_value(getattr(eval_result, "metrics", None), metric),
            fingerprint,
            _per_user_map(_per_user_columns(getattr(eval_result, "per_user", None)), metric),
        )
        replay = self._recorded_decision(stored.sha256, fingerprint)
        if replay is not None:
            return replay
        prepared = Path(prepared_dir) if prepared_dir is not None else self.repo_root / "artifacts/prepared"

        for _attempt in range(_MAX_ATTEMPTS):
            champion = self._champion()
            baseline: Scores | None = None
            if champion is not None and champion.artifact_sha256 != stored.sha256:
                baseline = (
                    self._champion_scores(champion, fingerprint, evaluate_fn, prepared)
                    if fingerprint
                    else Scores(None, None)
                )
            try:
                return self._decide_locked(stored.sha256, fingerprint, candidate, champion, baseline,
                                           mostpop_result)
            except _ChampionChanged:
                log.info("champion changed while scoring it; deciding again")
        raise RegistryError(f"the champion kept changing; gave up after {_MAX_ATTEMPTS} attempts")

    def _recorded_decision(self, sha256: str, fingerprint: str | None) -> PromotionDecision | None:
        with read_session(self.engine) as session:
            model_id = self._model_id(session)
            version = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.model_id == model_id, ModelVersion.artifact_sha256 == sha256
                )
            ).one_or_none()
            if version is None:
                return None
            return self._find_decision(session, version, fingerprint)

    def _find_decision(
        self, session: Session, version: ModelVersion, fingerprint: str | None
    ) -> PromotionDecision | None:
        event = session.scalars(
            select(PromotionEvent)
            .where(
                PromotionEvent.candidate_version_id == version.id,
                PromotionEvent.eval_fingerprint == fingerprint,  # `IS NULL` when None
                PromotionEvent.decision.in_(("promoted", "rejected")),
                # A decision is only replayed under the same gate: new thresholds deserve a new decision.
                PromotionEvent.metric == self.gate.metric,
                PromotionEvent.min_delta == self.gate.min_delta,
                PromotionEvent.significance == self.gate.significance,
                PromotionEvent.alpha == self.gate.alpha,
            )
            .order_by(PromotionEvent.id)
            .limit(1)
        ).one_or_none()
        if event is None:
            return None
        baseline_number = (
            session.scalar(select(ModelVersion.version).where(ModelVersion.id == event.baseline_version_id))
            if event.baseline_version_id is not None
            else None
        )
        return _decision_from_event(event, version, baseline_number, replayed=True)

    def _champion(self) -> _Champion | None:
        with read_session(self.engine) as session:
            return self._champion_in(session)

    def _champion_in(self, session: Session) -> _Champion | None:
        row = session.execute(
            select(ModelVersion.id, ModelVersion.version, ModelVersion.artifact_sha256)
            .join(Alias, Alias.version_id == ModelVersion.id)
            .join(RegisteredModel, RegisteredModel.id == Alias.model_id)
            .where(RegisteredModel.name == self.model_name, Alias.alias == CHAMPION)
        ).one_or_none()
        return None if row is None else _Champion(row.id, row.version, row.artifact_sha256)

    def _champion_scores(
        self,
        champion: _Champion,
        fingerprint: str,
        evaluate_fn: EvaluateFn | None,
        prepared_dir: Path,
    ) -> Scores:
        """The champion's scores on the candidate's evaluation set, re-scoring it if never done before."""
        metric = self.gate.metric
        with read_session(self.engine) as session:
            evaluation = session.scalars(
                select(Evaluation).where(
                    Evaluation.version_id == champion.version_id, Evaluation.eval_fingerprint == fingerprint
                )
            ).one_or_none()
            if evaluation is not None:
                return Scores(
                    _metric_value(evaluation.metrics, metric),
                    fingerprint,
                    _per_user_map(evaluation.per_user, metric),
                )
        # Data changed since the champion was scored: score it again on the candidate's evaluation set.
        checkpoint = self.store.verify(champion.artifact_sha256)
        evaluate = evaluate_fn or _default_evaluate_fn()
        log.info("re-scoring champion v%d on evaluation set %s", champion.version, fingerprint[:12])
        result = evaluate(checkpoint, prepared_dir, split="test")
        got = getattr(result, "eval_fingerprint", None)
        if got != fingerprint:
            raise RegistryError(
                f"re-scoring champion v{champion.version} on {prepared_dir} gave evaluation set "
                f"{str(got)[:12]}, but the candidate was evaluated on {fingerprint[:12]}: evaluate both on "
                "the same prepared data"
            )
        metrics = _clean_metrics(getattr(result, "metrics", None))
        per_user = _per_user_columns(getattr(result, "per_user", None))
        try:
            with session_scope(self.engine) as session:
                self._add_evaluation(session, champion.version_id, fingerprint, metrics, per_user, "rescore")
        except IntegrityError:
            pass  # a concurrent promoter stored the same re-score
        return Scores(
            _metric_value(getattr(result, "metrics", None), metric),
            fingerprint,
            _per_user_map(per_user, metric),
        )

    def _decide_locked(
        self,
        sha256: str,
        fingerprint: str | None,
        candidate: Scores,
        champion: _Champion | None,
        baseline: Scores | None,
        mostpop_result: Any,
    ) -> PromotionDecision:
        gate = self.gate
        with locked_session(self.engine, self.model_name) as (session, model):
            version = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.model_id == model.id, ModelVersion.artifact_sha256 == sha256
                )
            ).one()
            recorded = self._find_decision(session, version, fingerprint)
            if recorded is not None:
                return recorded
            current = self._champion_in(session)
            if (current.version_id if current else None) != (champion.version_id if champion else None):
                raise _ChampionChanged  # rolls the transaction back; nothing was written

            baseline_kind: str | None
            baseline_version_id: int | None
            if current is not None and current.version_id == version.id:
                outcome = GateDecision(
                    False, f"v{version.version} is already the champion", candidate.metric_value
                )
                baseline_kind, baseline_version_id = "champion", current.version_id
            elif current is not None:
                outcome = decide(candidate, baseline, gate, baseline_label=f"champion v{current.version}")
                baseline_kind, baseline_version_id = "champion", current.version_id
            elif mostpop_result is None:
                outcome = GateDecision(
                    False,
                    "no champion yet and no MostPop result to beat: the first champion must beat MostPop "
                    "on the same evaluation set",
                    candidate.metric_value,
                )
                baseline_kind, baseline_version_id = None, None
            else:
                mostpop = Scores(
                    _metric_value(getattr(mostpop_result, "metrics", None), gate.metric),
                    getattr(mostpop_result, "eval_fingerprint", None) or None,
                    _per_user_map(_per_user_columns(getattr(mostpop_result, "per_user", None)), gate.metric),
                )
                outcome = decide(candidate, mostpop, gate, baseline_label="MostPop")
                baseline_kind, baseline_version_id = "mostpop", None

            decision = "promoted" if outcome.promote else "rejected"
            if outcome.promote:
                self._move_champion(session, model.id, version.id)
                version.status = "promoted"
            elif version.status == "registered":
                version.status = "rejected"
            event = PromotionEvent(
                model_id=model.id,
                candidate_version_id=version.id,
                baseline_version_id=baseline_version_id,
                baseline_kind=baseline_kind,
                metric=gate.metric,
                candidate_metric=_finite_or_none(outcome.candidate_metric),
                baseline_metric=_finite_or_none(outcome.baseline_metric),
                eval_fingerprint=fingerprint,
                delta=_finite_or_none(outcome.delta),
                p_value=_finite_or_none(outcome.p_value),
                min_delta=gate.min_delta,
                significance=gate.significance,
                alpha=gate.alpha,
                decision=decision,
                reason=outcome.reason,
            )
            session.add(event)
            log.info("gate model=%s version=%d decision=%s reason=%s", self.model_name, version.version,
                     decision, outcome.reason)
            return _decision_from_event(event, version, current.version if current is not None else None)

    @staticmethod
    def _move_champion(session: Session, model_id: int, version_id: int) -> None:
        alias = session.scalars(
            select(Alias).where(Alias.model_id == model_id, Alias.alias == CHAMPION)
        ).one_or_none()
        if alias is None:
            session.add(Alias(model_id=model_id, alias=CHAMPION, version_id=version_id))
        else:
            alias.version_id = version_id
            alias.updated_at = utcnow()

    # -- rollback --

    def rollback(self, to_version: int | None = None) -> EventInfo:
        """Move the champion back to the previous champion, or to `to_version` (a once-promoted version).

        "Previous" replays the alias history as a stack: promotions push, a rollback pops back to its
        target — so rolling back twice goes two champions back rather than toggling between two.
        """
        self._ensure_model()
        with locked_session(self.engine, self.model_name) as (session, model):
            current = self._champion_in(session)
            if current is None:
                raise RollbackError("there is no champion to roll back")
            if to_version is None:
                stack = self._champion_stack(session, model.id)
                while stack and stack[-1] == current.version_id:
                    stack.pop()
                if not stack:
                    raise RollbackError(
                        f"champion v{current.version} has no previous champion to roll back to"
                    )
                target = session.get(ModelVersion, stack[-1])
                assert target is not None
            else:
                target = session.scalars(
                    select(ModelVersion).where(
                        ModelVersion.model_id == model.id, ModelVersion.version == to_version
                    )
                ).one_or_none()
                if target is None:
                    raise RollbackError(f"version {to_version} does not exist")
            if target.id == current.version_id:
                raise RollbackError(f"v{target.version} is already the champion")
            if target.status != "promoted":
                raise RollbackError(
                    f"v{target.version} was never promoted (status: {target.status}); only a former "
                    "champion can be rolled back to"
                )
            # Never point the champion at an artifact that could not be loaded.
            self.store.verify(target.artifact_sha256)
            champion_row = session.get(ModelVersion, current.version_id)
            assert champion_row is not None
            same_set = target.eval_fingerprint == champion_row.eval_fingerprint
            metric = self.gate.metric
            target_metric = _finite_or_none(target.metrics.get(metric))
            current_metric = _finite_or_none(champion_row.metrics.get(metric))
            self._move_champion(session, model.id, target.id)
            event = PromotionEvent(
                model_id=model.id,
                candidate_version_id=target.id,
                baseline_version_id=current.version_id,
                baseline_kind="champion",
                metric=metric,
                candidate_metric=target_metric,
                baseline_metric=current_metric if same_set else None,
                eval_fingerprint=target.eval_fingerprint if same_set else None,
                delta=(target_metric - current_metric)
                if same_set and target_metric is not None and current_metric is not None
                else None,
                decision="rollback",
                reason=f"manual rollback from v{current.version} to v{target.version}",
            )
            session.add(event)
            session.flush()
            log.info("rollback model=%s from=v%d to=v%d", self.model_name, current.version, target.version)
            return self._event_info(session, event)

    @staticmethod
    def _champion_stack(session: Session, model_id: int) -> list[int]:
        stack: list[int] = []
        events = session.execute(
            select(PromotionEvent.decision, PromotionEvent.candidate_version_id)
            .where(
                PromotionEvent.model_id == model_id,
                PromotionEvent.decision.in_(("promoted", "rollback")),
            )
            .order_by(PromotionEvent.id)
        ).all()
        for decision, version_id in events:
            if decision == "rollback" and version_id in stack:
                del stack[stack.index(version_id) + 1 :]
            else:
                stack.append(version_id)
        return stack

    # -- queries --

    def champion_version(self) -> int | None:
        champion = self._champion()
        return champion.version if champion else None

    def champion_dir(self) -> Path:
        """The champion's checkpoint directory, verified file by file (raises ArtifactIntegrityError)."""
        champion = self._champion()
        if champion is None:
            raise NotFoundError(f"model {self.model_name!r} has no champion yet")
        return self.store.verify(champion.artifact_sha256)

    def version_dir(self, version: int) -> Path:
        return self.store.verify(self.get_version(version).artifact_sha256)

    def load_champion(self) -> tuple[Any, dict[str, Any]]:
        """Verify every file of the champion's artifact, then rebuild the model from it."""
        from recsys.checkpoint import load_model  # lazy: pulls in torch

        return load_model(self.champion_dir())

    def list_versions(self) -> list[VersionInfo]:
        with read_session(self.engine) as session:
            champion = self._champion_in(session)
            rows = session.scalars(
                select(ModelVersion)
                .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                .where(RegisteredModel.name == self.model_name)
                .order_by(ModelVersion.version)
            ).all()
            return [self._version_info(v, champion) for v in rows]

    def get_version(self, version: int) -> VersionInfo:
        with read_session(self.engine) as session:
            row = session.scalars(
                select(ModelVersion)
                .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                .where(RegisteredModel.name == self.model_name, ModelVersion.version == version)
            ).one_or_none()
            if row is None:
                raise NotFoundError(f"version {version} of model {self.model_name!r} does not exist")
            return self._version_info(row, self._champion_in(session))

    def history(self, limit: int | None = None) -> list[EventInfo]:
        """Promotion events, oldest first (the last `limit` when given)."""
        with read_session(self.engine) as session:
            query = (
                select(PromotionEvent)
                .join(RegisteredModel, RegisteredModel.id == PromotionEvent.model_id)
                .where(RegisteredModel.name == self.model_name)
                .order_by(PromotionEvent.id.desc())
            )
            if limit is not None:
                query = query.limit(limit)
            events = list(reversed(session.scalars(query).all()))
            return [self._event_info(session, e) for e in events]

    @staticmethod
    def _version_info(row: ModelVersion, champion: _Champion | None) -> VersionInfo:
        return VersionInfo(
            version=row.version,
            architecture=row.architecture,
            status=row.status,
            is_champion=champion is not None and champion.version_id == row.id,
            metrics=dict(row.metrics or {}),
            eval_fingerprint=row.eval_fingerprint,
            artifact_uri=row.artifact_uri,
            artifact_sha256=row.artifact_sha256,
            dataset_version=row.dataset_version,
            dataset_fingerprint=row.dataset_fingerprint,
            code_version=row.code_version,
            params=dict(row.params or {}),
            created_at=_as_utc(row.created_at),
        )

    @staticmethod
    def _event_info(session: Session, event: PromotionEvent) -> EventInfo:
        def number(version_id: int | None) -> int | None:
            if version_id is None:
                return None
            return session.scalar(select(ModelVersion.version).where(ModelVersion.id == version_id))

        return EventInfo(
            id=event.id,
            decision=event.decision,
            candidate_version=number(event.candidate_version_id),  # type: ignore[arg-type]
            baseline_version=number(event.baseline_version_id),
            baseline_kind=event.baseline_kind,
            metric=event.metric,
            candidate_metric=event.candidate_metric,
            baseline_metric=event.baseline_metric,
            delta=event.delta,
            p_value=event.p_value,
            eval_fingerprint=event.eval_fingerprint,
            reason=event.reason,
            created_at=_as_utc(event.created_at),
        )


# --- entry points ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredEval:
    """An evaluation read back from the `evaluate` stage's outputs (same fields the gate uses)."""

    metrics: dict[str, float]
    per_user: Any
    eval_fingerprint: str


def read_eval_outputs(repo_root: Path, model: str) -> StoredEval | None:
    """`metrics/<model>.json` + `artifacts/eval/<model>/per_user.parquet`, or None when either is absent.

    Reusing the stage's outputs keeps the test split scored once; the fingerprint inside the metrics file
    says which evaluation set the numbers belong to.
    """
    import pandas as pd

    validate_name(model, "model name")
    metrics_path = Path(repo_root) / "metrics" / f"{model}.json"
    per_user_path = Path(repo_root) / "artifacts" / "eval" / model / "per_user.parquet"
    if not metrics_path.is_file() or not per_user_path.is_file():
        return None
    try:
        raw = json.loads(metrics_path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise RegistryError(f"{metrics_path} is not valid JSON: {err}") from err
    fingerprint = raw.pop("eval_fingerprint", None)
    if not isinstance(fingerprint, str) or not fingerprint:
        raise RegistryError(f"{metrics_path} has no eval_fingerprint; re-run the evaluate stage")
    metrics = {k: v for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return StoredEval(metrics, pd.read_parquet(per_user_path), fingerprint)


def open_registry(
    config: RegistryConfig, repo_root: Path, gate: GateConfig | None = None
) -> Registry:
    """Connect to the registry named by `config` (relative paths are under `repo_root`), migrating it to
    the latest schema first."""
    repo_root = Path(repo_root)
    validate_name(config.model_name, "registry.model_name")
    try:
        url = resolve_url(config.url, repo_root)
        engine = make_engine(url)
    except Exception as err:  # a malformed URL, a missing driver
        raise ConfigError(f"registry.url: cannot use {config.url!r}: {err}") from err
    migrate.upgrade(engine)
    artifact_root = Path(config.artifact_root)
    if not artifact_root.is_absolute():
        artifact_root = repo_root / artifact_root
    return Registry(engine, ArtifactStore(artifact_root), config.model_name, gate, repo_root)


def promote(
    candidate_dir: Path,
    eval_result: Any,
    *,
    params: Any,
    mostpop_result: Any = None,
    dataset_version: str | None = None,
    evaluate_fn: EvaluateFn | None = None,
    repo_root: Path | None = None,
    prepared_dir: Path | None = None,
    code_version: str | None = None,
) -> PromotionDecision:
    """Register `candidate_dir` and run the gate against the champion (or MostPop); record the decision.

    `params` is the project's `Params` (its `registry` and `gate` sections are used, and the model's
    training settings are stored with the version). `evaluate_fn(checkpoint_dir, prepared_dir,
    split="test")` re-scores the champion when the evaluation set changed (default:
    `recsys.evaluate.evaluate_checkpoint`).
    """

    root = Path(repo_root) if repo_root is not None else Path(".")
    candidate_dir = Path(candidate_dir)
    meta = _read_meta(candidate_dir)
    version_params: dict[str, Any] = {"model": meta.get("config")}
    train_config = getattr(params, "train_config", None)
    if callable(train_config) and isinstance(meta.get("model"), str):
        try:
            version_params["train"] = dataclasses.asdict(train_config(meta["model"]))
        except (ConfigError, TypeError):
            pass
    with open_registry(params.registry, root, params.gate) as registry:
        return registry.promote(
            candidate_dir,
            eval_result,
            params=version_params,
            mostpop_result=mostpop_result,
            dataset_version=dataset_version,
            evaluate_fn=evaluate_fn,
            prepared_dir=prepared_dir,
            code_version=code_version if code_version is not None else git_code_version(root),
        )
