"""Versions carry a role: "baseline" marks the reference model that serves until a model passes the gate.

Revision ID: 0002_version_role
Revises: 0001_initial
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_version_role"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("model_versions", sa.Column("role", sa.String(16), nullable=True))


def downgrade() -> None:
    # SQLite (>= 3.35) and PostgreSQL both drop a column in place; batch mode would rebuild the table,
    # which the foreign keys pointing at model_versions forbid while rows exist.
    op.execute("ALTER TABLE model_versions DROP COLUMN role")
