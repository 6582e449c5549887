"""Rollback: the champion alias moves back to a former champion, recorded as an event like any decision."""

from __future__ import annotations

import logging
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from recsys.registry.db import ModelVersion, PromotionEvent, locked_session, move_champion
from recsys.registry.reads import MAX_STORED_VERSION, RegistryReads, held
from recsys.registry.records import EventInfo, RollbackError, event_info, finite_or_none

log = logging.getLogger(__name__)


def rollback(registry: RegistryReads, to_version: int | None = None) -> EventInfo:
    """Move the champion back to the previous champion, or to `to_version` (a once-promoted version).

    "Previous" replays the alias history as a stack: promotions push, a rollback pops back to its
    target — so rolling back twice goes two champions back rather than toggling between two.
    """
    with locked_session(registry.engine, registry.model_name) as (session, model):
        current = registry._champion_in(session)
        if current is None:
            raise RollbackError("there is no champion to roll back")
        if to_version is None:
            stack = _champion_stack(session, model.id)
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
            ).one_or_none() if 1 <= to_version <= MAX_STORED_VERSION else None
            if target is None:
                latest = session.scalar(select(func.max(ModelVersion.version))
                                        .where(ModelVersion.model_id == model.id))
                raise RollbackError(f"version {to_version} does not exist ({held(latest)})")
        if target.id == current.version_id:
            raise RollbackError(f"v{target.version} is already the champion")
        if target.status != "promoted":
            raise RollbackError(
                f"v{target.version} was never promoted (status: {target.status}); only a former "
                "champion can be rolled back to"
            )
        # Never point the champion at an artifact that could not be loaded.
        registry.store.verify(target.artifact_sha256)
        champion_row = session.get(ModelVersion, current.version_id)
        assert champion_row is not None
        same_set = target.eval_fingerprint == champion_row.eval_fingerprint
        metric = registry.gate.metric
        target_metric = finite_or_none(target.metrics.get(metric))
        current_metric = finite_or_none(champion_row.metrics.get(metric))
        move_champion(session, model.id, target.id)
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
        log.info("rollback model=%s from=v%d to=v%d", registry.model_name, current.version, target.version)
        return event_info(session, event)


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
