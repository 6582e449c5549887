"""`recsys registry ...` and `recsys recommend ...` through typer's CliRunner, plus the serving function."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_registry_support import make_checkpoint, make_eval
from typer.testing import CliRunner

from recsys.commands.recommend import app as recommend_app
from recsys.commands.registry import app as registry_app
from recsys.config import load_params
from recsys.recommend import recommend
from recsys.registry import open_registry

runner = CliRunner()
INJECTION = "x'; DROP TABLE model_versions;--"
MOSTPOP = make_eval(-0.15)


def write_params(root: Path, **gate: object) -> Path:
    gate_lines = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in gate.items())
    path = root / "params.yaml"
    path.write_text(
        "models: [mostpop]\n"
        "registry:\n  url: sqlite:///registry/registry.db\n  artifact_root: registry/artifacts\n"
        "  model_name: next_item\n"
        + ("gate:\n" + gate_lines if gate_lines else "")
    )
    return path


@pytest.fixture
def params_path(tmp_path: Path) -> Path:
    return write_params(tmp_path)


def open_from(params_path: Path):  # type: ignore[no-untyped-def]
    params = load_params(params_path)
    return open_registry(params.registry, params_path.parent, params.gate)


def invoke(app, *args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    # Every failure must be a deliberate exit with a message, never an escaped exception.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def test_registry_commands_walkthrough(tmp_path, params_path):
    out = invoke(registry_app, "list", "--params", str(params_path))
    assert out.exit_code == 0 and "no versions registered" in out.output

    with open_from(params_path) as reg:
        ck = lambda name: make_checkpoint(tmp_path / "ckpts", name)  # noqa: E731
        assert reg.promote(ck("v1"), make_eval(0.0, seed=1), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
        assert reg.promote(ck("v2"), make_eval(0.05, seed=2), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
        refused = reg.promote(ck("v3"), make_eval(0.01, seed=3), baseline_result=MOSTPOP, baseline_kind="mostpop")
        assert not refused.promoted

    listing = invoke(registry_app, "list", "--params", str(params_path))
    assert listing.exit_code == 0
    lines = listing.output.splitlines()
    assert "ndcg@10" in lines[0]
    champion_lines = [line for line in lines[1:] if line.startswith("*")]
    assert len(champion_lines) == 1 and champion_lines[0].split()[1] == "2"

    show = invoke(registry_app, "show", "2", "--params", str(params_path))
    assert show.exit_code == 0
    shown = json.loads(show.output)
    assert shown["version"] == 2 and shown["champion"] is True and shown["status"] == "promoted"
    assert len(shown["artifact_sha256"]) == 64 and shown["metrics"]["ndcg@10"] > 0

    history = invoke(registry_app, "history", "--params", str(params_path))
    assert history.exit_code == 0
    assert "worse than champion v2" in history.output  # the refused candidate, with its reason
    assert history.output.count("promoted") >= 2

    rollback = invoke(registry_app, "rollback", "--params", str(params_path))
    assert rollback.exit_code == 0 and "champion is now v1 (was v2)" in rollback.output
    again = invoke(registry_app, "rollback", "--params", str(params_path))
    assert again.exit_code == 1 and "no previous champion" in again.output
    to = invoke(registry_app, "rollback", "--to", "2", "--params", str(params_path))
    assert to.exit_code == 0 and "champion is now v2" in to.output
    never = invoke(registry_app, "rollback", "--to", "3", "--params", str(params_path))
    assert never.exit_code == 1 and "never promoted" in never.output
    assert "rollback" in invoke(registry_app, "history", "-n", "2", "--params", str(params_path)).output


def test_registry_command_errors_are_one_clear_line(tmp_path, params_path):
    missing = invoke(registry_app, "show", "7", "--params", str(params_path))
    assert missing.exit_code == 1 and "version 7" in missing.output and "does not exist" in missing.output
    no_params = invoke(registry_app, "list", "--params", str(tmp_path / "nope.yaml"))
    assert no_params.exit_code == 1 and "params file not found" in no_params.output
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "params.yaml").write_text(f"models: [mostpop]\nregistry:\n  model_name: \"{INJECTION}\"\n")
    refused = invoke(registry_app, "list", "--params", str(bad / "params.yaml"))
    assert refused.exit_code == 1 and "registry.model_name must be lowercase letters" in refused.output
    no_champion = invoke(registry_app, "rollback", "--params", str(params_path))
    assert no_champion.exit_code == 1 and "no champion" in no_champion.output


@pytest.mark.parametrize("args", [("show", INJECTION), ("rollback", "--to", INJECTION)])
def test_injection_strings_on_the_command_line_are_refused(params_path, args):
    result = invoke(registry_app, *args, "--params", str(params_path))
    assert result.exit_code == 2  # not an integer: rejected by the CLI before any SQL runs
    assert not (params_path.parent / "registry").exists()  # the registry was not even opened
    with open_from(params_path) as reg:
        assert reg.list_versions() == []


# --- recommend -----------------------------------------------------------------------------------------


class FixedScores(torch.nn.Module):
    """A model with fixed scores that records the batches it sees (the Batch contract's other side)."""

    def __init__(self, scores: list[float], max_len: int = 4):
        super().__init__()
        self.scores = torch.tensor(scores)
        self.config = type("Config", (), {"max_len": max_len})()
        self.batches: list = []

    def score(self, batch):  # type: ignore[no-untyped-def]
        self.batches.append(batch)
        return self.scores.expand(batch.items.shape[0], -1)


def test_recommend_excludes_padding_and_seen_items_and_left_pads():
    model = FixedScores([100.0, 5.0, 4.0, 3.0, 2.0, 1.0, float("nan")])
    out = recommend(model, {"n_items": 6}, [1, 3], k=3, at_time=1_700_000_000,
                    history_times=[10, 20], user_index=2)
    assert [i for i, _ in out] == [2, 4, 5]  # 0 is padding, 1 and 3 were seen, NaN is never ranked
    batch = model.batches[0]
    assert batch.items.tolist() == [[0, 0, 1, 3]] and batch.times.tolist() == [[0, 0, 10, 20]]
    assert batch.users.tolist() == [2] and batch.next_time.tolist() == [1_700_000_000]
    # Longer histories keep the most recent max_len events; k larger than what is left is capped.
    out = recommend(model, {"n_items": 6}, [1, 2, 3, 4, 5], k=10, at_time=None)
    assert model.batches[-1].items.tolist() == [[2, 3, 4, 5]]
    assert [i for i, _ in out] == []  # everything except the NaN item was seen
    with pytest.raises(ValueError):
        recommend(model, {"n_items": 6}, [], k=0, at_time=None)


def _prepared(root: Path) -> Path:
    prepared = root / "artifacts" / "prepared"
    prepared.mkdir(parents=True)
    # Dataset ids differ from the checkpoint's: the command must map through raw ids.
    pd.DataFrame({"item": pd.array([1, 2, 3, 4], dtype="int32"), "item_id": ["m4", "m3", "m2", "m1"],
                  "title": ["Four", "Three", None, "One"]}).to_parquet(prepared / "items.parquet")
    pd.DataFrame({"user": pd.array([1, 2], dtype="int32"), "user_id": ["alice", "bob"]}).to_parquet(
        prepared / "users.parquet")
    pd.DataFrame({
        "user": pd.array([1, 1, 2], dtype="int32"), "item": pd.array([4, 2, 1], dtype="int32"),
        "timestamp": [1_700_000_000, 1_700_000_100, 1_700_000_000], "role": pd.array([0, 2, 2], dtype="int8"),
    }).to_parquet(prepared / "events.parquet")
    return prepared


def _mostpop_checkpoint(root: Path) -> Path:
    from recsys.checkpoint import save_checkpoint
    from recsys.models.mostpop import MostPop, MostPopConfig

    model = MostPop(MostPopConfig(), n_items=4, n_users=2)
    # Checkpoint ids 1..4 = m1..m4; popularity m1 > m2 > m3 > m4.
    model.fit_statistics(torch.tensor([1, 1, 1, 1, 2, 2, 2, 3, 3, 4]))
    return save_checkpoint(root / "ckpt" / "mostpop", model, dataset_fingerprint="d" * 64,
                           item_ids=["m1", "m2", "m3", "m4"], user_ids=["alice", "bob"])


def test_recommend_command_serves_the_champion(tmp_path, params_path):
    _prepared(tmp_path)
    no_champion = invoke(recommend_app, "--user", "alice", "-k", "2", "--params", str(params_path))
    assert no_champion.exit_code == 0 and "[popularity_fallback]: popularity fallback: no champion is registered " \
        "yet" in no_champion.output  # (test_recommend_command.py has the details)

    with open_from(params_path) as reg:
        assert reg.promote(_mostpop_checkpoint(tmp_path), make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted

    out = invoke(recommend_app, "--user", "alice", "-k", "2", "--params", str(params_path))
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.output.splitlines()[1:]]
    # alice saw m1 (dataset item 4) and m3 (dataset item 2): next most popular are m2, then m4.
    assert [r[1] for r in rows] == ["m2", "m4"]
    assert "Four" in out.output and "One" not in out.output  # titles shown; m2 has no title
    assert "champion v1" in out.output

    # --at before alice's second event: m3 is not seen yet, so it is recommended again.
    early = invoke(recommend_app, "--user", "alice", "-k", "1", "--at", "2023-11-14T22:13:30Z",
                   "--params", str(params_path))
    assert early.exit_code == 0 and early.output.splitlines()[1].split()[1] == "m2"
    early3 = invoke(recommend_app, "--user", "alice", "-k", "3", "--at", "2023-11-14T22:13:30Z",
                    "--params", str(params_path))
    assert [line.split()[1] for line in early3.output.splitlines()[1:]] == ["m2", "m3", "m4"]

    # A user the champion has never seen: popularity answers (no baseline registered: the dataset's), and
    # the answer says so.
    unknown = invoke(recommend_app, "--user", INJECTION, "--params", str(params_path))
    assert unknown.exit_code == 0, unknown.output
    assert "[popularity_fallback]" in unknown.output and "is not in the prepared dataset" in unknown.output
    bad_time = invoke(recommend_app, "--user", "alice", "--at", "yesterday", "--params", str(params_path))
    assert bad_time.exit_code == 2 and "ISO-8601" in bad_time.output


def test_recommend_refuses_a_tampered_champion(tmp_path, params_path):
    _prepared(tmp_path)
    with open_from(params_path) as reg:
        assert reg.promote(_mostpop_checkpoint(tmp_path), make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
        weights = reg.champion_dir() / "model.safetensors"
    weights.chmod(0o644)
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    out = invoke(recommend_app, "--user", "alice", "--params", str(params_path))
    assert out.exit_code == 1
    assert "model.safetensors is truncated" in out.output and "refusing to load" in out.output


def _write_stage_outputs(root: Path, model: str, ev, payload: bytes) -> None:  # type: ignore[no-untyped-def]
    ckpt_root = root / "artifacts" / "models"
    if (ckpt_root / model).exists():
        import shutil

        shutil.rmtree(ckpt_root / model)
    make_checkpoint(ckpt_root, model, model=model, payload=payload)
    (root / "metrics").mkdir(exist_ok=True)
    from recsys.digest import CHECKPOINT_SHA256, directory_digest

    (root / "metrics" / f"{model}.json").write_text(
        json.dumps({**ev.metrics, "eval_seconds": 0.1, "eval_fingerprint": ev.eval_fingerprint,
                    CHECKPOINT_SHA256: directory_digest(ckpt_root / model)}))
    (root / "artifacts" / "eval" / model).mkdir(parents=True, exist_ok=True)
    ev.per_user.to_parquet(root / "artifacts" / "eval" / model / "per_user.parquet")


def test_promote_command_from_stage_outputs(tmp_path, params_path):
    missing = invoke(registry_app, "promote", "--model", "sasrec", "--params", str(params_path))
    assert missing.exit_code == 1 and "dvc repro evaluate@sasrec" in missing.output

    _write_stage_outputs(tmp_path, "mostpop", make_eval(-0.15, seed=7), b"mostpop")
    _write_stage_outputs(tmp_path, "sasrec", make_eval(0.0, seed=8), b"sasrec one")
    unlabelled = invoke(registry_app, "promote", "--model", "sasrec", "--dataset-version", " ",
                        "--params", str(params_path))
    assert unlabelled.exit_code == 2 and unlabelled.output.strip() == (
        "error: recsys registry promote: --dataset-version is empty: leave it out for the DVC version of "
        "data/, or give a label (see 'recsys registry promote --help')"), unlabelled.output
    # A control character was recorded for good and split every later `registry list` table's line
    two_lines = invoke(registry_app, "promote", "--model", "sasrec", "--dataset-version", "a\nb",
                       "--params", str(params_path))
    assert two_lines.exit_code == 2 and two_lines.output.strip() == (
        "error: recsys registry promote: --dataset-version 'a\\nb' holds a control character: give a label on "
        "one line (see 'recsys registry promote --help')"), two_lines.output
    with open_from(params_path) as reg:
        assert reg.list_versions() == []  # refused before anything was registered
    # An unknown baseline was taken (a `rejected` version recorded for good, the name never said): refused.
    unknown = invoke(registry_app, "promote", "--model", "sasrec", "--baseline", "nosuch",
                     "--params", str(params_path))
    assert unknown.exit_code == 1 and "nosuch" in unknown.output and "Traceback" not in unknown.output
    assert len(unknown.output.strip().splitlines()) == 1, unknown.output
    with open_from(params_path) as reg:
        assert reg.list_versions() == []
    first = invoke(registry_app, "promote", "--model", "sasrec", "--dataset-version", "seed",
                   "--params", str(params_path))
    # MostPop became the baseline champion (v1) first; sasrec had to beat it.
    assert first.exit_code == 0 and first.output.startswith("PROMOTED v2 (sasrec)"), first.output
    assert "better than baseline champion v1" in first.output
    rerun = invoke(registry_app, "promote", "--model", "sasrec", "--params", str(params_path))
    assert rerun.exit_code == 0 and "already decided" in rerun.output

    _write_stage_outputs(tmp_path, "sasrec", make_eval(-0.05, seed=9), b"sasrec worse")  # a worse retrain
    worse = invoke(registry_app, "promote", "--model", "sasrec", "--params", str(params_path))
    assert worse.exit_code == 0 and worse.output.startswith("REFUSED v3")
    assert "worse than champion v2" in worse.output
    with open_from(params_path) as reg:
        assert reg.champion_version() == 2
        assert reg.get_version(2).dataset_version == "seed"
        baseline = reg.get_version(1)
        assert baseline.is_baseline and baseline.architecture == "mostpop" and baseline.dataset_version == "seed"
    injected = invoke(registry_app, "promote", "--model", INJECTION, "--params", str(params_path))
    assert injected.exit_code == 1 and "invalid model name" in injected.output


def test_reading_a_registry_nobody_has_written_creates_nothing(tmp_path):
    """`list`, `show`, `history` and `recommend` only read: on a fresh clone (no registry file yet) they answer
    as an empty registry would, and leave no registry/ folder or database behind; nor does a refused
    `rollback`."""
    params_path = write_params(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert "no versions registered" in invoke(registry_app, "list", "--params", str(params_path)).output
    assert "no promotion events yet" in invoke(registry_app, "history", "--params", str(params_path)).output
    shown = invoke(registry_app, "show", "1", "--params", str(params_path))
    assert shown.exit_code == 1 and "version 1 of model 'next_item' does not exist" in shown.output
    served = invoke(recommend_app, "--history", "m1", "--params", str(params_path))
    assert served.exit_code == 1 and "nothing can answer yet" in served.output
    refused = invoke(registry_app, "rollback", "--params", str(params_path))  # writes, but has nothing to do
    assert refused.exit_code == 1 and "no champion to roll back" in refused.output, refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["params.yaml"]
    # a writer creates it as before
    with open_from(params_path) as reg:
        assert reg.champion_version() is None
    assert (tmp_path / "registry" / "registry.db").is_file()
    assert "no versions registered" in invoke(registry_app, "list", "--params", str(params_path)).output
