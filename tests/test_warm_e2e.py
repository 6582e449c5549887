"""Warm start end to end on a copy of the repository: a champion trained cold through `dvc repro` and
promoted by hand, then `train.init: warm` through the retrain flow — the candidate starts from the champion,
its lineage says so, the gate judges it as usual, and DVC tracks the warm source as the stage's input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flow_support import make_repo, registry_for, run_flow_process, sh, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def changed_stages(repo: Path) -> set[str]:
    done = subprocess.run(["dvc", "status", "--json"], cwd=repo, env=subprocess_env(), capture_output=True,
                          text=True, timeout=600, check=True)
    return set(json.loads(done.stdout or "{}"))


def test_a_warm_candidate_starts_from_the_champion_through_dvc_and_the_retrain_flow(tmp_path):
    # FLOW_PARAMS' 12 epochs: at 6 the cold champion's gain over MostPop (p=0.057 over 80 users once repeated
    # targets count as misses) was not significant, and nothing was promoted to start from
    repo = make_repo(tmp_path / "repo")
    cold_note = (repo / "artifacts" / "warm" / "sasrec" / "source.json").read_text()  # `recsys bootstrap`
    assert json.loads(cold_note)["source"] is None

    # 1. The champion: trained cold by `dvc repro`, promoted by hand.
    sh(["dvc", "repro"], repo)
    assert "PROMOTED" in sh(["recsys", "registry", "promote", "--model", "sasrec"], repo)
    with registry_for(repo) as registry:
        champion = registry.champion_info()
    assert champion.architecture == "sasrec" and champion.params["init"] == {"mode": "cold"}
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert "artifacts/warm/sasrec" in {d["path"] for d in lock["stages"]["train@sasrec"]["deps"]}

    # 2. Retrain with train.init: warm through the flow (it writes the warm source, then runs dvc repro).
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["init"] = "warm"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    code, output = run_flow_process([sys.executable, "-m", "flows.retrain", "--repo-root", str(repo)], repo,
                                    subprocess_env(tmp_path / "prefect-home"), tmp_path / "retrain.log")
    assert code == 0, output[-4000:]
    assert f"warm source sasrec: v{champion.version} (updated)" in output, output[-4000:]
    meta = json.loads((repo / "artifacts" / "models" / "sasrec" / "model.json").read_text())
    assert meta["init"]["mode"] == "warm" and meta["init"]["from_version"] == champion.version
    assert meta["init"]["from_sha256"] == champion.artifact_sha256 and meta["init"]["warm_streak"] == 1
    assert meta["init"]["items"]["new"] == 0 and meta["init"]["items"]["dropped"] == 0  # same data

    # 3. The registry's lineage says "warm from vN"; the gate judged it against the champion as usual.
    with registry_for(repo) as registry:
        candidate = registry.list_versions()[-1]
        events = [e for e in registry.history() if e.candidate_version == candidate.version]
    assert candidate.version > champion.version and candidate.architecture == "sasrec"
    assert candidate.params["init"]["from_version"] == champion.version
    assert [e.decision in ("promoted", "rejected") for e in events] == [True]
    assert events[0].baseline_version == champion.version and events[0].metric == "ndcg@10"
    shown = json.loads(sh(["recsys", "registry", "show", str(candidate.version)], repo))
    assert shown["init"] == f"warm from v{champion.version}"

    # 4. DVC: nothing left to do, `recsys warm` with nothing new changes nothing (even if the warm candidate
    # became champion), and a changed warm source re-runs exactly the stages that start from it.
    assert changed_stages(repo) == set()
    sh(["recsys", "warm"], repo)
    assert changed_stages(repo) == set()
    source = repo / "artifacts" / "warm" / "sasrec" / "source.json"
    original = source.read_bytes()
    try:
        source.write_bytes(original.replace(b'"reason": null', b'"reason": "edited"'))
        assert changed_stages(repo) == {"train@sasrec"}
    finally:
        source.write_bytes(original)
    assert changed_stages(repo) == set()
