"""Eight retraining runs promote at the same moment: exactly one champion, the best; no lost updates."""

from __future__ import annotations

import pytest
from pg import pg_server, pg_url  # noqa: F401  (fixtures)
from test_registry_support import RACE_SHIFTS, registry_config, run_race

from recsys.config import GateConfig
from recsys.registry import open_registry


def check_race(url: str, root) -> None:  # type: ignore[no-untyped-def]
    results = run_race(url, root)
    best = max(range(len(RACE_SHIFTS)), key=RACE_SHIFTS.__getitem__)
    by_index = {r["index"]: r for r in results}

    with open_registry(registry_config(root, url), root, GateConfig()) as registry:
        versions = registry.list_versions()
        events = registry.history()
        champion = registry.champion_version()

    # Unique, gapless version numbers: one per run.
    assert sorted(r["version"] for r in results) == list(range(1, 9))
    assert [v.version for v in versions] == list(range(1, 9))
    # Exactly one champion, and it is the best candidate.
    assert [v.version for v in versions if v.is_champion] == [champion]
    assert champion == by_index[best]["version"]
    # One event per attempt.
    assert len(events) == 8
    assert sorted(e.candidate_version for e in events) == list(range(1, 9))
    # Serializable history: each promotion was compared with the champion of its moment, and improved on it.
    current, current_metric = None, None
    for event in events:
        assert event.baseline_version == current, (event, current)
        if event.decision == "promoted":
            assert current_metric is None or event.candidate_metric > current_metric
            current, current_metric = event.candidate_version, event.candidate_metric
        else:
            assert event.decision == "rejected" and event.reason
    assert current == champion
    promoted = {r["version"] for r in results if r["promoted"]}
    assert promoted == {e.candidate_version for e in events if e.decision == "promoted"}


# Eight spawned interpreters importing pandas/scipy/SQLAlchemy take ~10 s on two cores: marked slow.
@pytest.mark.slow
def test_racing_promotions_on_sqlite(tmp_path):
    check_race(f"sqlite:///{tmp_path / 'registry.db'}", tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
def test_racing_promotions_on_postgresql(tmp_path, pg_url):  # noqa: F811
    check_race(pg_url, tmp_path)
