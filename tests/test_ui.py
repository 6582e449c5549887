"""A real Prefect server, `prefect deploy` of prefect.yaml, a manual run with custom parameters executed by a
process worker, and the Prefect UI checked in headless Chromium (the screenshot is kept in test-output/)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flow_support import REPO_ROOT, make_repo, registry_for
from server_support import get_json, prefect_server, scheduled_runs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_DIR = REPO_ROOT / "test-output"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`prefect server start` on a free localhost port with its own PREFECT_HOME; stopped afterwards."""
    with prefect_server(tmp_path_factory.mktemp("prefect-server-home")) as (api, env):
        yield api.removesuffix("/api"), env


def server_home(env: dict) -> Path:
    return Path(env["PREFECT_HOME"]).parent


def run(cmd: list[str], cwd: Path, env: dict, timeout: int = 600) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{output[-4000:]}"
    return output


def test_deploy_manual_run_with_custom_parameters_and_ui_shows_run_and_artifacts(server, tmp_path):
    base, env = server
    repo = make_repo(tmp_path / "repo")
    env = {**env, "PWD": str(repo)}  # prefect.yaml's pull step resolves {{ $PWD }} at deploy time

    run(["prefect", "work-pool", "create", "recsys-local", "--type", "process"], repo, env)
    deployed = run(["prefect", "--no-prompt", "deploy", "--all"], repo, env)
    assert "retrain/manual" in deployed and "pipeline/nightly" in deployed, deployed[-2000:]
    nightly = get_json(f"{base}/api/deployments/name/pipeline/nightly")
    assert nightly["schedules"] and nightly["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert nightly["concurrency_limit"] == 1 or (nightly.get("global_concurrency_limit") or {}).get("limit") == 1

    started = run(["prefect", "deployment", "run", "retrain/manual", "--params",
                   json.dumps({"models": ["sasrec"], "epochs": 2, "force": True})], repo, env)
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started).group(1)
    run(["prefect", "worker", "start", "--pool", "recsys-local", "--run-once"], repo, env, timeout=900)

    flow_run = get_json(f"{base}/api/flow_runs/{flow_run_id}")
    assert flow_run["state_type"] == "COMPLETED", flow_run["state"]
    # The server's scheduler puts the nightly deployment's next runs on the calendar. With SQLAlchemy 2.1
    # beside Prefect 3.8 it failed every cycle ("Can't evaluate bulk DML statement") and no run was ever
    # scheduled.
    scheduled = scheduled_runs(base, nightly["id"])
    assert scheduled and all(r["expected_start_time"][11:16] == "02:00" for r in scheduled), (
        scheduled, (server_home(env) / "server.log").read_text()[-3000:])
    assert flow_run["parameters"]["epochs"] == 2 and flow_run["parameters"]["models"] == ["sasrec"]
    curve = (repo / "plots" / "sasrec.csv").read_text().strip().splitlines()
    assert len(curve) == 3  # header + the two epochs the custom parameter asked for
    assert registry_for(repo).champion_version() is not None

    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    from playwright.sync_api import sync_playwright

    SCREENSHOT_DIR.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/runs/flow-run/{flow_run_id}")
            page.get_by_text(flow_run["name"]).first.wait_for(timeout=60_000)
            page.get_by_text("Completed").first.wait_for(timeout=30_000)
            page.screenshot(path=str(SCREENSHOT_DIR / "ui-flow-run.png"), full_page=True)
            page.get_by_text("Artifacts", exact=True).first.click()
            page.get_by_text("promotion-decision").first.wait_for(timeout=30_000)
            page.get_by_text("model-metrics").first.wait_for(timeout=30_000)
            page.screenshot(path=str(SCREENSHOT_DIR / "ui-flow-run-artifacts.png"), full_page=True)
        finally:
            browser.close()
    assert (SCREENSHOT_DIR / "ui-flow-run-artifacts.png").stat().st_size > 10_000
