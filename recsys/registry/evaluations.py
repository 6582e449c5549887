"""A version's scores on an evaluation set: recording them, looking them up, re-scoring a champion.

An evaluation set is named by its fingerprint (the prepared data's evaluation targets); a version has at most
one Evaluation row per fingerprint, and rows are never deleted. The gate compares a candidate and the
champion on the same set, so when the data changed since the champion was scored it is scored again
(`champion_scores` with the caller's `rescore`) — outside any write lock, because evaluation is slow.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from recsys.gate import Scores
from recsys.registry.db import Evaluation, ModelVersion, read_session, session_scope
from recsys.registry.records import (
    Champion,
    RegistryError,
    clean_metrics,
    metric_value,
    per_user_columns,
    per_user_map,
)
from recsys.registry.store import ArtifactStore

log = logging.getLogger(__name__)

# rescore(champion checkpoint dir) -> an evaluation result on the candidate's evaluation set.
RescoreFn = Callable[[Path], Any]


def scores_of(result: Any, metric: str) -> Scores:
    """The gate's view of an evaluation result: the metric, the set's fingerprint, per-user values."""
    return Scores(
        metric_value(getattr(result, "metrics", None), metric),
        getattr(result, "eval_fingerprint", None) or None,
        per_user_map(per_user_columns(getattr(result, "per_user", None)), metric),
    )


def has_evaluation(session: Session, model_id: int | None, artifact_sha256: str, fingerprint: str) -> bool:
    """Whether the model's version with this artifact was scored on this evaluation set."""
    found = session.scalar(
        select(Evaluation.id).join(ModelVersion, Evaluation.version_id == ModelVersion.id).where(
            ModelVersion.model_id == model_id,
            ModelVersion.artifact_sha256 == artifact_sha256, Evaluation.eval_fingerprint == fingerprint,
        ).limit(1)
    )
    return found is not None


def add_evaluation(
    session: Session,
    version_id: int,
    fingerprint: str,
    metrics: dict[str, Any],
    source: str,
    per_user: Callable[[], dict[str, Any] | None],
) -> None:
    """Record the evaluation unless it is there; `per_user()` gives its column lists, asked only then."""
    exists = session.scalar(
        select(Evaluation.id).where(Evaluation.version_id == version_id, Evaluation.eval_fingerprint == fingerprint)
    )
    if exists is None:
        session.add(
            Evaluation(
                version_id=version_id,
                eval_fingerprint=fingerprint,
                metrics=metrics,
                per_user=per_user(),
                source=source,
            )
        )


def champion_scores(
    engine: Engine,
    store: ArtifactStore,
    champion: Champion,
    fingerprint: str,
    rescore: RescoreFn | None,
    metric: str,
) -> Scores:
    """The champion's scores on the candidate's evaluation set, re-scoring it if never done before."""
    with read_session(engine) as session:
        evaluation = session.scalars(
            select(Evaluation).where(
                Evaluation.version_id == champion.version_id, Evaluation.eval_fingerprint == fingerprint
            )
        ).one_or_none()
        if evaluation is not None:
            return Scores(metric_value(evaluation.metrics, metric), fingerprint,
                          per_user_map(evaluation.per_user, metric))
    if rescore is None:
        raise RegistryError(
            f"champion v{champion.version} was never scored on evaluation set {fingerprint[:12]} and no "
            "re-scoring function was given"
        )
    # Data changed since the champion was scored: score it again on the candidate's evaluation set.
    checkpoint = store.verify(champion.artifact_sha256)
    log.info("re-scoring champion v%d on evaluation set %s", champion.version, fingerprint[:12])
    result = rescore(checkpoint)
    got = getattr(result, "eval_fingerprint", None)
    if got != fingerprint:
        raise RegistryError(
            f"re-scoring champion v{champion.version} gave evaluation set {str(got)[:12]}, but the "
            f"candidate was evaluated on {fingerprint[:12]}: evaluate both on the same prepared data"
        )
    metrics = clean_metrics(getattr(result, "metrics", None))
    per_user = per_user_columns(getattr(result, "per_user", None))
    try:
        with session_scope(engine) as session:
            add_evaluation(session, champion.version_id, fingerprint, metrics, "rescore", lambda: per_user)
    except IntegrityError:
        pass  # a concurrent promoter stored the same re-score
    return Scores(metric_value(getattr(result, "metrics", None), metric), fingerprint,
                  per_user_map(per_user, metric))
