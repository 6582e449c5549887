"""Alembic environment. Run in code (`recsys.registry.migrate`), never from an alembic.ini.

The caller passes an open connection in `config.attributes["connection"]` so that migrations run on the
registry's own engine (with its SQLite BEGIN IMMEDIATE hooks) inside the caller's transaction.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from recsys.registry.db import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things; batch mode rebuilds tables for future migrations.
        render_as_batch=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
