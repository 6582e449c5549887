"""The one promotion path (`recsys.promotion.promote_candidate`) behind the flow and `recsys registry
promote`: identical lineage either way, the baseline champion, and re-scoring on new data."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from promotion_support import (
    DATA_MD5,
    evaluation_rows,
    event_rows,
    git,
    make_workspace,
    train,
    version_rows,
    write_stage_outputs,
)
from typer.testing import CliRunner

from recsys.commands.registry import app as registry_app
from recsys.config import load_params
from recsys.lineage import git_code_version
from recsys.promotion import PromotionError, promote_candidate
from recsys.registry import open_registry

runner = CliRunner()


@pytest.fixture(scope="module")
def mostpop_checkpoint(tiny_prepared, fast_train_config, tmp_path_factory) -> Path:
    from recsys.models.mostpop import MostPopConfig

    root = tmp_path_factory.mktemp("mostpop")
    return train("mostpop", MostPopConfig(), fast_train_config, tiny_prepared, root / "model")


@pytest.fixture
def workspace(tmp_path, write_params, tiny_prepared_dir, trained_sasrec, mostpop_checkpoint) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    params = write_params(path=root / "params.yaml")
    return make_workspace(root, params, tiny_prepared_dir, {"mostpop": mostpop_checkpoint,
                                                            "sasrec": trained_sasrec[1]})


def second_params(root: Path, name: str) -> Path:
    """The same params.yaml with its own registry (database and artifact store)."""
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["registry"] = {"url": f"sqlite:///{name}/registry.db", "artifact_root": f"{name}/artifacts",
                       "model_name": raw.get("registry", {}).get("model_name", "next_item")}
    path = root / f"params-{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def open_from(params_path: Path):  # type: ignore[no-untyped-def]
    params = load_params(params_path)
    return open_registry(params.registry, params_path.parent, params.gate)


def cli_promote(params_path: Path, *args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(registry_app,
                           ["promote", "--model", "sasrec", *args, "--params", str(params_path)])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def test_flow_and_cli_record_identical_lineage(workspace):
    from flows.retrain import promote_candidate as flow_promote

    flow_params, cli_params = second_params(workspace, "reg-flow"), second_params(workspace, "reg-cli")
    by_flow = flow_promote.fn(str(workspace), "sasrec", flow_params.name)
    by_hand = cli_promote(cli_params)
    assert by_hand.exit_code == 0, by_hand.output

    with open_from(flow_params) as flow_reg, open_from(cli_params) as cli_reg:
        flow_versions, cli_versions = version_rows(flow_reg), version_rows(cli_reg)
        assert flow_versions == cli_versions  # every field: params, code, dataset, metrics, role, status…
        assert event_rows(flow_reg) == event_rows(cli_reg)  # decisions, reasons, compared values
        assert evaluation_rows(flow_reg) == evaluation_rows(cli_reg)
        assert flow_reg.champion_version() == cli_reg.champion_version()

    baseline, candidate = flow_versions
    head = git(workspace, "rev-parse", "HEAD")
    params = load_params(workspace / "params.yaml")
    checkpoint = json.loads((workspace / "artifacts/models/sasrec/model.json").read_text())
    assert candidate["architecture"] == "sasrec" and candidate["version"] == by_flow["version"] == 2
    # What the checkpoint was trained with (the tests' short run), not params.yaml's train settings, which a
    # version used to record (a run under `--epochs 3` said params.yaml's 200).
    trained = checkpoint["train_config"]
    assert trained != json.loads(json.dumps(dataclasses.asdict(params.train_config("sasrec"))))
    assert candidate["params"] == {
        "model": "sasrec", "config": checkpoint["config"],
        "train": trained,
        "evaluate": json.loads(json.dumps(dataclasses.asdict(params.evaluate))),
        "init": {"mode": "cold"},  # trained with train.init: cold (the checkpoint records no init)
        "prepare": json.loads(json.dumps(dataclasses.asdict(params.prepare))),  # the split it trained under
        "train_until": checkpoint["train_until"],  # its newest training event (recsys/held_out.py)
    }
    prepared = json.loads((workspace / "artifacts/prepared/fingerprint.json").read_text())
    assert isinstance(checkpoint["train_until"], int) and checkpoint["train_until"] == prepared["train_until"]
    # Registered by hand, the version still records its code (dirty: code.py was edited) and dataset.
    assert candidate["code_version"] == baseline["code_version"] == f"{head}-dirty"
    assert candidate["dataset_version"] == baseline["dataset_version"] == DATA_MD5
    assert ("PROMOTED v2" if by_flow["promoted"] else "REFUSED v2") in by_hand.output
    # MostPop on the same data became the baseline champion before the candidate was gated against it.
    assert baseline["architecture"] == "mostpop" and baseline["role"] == "baseline"
    assert baseline["status"] == "promoted"
    assert by_flow["baseline_kind"] == "champion" and by_flow["baseline_version"] == 1
    assert by_flow["champion_rescored_metric"] == pytest.approx(baseline["metrics"]["ndcg@10"])


def test_the_gated_version_records_every_cold_try_of_its_run(workspace):
    """Only the best model by validation is gated: a periodic cold try (recsys/warm.py's `cold_try_of`) that
    another model beat on validation lost with it, and the version gated says so (`cold_tries`), or the
    next batch would train that model cold again (recsys/warm_source.py's `cold_tried`)."""
    from recsys.warm import COLD_TRIES, COLD_TRY_OF

    tried = {"version": 4, "artifact_sha256": "ab" * 32}
    other = workspace / "artifacts" / "models" / "bert4rec"  # another listed model, trained in the same run
    other.mkdir(parents=True)
    (other / "model.json").write_text(json.dumps({"model": "bert4rec", "init": {
        "requested": "auto", "mode": "cold", "reason": "the line's 5th version", COLD_TRY_OF: tried}}))
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    (workspace / "params.yaml").write_text(yaml.safe_dump({**raw, "models": [*raw["models"], "bert4rec"]}))
    params = load_params(workspace / "params.yaml")
    decision = promote_candidate(workspace, params, "sasrec")
    with open_from(workspace / "params.yaml") as registry:
        gated = registry.get_version(decision.version)
    assert gated.params[COLD_TRIES] == [{"model": "bert4rec", **tried}]


def test_the_flow_records_the_data_dvc_repro_trained_on_not_an_ingest_since(workspace):
    """An ingest between the flow's `dvc repro` and its promotion moved data.dvc on, and the version was
    recorded with data its model never saw. The flow takes dvc.lock's record of what `prepare` ran on; a
    promotion by hand keeps data.dvc's (its stages may have been run by hand)."""
    from flows.retrain import promote_candidate as flow_promote

    trained_on = "0" * 32 + ".dir"
    lock = {"schema": "2.0", "stages": {"prepare": {"cmd": "python -m recsys.prepare", "deps": [
        {"path": "recsys/prepare.py", "md5": "1" * 32, "size": 1},
        {"path": "data", "md5": trained_on, "size": 10, "nfiles": 1}]}}}
    (workspace / "dvc.lock").write_text(yaml.safe_dump(lock))
    flow_params, cli_params = second_params(workspace, "reg-flow"), second_params(workspace, "reg-cli")
    flow_promote.fn(str(workspace), "sasrec", flow_params.name)
    assert cli_promote(cli_params).exit_code == 0
    with open_from(flow_params) as flow_reg, open_from(cli_params) as cli_reg:
        assert {v["dataset_version"] for v in version_rows(flow_reg)} == {trained_on}
        assert {v["dataset_version"] for v in version_rows(cli_reg)} == {DATA_MD5}


def test_a_promotion_waits_for_the_workspace_lock(workspace, tmp_path):
    """A `dvc repro` or an ingest of another run (holding the workspace lock) could replace a checkpoint or
    its metrics while a promotion read and copied them: the promotion now waits for the lock — still
    waiting a second after it started, done once the holder lets go (which it does when told)."""
    import subprocess
    import sys
    import threading

    go, released = tmp_path / "go", tmp_path / "released"
    hold = ("import sys, time\nfrom pathlib import Path\n"
            "from recsys.workspace import workspace_lock\n"
            "with workspace_lock(Path(sys.argv[1])):\n"
            "    print('locked', flush=True)\n"
            "    deadline = time.monotonic() + 60\n"
            "    while not Path(sys.argv[2]).exists() and time.monotonic() < deadline:\n"
            "        time.sleep(0.02)\n"
            "    Path(sys.argv[3]).write_text('x')\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(workspace), str(go), str(released)],
                              stdout=subprocess.PIPE, text=True)
    decisions = []
    try:
        assert holder.stdout.readline().strip() == "locked"
        promoter = threading.Thread(target=lambda: decisions.append(
            promote_candidate(workspace, load_params(workspace / "params.yaml"), "sasrec")))
        promoter.start()
        promoter.join(1.0)
        assert promoter.is_alive() and not decisions  # blocked on the lock the holder keeps
        go.write_text("x")
        promoter.join(60)
        assert released.exists()  # it finished only after the holder let go
        [decision] = decisions
        assert decision.version == 2
    finally:
        go.write_text("x")
        holder.wait(60)


def test_a_repeated_promotion_changes_nothing(workspace):
    params = load_params(workspace / "params.yaml")
    first = promote_candidate(workspace, params, "sasrec")
    again = promote_candidate(workspace, params, "sasrec")
    assert again.replayed and again.version == first.version and again.decision == first.decision
    with open_from(workspace / "params.yaml") as reg:
        assert len(reg.list_versions()) == 2 and len(reg.history()) == 2


def test_metrics_of_another_checkpoint_are_refused_and_nothing_is_registered(workspace):
    """`recsys registry promote` registered whatever artifacts/models/<m> held with whatever metrics/<m>.json
    said: a checkpoint truncated after its evaluation became champion (and every `recommend` then failed); one
    trained on by hand (`recsys train` resumed) was gated on the old checkpoint's numbers, and that decision
    replayed for good. The evaluate stage records the digest of what it scored; a promotion checks it."""
    params = load_params(workspace / "params.yaml")
    weights = workspace / "artifacts" / "models" / "sasrec" / "model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(intact[:1000])
    # From another folder the command to score it names the repository's params.yaml; `dvc repro` is the
    # other way on, as it puts back the checkpoint dvc.lock records (a checkpoint trained by hand is lost).
    with pytest.raises(PromotionError, match=(
            rf"^{workspace}/metrics/sasrec.json scored another checkpoint \(sha256 [0-9a-f]{{12}}\) than .* holds "
            r"now \([0-9a-f]{12}\): it was trained again, resumed or changed since: score the checkpoint as it "
            rf"is with `recsys evaluate --model sasrec --params {workspace}/params.yaml`, or go back to the one "
            r"dvc.lock records with `dvc repro evaluate@sasrec`; then promote$")):
        promote_candidate(workspace, params, "sasrec")
    weights.write_bytes(intact)
    metrics_path = workspace / "metrics" / "mostpop.json"  # the baseline's numbers are checked too
    recorded = json.loads(metrics_path.read_text())
    metrics_path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "checkpoint_sha256"}))
    with pytest.raises(PromotionError, match=rf"^{workspace}/metrics/mostpop.json does not say which checkpoint "
                                             r"it scored"):
        promote_candidate(workspace, params, "sasrec")
    with open_from(workspace / "params.yaml") as reg:
        assert reg.list_versions() == [] and reg.history() == []
    metrics_path.write_text(json.dumps(recorded))
    assert promote_candidate(workspace, params, "sasrec").decision == "promoted"


def test_promoting_the_baseline_first_installs_it_once_and_later_gates_it(workspace):
    """`promote --model mostpop` with nothing gated yet: the baseline champion, one event (it was installed,
    then gated against itself: a second, `rejected`, event for the same version). Once a model has passed,
    the baseline is a candidate like any other."""
    first = runner.invoke(registry_app, ["promote", "--model", "mostpop", "--params",
                                         str(workspace / "params.yaml")])
    assert first.exit_code == 0, first.output
    assert first.output.startswith(
        "PROMOTED v1 (mostpop): v1 (mostpop) is the baseline champion"), first.output
    with open_from(workspace / "params.yaml") as reg:
        assert reg.champion_version() == 1 and [e.decision for e in reg.history()] == ["promoted"]
    again_first = runner.invoke(registry_app, ["promote", "--model", "mostpop", "--params",
                                               str(workspace / "params.yaml")])
    assert "PROMOTED v1 (mostpop) (already decided earlier; nothing changed)" in again_first.output
    params = load_params(workspace / "params.yaml")
    gated = promote_candidate(workspace, params, "sasrec")
    again = promote_candidate(workspace, params, "mostpop")
    assert gated.promoted and gated.version == 2, gated  # the tiny SASRec beats MostPop
    assert again.baseline_kind == "champion" and again.baseline_version == 2 and not again.promoted
    with open_from(workspace / "params.yaml") as reg:
        assert len(reg.list_versions()) == 2


def test_only_a_counting_model_can_be_the_ungated_baseline(workspace):
    """`--baseline sasrec` installed SASRec as the champion without the gate (a version the gate had just
    refused included): a baseline must be a model that learns by counting."""
    args = ["promote", "--model", "sasrec", "--params", str(workspace / "params.yaml")]
    for baseline in ("sasrec", "bert4rec"):
        refused = runner.invoke(registry_app, [*args, "--baseline", baseline])
        assert refused.exit_code == 1 and refused.output.count("\n") == 1, refused.output
        assert f"{baseline} cannot be the baseline: a baseline is champion without passing the gate" in refused.output
        assert "(mostpop; the default is mostpop)" in refused.output
    assert not (workspace / "registry").exists()  # refused before the registry was opened
    with pytest.raises(PromotionError, match="cannot be the baseline"):
        promote_candidate(workspace, load_params(workspace / "params.yaml"), "mostpop", baseline="mojito")


def test_a_damaged_registry_database_is_one_line_and_not_worth_retrying(workspace):
    """The flows' promote task retried any SQLAlchemy error twice, then printed its traceback: the promotion
    step names the registry in one line, and a damaged file is not a failure that may pass."""
    from recsys.entry import is_transient, is_user_error
    from recsys.registry import RegistryDatabaseError

    (workspace / "registry").mkdir()
    (workspace / "registry" / "registry.db").write_bytes(b"not a database, at all" * 100)
    with pytest.raises(RegistryDatabaseError) as err:
        promote_candidate(workspace, load_params(workspace / "params.yaml"), "sasrec")
    assert str(err.value) == ("cannot promote 'sasrec': the registry database failed (registry "
                              "sqlite:///registry/registry.db): file is not a database")
    assert is_user_error(err.value) and not is_transient(err.value)
    out = runner.invoke(registry_app, ["promote", "--model", "sasrec", "--params", str(workspace / "params.yaml")])
    assert out.exit_code == 1 and out.output == f"error: {err.value}\n", out.output


def test_code_version_is_dirty_only_for_code_changes(workspace):
    head = git(workspace, "rev-parse", "HEAD")
    assert git_code_version(workspace) == f"{head}-dirty"  # code.py edited by make_workspace
    git(workspace, "checkout", "--", "code.py")
    assert git_code_version(workspace) == head
    (workspace / "data.dvc").write_text("outs:\n- md5: ffff.dir\n  path: data\n")  # DVC bookkeeping only
    (workspace / "untracked.py").write_text("x = 1\n")
    assert git_code_version(workspace) == head
    assert git_code_version(workspace.parent) is None  # not a git checkout


def test_new_data_rescores_the_champion_and_the_decision_carries_the_compared_value(
    workspace, tiny_generated, tiny_prepare_config, tiny_sasrec_config, fast_train_config
):
    """A champion from the old data is re-scored on the candidate's test set; that value is what the gate
    compared and what the decision reports (not the champion's stored metric)."""
    from recsys.evaluate import evaluate_checkpoint
    from recsys.models.mostpop import MostPopConfig
    from recsys.prepare import prepare, save

    params_path = workspace / "params.yaml"
    old = promote_candidate(workspace, load_params(params_path), "sasrec")
    assert old.promoted and old.version == 2, old.reason
    with open_from(params_path) as reg:
        stored = reg.get_version(2).metrics["ndcg@10"]

    # New data: a later batch changes the prepared dataset (and so the test set's fingerprint).
    interactions = tiny_generated.interactions
    newer = interactions[interactions["user_id"].astype(str) != str(interactions["user_id"].iloc[0])]
    prepared = prepare(newer, tiny_prepare_config, tiny_generated.items)
    new_dir = workspace.parent / "prepared-new"
    save(prepared, new_dir)
    import shutil

    shutil.rmtree(workspace / "artifacts" / "prepared")
    shutil.copytree(new_dir, workspace / "artifacts" / "prepared")
    params = load_params(params_path)
    models = workspace.parent / "models-new"
    write_stage_outputs(workspace, "mostpop", train("mostpop", MostPopConfig(), fast_train_config, prepared,
                                                    models / "mostpop"), new_dir, params.evaluate)
    write_stage_outputs(workspace, "sasrec", train("sasrec", tiny_sasrec_config,
                                                   dataclasses.replace(fast_train_config, epochs=1, seed=7),
                                                   prepared, models / "sasrec"), new_dir, params.evaluate)

    decision = promote_candidate(workspace, params, "sasrec")
    with open_from(params_path) as reg:
        rescored = evaluate_checkpoint(reg.version_dir(2), new_dir, "test", params.evaluate)
        rescored = rescored.metrics["ndcg@10"]
        versions = reg.list_versions()
    assert decision.baseline_kind == "champion" and decision.baseline_version == 2
    assert decision.champion_rescored_metric == pytest.approx(rescored)
    assert decision.baseline_metric == decision.champion_rescored_metric
    assert decision.champion_rescored_metric != pytest.approx(stored)
    # The new MostPop is registered as a baseline but does not displace a champion that passed the gate.
    assert [v.role for v in versions] == ["baseline", None, "baseline", None]


def test_the_champion_is_rescored_where_its_models_evaluate_stage_runs(write_params, tiny_prepared_dir,
                                                                        trained_sasrec, monkeypatch):
    """The gate re-scored the champion on the CPU whatever `train.device` said, while the candidate's test
    pass ran on its training device: now both are measured where the model's evaluate stage runs."""
    import torch

    from recsys import evaluate
    from recsys.evaluate import evaluate_checkpoint
    from recsys.promotion import rescore_on

    asked: list[tuple] = []  # what the rescore asks for, as the evaluate stage does: device, allocator

    def spy(name, real):
        def record(*args):
            asked.append((name, args[0]))
            return real(*args)
        monkeypatch.setattr(evaluate, name, record)

    spy("resolve_device", evaluate.resolve_device)
    spy("retain_cpu_memory", evaluate.retain_cpu_memory)
    checkpoint = trained_sasrec[1]
    # The global train section says cuda and retain; sasrec's own says cpu and system: sasrec's decides.
    params = load_params(write_params({"train": {"device": "cuda", "cpu_allocator": "retain"},
                                       "sasrec": {"train": {"device": "cpu", "cpu_allocator": "system"}}}))
    rescored = rescore_on(params, tiny_prepared_dir)(checkpoint)
    assert asked == [("resolve_device", "cpu"), ("retain_cpu_memory", "system")]
    assert rescored.metrics == evaluate_checkpoint(checkpoint, tiny_prepared_dir, "test", params.evaluate).metrics
    asked.clear()
    # The checkpoint's own model's train section decides (sasrec's here, not the global train section);
    # `cuda` on a machine without one (a fan-out coordinator, whose workers have the GPUs) is the CPU.
    on_cuda = load_params(write_params({"sasrec": {"train": {"device": "cuda"}}}))
    assert on_cuda.train.device != "cuda" and on_cuda.train_config("sasrec").device == "cuda"
    on_device = rescore_on(on_cuda, tiny_prepared_dir)(checkpoint)
    allocator = on_cuda.train_config("sasrec").cpu_allocator
    assert asked == [("resolve_device", "auto"), ("retain_cpu_memory", allocator)]
    if torch.cuda.is_available():  # scored on the GPU: the same users, the numbers within float error
        assert on_device.metrics.keys() == rescored.metrics.keys()
        assert on_device.metrics["ndcg@10"] == pytest.approx(rescored.metrics["ndcg@10"], abs=1e-3)
    else:
        assert on_device.metrics == rescored.metrics
