"""The baseline champion: the counting model that serves until a model passes the gate
(`Registry.install_baseline` registers it, then this makes it champion), recorded as an event like any
decision."""

from __future__ import annotations

import logging

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from recsys.registry.db import ModelVersion, PromotionEvent, locked_session, move_champion
from recsys.registry.reads import RegistryReads
from recsys.registry.records import BASELINE_ROLE, finite_or_none

log = logging.getLogger(__name__)


def make_baseline_champion(registry: RegistryReads, number: int, sha256: str, metric: str) -> int | None:
    """Make the registered baseline version `number` (artifact `sha256`) champion while no model has passed
    the gate (no champion, or the champion is an older baseline): its version, or None when a gated model is
    champion (nothing happens then). Recorded as a `promoted` event without a gate comparison; repeating it
    changes nothing."""
    with locked_session(registry.engine, registry.model_name) as (session, model):
        version = session.scalars(
            select(ModelVersion).where(
                ModelVersion.model_id == model.id, ModelVersion.artifact_sha256 == sha256
            )
        ).one()
        current = registry._champion_in(session)
        if current is not None and current.version_id == version.id:
            return number
        if current is not None and current.role != BASELINE_ROLE:
            return None
        move_champion(session, model.id, version.id)
        version.status = "promoted"
        reason = (
            f"baseline champion: v{number} ({version.architecture}) serves until a model passes the gate"
            if current is None
            else f"baseline champion refreshed: v{number} ({version.architecture}) replaces baseline "
            f"v{current.version}; " + ("the champion had been rolled back to the baseline"
                                       if _a_model_passed(session, model.id)
                                       else "no model has passed the gate yet")
        )
        session.add(
            PromotionEvent(
                model_id=model.id,
                candidate_version_id=version.id,
                baseline_version_id=current.version_id if current else None,
                baseline_kind="champion" if current else None,
                metric=metric,
                candidate_metric=finite_or_none((version.metrics or {}).get(metric)),
                eval_fingerprint=version.eval_fingerprint,
                decision="promoted",
                reason=reason,
            )
        )
        log.info("baseline champion model=%s version=%d", registry.model_name, number)
        return number


def _a_model_passed(session: Session, model_id: int) -> bool:
    """Whether a model (not a baseline) was ever promoted through the gate."""
    return session.scalar(
        select(PromotionEvent.id)
        .join(ModelVersion, ModelVersion.id == PromotionEvent.candidate_version_id)
        .where(PromotionEvent.model_id == model_id, PromotionEvent.decision == "promoted",
               or_(ModelVersion.role.is_(None), ModelVersion.role != BASELINE_ROLE))
        .limit(1)
    ) is not None
