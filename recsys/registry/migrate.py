"""Run the registry's Alembic migrations in code (no alembic.ini; the scripts ship inside the package)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Engine

from recsys.registry.db import VERSION_TABLE
from recsys.registry.records import RegistryError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any constant works; it only has to be the same in every process that migrates this database.
_PG_MIGRATION_LOCK = 7_311_942_001


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def _run(engine: Engine, fn_name: str, revision: str) -> None:
    config = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Several processes opening a fresh registry at once would race to CREATE TABLE; the
            # transaction-scoped advisory lock makes them take turns (SQLite: BEGIN IMMEDIATE does it).
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        config.attributes["connection"] = connection
        getattr(command, fn_name)(config, revision)


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def upgrade(engine: Engine, revision: str = "head") -> None:
    # The common case — already at head — is answered by a plain read, without taking the write lock.
    current = current_revision(engine)
    if revision == "head" and current == head_revision():
        return
    if current is not None and current not in known_revisions():
        # A newer recsys migrated it (a colleague's upgrade of a shared registry): Alembic would say "Can't
        # locate revision" with a traceback; this code cannot read that schema, and must not write it.
        raise RegistryError(f"the registry's schema is at revision {current!r}, which this recsys does not know "
                            f"(its newest is {head_revision()!r}): a newer recsys migrated it; upgrade recsys "
                            "to use this registry")
    _run(engine, "upgrade", revision)


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def downgrade(engine: Engine, revision: str = "base") -> None:
    _run(engine, "downgrade", revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.execution_options(sqlite_begin="DEFERRED").connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()
