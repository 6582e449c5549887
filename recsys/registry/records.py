"""What the registry hands back (decisions, versions, events), its errors, and the conversions between
evaluation results, database rows and JSON-safe values."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from recsys.registry.db import ModelVersion, PromotionEvent, masked_url

_NON_METRIC_COLUMNS = {"user_id", "user", "rank"}
BASELINE_ROLE = "baseline"


class RegistryError(Exception):
    """A registry operation cannot be done; the message says why."""


class RegistryDatabaseError(RegistryError):
    """The registry's database failed. `transient` when running again may succeed (a server refused or lost
    the connection, a busy SQLite file); a damaged file or refused credentials fail the same way again."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


# What a driver says when the failure may pass (psycopg's and sqlite3's wording).
_PASSING = ("could not connect", "connection refused", "connection timed out", "timeout expired", "timed out",
            "database is locked", "server closed the connection", "terminating connection", "connection reset",
            "the database system is starting up", "the database system is shutting down")


def database_failure(err: SQLAlchemyError, doing: str, url: str | None = None) -> RegistryDatabaseError:
    """One line naming what was being done and the registry (password masked), with the driver's first line
    only — never the SQL statement, its parameters or a traceback."""
    orig = getattr(err, "orig", None)
    lines = str(orig if orig is not None else err).strip().splitlines()
    detail = lines[0].strip() if lines else type(err).__name__
    if orig is None:
        detail = detail.split(" [SQL:")[0].split("(Background on this error")[0].strip()
    where = f" (registry {masked_url(url)})" if url else ""
    passing = isinstance(err, OperationalError) and (
        (isinstance(err, DBAPIError) and err.connection_invalidated)
        or any(words in detail.lower() for words in _PASSING))
    if "database is locked" in detail.lower():  # SQLite's writer lock, held past the 60 s busy timeout
        detail += (" (another process holds the SQLite registry's write lock — a promotion, a rollback, or a "
                   "program holding it open — past SQLite's 60 s wait; run again when it has finished)")
    return RegistryDatabaseError(f"{doing}: the registry database failed{where}: {detail}", passing)


@contextmanager
def database_errors(doing: str, url: str | None = None) -> Iterator[None]:
    """A SQLAlchemy error inside becomes a RegistryDatabaseError (`database_failure`): a user error the flows
    report in one line and retry only when it may pass."""
    try:
        yield
    except SQLAlchemyError as err:
        raise database_failure(err, doing, url) from err


class NotFoundError(RegistryError):
    pass


class RollbackError(RegistryError):
    pass


@dataclass(frozen=True)
class PromotionDecision:
    promoted: bool  # the candidate is the champion after this decision (False for a replayed `promoted`
    # decision whose version a rollback or a later promotion has replaced since)
    decision: str  # "promoted" | "rejected": what the gate decided
    reason: str
    version: int
    artifact_sha256: str
    eval_fingerprint: str | None
    metric: str
    candidate_metric: float | None
    # What the gate compared the candidate with: the champion on the candidate's evaluation set, or an
    # unregistered reference result when there was no champion.
    baseline_metric: float | None
    baseline_version: int | None
    baseline_kind: str | None
    delta: float | None
    p_value: float | None
    # True when this decision had already been recorded by an earlier run and was only read back.
    replayed: bool = False
    # The champion's gate metric re-scored on the candidate's evaluation set — the number the gate
    # actually compared (its stored metric may come from older data). None when no champion was compared.
    champion_rescored_metric: float | None = None


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
    role: str | None = None  # "baseline" for the reference model that serves until a model passes the gate

    @property
    def is_baseline(self) -> bool:
        return self.role == BASELINE_ROLE


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
class Champion:
    version_id: int
    version: int
    artifact_sha256: str
    role: str | None = None


# --- conversions -----------------------------------------------------------------------------------------


def as_utc(moment: datetime) -> datetime:
    """SQLite hands timestamps back without a zone; every stored time is UTC."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def finite_or_none(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def clean_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float | None]:
    """JSON-safe metrics: NaN/inf become null (PostgreSQL JSON rejects NaN; null reads as 'missing')."""
    return {str(k): finite_or_none(v) for k, v in (metrics or {}).items()}


def metric_value(metrics: Mapping[str, Any] | None, metric: str) -> float | None:
    if not metrics or metric not in metrics or metrics[metric] is None:
        return None
    try:
        return float(metrics[metric])  # NaN stays NaN: the gate reports it as such
    except (TypeError, ValueError):
        return None


def per_user_columns(per_user: Any) -> dict[str, list[Any]] | None:
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
        columns[str(name)] = [finite_or_none(v) for v in values.tolist()]
    return columns


def per_user_map(columns: Mapping[str, list[Any]] | None, metric: str) -> dict[str, float] | None:
    if not columns or metric not in columns or "user_id" not in columns:
        return None
    users = columns["user_id"]
    if len(set(users)) != len(users):
        return None  # ambiguous pairing; the gate reports per-user values as unusable
    return {u: (math.nan if v is None else float(v)) for u, v in zip(users, columns[metric])}


def read_meta(checkpoint: Path) -> dict[str, Any]:
    path = Path(checkpoint) / "model.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise RegistryError(f"{checkpoint} is not a checkpoint: model.json is missing") from err
    except ValueError as err:
        raise RegistryError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(meta, dict):
        raise RegistryError(f"{path}: expected a JSON object")
    return meta


def decision_from_event(
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
        champion_rescored_metric=event.baseline_metric if event.baseline_kind == "champion" else None,
    )


def version_info(row: ModelVersion, champion: Champion | None) -> VersionInfo:
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
        created_at=as_utc(row.created_at),
        role=row.role,
    )


def event_info(session: Session, event: PromotionEvent) -> EventInfo:
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
        created_at=as_utc(event.created_at),
    )
