"""Initial registry schema: models, versions, evaluations, aliases, append-only promotion events.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "registered_models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", _TZ, nullable=False),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("registered_models.id"), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("architecture", sa.String(64), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("artifact_uri", sa.String(512), nullable=False),
        sa.Column("artifact_sha256", sa.String(64), nullable=False),
        sa.Column("dataset_version", sa.String(128), nullable=True),
        sa.Column("dataset_fingerprint", sa.String(64), nullable=True),
        sa.Column("code_version", sa.String(64), nullable=True),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("eval_fingerprint", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", _TZ, nullable=False),
        sa.UniqueConstraint("model_id", "version", name="uq_model_versions_model_version"),
        sa.UniqueConstraint("model_id", "artifact_sha256", name="uq_model_versions_model_artifact"),
        sa.CheckConstraint("version >= 1", name="ck_model_versions_version_positive"),
        sa.CheckConstraint(
            "status IN ('registered', 'promoted', 'rejected')", name="ck_model_versions_status"
        ),
    )
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("model_versions.id"), nullable=False),
        sa.Column("eval_fingerprint", sa.String(64), nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("per_user", sa.JSON, nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", _TZ, nullable=False),
        sa.UniqueConstraint("version_id", "eval_fingerprint", name="uq_evaluations_version_fingerprint"),
    )
    op.create_table(
        "aliases",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("registered_models.id"), nullable=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("model_versions.id"), nullable=False),
        sa.Column("updated_at", _TZ, nullable=False),
        sa.UniqueConstraint("model_id", "alias", name="uq_aliases_model_alias"),
    )
    op.create_table(
        "promotion_events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("registered_models.id"), nullable=False),
        sa.Column(
            "candidate_version_id", sa.Integer, sa.ForeignKey("model_versions.id"), nullable=False
        ),
        sa.Column("baseline_version_id", sa.Integer, sa.ForeignKey("model_versions.id"), nullable=True),
        sa.Column("baseline_kind", sa.String(16), nullable=True),
        sa.Column("metric", sa.String(32), nullable=False),
        sa.Column("candidate_metric", sa.Float, nullable=True),
        sa.Column("baseline_metric", sa.Float, nullable=True),
        sa.Column("eval_fingerprint", sa.String(64), nullable=True),
        sa.Column("delta", sa.Float, nullable=True),
        sa.Column("p_value", sa.Float, nullable=True),
        sa.Column("min_delta", sa.Float, nullable=True),
        sa.Column("significance", sa.Boolean, nullable=True),
        sa.Column("alpha", sa.Float, nullable=True),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", _TZ, nullable=False),
        sa.CheckConstraint(
            "decision IN ('promoted', 'rejected', 'rollback')", name="ck_promotion_events_decision"
        ),
    )
    op.create_index(
        "ix_promotion_events_candidate_fp", "promotion_events", ["candidate_version_id", "eval_fingerprint"]
    )

    # The audit trail is append-only in the database itself, not just by convention in the ORM.
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER promotion_events_no_{action.lower()} BEFORE {action} ON promotion_events "
                "BEGIN SELECT RAISE(ABORT, 'promotion_events is append-only'); END"
            )
    elif dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION promotion_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'promotion_events is append-only'; END $$"
        )
        op.execute(
            "CREATE TRIGGER promotion_events_append_only BEFORE UPDATE OR DELETE ON promotion_events "
            "FOR EACH ROW EXECUTE FUNCTION promotion_events_append_only()"
        )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS promotion_events_no_{action}")
    elif dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS promotion_events_append_only ON promotion_events")
        op.execute("DROP FUNCTION IF EXISTS promotion_events_append_only()")
    op.drop_index("ix_promotion_events_candidate_fp", table_name="promotion_events")
    op.drop_table("promotion_events")
    op.drop_table("aliases")
    op.drop_table("evaluations")
    op.drop_table("model_versions")
    op.drop_table("registered_models")
