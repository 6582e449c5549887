"""The registry on a real PostgreSQL server (started by the test; skipped only where it is not installed)."""

from __future__ import annotations

import pytest
from pg import pg_server, pg_url  # noqa: F401  (fixtures)
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError
from test_registry_support import FP_B, CountingEvaluate, make_checkpoint, make_eval, registry_config

from recsys.config import GateConfig
from recsys.registry import open_registry
from recsys.registry import migrate

pytestmark = pytest.mark.postgres
INJECTION = "x'; DROP TABLE model_versions;--"
MOSTPOP = make_eval(-0.15)


def test_migrations_up_down_up_on_postgresql(tmp_path, pg_url):  # noqa: F811
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from recsys.registry.db import VERSION_TABLE, Base

    with open_registry(registry_config(tmp_path, pg_url), tmp_path) as reg:
        assert reg.engine.dialect.name == "postgresql"
        tables = set(inspect(reg.engine).get_table_names())
        assert {"registered_models", "model_versions", "aliases", "promotion_events", "evaluations"} <= tables
        with reg.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, Base.metadata) == []
        migrate.downgrade(reg.engine, "base")
        assert set(inspect(reg.engine).get_table_names()) <= {VERSION_TABLE}
        with reg.engine.connect() as conn:  # the trigger function went with the schema
            assert conn.execute(
                text("SELECT count(*) FROM pg_proc WHERE proname = 'promotion_events_append_only'")
            ).scalar_one() == 0
        migrate.upgrade(reg.engine)
        assert migrate.current_revision(reg.engine) == "0002_version_role"


def test_decisions_rescore_and_rollback_on_postgresql(tmp_path, pg_url):  # noqa: F811
    with open_registry(registry_config(tmp_path, pg_url), tmp_path, GateConfig()) as reg:
        ck = lambda name: make_checkpoint(tmp_path / "ckpts", name)  # noqa: E731
        assert reg.promote(ck("v1"), make_eval(0.0, seed=1), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
        assert reg.promote(ck("v2"), make_eval(0.05, seed=2), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
        lower = reg.promote(ck("v3"), make_eval(0.01, seed=3), baseline_result=MOSTPOP, baseline_kind="mostpop")
        assert not lower.promoted and "worse than champion v2" in lower.reason
        nan = reg.promote(ck("v4"), make_eval(0.5, seed=4, metric_override=float("nan")),
                          baseline_result=MOSTPOP, baseline_kind="mostpop")
        assert not nan.promoted and "NaN" in nan.reason
        rescore = CountingEvaluate(make_eval(0.3, FP_B, seed=5))
        out = reg.promote(ck("v5"), make_eval(0.2, FP_B, seed=6), rescore=rescore)
        assert not out.promoted and out.baseline_metric == pytest.approx(rescore.result.metrics["ndcg@10"])
        assert len(rescore.calls) == 1
        assert reg.rollback().candidate_version == 1
        assert reg.champion_version() == 1
        assert [e.decision for e in reg.history()] == ["promoted", "promoted", "rejected", "rejected",
                                                      "rejected", "rollback"]


def test_append_only_and_injection_on_postgresql(tmp_path, pg_url):  # noqa: F811
    with open_registry(registry_config(tmp_path, pg_url), tmp_path, GateConfig()) as reg:
        out = reg.promote(make_checkpoint(tmp_path, "a"), make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop",
                          dataset_version=INJECTION)
        assert out.promoted
        assert reg.get_version(1).dataset_version == INJECTION
        for statement in ("UPDATE promotion_events SET reason = 'x'", "DELETE FROM promotion_events"):
            with pytest.raises(DBAPIError, match="append-only"):
                with reg.engine.begin() as conn:
                    conn.execute(text(statement))
        assert "model_versions" in inspect(reg.engine).get_table_names()
        assert len(reg.history()) == 1
