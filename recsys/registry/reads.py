"""The registry's read side: the champion, versions, history and recorded decisions (no writes here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from recsys.config import GateConfig, validate_name
from recsys.registry.db import (
    CHAMPION,
    Alias,
    ModelVersion,
    PromotionEvent,
    RegisteredModel,
    read_session,
)
from recsys.registry.records import (
    BASELINE_ROLE,
    Champion,
    EventInfo,
    NotFoundError,
    PromotionDecision,
    VersionInfo,
    decision_from_event,
    event_info,
    version_info,
)
from recsys.registry.store import ArtifactStore


# model_versions.version is an INTEGER column (32-bit on PostgreSQL): a larger number cannot name a version,
# and binding it would be a database error rather than "not found".
MAX_STORED_VERSION = 2**31 - 1


def held(latest: int | None) -> str:
    """What a registry holds, for a version that is not there."""
    if latest is None:
        return "the registry holds no versions yet"
    versions = f"versions 1–{latest}" if latest > 1 else "version 1"
    return f"the registry holds {versions}; `recsys registry list` shows them"


class RegistryReads:
    def __init__(
        self, engine: Engine, store: ArtifactStore, model_name: str, gate: GateConfig | None = None
    ) -> None:
        self.engine = engine
        self.store = store
        self.model_name = validate_name(model_name, "model name")
        self.gate = gate or GateConfig()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _model_id(self, session: Session) -> int | None:
        return session.scalar(select(RegisteredModel.id).where(RegisteredModel.name == self.model_name))

    # -- the champion --

    def _champion(self) -> Champion | None:
        with read_session(self.engine) as session:
            return self._champion_in(session)

    def _champion_in(self, session: Session) -> Champion | None:
        row = session.execute(
            select(ModelVersion.id, ModelVersion.version, ModelVersion.artifact_sha256, ModelVersion.role)
            .join(Alias, Alias.version_id == ModelVersion.id)
            .join(RegisteredModel, RegisteredModel.id == Alias.model_id)
            .where(RegisteredModel.name == self.model_name, Alias.alias == CHAMPION)
        ).one_or_none()
        return None if row is None else Champion(row.id, row.version, row.artifact_sha256, row.role)

    def champion_version(self) -> int | None:
        champion = self._champion()
        return champion.version if champion else None

    def champion_info(self) -> VersionInfo:
        champion = self._champion()
        if champion is None:
            raise NotFoundError(f"model {self.model_name!r} has no champion yet")
        return self.get_version(champion.version)

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

    def latest_baseline(self) -> VersionInfo | None:
        """The most recently registered version marked as the baseline, or None."""
        baselines = [v for v in self.list_versions() if v.role == BASELINE_ROLE]
        return baselines[-1] if baselines else None

    # -- versions and history --

    def list_versions(self) -> list[VersionInfo]:
        with read_session(self.engine) as session:
            champion = self._champion_in(session)
            rows = session.scalars(
                select(ModelVersion)
                .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                .where(RegisteredModel.name == self.model_name)
                .order_by(ModelVersion.version)
            ).all()
            return [version_info(v, champion) for v in rows]

    def get_version(self, version: int) -> VersionInfo:
        with read_session(self.engine) as session:
            row = session.scalars(
                select(ModelVersion)
                .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                .where(RegisteredModel.name == self.model_name, ModelVersion.version == version)
            ).one_or_none() if 1 <= version <= MAX_STORED_VERSION else None
            if row is None:
                latest = session.scalar(
                    select(func.max(ModelVersion.version))
                    .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                    .where(RegisteredModel.name == self.model_name))
                raise NotFoundError(f"version {version} of model {self.model_name!r} does not exist "
                                    f"({held(latest)})")
            return version_info(row, self._champion_in(session))

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
            return [event_info(session, e) for e in events]

    def champion_line(self) -> list[VersionInfo]:
        """Every version that became champion, in the order it did (a version appears again when promoted or
        rolled back to again); the last is the champion. Empty when there has never been one."""
        with read_session(self.engine) as session:
            champion = self._champion_in(session)
            ids = list(session.scalars(
                select(PromotionEvent.candidate_version_id)
                .join(RegisteredModel, RegisteredModel.id == PromotionEvent.model_id)
                .where(RegisteredModel.name == self.model_name,
                       PromotionEvent.decision.in_(("promoted", "rollback")))
                .order_by(PromotionEvent.id)
            ))
            if champion is not None and (not ids or ids[-1] != champion.version_id):
                ids.append(champion.version_id)  # a champion set without an event (never by this code)
            rows = {v.id: v for v in session.scalars(select(ModelVersion).where(ModelVersion.id.in_(set(ids))))}
            return [version_info(rows[i], champion) for i in ids]

    # -- recorded decisions --

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
            .order_by(PromotionEvent.id.desc())  # the latest: an outdated rejection is decided again
            .limit(1)
        ).one_or_none()
        if event is None:
            return None
        baseline_number = (
            session.scalar(select(ModelVersion.version).where(ModelVersion.id == event.baseline_version_id))
            if event.baseline_version_id is not None
            else None
        )
        return decision_from_event(event, version, baseline_number, replayed=True)
