"""The warm source resolved from the registry (recsys/warm_source.py) — what the train stage starts from — and
how the registry's commands show the way a version started. A real SQLite registry and real checkpoints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from flow_support import modules_loaded_by
from test_registry_support import make_eval
from typer.testing import CliRunner

from recsys.checkpoint import save_checkpoint
from recsys.config import load_params
from recsys.layout import Layout
from recsys.models import build_model
from recsys.registry import ArtifactIntegrityError, open_registry
from recsys.warm import (
    CHECKPOINT,
    NO_EARLIER_CHAMPION,
    SOURCE_FILE,
    WRITTEN_COLD,
    check_files,
    read_source,
)
from recsys.warm_source import resolve_warm_sources

runner = CliRunner()
SASREC = {"dim": 16, "n_layers": 1, "n_heads": 1, "dropout": 0.1, "max_len": 20}


def workspace(root: Path, init: str, data: str = "d1", prepare: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    params = {"models": ["mostpop", "sasrec", "bert4rec"], "train": {"init": init}, "sasrec": SASREC,
              "registry": {"url": "sqlite:///registry/registry.db", "artifact_root": "registry/artifacts"},
              **({"prepare": prepare} if prepare else {})}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    set_data(root, data)
    return root


def set_data(root: Path, version: str) -> None:
    """The raw store's DVC version, as `data.dvc` records it."""
    (root / "data.dvc").write_text(f"outs:\n- md5: {version}.dir\n  nfiles: 2\n  path: data\n")


def champion(root: Path, name: str = "sasrec", *, data: str = "d0", seed: int = 0, init: dict | None = None,
             prepare: dict | None = None):
    """Register a checkpoint of `name` trained on data version `data` (by default an earlier one than the
    workspace's d1: the champion a new batch finds) and make it the champion."""
    params = load_params(root / "params.yaml")
    ckpt = trained(root / "trained" / f"{name}-{seed}", params, name, seed, init)
    with open_registry(params.registry, root, params.gate) as registry:
        lineage = {"model": name, "init": init or {"mode": "cold"},
                   **({"prepare": prepare} if prepare else {})}
        return registry.install_baseline(ckpt, make_eval(0.0), params=lineage, dataset_version=f"{data}.dir")


def trained(directory: Path, params, name: str, seed: int, init: dict | None) -> Path:
    """A checkpoint of `name` (fresh weights from `seed`) saved to `directory`, recording `init`."""
    torch.manual_seed(seed)
    model = build_model(name, params.model_config(name), n_items=4, n_users=2)
    return save_checkpoint(directory, model, dataset_fingerprint="0" * 64, item_ids=list("abcd"),
                           user_ids=["u1", "u2"], extra={"init": init} if init else None)


def resolve(root: Path) -> list[str]:
    return resolve_warm_sources(root, load_params(root / "params.yaml"))


def source(root: Path, model: str):
    return read_source(Layout(root).warm_dir(model))


def test_cold_models_get_a_constant_note_without_opening_the_registry(tmp_path):
    root = workspace(tmp_path / "repo", "cold")
    assert resolve(root) == ["mostpop: cold (a counting model)", "sasrec: cold (train.init is cold)",
                             "bert4rec: cold (train.init is cold)"]
    assert not (root / "registry").exists()
    assert source(root, "sasrec").reason == WRITTEN_COLD and source(root, "sasrec").version is None
    before = {m: (Layout(root).warm_dir(m) / SOURCE_FILE).read_bytes() for m in ("mostpop", "sasrec")}
    champion(root)  # a new champion changes nothing a cold stage depends on
    resolve(root)
    assert {m: (Layout(root).warm_dir(m) / SOURCE_FILE).read_bytes() for m in before} == before


def test_resolving_cold_models_never_loads_torch(tmp_path):
    """Every nothing-new scheduled run resolves the warm sources; when all models are cold it builds nothing."""
    root = workspace(tmp_path / "repo", "cold")
    loaded = modules_loaded_by("from pathlib import Path; from recsys.config import load_params; "
                               "from recsys.warm_source import resolve_warm_sources; "
                               "print(resolve_warm_sources(Path('.'), load_params('params.yaml')))", cwd=root)
    assert "recsys.warm_source" in loaded and "torch" not in loaded and "recsys.models" not in loaded
    assert source(root, "sasrec").reason == WRITTEN_COLD


def test_the_champion_of_the_same_model_is_copied_in_and_verified(tmp_path):
    root = workspace(tmp_path / "repo", "auto")
    version = champion(root)
    lines = resolve(root)
    assert lines == ["mostpop: cold (a counting model)", f"sasrec: v{version} (updated)",
                     f"bert4rec: none (the champion v{version} is a sasrec model)"]
    got = source(root, "sasrec")
    params = load_params(root / "params.yaml")
    with open_registry(params.registry, root, params.gate) as registry:
        info = registry.get_version(version)
        stored = registry.version_dir(version)
    assert (got.version, got.artifact_sha256) == (version, info.artifact_sha256)
    check_files(Layout(root).warm_dir("sasrec"), got.files)
    copied = Layout(root).warm_dir("sasrec") / CHECKPOINT
    for name, _, _ in got.files:
        assert (copied / name).read_bytes() == (stored / name).read_bytes()
    assert source(root, "bert4rec").reason == "the champion is a sasrec model, not bert4rec"
    assert resolve(root)[1] == f"sasrec: v{version}"  # already in place: nothing rewritten


def test_a_champion_trained_on_the_current_data_does_not_replace_the_source(tmp_path):
    root = workspace(tmp_path / "repo", "auto")
    first = champion(root, data="d0")
    assert resolve(root)[1] == f"sasrec: v{first} (updated)"
    second = champion(root, data="d1", seed=1, init={"mode": "warm", "from_version": first, "warm_streak": 1})
    # The new champion is (typically) what the last run trained from the first: nothing new to learn from.
    assert resolve(root)[1] == (f"sasrec: v{first} kept (the champion v{second} was trained on the current "
                                "data; new data makes it the warm source)")
    assert source(root, "sasrec").version == first
    set_data(root, "d2")  # a batch arrived
    assert resolve(root)[1] == f"sasrec: v{second} (updated)"
    assert source(root, "sasrec").version == second


LOO = {"min_user_interactions": 5, "min_item_interactions": 5, "split": "loo", "valid_quantile": 0.8,
       "test_quantile": 0.9}


def test_a_champion_trained_on_data_split_otherwise_is_never_the_source(tmp_path):
    """A champion trained under leave-one-out may have learnt events a global-time split now validates and
    tests on: it is passed over (the line says which setting changed), and under `warm` the same family's
    first version trained on the current data with today's settings is taken instead."""
    root = workspace(tmp_path / "repo", "auto", prepare={"split": "global_time"})
    first = champion(root, prepare=LOO)
    assert resolve(root)[1] == (f"sasrec: none (v{first} was trained on data prepared otherwise: "
                                "prepare.split loo, now global_time)")
    got = source(root, "sasrec")
    assert got.version is None and got.reason == (
        "the champion as the current data arrived was trained on data prepared otherwise (prepare.split loo, "
        "now global_time): it may have learnt today's validation and test events")
    today = {**LOO, "split": "global_time"}
    second = champion(root, data="d1", seed=1, prepare=today)  # trained on the current data, today's split
    assert resolve(root)[1].startswith(f"sasrec: none (v{first} was trained on data prepared otherwise")
    workspace(root, "warm", prepare={"split": "global_time"})
    assert resolve(root)[1] == (f"sasrec: v{second} (updated)")
    set_data(root, "d2")  # the next batch: the champion, trained under today's split, is the source
    workspace(root, "auto", data="d2", prepare={"split": "global_time"})
    assert resolve(root)[1] == f"sasrec: v{second}"


def test_the_split_settings_compared_are_those_that_move_events(tmp_path):
    """Under leave-one-out the time quantiles split nothing: a champion recorded with others is still the
    source; a k-core threshold decides which events remain, so a change there passes it over."""
    root = workspace(tmp_path / "repo", "auto", prepare={"valid_quantile": 0.5, "test_quantile": 0.6})
    version = champion(root, prepare=LOO)
    assert resolve(root)[1] == f"sasrec: v{version} (updated)"
    workspace(root, "auto", prepare={"min_item_interactions": 10})
    assert resolve(root)[1] == (f"sasrec: none (v{version} was trained on data prepared otherwise: "
                                "prepare.min_item_interactions 5, now 10)")


def test_no_source_yet_is_kept_under_auto_but_not_under_warm(tmp_path):
    root = workspace(tmp_path / "repo", "auto")
    resolve(root)
    assert source(root, "sasrec").reason == NO_EARLIER_CHAMPION
    version = champion(root, data="d1")  # trained cold by this very run, on this data
    assert resolve(root)[1] == (f"sasrec: none kept (the champion v{version} was trained on the current "
                                "data; new data makes it the warm source)")
    workspace(root, "warm")  # asked for explicitly: start from the champion now
    assert resolve(root)[1] == f"sasrec: v{version} (updated)"
    # Switching from cold to warm also starts from the champion on the same data.
    other = workspace(tmp_path / "other", "cold")
    champion(other, data="d1")
    resolve(other)
    workspace(other, "warm")
    assert source(other, "sasrec").reason == WRITTEN_COLD and resolve(other)[1].endswith("(updated)")


def warm_bytes(root: Path) -> dict[str, dict[str, bytes]]:
    return {m: tree(Layout(root).warm_dir(m)) for m in ("mostpop", "sasrec", "bert4rec")}


def test_a_champion_of_another_family_on_the_current_data_changes_no_source(tmp_path):
    """Whatever family a champion trained on the current data is, the sources — and so every train stage —
    stay as the data's run left them: a run with nothing new retrains nothing."""
    root = workspace(tmp_path / "repo", "auto")
    assert resolve(root)[1:] == ["sasrec: none (no champion yet)", "bert4rec: none (no champion yet)"]
    night_one = warm_bytes(root)
    champion(root, "sasrec", data="d1")  # the first night's winner
    assert resolve(root)[2] == "bert4rec: none kept (the champion v1 was trained on the current data (a sasrec model))"
    assert warm_bytes(root) == night_one
    champion(root, "bert4rec", data="d1", seed=1)  # another family wins on the same data
    resolve(root)
    assert warm_bytes(root) == night_one

    other = workspace(tmp_path / "other", "auto")
    first = champion(other, "sasrec", data="d0")
    resolve(other)
    before = warm_bytes(other)
    assert source(other, "sasrec").version == first
    assert source(other, "bert4rec").reason == "the champion is a sasrec model, not bert4rec"
    newer = champion(other, "bert4rec", data="d1", seed=1)
    assert resolve(other)[1:] == [
        f"sasrec: v{first} kept (the champion v{newer} was trained on the current data (a bert4rec model))",
        (f"bert4rec: none (the champion as the current data arrived, v{first}, is a sasrec model; the champion "
         f"v{newer} was trained on the current data; new data makes it the warm source)")]
    assert warm_bytes(other) == before
    set_data(other, "d2")
    assert resolve(other)[1:] == [f"sasrec: none (the champion v{newer} is a bert4rec model)",
                                  f"bert4rec: v{newer} (updated)"]


def test_a_fresh_clone_resolves_the_sources_the_training_workspace_had(tmp_path):
    """`artifacts/warm` is in neither git nor DVC: a clone (or a workspace that lost it) must resolve the same
    bytes from the registry alone, or `dvc repro` there retrains what the run-cache holds."""
    root = workspace(tmp_path / "repo", "auto")
    first = champion(root, "sasrec", data="d0")
    resolve(root)
    champion(root, "sasrec", data="d1", seed=1, init={"mode": "warm", "from_version": first, "warm_streak": 1})
    resolve(root)
    trained = warm_bytes(root)
    assert source(root, "sasrec").version == first
    shutil.rmtree(root / "artifacts" / "warm")
    resolve(root)
    assert warm_bytes(root) == trained
    # The same under `warm` after a first night with no champion: the first champion on this data, not the newest.
    fresh = workspace(tmp_path / "fresh", "warm")
    v1 = champion(fresh, "sasrec", data="d1")
    assert resolve(fresh)[1] == f"sasrec: v{v1} (updated)"
    v2 = champion(fresh, "sasrec", data="d1", seed=2, init={"mode": "warm", "from_version": v1, "warm_streak": 1})
    assert resolve(fresh)[1] == f"sasrec: v{v1} kept (the champion v{v2} was trained on the current data; new " \
                                "data makes it the warm source)"
    kept = warm_bytes(fresh)
    shutil.rmtree(fresh / "artifacts" / "warm")
    resolve(fresh)
    assert warm_bytes(fresh) == kept


def test_a_rollback_makes_the_rolled_back_to_champion_the_source(tmp_path):
    root = workspace(tmp_path / "repo", "auto")
    first = champion(root, "sasrec", data="d0")
    second = champion(root, "sasrec", data="d0", seed=1)
    assert resolve(root)[1] == f"sasrec: v{second} (updated)"
    params = load_params(root / "params.yaml")
    with open_registry(params.registry, root, params.gate) as registry:
        registry.rollback(first)
    assert resolve(root)[1] == f"sasrec: v{first} (updated)"


def test_the_sources_resolve_again_under_a_lock_the_caller_holds(tmp_path):
    """The retrain flow resolves once as it starts and again under the lock its `dvc repro` runs in: a batch
    ingested in between (the lock is free between tasks) must not leave today's data training from the
    source chosen for yesterday's. Under the held lock the resolver takes no lock of its own (it is not
    re-entrant: the first resolve would wait for itself) and writes the source the new data calls for."""
    from recsys.workspace import workspace_lock

    root = workspace(tmp_path / "repo", "auto")
    first = champion(root, data="d0")
    second = champion(root, data="d1", seed=1, init={"mode": "warm", "from_version": first, "warm_streak": 1})
    assert resolve(root)[1].startswith(f"sasrec: v{first} kept")  # the run starts: v2 trained on today's d1
    set_data(root, "d2")  # an ingest commits a batch before `dvc repro` takes the lock
    with workspace_lock(root):
        lines = resolve_warm_sources(root, load_params(root / "params.yaml"), held=True)
    assert lines[1] == f"sasrec: v{second} (updated)" and source(root, "sasrec").version == second


def test_a_damaged_source_record_is_rewritten_and_refused_by_the_train_stage_in_one_line(tmp_path):
    from recsys.checkpoint import CheckpointError

    root = workspace(tmp_path / "repo", "cold")
    resolve(root)
    record = Layout(root).warm_dir("sasrec") / SOURCE_FILE
    record.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(CheckpointError, match=r"source.json is damaged \(.*utf-8.*\); run `recsys warm`"):
        read_source(record.parent)
    assert resolve(root)[1] == "sasrec: cold (train.init is cold)"
    assert source(root, "sasrec").reason == WRITTEN_COLD


def test_a_damaged_registry_artifact_is_never_copied(tmp_path):
    root = workspace(tmp_path / "repo", "warm")
    version = champion(root)
    params = load_params(root / "params.yaml")
    with open_registry(params.registry, root, params.gate) as registry:
        weights = registry.store.path_for(registry.get_version(version).artifact_sha256) / "model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(weights.read_bytes()[:-4])
    with pytest.raises(ArtifactIntegrityError, match="truncated"):
        resolve(root)
    assert not (Layout(root).warm_dir("sasrec") / CHECKPOINT).exists()


def test_recsys_warm_and_the_registry_commands_say_how_a_version_started(tmp_path):
    from recsys.cli import app as cli_app
    from recsys.commands.registry import app as registry_app

    root = workspace(tmp_path / "repo", "auto")
    first = champion(root)
    out = runner.invoke(cli_app, ["warm", "--model", "sasrec", "--params", str(root / "params.yaml")])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == f"warm source sasrec: v{first} (updated)"
    warm = champion(root, data="d2", seed=1,
                    init={"mode": "warm", "from_version": first, "warm_streak": 1})
    params = ["--params", str(root / "params.yaml")]
    shown = json.loads(runner.invoke(registry_app, ["show", str(warm), *params]).output)
    assert shown["init"] == f"warm from v{first}" and shown["params"]["init"]["from_version"] == first
    assert json.loads(runner.invoke(registry_app, ["show", str(first), *params]).output)["init"] == "cold"
    listing = runner.invoke(registry_app, ["list", *params]).output.splitlines()
    assert "init" in listing[0] and f"warm from v{first}" in listing[-1] and "cold" in listing[-2]
    history = runner.invoke(registry_app, ["history", *params]).output.splitlines()
    assert re.search(rf"promoted +v{warm} +warm from v{first} ", history[-1]), history[-1]


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_fan_out_worker_puts_the_coordinators_warm_source_in_place_byte_for_byte(tmp_path):
    """The coordinator ships each model's source.json; a worker (a clean clone: no registry database) copies
    the named checkpoint from the shared artifact store, so `train@<model>`'s inputs — and DVC's run-cache
    key — are the coordinator's."""
    from recsys.warm_source import materialise_warm_source

    shared = tmp_path / "shared-artifacts"  # storage every machine mounts at the same absolute path
    coordinator = workspace(tmp_path / "coordinator", "auto")
    params = yaml.safe_load((coordinator / "params.yaml").read_text())
    params["registry"]["artifact_root"] = str(shared)
    (coordinator / "params.yaml").write_text(yaml.safe_dump(params))
    version = champion(coordinator)
    resolve(coordinator)
    worker = tmp_path / "worker"
    worker.mkdir()
    (worker / "params.yaml").write_text((coordinator / "params.yaml").read_text())  # shipped as is
    for model in ("sasrec", "bert4rec", "mostpop"):
        shipped = (Layout(coordinator).warm_dir(model) / SOURCE_FILE).read_text()
        line = materialise_warm_source(worker, load_params(worker / "params.yaml"), model, shipped)
        assert tree(Layout(worker).warm_dir(model)) == tree(Layout(coordinator).warm_dir(model))
        assert line.startswith(f"{model}: v{version}" if model == "sasrec" else f"{model}: none")
    assert (Layout(worker).warm_dir("sasrec") / CHECKPOINT).is_dir()
    assert not (worker / "registry").exists()  # the worker never opened a registry database
    # A source that records a lost cold try (below) ships that too.
    from recsys.warm import COLD_TRY_OF

    sha = source(coordinator, "sasrec").artifact_sha256
    rejected(coordinator, {"requested": "auto", "mode": "cold", "reason": "a cold try",
                           COLD_TRY_OF: {"version": version, "artifact_sha256": sha}}, data="d1", seed=3)
    set_data(coordinator, "d2")
    resolve(coordinator)
    shipped = (Layout(coordinator).warm_dir("sasrec") / SOURCE_FILE).read_text()
    assert source(coordinator, "sasrec").cold_tried
    materialise_warm_source(worker, load_params(worker / "params.yaml"), "sasrec", shipped)
    assert tree(Layout(worker).warm_dir("sasrec")) == tree(Layout(coordinator).warm_dir("sasrec"))


def test_a_worker_that_cannot_read_the_artifact_store_stops_with_the_setting(tmp_path):
    from recsys.warm_source import WarmSourceUnavailable, materialise_warm_source

    coordinator = workspace(tmp_path / "coordinator", "warm")
    champion(coordinator)
    resolve(coordinator)
    shipped = (Layout(coordinator).warm_dir("sasrec") / SOURCE_FILE).read_text()
    worker = workspace(tmp_path / "worker", "warm")
    params = yaml.safe_load((worker / "params.yaml").read_text())
    params["registry"]["artifact_root"] = str(tmp_path / "not-mounted")  # absolute, but not there
    (worker / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(WarmSourceUnavailable, match=r"cannot read .*registry.artifact_root \(/.*not-mounted\) "
                                                    r"must be storage every worker mounts"):
        materialise_warm_source(worker, load_params(worker / "params.yaml"), "sasrec", shipped)
    # Nothing half-written: no record without its checkpoint, no temporary left behind.
    assert not (worker / "artifacts").exists()


@pytest.mark.parametrize("damage,message", [
    (lambda text: text[: len(text) // 2], "is damaged"),
    (lambda text: text.replace('"artifact_sha256": "', '"artifact_sha256": "../'), "is damaged"),
    (lambda text: json.dumps(json.loads(text)) + "\n", "is not as this commit writes it"),
])
def test_a_damaged_or_foreign_shipped_record_stops_the_worker_before_anything_is_written(tmp_path, damage,
                                                                                          message):
    from recsys.warm_source import WarmSourceUnavailable, materialise_warm_source

    coordinator = workspace(tmp_path / "coordinator", "warm")
    champion(coordinator)
    resolve(coordinator)
    shipped = damage((Layout(coordinator).warm_dir("sasrec") / SOURCE_FILE).read_text())
    worker = workspace(tmp_path / "worker", "warm")
    with pytest.raises(WarmSourceUnavailable, match=f"the work order's warm source record for sasrec {message}"):
        materialise_warm_source(worker, load_params(worker / "params.yaml"), "sasrec", shipped)
    assert not (worker / "artifacts").exists()


def test_a_stray_file_in_a_warm_source_is_cleared_by_the_next_resolve(tmp_path):
    """DVC hashes the whole directory, and a fan-out worker's copy holds only the record and checkpoint: a
    stray file (an editor's swap file) must not survive `recsys warm` as if the source were in place."""
    root = workspace(tmp_path / "repo", "auto")
    champion(root)
    resolve(root)
    warm_dir = Layout(root).warm_dir("sasrec")
    (warm_dir / ".source.json.swp").write_text("x")
    resolve(root)
    assert sorted(p.name for p in warm_dir.iterdir()) == [CHECKPOINT, SOURCE_FILE]


def test_settings_recorded_by_another_recsys_version_are_compared_without_a_traceback(tmp_path):
    """A record today's checks refuse, or with a key this version lacks, is compared on the keys it shares
    with today's settings (the quantiles ignored under leave-one-out): the same split is still the source,
    another is passed over; neither stops the resolution."""
    root = workspace(tmp_path / "repo", "auto")
    version = champion(root, prepare={**LOO, "min_user_interactions": 0, "new_setting": 1})
    assert resolve(root)[1] == (f"sasrec: none (v{version} was trained on data prepared otherwise: "
                                "prepare.min_user_interactions 0, now 5)")
    other = champion(root, seed=1, prepare={**LOO, "new_setting": 1, "valid_quantile": 0.3})
    assert resolve(root)[1] == f"sasrec: v{other} (updated)"


def test_a_champion_on_the_current_data_split_otherwise_is_not_promised_as_the_next_source(tmp_path):
    root = workspace(tmp_path / "repo", "warm", prepare={"split": "global_time"})
    version = champion(root, data="d1", prepare=LOO)
    assert resolve(root)[1] == (f"sasrec: none kept (the champion v{version} was trained on the current data "
                                "prepared otherwise (prepare.split loo, now global_time))")


def rejected(root: Path, init: dict, *, data: str, seed: int) -> int:
    """Put a checkpoint trained on data version `data` with `init` as its training start where the train
    stage leaves it, and register it as the promotion does (with the run's cold tries); the gate rejects
    it (it scores below the champion). Returns its version."""
    from recsys.promotion import checkpoint_dir, cold_tries
    from recsys.warm import COLD_TRIES

    params = load_params(root / "params.yaml")
    shutil.rmtree(checkpoint_dir(root, "sasrec"), ignore_errors=True)
    ckpt = trained(checkpoint_dir(root, "sasrec"), params, "sasrec", seed, init)
    tries = cold_tries(root, params)
    with open_registry(params.registry, root, params.gate) as registry:
        decision = registry.promote(ckpt, make_eval(-0.3, seed=seed), dataset_version=f"{data}.dir",
                                    params={"model": "sasrec", "init": init,
                                            **({COLD_TRIES: tries} if tries else {})})
    assert not decision.promoted
    return decision.version


def test_a_cold_try_that_lost_the_gate_is_not_repeated_on_every_later_batch(tmp_path):
    """`auto` trains every `warm_cold_every`-th version of a warm line cold. When that cold candidate loses,
    the champion and its streak stay: without a record of the try, every later batch would train cold again.
    The next data version's source says the try was made, and the stage warm-starts, its streak afresh."""
    from recsys.model_configs import TrainConfig
    from recsys.warm import COLD_TRY_OF, start

    root = workspace(tmp_path / "repo", "auto")
    line_end = {"mode": "warm", "from_version": 1, "warm_streak": 4}
    top = champion(root, data="d0", init=line_end)  # the 4th warm start of a line: the 5th is a cold try
    assert resolve(root)[1] == f"sasrec: v{top} (updated)"
    params = load_params(root / "params.yaml")
    cfg = TrainConfig(init="auto", device="cpu", progress="off", warm_cold_every=5)
    warm_dir = Layout(root).warm_dir("sasrec")

    def stage(seed: int) -> dict:
        torch.manual_seed(seed)
        model = build_model("sasrec", params.model_config("sasrec"), n_items=4, n_users=2)
        config = params.model_config("sasrec")
        return start(model, "sasrec", config, cfg, warm_dir, list("abcd"), ["u1", "u2"])

    tried = stage(0)
    assert tried["mode"] == "cold" and "train.warm_cold_every = 5" in tried["reason"]
    with open_registry(params.registry, root, params.gate) as registry:
        sha = registry.get_version(top).artifact_sha256
    assert tried[COLD_TRY_OF] == {"version": top, "artifact_sha256": sha}
    rejected(root, tried, data="d1", seed=5)  # the cold try, trained on d1, loses: v{top} stays champion

    before = warm_bytes(root)
    assert resolve(root)[1] == f"sasrec: v{top}"  # nothing new: the bytes (and the stage) stay as they were
    assert warm_bytes(root) == before and not source(root, "sasrec").cold_tried
    set_data(root, "d2")  # the next batch
    assert resolve(root)[1] == f"sasrec: v{top} (a cold try from it lost the gate) (updated)"
    assert source(root, "sasrec").cold_tried
    again = stage(1)
    assert again["mode"] == "warm" and again["from_version"] == top and again["warm_streak"] == 1
    # That warm candidate loses too: the champion is unchanged, the try is still on record: warm again.
    rejected(root, again, data="d2", seed=6)
    set_data(root, "d3")
    resolve(root)
    assert stage(2)["mode"] == "warm"
    # A rejection that was not a cold try in this source's place (another source's, or a plain cold start)
    # says nothing.
    other = workspace(tmp_path / "other", "auto")
    top = champion(other, data="d0", init=line_end)
    rejected(other, {"requested": "auto", "mode": "cold", "reason": "x"}, data="d1", seed=7)
    rejected(other, {**tried, COLD_TRY_OF: {"version": top, "artifact_sha256": "cd" * 32}}, data="d1", seed=8)
    set_data(other, "d2")
    resolve(other)
    assert not source(other, "sasrec").cold_tried


def test_every_versions_record_is_read_once_and_only_when_a_source_is_checked(tmp_path, monkeypatch):
    """The lost-cold-try check reads every version's record; a scheduled run with no source to check (no
    champion yet, or a champion of another family) must not pay for it, and two warm models share one read."""
    from recsys.registry import Registry

    reads = []
    real = Registry.list_versions
    monkeypatch.setattr(Registry, "list_versions", lambda self: reads.append(1) or real(self))
    root = workspace(tmp_path / "repo", "auto")
    resolve(root)  # no champion
    champion(root, "mostpop", data="d0")  # a champion no trainable model starts from
    resolve(root)
    assert reads == []
    set_data(root, "d2")
    champion(root, "sasrec", data="d1")
    bert = champion(root, "bert4rec", data="d1")
    set_data(root, "d3")
    assert resolve(root)[2] == f"bert4rec: v{bert} (updated)" and reads == [1]


def test_the_fan_out_coordinator_ships_the_source_resolved_under_its_lock(tmp_path, monkeypatch, caplog):
    """The fan-out coordinator writes its work orders under the lock it runs `dvc` in; a batch ingested since
    the run's warm-sources task must not ship yesterday's source with today's data. The interleaving is the
    fault produced here: DVC and the work pool are stood in for (tests/test_fanout_e2e.py runs them)."""
    import logging
    from types import SimpleNamespace

    import flows.fanout
    from recsys import fanout

    root = workspace(tmp_path / "repo", "auto")
    first = champion(root, data="d0")
    second = champion(root, data="d1", seed=1, init={"mode": "warm", "from_version": first, "warm_streak": 1})
    assert resolve(root)[1].startswith(f"sasrec: v{first} kept")  # the run's first resolution, on d1
    set_data(root, "d2")  # an ingest commits a batch before the coordinator takes the lock
    shipped = {}
    monkeypatch.setattr(flows.fanout, "get_run_logger", lambda: logging.getLogger("fanout-test"))
    monkeypatch.setattr(flows.fanout, "run_dvc", lambda *args, **kwargs: SimpleNamespace(stdout=""))
    monkeypatch.setattr(fanout, "stale_models", lambda root, models: list(models))
    monkeypatch.setattr(fanout, "work_order",
                        lambda root, model, commit: shipped.setdefault(model, source(root, model)))
    monkeypatch.setattr(flows.fanout, "wait_for", lambda orders, deployment, idle_minutes: None)
    with caplog.at_level(logging.WARNING, logger="fanout-test"):
        flows.fanout.reproduce_on_workers(root, ["sasrec"], "train-model/recsys-gpu", "0" * 40, None)
    assert shipped["sasrec"].version == second
    assert f"warm source sasrec: v{second} (updated): it moved on since the run resolved it" in caplog.text
