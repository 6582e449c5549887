"""A new user's story end to end, on real MovieLens rows with their own column names and string ids.

A fresh copy of the repository; a sample of `../shared/data/ml-100k` as the user's export (columns
`customer`, `sku`, `ts`, `kind`; ids like `c-17` and `m-0042`); `recsys data import table`; then two batches
(JSON lines with ISO times, Parquet with epoch seconds) through the nightly `pipeline` flow. After every step,
`recsys recommend` answers for a known user, an unknown user and a `--history`, and says who answered.

MovieLens may not be redistributed, so the rows are read from outside the repository (`RECSYS_ML100K`, else
`../shared/data/ml-100k` beside it) and the test is skipped where they are absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flow_support import REPO_ROOT, make_repo, run_flow_process, sh, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ML100K = Path(os.environ.get("RECSYS_ML100K", REPO_ROOT.parent / "shared" / "data" / "ml-100k"))
N_USERS = 120  # the users with the smallest ids: ~12k events, seconds per training run


def _export() -> pd.DataFrame:
    """The user's export: renamed columns, string ids, an event type, in time order."""
    raw = pd.read_csv(ML100K / "u.data", sep="\t", names=["user", "item", "rating", "ts"])
    raw = raw[raw["user"] <= N_USERS].sort_values(["ts", "user", "item"], kind="stable").reset_index(drop=True)
    return pd.DataFrame({"customer": "c-" + raw["user"].astype(str), "sku": raw["item"].map("m-{:04d}".format),
                         "ts": raw["ts"].astype("int64"), "kind": "rating"})


def _recommend(repo: Path, *args: str) -> dict:
    done = subprocess.run(["recsys", "recommend", *args, "-k", "5", "--json"], cwd=repo, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _check_serving(repo: Path, known_user: str, history: list[str], champion_source: set[str]) -> list[int]:
    """Known user: the champion answers; unknown user: popularity, saying why; a history: the champion."""
    known = _recommend(repo, "--user", known_user)
    assert known["source"] in champion_source, known
    assert len(known["recommendations"]) == 5 and known["model_version"] == known["champion_version"], known
    stranger = _recommend(repo, "--user", "c-never-seen")
    assert stranger["source"] in {"popularity_fallback", "baseline_champion"}, stranger
    if stranger["source"] == "popularity_fallback":
        assert "c-never-seen" in stranger["reason"], stranger
    assert len(stranger["recommendations"]) == 5, stranger
    session = _recommend(repo, "--history", ",".join(history))
    assert session["source"] in champion_source and len(session["recommendations"]) == 5, session
    assert not set(history) & {r["item_id"] for r in session["recommendations"]}, session  # seen never shown
    for answer in (known, stranger, session):
        assert all(r["item_id"].startswith("m-") for r in answer["recommendations"]), answer  # raw ids back
    return [known["champion_version"], session["champion_version"]]


def _pipeline(repo: Path, tmp_path: Path, name: str) -> str:
    code, output = run_flow_process([sys.executable, "-m", "flows.pipeline", "--repo-root", str(repo)], repo,
                                    subprocess_env(tmp_path / "prefect-home"), tmp_path / f"{name}.log",
                                    timeout=1500)
    assert code == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    return output


@pytest.mark.skipif(not (ML100K / "u.data").is_file(), reason=f"MovieLens 100K not found at {ML100K}")
def test_a_new_users_data_from_import_through_two_nightly_batches(tmp_path):
    export = _export()
    seed_end, batch_end = int(len(export) * 0.8), int(len(export) * 0.9)
    seed, batch1, batch2 = export.iloc[:seed_end], export.iloc[seed_end:batch_end], export.iloc[batch_end:]

    repo = make_repo(tmp_path / "repo", {
        # The user's own plausibility floor (MovieLens 100K is from 1997-98), and their columns mapped once.
        "ingest": {"timestamp_floor": 800_000_000, "column_mapping": {"user_id": "customer", "item_id": "sku",
                                                                      "timestamp": "ts", "event": "kind"}},
        "prepare": {"min_user_interactions": 5, "min_item_interactions": 5},
    }, bootstrap=False)
    exports = tmp_path / "exports"
    exports.mkdir()
    seed.to_csv(exports / "history.csv", index=False)

    # 1. Import the seed, naming the columns; version it.
    sh(["recsys", "data", "import", "table", str(exports / "history.csv"), "--column", "user_id=customer",
        "--column", "item_id=sku", "--column", "timestamp=ts", "--column", "event=kind"], repo)
    sh(["dvc", "add", "data", "--quiet"], repo)
    stored = pd.read_parquet(repo / "data" / "interactions")
    assert len(stored) == len(seed) and set(stored["user_id"]) == set(seed["customer"]), stored.head()

    # Nothing has been trained yet: serving says what to run, in one line.
    done = subprocess.run(["recsys", "recommend", "--user", "c-1"], cwd=repo, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("error: ")]) == 1, done.stderr

    # 2. The first night trains on the seed: a champion (SASRec past the gate, or the baseline) serves.
    _pipeline(repo, tmp_path, "night0")
    known_user = seed["customer"].value_counts().index[0]
    history = list(seed["sku"].value_counts().index[:3])  # an anonymous session of well-known films
    served = {"champion", "baseline_champion"}
    versions = [_check_serving(repo, known_user, history, served)]

    # 3. Two nightly batches with other formats: JSON lines with ISO times, Parquet with epoch seconds.
    inbox = repo / "inbox"
    inbox.mkdir(exist_ok=True)
    iso = batch1.assign(ts=pd.to_datetime(batch1["ts"], unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
    nights = [(inbox / "night-1.jsonl", iso, batch1), (inbox / "night-2.parquet", batch2, batch2)]
    expected_rows = len(seed)
    for night, (path, as_written, rows) in enumerate(nights, start=1):
        if path.suffix == ".parquet":
            as_written.to_parquet(path, index=False)
        else:
            as_written.to_json(path, orient="records", lines=True)
        output = _pipeline(repo, tmp_path, f"night{night}")
        assert (inbox / "processed" / path.name).is_file(), output[-3000:]
        manifest = [json.loads(line) for line in (repo / "ingest_manifest.jsonl").read_text().splitlines()]
        assert manifest[-1]["source"] == path.name, manifest[-1]
        assert manifest[-1]["rows_accepted"] == len(rows), manifest[-1]  # MovieLens has no bad or repeated rows
        expected_rows += len(rows)
        assert len(pd.read_parquet(repo / "data" / "interactions")) == expected_rows, night
        versions.append(_check_serving(repo, known_user, history, served))
        newcomers = sorted(set(rows["customer"]) - set(seed["customer"]))
        if newcomers:  # a user who arrived in a batch is served too (by the champion, or by popularity)
            assert len(_recommend(repo, "--user", newcomers[0])["recommendations"]) == 5

    # Every answer named a registered version; the champion never went backwards.
    champions = [v[0] for v in versions]
    assert champions == sorted(champions) and all(v[0] == v[1] for v in versions), versions
    events = yaml.safe_load((repo / "params.yaml").read_text())["ingest"]["allowed_events"]
    assert "rating" in events  # the sample's event type is one the suite accepts (else every row is quarantined)
