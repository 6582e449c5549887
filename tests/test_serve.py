"""`python -m flows.serve`: its deployments, and a schedule parsed before anything is served."""

from __future__ import annotations

import pytest


def test_the_served_deployments_and_their_schedule():
    from flows.serve import deployments

    served = deployments("30 3 * * 1")
    assert [(d.flow_name, d.name) for d in served] == [("pipeline", "nightly"), ("pipeline", "manual"),
                                                       ("retrain", "manual"), ("ingest", "manual")]
    nightly = served[0]
    assert [s.schedule.cron for s in nightly.schedules] == ["30 3 * * 1"]
    assert all(not d.schedules for d in served[1:])


@pytest.mark.parametrize("bad", ["every night", "0 2 * *", "61 2 * * *", ""])
def test_a_bad_schedule_is_one_usage_line_before_anything_is_served(bad, capsys):
    from flows.serve import main

    with pytest.raises(SystemExit) as done:
        main(["--cron", bad])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --cron: not a cron expression: {bad!r}" in err and "Traceback" not in err
