"""The distributed retrain path end to end (issue 15): a real `prefect server`, two process workers each in its
own clone, the S3-compatible test server as the DVC remote and PostgreSQL registries, all started here on
127.0.0.1 and stopped at the end.

The same four-model pipeline runs twice on the same data: serially in one workspace (`python -m flows.retrain`,
the single-machine default) and fanned out (`--fan-out train-model/worker`). The fanned-out run must end with
the same metrics files and the same registry rows (field by field, ids and times aside). Mid-way through it,
the worker training a model is killed with SIGKILL (with every process it started): its flow run stops
sending heartbeats, the server's automation marks it Crashed, and the coordinator hands the model out again
to the surviving worker. Before any worker starts, a fanned-out run gives up after its idle limit with one
line and cancels the runs it handed out (no worker would ever have taken them)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from fanout_support import WORKER_DEPLOYMENT, cluster, run_retrain
from server_support import stop_tree
from pg import pg_server  # noqa: F401  (fixture)
from s3 import S3Server, s3_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(1500)]

MODELS = ["mostpop", "sasrec", "bert4rec", "mojito"]
SMALL = {"dim": 16, "n_layers": 1, "n_heads": 1, "max_len": 20}
PARAMS = {
    "models": MODELS,
    "train": {"epochs": 8, "patience": 8},
    "sasrec": {**SMALL, "train": {"patience": 8}},
    "bert4rec": {**SMALL, "ffn_dim": 32, "train": {"epochs": 8, "patience": 8}},
    "mojito": {**SMALL, "time_dim": 4, "fism_items": 5},
}
TRAINABLE = MODELS[1:]


def without_clock(value):
    """`value` without what differs between two runs of the same computation: wall times (`*_seconds`) and
    times of day (`*_at`), at any depth; JSON text is compared as what it encodes."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if not k.endswith(("_seconds", "_at"))}
    if isinstance(value, list):
        return [without_clock(v) for v in value]
    return value


def registry_rows(url: str) -> dict[str, list]:
    """Every registry table's rows, ids and times aside, in a stable order."""
    engine = create_engine(url)
    try:
        out = {}
        for table in sorted(inspect(engine).get_table_names()):
            with engine.connect() as conn:
                rows = [dict(r._mapping) for r in conn.execute(text(f'SELECT * FROM "{table}"'))]
            out[table] = sorted((without_clock({k: v for k, v in row.items() if k != "id"}) for row in rows), key=repr)
        return out
    finally:
        engine.dispose()


class Assassin(threading.Thread):
    """Kill -9 the first worker found training a model (its curve file has appeared in its runs' temp dir)."""

    def __init__(self, workers, temps: list[Path]):
        super().__init__(daemon=True)
        self.workers, self.temps, self.victim, self.model = workers, temps, None, None
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for index, tmp in enumerate(self.temps):
                for curve in tmp.glob("*/*/plots/*.csv"):
                    if curve.stem in TRAINABLE and len(curve.read_text().splitlines()) >= 2:
                        self.victim, self.model = index, curve.stem
                        stop_tree(self.workers[index], signal.SIGKILL)
                        return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def team(s3_server: S3Server, pg_server, tmp_path_factory):  # noqa: F811
    if shutil.which("git") is None:
        pytest.skip("needs git")
    with cluster(tmp_path_factory.mktemp("fanout"), PARAMS, s3_server) as the:
        yield the, pg_server


def test_fan_out_matches_the_serial_run_and_survives_a_killed_worker(team):
    the, pg = team
    serial_db, fanned_db = pg.create_database(), pg.create_database()
    serial = the.clone("serial", pg.url(serial_db))
    coordinator = the.clone("coordinator", pg.url(fanned_db))

    _, serial_summary, _ = run_retrain(serial, the.env)
    assert set(serial_summary["stages_run"]) >= {f"train@{m}" for m in MODELS}

    # No worker online yet: the coordinator hands the models out, nobody takes them, it gives up.
    idle = subprocess.run(["python", "-m", "flows.retrain", "--fan-out", WORKER_DEPLOYMENT,
                           "--fan-out-idle-minutes", "0.25"], cwd=coordinator, env=the.env, capture_output=True,
                          text=True, timeout=600)
    last = idle.stderr.strip().splitlines()[-1]
    assert idle.returncode == 1 and "Traceback" not in idle.stderr, idle.stderr[-4000:]
    assert last.startswith("error: fan-out: no worker of pool recsys-gpu took any of train-model/worker's runs "
                           "for 0.25 min") and "--fan-out-idle-minutes" in last, last
    abandoned = the.flow_runs()
    assert sorted(r["parameters"]["model"] for r in abandoned) == sorted(TRAINABLE + ["mostpop"])
    assert {r["state_type"] for r in abandoned} == {"CANCELLED"}, [r["state"] for r in abandoned]
    abandoned_ids = {r["id"] for r in abandoned}

    workers = [the.start_worker("worker-a"), the.start_worker("worker-b")]
    assassin = Assassin(workers, the.worker_tmp)
    assassin.start()
    seconds, fanned_summary, output = run_retrain(coordinator, the.env, "--fan-out", WORKER_DEPLOYMENT)
    assassin.stopped.set()

    # A worker died mid-training; its run was marked Crashed and handed to the other worker.
    assert assassin.model is not None, "no worker was seen training: the kill did not happen"
    runs = [r for r in the.flow_runs() if r["id"] not in abandoned_ids]  # the cancelled ones stay cancelled
    assert {r["state_type"] for r in the.flow_runs() if r["id"] in abandoned_ids} == {"CANCELLED"}
    states = {m: sorted(r["state_type"] for r in runs if r["parameters"]["model"] == m) for m in MODELS}
    assert states[assassin.model] == ["COMPLETED", "CRASHED"], states
    assert all("COMPLETED" in s for s in states.values()), states
    assert "ran here too" not in output, output[-4000:]  # every stage came from the workers' run-cache

    coordinator_run = the.flow_runs(flow="retrain")[0]  # the newest retrain run: this one
    assert coordinator_run["state_type"] == "COMPLETED", coordinator_run["state"]

    # Same results as the serial run: the metrics files (wall times aside), the registry row for row.
    for m in MODELS:
        fanned, alone = ((repo / "metrics" / f"{m}.json").read_text() for repo in (coordinator, serial))
        assert without_clock(fanned) == without_clock(alone), m
    assert fanned_summary["candidate"] == serial_summary["candidate"]
    assert fanned_summary["models"] == serial_summary["models"]
    assert registry_rows(pg.url(fanned_db)) == registry_rows(pg.url(serial_db))
    print(f"fan-out with a killed worker: {seconds:.0f}s wall (killed on {assassin.model})")
