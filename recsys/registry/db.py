"""Registry schema (SQLAlchemy 2 typed ORM) and engine helpers.

The schema itself is created and evolved only by the Alembic migrations shipped next to this module
(`recsys/registry/migrations`); `Base.metadata` is the model the migrations are checked against.

Concurrency: every write that reads-then-decides (version numbering, compare-and-promote, rollback) runs
in `locked_session`, which holds the database's write lock for the registered model:
SQLite — every transaction starts with `BEGIN IMMEDIATE` (the reserved lock is taken at BEGIN, not at the
first write, so two processes can never both read the same champion and then both write);
PostgreSQL — `SELECT ... FOR UPDATE` on the `registered_models` row (other models are not blocked).
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

log = logging.getLogger(__name__)

VERSION_STATUSES = ("registered", "promoted", "rejected")
DECISIONS = ("promoted", "rejected", "rollback")
CHAMPION = "champion"
# Alembic's bookkeeping table, named so it cannot collide with another app's in a shared database.
VERSION_TABLE = "registry_alembic_version"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class RegisteredModel(Base):
    __tablename__ = "registered_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "version", name="uq_model_versions_model_version"),
        # One version per artifact: re-registering the same checkpoint (a re-run after a crash, or the
        # same DVC-cached model) finds the existing version instead of minting a second one.
        UniqueConstraint("model_id", "artifact_sha256", name="uq_model_versions_model_artifact"),
        CheckConstraint("version >= 1", name="ck_model_versions_version_positive"),
        CheckConstraint(
            "status IN ('registered', 'promoted', 'rejected')", name="ck_model_versions_status"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registered_models.id"))
    version: Mapped[int] = mapped_column(Integer)
    architecture: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Relative to the registry's artifact root ("sha256/<hex>"), so a registry can be moved or cloned.
    artifact_uri: Mapped[str] = mapped_column(String(512))
    artifact_sha256: Mapped[str] = mapped_column(String(64))
    dataset_version: Mapped[str | None] = mapped_column(String(128))
    dataset_fingerprint: Mapped[str | None] = mapped_column(String(64))
    code_version: Mapped[str | None] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    eval_fingerprint: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="registered")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # "baseline": the reference model (MostPop) that is champion until a model passes the gate.
    role: Mapped[str | None] = mapped_column(String(16))


class Evaluation(Base):
    """A version's scores on one evaluation set: the registration-time evaluation and every re-score.

    Per-user values are kept because the paired significance test needs them for both sides; caching the
    champion's re-score means the next candidate on the same data does not re-evaluate it again.
    """

    __tablename__ = "evaluations"
    __table_args__ = (
        UniqueConstraint("version_id", "eval_fingerprint", name="uq_evaluations_version_fingerprint"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    eval_fingerprint: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    # {"user_id": [...], "<metric>": [...], ...}: column-oriented, aligned by position.
    per_user: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(String(16))  # "registration" | "rescore"
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Alias(Base):
    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("model_id", "alias", name="uq_aliases_model_alias"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registered_models.id"))
    alias: Mapped[str] = mapped_column(String(64))
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class PromotionEvent(Base):
    """Append-only (enforced by database triggers, see the migration): one row per gate decision/rollback."""

    __tablename__ = "promotion_events"
    __table_args__ = (
        CheckConstraint(
            "decision IN ('promoted', 'rejected', 'rollback')", name="ck_promotion_events_decision"
        ),
        Index("ix_promotion_events_candidate_fp", "candidate_version_id", "eval_fingerprint"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registered_models.id"))
    candidate_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    baseline_version_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    baseline_kind: Mapped[str | None] = mapped_column(String(16))  # "champion" | "mostpop" | None
    metric: Mapped[str] = mapped_column(String(32))
    candidate_metric: Mapped[float | None] = mapped_column(Float)
    baseline_metric: Mapped[float | None] = mapped_column(Float)
    eval_fingerprint: Mapped[str | None] = mapped_column(String(64))
    delta: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    min_delta: Mapped[float | None] = mapped_column(Float)
    significance: Mapped[bool | None] = mapped_column(Boolean)
    alpha: Mapped[float | None] = mapped_column(Float)
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def move_champion(session: Session, model_id: int, version_id: int) -> None:
    """Point the model's champion alias at `version_id` (inside the caller's locked session)."""
    alias = session.scalars(
        select(Alias).where(Alias.model_id == model_id, Alias.alias == CHAMPION)
    ).one_or_none()
    if alias is None:
        session.add(Alias(model_id=model_id, alias=CHAMPION, version_id=version_id))
    else:
        alias.version_id = version_id
        alias.updated_at = utcnow()


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def masked_url(url: str) -> str:
    """`url` fit to show in a message, a log or a work order: its password as `***`, the user-part's and a
    `?password=…` query's alike (both reach the driver) — also in a string SQLAlchemy cannot parse (the text
    between `scheme://user:` and the last `@`, and any `password…=` value). Unchanged when it holds none."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        hidden = re.sub(r"(://[^/:@]*:).*@", r"\1***@", url)
        return re.sub(r"([?&][^=&]*password[^=&]*=)[^&]*", r"\1***", hidden, flags=re.IGNORECASE)
    secret = {key: "***" for key in parsed.query if "password" in key.lower()}
    if parsed.password is None and not secret:
        return url
    return parsed.update_query_dict(secret).render_as_string(hide_password=True)


EMPTY_SQLITE = "sqlite://"  # an in-memory database: what a reader gets where no registry file exists yet


def resolve_url(url: str, repo_root: Path, read_only: bool = False) -> str:
    """Make a relative SQLite file path relative to `repo_root` and create its parent directory — or, for a
    reader (`read_only`), give an empty in-memory database where that file does not exist yet, so that
    looking at a registry nobody has written to creates nothing."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return url
    path = Path(database)
    if not path.is_absolute():
        path = Path(repo_root) / path
    if read_only and not path.exists():
        return EMPTY_SQLITE
    path.parent.mkdir(parents=True, exist_ok=True)
    return parsed.set(database=str(path)).render_as_string(hide_password=False)


def make_engine(url: str) -> Engine:
    """An engine whose transactions are safe for read-then-write decisions (see module docstring)."""
    if _is_sqlite(url):
        # A generous busy timeout: racing promoters wait for the write lock instead of failing.
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            # pysqlite's own BEGIN handling is deferred and skips DDL; turn it off and emit our own
            # (SQLAlchemy docs, "Serializable isolation / Savepoints / Transactional DDL").
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Writers take the write lock at BEGIN; pure reads (opted in via `read_session`) stay deferred
            # so that listing versions or serving never queues behind a promotion.
            mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
            conn.exec_driver_sql("BEGIN DEFERRED" if mode == "DEFERRED" else "BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A transaction: committed when the block exits normally, rolled back on an exception."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        yield session


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    """A read-only transaction (deferred on SQLite: takes no write lock). Never write through it."""
    bind = engine.execution_options(sqlite_begin="DEFERRED")
    with Session(bind, expire_on_commit=False) as session, session.begin():
        yield session


@contextmanager
def locked_session(engine: Engine, model_name: str) -> Iterator[tuple[Session, RegisteredModel]]:
    """A transaction holding the write lock of `model_name` (which must exist) for its whole duration."""
    with session_scope(engine) as session:
        # On SQLite the lock is already held (BEGIN IMMEDIATE); FOR UPDATE is a no-op there.
        model = session.execute(
            select(RegisteredModel).where(RegisteredModel.name == model_name).with_for_update()
        ).scalar_one()
        yield session, model
