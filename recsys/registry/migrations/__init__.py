"""Alembic environment for the registry schema; run programmatically by `recsys.registry.migrate`."""
