"""Registry on SQLite: every gate decision path end to end, idempotency, rollback, artifacts, security."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError
from test_registry_support import (
    FP_A,
    FP_B,
    N_USERS,
    CountingEvaluate,
    eval_from_values,
    make_checkpoint,
    make_eval,
    registry_config,
)

from recsys.config import ConfigError, GateConfig
from recsys.registry import (
    ArtifactIntegrityError,
    RegistryError,
    RollbackError,
    open_registry,
)
from recsys.registry import migrate
from recsys.registry.store import ArtifactError, ArtifactStore, directory_digest


@pytest.fixture
def registry(tmp_path):
    with open_registry(registry_config(tmp_path), tmp_path, GateConfig()) as reg:
        yield reg


MOSTPOP = make_eval(-0.15)


def _promote(registry, tmp_path, name, ev, **kw):
    kw.setdefault("baseline_result", MOSTPOP)
    kw.setdefault("baseline_kind", "mostpop")
    return registry.promote(make_checkpoint(tmp_path / "ckpts", name), ev, **kw)


# --- decision paths ------------------------------------------------------------------------------------


def test_first_candidate_without_champion_or_mostpop_is_refused_and_recorded(registry, tmp_path):
    out = _promote(registry, tmp_path, "a", make_eval(0.0), baseline_result=None)
    assert not out.promoted and out.decision == "rejected"
    assert "no baseline result" in out.reason
    assert registry.champion_version() is None
    [event] = registry.history()
    assert event.decision == "rejected" and event.candidate_version == 1 and "baseline" in event.reason
    assert registry.get_version(1).status == "rejected"


def test_first_candidate_must_beat_mostpop(registry, tmp_path):
    worse = _promote(registry, tmp_path, "a", make_eval(-0.2, seed=1))
    assert not worse.promoted and "worse than mostpop" in worse.reason and worse.baseline_kind == "mostpop"
    better = _promote(registry, tmp_path, "b", make_eval(0.0, seed=2))
    assert better.promoted and better.baseline_kind == "mostpop" and better.baseline_version is None
    assert better.p_value is not None and better.p_value < 0.05
    assert registry.champion_version() == 2


def test_mostpop_on_another_evaluation_set_is_not_a_valid_baseline(registry, tmp_path):
    out = _promote(registry, tmp_path, "a", make_eval(0.0), baseline_result=make_eval(-0.2, FP_B))
    assert not out.promoted and "different evaluation set" in out.reason


def test_higher_lower_equal_nan_against_the_champion(registry, tmp_path):
    assert _promote(registry, tmp_path, "v1", make_eval(0.0, seed=1)).promoted

    higher = _promote(registry, tmp_path, "v2", make_eval(0.05, seed=2))
    assert higher.promoted and higher.baseline_version == 1 and higher.baseline_kind == "champion"
    assert higher.delta == pytest.approx(higher.candidate_metric - higher.baseline_metric)
    assert registry.champion_version() == 2

    lower = _promote(registry, tmp_path, "v3", make_eval(0.01, seed=3))
    assert not lower.promoted and "worse than champion v2" in lower.reason

    # Same per-user results as the champion from a different artifact: not an improvement.
    equal = _promote(registry, tmp_path, "v4", make_eval(0.05, seed=2))
    assert not equal.promoted and "equal to champion v2" in equal.reason

    nan = _promote(registry, tmp_path, "v5", make_eval(0.5, seed=5, metric_override=float("nan")))
    assert not nan.promoted and "NaN" in nan.reason

    missing = make_eval(0.5, seed=6)
    del missing.metrics["ndcg@10"]
    out = _promote(registry, tmp_path, "v6", missing)
    assert not out.promoted and "missing" in out.reason

    assert registry.champion_version() == 2
    events = registry.history()
    assert [e.decision for e in events] == ["promoted", "promoted", "rejected", "rejected", "rejected",
                                            "rejected"]
    assert all(e.reason for e in events)
    assert [v.version for v in registry.list_versions()] == [1, 2, 3, 4, 5, 6]
    # NaN is stored as "missing", never as a number that could compare as better.
    assert registry.get_version(5).metrics["ndcg@10"] is None
    assert events[4].candidate_metric is None


def test_significance_on_and_off(tmp_path):
    champion = make_eval(0.1, noise=0.0)
    noise = np.random.default_rng(9).normal(0.0, 0.03, N_USERS)
    # Mean gain exactly 0.003, per-user noise 0.03: t ≈ 0.9, far from significant.
    noisy = eval_from_values(champion.per_user["ndcg@10"].to_numpy() + 0.003 + noise - noise.mean())
    for significance, expected in [(True, False), (False, True)]:
        root = tmp_path / str(significance)
        with open_registry(registry_config(root), root, GateConfig(significance=significance)) as reg:
            assert _promote(reg, root, "champ", champion).promoted
            out = _promote(reg, root, "cand", noisy)
            assert out.promoted is expected, out.reason
            assert out.delta == pytest.approx(0.003)
            assert out.p_value is not None and out.p_value > 0.05
            if significance:
                assert "not significant" in out.reason
            else:
                assert "significance test off" in out.reason


def test_min_delta_from_params(tmp_path):
    with open_registry(registry_config(tmp_path), tmp_path, GateConfig(min_delta=0.02)) as reg:
        assert _promote(reg, tmp_path, "champ", make_eval(0.0, seed=1)).promoted
        small = _promote(reg, tmp_path, "small", make_eval(0.01, seed=2))
        assert not small.promoted and "min_delta" in small.reason
        assert _promote(reg, tmp_path, "big", make_eval(0.04, seed=3)).promoted


def test_champion_is_rescored_on_new_data_before_comparing(registry, tmp_path):
    assert _promote(registry, tmp_path, "champ", make_eval(0.10, FP_A, seed=1)).promoted
    # New data (evaluation set B). On B the champion scores 0.20 above its base, the candidate 0.15:
    # the candidate beats the champion's *old* number but not the champion on the same data.
    rescore = CountingEvaluate(make_eval(0.20, FP_B, seed=11))
    out = _promote(registry, tmp_path, "cand", make_eval(0.15, FP_B, seed=12), rescore=rescore)
    assert not out.promoted and "worse than champion v1" in out.reason
    assert out.baseline_metric == pytest.approx(rescore.result.metrics["ndcg@10"])
    assert out.eval_fingerprint == FP_B
    # The value the gate compared is the re-scored one, not the champion's stored metric.
    assert out.champion_rescored_metric == out.baseline_metric != registry.get_version(1).metrics["ndcg@10"]
    [checkpoint] = rescore.calls
    assert checkpoint == registry.store.path_for(registry.get_version(1).artifact_sha256)

    # The re-score is cached per evaluation set: a second candidate on B does not re-evaluate.
    better = _promote(registry, tmp_path, "cand2", make_eval(0.30, FP_B, seed=13), rescore=rescore)
    assert better.promoted and better.baseline_metric == pytest.approx(rescore.result.metrics["ndcg@10"])
    assert len(rescore.calls) == 1


def test_champion_changing_during_rescore_is_decided_against_the_new_champion(registry, tmp_path):
    """Re-scoring happens outside the lock; if another run crowns a champion meanwhile, decide again."""
    assert _promote(registry, tmp_path, "v1", make_eval(0.10, FP_A, seed=1)).promoted
    champion_on_b = make_eval(0.10, FP_B, seed=21)

    def evaluate_while_another_run_promotes(checkpoint):
        if not hasattr(evaluate_while_another_run_promotes, "done"):
            evaluate_while_another_run_promotes.done = True  # type: ignore[attr-defined]
            other = _promote(registry, tmp_path, "rival", make_eval(0.30, FP_B, seed=22),
                             rescore=CountingEvaluate(champion_on_b))
            assert other.promoted and other.version == 3
        return champion_on_b

    out = _promote(registry, tmp_path, "slow", make_eval(0.20, FP_B, seed=23),
                   rescore=evaluate_while_another_run_promotes)
    # Compared with the new champion (v3, better), not the stale one (v1, which it would have beaten).
    assert not out.promoted and out.baseline_version == 3 and "worse than champion v3" in out.reason
    assert registry.champion_version() == 3
    assert [(e.candidate_version, e.baseline_version, e.decision) for e in registry.history()] == [
        (1, None, "promoted"), (3, 1, "promoted"), (2, 3, "rejected")]


def test_rescore_on_a_different_evaluation_set_is_an_error(registry, tmp_path):
    assert _promote(registry, tmp_path, "champ", make_eval(0.1, FP_A, seed=1)).promoted
    wrong = CountingEvaluate(make_eval(0.1, FP_A, seed=1))  # evaluates on the old data again
    with pytest.raises(RegistryError, match="same prepared data"):
        _promote(registry, tmp_path, "cand", make_eval(0.2, FP_B), rescore=wrong)
    # The version is registered (never lost) but no decision was recorded for it.
    assert registry.get_version(2).status == "registered"
    assert len(registry.history()) == 1


LOO = {"min_user_interactions": 5, "min_item_interactions": 5, "split": "loo", "valid_quantile": 0.8,
       "test_quantile": 0.9}
GLOBAL_TIME = {**LOO, "split": "global_time"}


def _split_otherwise(version):  # what recsys.promotion passes: why a champion cannot be the yardstick
    return "was trained under leave-one-out" if (version.params or {}).get("prepare") == LOO else None


def test_a_champion_trained_under_other_split_settings_is_not_the_gates_yardstick(registry, tmp_path):
    """Its figure on today's test split may count events it learnt: it is neither re-scored nor compared,
    the candidate is gated against the baseline, and the decision says why; with no baseline it is refused."""
    loo, today = {"model": "sasrec", "prepare": LOO}, {"model": "sasrec", "prepare": GLOBAL_TIME}
    assert _promote(registry, tmp_path, "old", make_eval(0.3, FP_B, seed=1), params=loo,  # yesterday's split
                    baseline_result=make_eval(-0.15, FP_B)).promoted
    rescore = CountingEvaluate(make_eval(0.3, seed=1))  # what re-scoring it would give: far above the new one
    kw = {"params": today, "rescore": rescore, "incomparable": _split_otherwise, "baseline_kind": "mostpop"}
    new, weak = (make_checkpoint(tmp_path / "ckpts", name) for name in ("new", "weak"))
    refused = registry.promote(new, make_eval(0.0, seed=2), baseline_result=None, **kw)
    assert not refused.promoted and refused.reason == (
        "not gated against the champion v1, which was trained under leave-one-out; and there is no mostpop "
        "result on this evaluation set to gate against instead (evaluate it first: "
        "`dvc repro evaluate@mostpop`)")
    assert registry.champion_version() == 1
    again = registry.promote(new, make_eval(0.0, seed=2), baseline_result=None, **kw)
    assert again.replayed and again.reason == refused.reason  # decided once while that champion serves
    rejected = registry.promote(weak, make_eval(-0.3, seed=5), baseline_result=MOSTPOP, **kw)
    assert not rejected.promoted and rejected.baseline_kind == "mostpop"
    assert "worse than mostpop" in rejected.reason
    assert registry.promote(weak, make_eval(-0.3, seed=5), baseline_result=MOSTPOP, **kw).replayed
    assert len(registry.history()) == 3  # the first promotion, one refusal, one rejection: no repeats
    out = _promote(registry, tmp_path, "newer", make_eval(0.0, seed=3), params=today, rescore=rescore,
                   incomparable=_split_otherwise)
    assert out.promoted and out.baseline_kind == "mostpop" and out.baseline_version is None
    assert out.reason.endswith("(gated against mostpop, not the champion v1, which was trained under "
                               "leave-one-out)")
    assert rescore.calls == [] and registry.champion_version() == 4
    # Trained under today's settings, the new champion is the yardstick again: a weaker candidate is refused.
    worse = _promote(registry, tmp_path, "worse", make_eval(-0.1, seed=4), params=today,
                     incomparable=_split_otherwise)
    assert not worse.promoted and worse.baseline_kind == "champion" and worse.baseline_version == 4


def test_promotion_names_the_split_settings_a_champion_was_trained_under():
    from types import SimpleNamespace

    from recsys.config import parse_params
    from recsys.promotion import _untrustworthy as promotion_check

    params = parse_params({"prepare": {"split": "global_time"}})
    assert promotion_check(SimpleNamespace(params={"prepare": LOO}), params, None) == (
        "was trained on data prepared otherwise (prepare.split loo, now global_time), so today's test events "
        "may be among those it learnt")
    assert promotion_check(SimpleNamespace(params={"prepare": GLOBAL_TIME}), params, None) is None
    assert promotion_check(SimpleNamespace(params={}), params, None) is None  # recorded nothing: as before


def test_promotion_does_not_trust_a_champion_that_trained_on_events_today_holds_out():
    """Same settings, but late-arriving events moved today's global_time test cut to or before the champion's
    newest training event: its re-scored figure may count test events it learnt. The cut is read from the
    prepared dataset's fingerprint.json as the stage writes it."""
    from types import SimpleNamespace

    from recsys.config import parse_params
    from recsys.promotion import _untrustworthy as promotion_check

    params = parse_params({"prepare": {"split": "global_time"}})
    cut = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    champion = SimpleNamespace(params={"prepare": GLOBAL_TIME, "train_until": int(cut)})
    assert promotion_check(champion, params, cut - 0.25) == (
        "trained on events up to 2023-11-14 22:13:20 UTC, and today's split holds out every event from "
        "2023-11-14 22:13:20 UTC (today's prepare quantile cut is earlier than the one it trained under: events "
        "that arrived late, or that the k-core filter re-admitted, move it): it may have learnt today's test "
        "events")
    assert promotion_check(champion, params, cut) is not None  # its newest event is a test-period one today
    assert promotion_check(champion, params, cut + 0.5) is None  # trained only on events before the cut
    assert promotion_check(champion, params, None) is None  # loo today: no global cut
    assert promotion_check(SimpleNamespace(params={"prepare": GLOBAL_TIME}), params, cut) is None  # unrecorded


def test_the_gate_reads_todays_test_cut_from_the_prepared_dataset(tiny_interactions, tiny_prepare_config, tmp_path):
    import dataclasses

    from recsys.prepare import prepare, save
    from recsys.promotion import _test_from

    split = dataclasses.replace(tiny_prepare_config, split="global_time")
    prepared = prepare(tiny_interactions, split)
    save(prepared, tmp_path / "global")
    fp = prepared.fingerprint
    assert _test_from(tmp_path / "global") == fp["test_from"] > fp["held_out_from"]
    save(prepare(tiny_interactions, tiny_prepare_config), tmp_path / "loo")
    assert _test_from(tmp_path / "loo") is None and _test_from(tmp_path / "missing") is None


def test_candidate_that_is_already_champion(registry, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpts", "champ")
    assert registry.promote(ckpt, make_eval(0.1), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
    again = registry.promote(ckpt, make_eval(0.1, FP_B), baseline_result=MOSTPOP, baseline_kind="mostpop")
    assert not again.promoted and "already the champion" in again.reason
    assert [v.version for v in registry.list_versions()] == [1]


# --- idempotency ---------------------------------------------------------------------------------------


def test_rerun_after_success_returns_the_recorded_decision(registry, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpts", "a")
    first = registry.promote(ckpt, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop")
    second = registry.promote(ckpt, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop")
    assert first.promoted and not first.replayed
    assert second.replayed and second.promoted and second.version == first.version
    assert len(registry.list_versions()) == 1
    assert len(registry.history()) == 1


def test_a_changed_gate_decides_again_instead_of_replaying(tmp_path):
    config = registry_config(tmp_path)
    champion = make_checkpoint(tmp_path / "ckpts", "champion")
    candidate = make_checkpoint(tmp_path / "ckpts", "candidate")
    small_gain = make_eval(0.002, seed=7)
    with open_registry(config, tmp_path, GateConfig(min_delta=0.01)) as strict:
        assert strict.promote(champion, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop").promoted
        refused = strict.promote(candidate, small_gain, baseline_result=MOSTPOP, baseline_kind="mostpop")
        assert not refused.promoted and "min_delta" in refused.reason
        assert strict.promote(candidate, small_gain, baseline_result=MOSTPOP, baseline_kind="mostpop").replayed
    with open_registry(config, tmp_path, GateConfig(min_delta=0.0, significance=False)) as lenient:
        again = lenient.promote(candidate, small_gain, baseline_result=MOSTPOP, baseline_kind="mostpop")
        assert not again.replayed and again.promoted, again.reason
        assert lenient.champion_version() == again.version
        assert [e.decision for e in lenient.history()] == ["promoted", "rejected", "promoted"]


def test_a_rejection_is_decided_again_once_its_champion_no_longer_serves(registry, tmp_path):
    """A rejection measured against no champion (the baseline not evaluated yet) or against a champion a
    rollback has replaced is not replayed: the candidate is gated against what serves now — once, then that
    decision is the one replayed."""
    candidate = make_checkpoint(tmp_path / "ckpts", "cand")
    good = make_eval(0.05, seed=3)
    first = registry.promote(candidate, good, baseline_result=None, baseline_kind="mostpop")
    assert not first.promoted and "evaluate@mostpop" in first.reason
    assert registry.install_baseline(make_checkpoint(tmp_path / "ckpts", "mp", model="mostpop"), MOSTPOP) == 2
    again = registry.promote(candidate, good, baseline_result=None, baseline_kind="mostpop")
    assert again.promoted and not again.replayed and again.baseline_version == 2, again.reason
    assert registry.promote(candidate, good, baseline_result=None, baseline_kind="mostpop").replayed

    better = make_eval(0.10, seed=4)
    assert _promote(registry, tmp_path, "better", better).promoted  # v3 > v1
    late = make_eval(0.07, seed=5)
    refused = _promote(registry, tmp_path, "late", late)
    assert not refused.promoted and refused.baseline_version == 3
    assert registry.promote(tmp_path / "ckpts" / "late", late, baseline_result=MOSTPOP,
                            baseline_kind="mostpop").replayed  # the same champion: the same answer
    registry.rollback()  # back to v1, which "late" beats
    decided = registry.promote(tmp_path / "ckpts" / "late", late, baseline_result=MOSTPOP,
                               baseline_kind="mostpop")
    assert decided.promoted and not decided.replayed and decided.baseline_version == 1, decided.reason
    assert [e.decision for e in registry.history()] == [
        "rejected", "promoted", "promoted", "promoted", "rejected", "rollback", "promoted"]


def test_same_artifact_copied_elsewhere_is_the_same_version(registry, tmp_path):
    a = make_checkpoint(tmp_path / "one", "ck", payload=b"same weights")
    b = make_checkpoint(tmp_path / "two", "ck", payload=b"same weights")
    registry.promote(a, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop")
    out = registry.promote(b, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop")
    assert out.replayed and out.version == 1


def test_rerun_after_a_crash_between_register_and_decide(registry, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpts", "a")
    number, _ = registry.register(ckpt, make_eval(0.0))  # "crash" here: registered, undecided
    assert registry.history() == []
    out = registry.promote(ckpt, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop")
    assert out.promoted and out.version == number == 1
    assert len(registry.list_versions()) == 1 and len(registry.history()) == 1


# --- rollback ------------------------------------------------------------------------------------------


def test_rollback_walks_back_through_former_champions(registry, tmp_path):
    for i, shift in enumerate([0.0, 0.05, 0.10], start=1):
        assert _promote(registry, tmp_path, f"v{i}", make_eval(shift, seed=i)).promoted
    assert not _promote(registry, tmp_path, "v4", make_eval(-0.05, seed=4)).promoted

    event = registry.rollback()
    assert (event.decision, event.candidate_version, event.baseline_version) == ("rollback", 2, 3)
    assert "from v3 to v2" in event.reason
    assert event.delta == pytest.approx(event.candidate_metric - event.baseline_metric)
    assert registry.champion_version() == 2
    assert registry.rollback().candidate_version == 1
    with pytest.raises(RollbackError, match="no previous champion"):
        registry.rollback()

    assert registry.rollback(to_version=3).candidate_version == 3
    with pytest.raises(RollbackError, match="already the champion"):
        registry.rollback(to_version=3)
    with pytest.raises(RollbackError, match="never promoted"):
        registry.rollback(to_version=4)
    with pytest.raises(RollbackError, match="does not exist"):
        registry.rollback(to_version=99)
    decisions = [e.decision for e in registry.history()]
    assert decisions == ["promoted", "promoted", "promoted", "rejected", "rollback", "rollback", "rollback"]


def test_replaying_a_promotion_a_rollback_undid_says_it_is_not_the_champion(registry, tmp_path):
    """Re-running the same promotion after a rollback replays the recorded decision: it moves nothing (the
    rollback was a person's decision) and must not report the candidate as serving."""
    assert _promote(registry, tmp_path, "v1", make_eval(0.0, seed=1)).promoted
    second = make_eval(0.05, seed=2)
    assert _promote(registry, tmp_path, "v2", second).promoted
    registry.rollback()
    again = registry.promote(tmp_path / "ckpts" / "v2", second, baseline_result=MOSTPOP,
                             baseline_kind="mostpop")
    assert again.replayed and again.decision == "promoted" and not again.promoted and again.version == 2
    assert "since then v1 became the champion" in again.reason and "rollback --to 2" in again.reason
    assert registry.champion_version() == 1 and [e.decision for e in registry.history()][-1] == "rollback"


def test_rollback_without_champion(registry):
    with pytest.raises(RollbackError, match="no champion"):
        registry.rollback()


def test_rollback_refuses_a_tampered_target(registry, tmp_path):
    assert _promote(registry, tmp_path, "v1", make_eval(0.0, seed=1)).promoted
    assert _promote(registry, tmp_path, "v2", make_eval(0.1, seed=2)).promoted
    weights = registry.store.path_for(registry.get_version(1).artifact_sha256) / "model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"evil" + weights.read_bytes()[4:])
    with pytest.raises(ArtifactIntegrityError, match="model.safetensors was modified"):
        registry.rollback()
    assert registry.champion_version() == 2
    assert [e.decision for e in registry.history()] == ["promoted", "promoted"]


# --- artifacts -----------------------------------------------------------------------------------------


def test_artifacts_are_content_addressed(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    a = store.put(make_checkpoint(tmp_path / "x", "ck", payload=b"w"))
    b = store.put(make_checkpoint(tmp_path / "y", "other-name", payload=b"w"))
    c = store.put(make_checkpoint(tmp_path / "z", "ck", payload=b"w2"))
    assert a.sha256 == b.sha256 != c.sha256
    assert a.path == tmp_path / "store" / "sha256" / a.sha256
    assert directory_digest(a.path) == a.sha256
    assert sorted(p.name for p in a.path.iterdir()) == [
        "MANIFEST.json", "items.json", "model.json", "model.safetensors", "users.json"]
    assert not (tmp_path / "store" / "tmp").exists() or not any((tmp_path / "store" / "tmp").iterdir())


def test_a_stored_artifact_is_on_the_disk_before_its_address_names_it(tmp_path, monkeypatch):
    """The registry commits a version row naming the address right after `put`: every file and folder of the
    copy is flushed before the rename that gives it that address, and the folder holding it after. (The only
    mock: a power cut cannot be produced here, so the flushes are recorded, not survived.)"""
    from recsys.registry import store as store_module

    events = []
    monkeypatch.setattr(store_module, "fsync_path", lambda path: events.append(("fsync", Path(path))))
    monkeypatch.setattr(store_module, "fsync_dir", lambda path: events.append(("fsync", Path(path))))
    real_rename = os.rename
    monkeypatch.setattr(store_module.os, "rename",
                        lambda a, b: (events.append(("rename", Path(b))), real_rename(a, b))[1])
    store = ArtifactStore(tmp_path / "store")
    stored = store.put(make_checkpoint(tmp_path / "x", "ck", payload=b"w"))
    at = events.index(("rename", stored.path))
    before = {path.name for kind, path in events[:at] if kind == "fsync"}
    assert {f.name for f in stored.path.iterdir()} | {"copy"} <= before, events
    assert ("fsync", stored.path.parent) in events[at:], events


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "model.safetensors").write_bytes(b"X" * 10), "model.safetensors is truncated"),
        (lambda d: (d / "model.json").write_text((d / "model.json").read_text().replace("8", "9")),
         "model.json was modified"),
        (lambda d: (d / "items.json").unlink(), "items.json is missing"),
        (lambda d: (d / "extra.bin").write_bytes(b"x"), "extra.bin is not part of the artifact"),
        (lambda d: (d / "MANIFEST.json").unlink(), "manifest missing"),
    ],
)
def test_damaged_artifacts_are_refused_before_loading(registry, tmp_path, damage, message):
    assert _promote(registry, tmp_path, "v1", make_eval(0.0, seed=1)).promoted
    stored = registry.champion_dir()
    for p in stored.iterdir():
        p.chmod(0o644)
    damage(stored)
    with pytest.raises(ArtifactIntegrityError, match=message) as info:
        registry.champion_dir()
    assert "refusing to load" in str(info.value)
    with pytest.raises(ArtifactIntegrityError):
        registry.load_champion()  # verification happens before load_model is even imported


def test_tampering_with_file_and_manifest_together_is_caught(registry, tmp_path):
    assert _promote(registry, tmp_path, "v1", make_eval(0.0, seed=1)).promoted
    stored = registry.champion_dir()
    for p in stored.iterdir():
        p.chmod(0o644)
    (stored / "model.safetensors").write_bytes(b"forged")
    manifest = json.loads((stored / "MANIFEST.json").read_text())
    from recsys.registry.store import _listing

    manifest["files"] = _listing(stored)
    (stored / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactIntegrityError, match="does not match the artifact address"):
        registry.champion_dir()


def test_damaged_stored_copy_is_replaced_on_the_next_put(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    ckpt = make_checkpoint(tmp_path / "x", "ck")
    first = store.put(ckpt)
    (first.path / "model.json").chmod(0o644)
    (first.path / "model.json").write_text("{}")
    again = store.put(ckpt)
    assert again.sha256 == first.sha256
    store.verify(again.sha256)
    assert any((tmp_path / "store" / "corrupt").iterdir())


def test_store_refuses_symlinks_and_bad_addresses(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    ckpt = make_checkpoint(tmp_path / "x", "ck")
    os.symlink("/etc/passwd", ckpt / "link")
    with pytest.raises(ArtifactError, match="symbolic links"):
        store.put(ckpt)
    with pytest.raises(ArtifactError, match="invalid artifact sha256"):
        store.path_for("../../etc")
    with pytest.raises(ArtifactError, match="not found"):
        store.put(tmp_path / "nope")


# --- schema, migrations, append-only ------------------------------------------------------------------


def test_migrations_up_down_up_on_sqlite(tmp_path):
    with open_registry(registry_config(tmp_path), tmp_path) as reg:
        tables = set(inspect(reg.engine).get_table_names())
        assert {"registered_models", "model_versions", "aliases", "promotion_events", "evaluations"} <= tables
        assert migrate.current_revision(reg.engine) == migrate.head_revision() == "0002_version_role"
        migrate.downgrade(reg.engine, "base")
        assert set(inspect(reg.engine).get_table_names()) <= {"registry_alembic_version"}
        assert migrate.current_revision(reg.engine) is None
        migrate.upgrade(reg.engine)
        assert migrate.current_revision(reg.engine) == "0002_version_role"
        assert _promote(reg, tmp_path, "a", make_eval(0.0)).promoted


def test_migrations_match_the_orm_models(tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from recsys.registry.db import VERSION_TABLE, Base

    with open_registry(registry_config(tmp_path), tmp_path) as reg, reg.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
        assert diff == []


def test_default_sqlite_path_is_created_under_the_repo_root(tmp_path):
    from recsys.config import RegistryConfig

    with open_registry(RegistryConfig(), tmp_path) as reg:
        assert reg.store.root == tmp_path / "registry" / "artifacts"
    assert (tmp_path / "registry" / "registry.db").is_file()


def test_promotion_events_are_append_only(registry, tmp_path):
    assert _promote(registry, tmp_path, "a", make_eval(0.0)).promoted
    for statement in ("UPDATE promotion_events SET decision = 'rejected'", "DELETE FROM promotion_events"):
        with pytest.raises(DBAPIError, match="append-only"):
            with registry.engine.begin() as conn:
                conn.execute(text(statement))
    assert registry.history()[0].decision == "promoted"


# --- security ------------------------------------------------------------------------------------------

INJECTION = "x'; DROP TABLE model_versions;--"


def test_injection_in_model_name_is_refused(tmp_path):
    """Refused when the settings are built (params.yaml's load), and again by the registry itself for any
    settings object that got past that."""
    import dataclasses

    config = registry_config(tmp_path)
    with pytest.raises(ValueError, match="registry.model_name must be lowercase letters"):
        type(config)(url=config.url, artifact_root=config.artifact_root, model_name=INJECTION)
    bad = dataclasses.replace(config)
    object.__setattr__(bad, "model_name", INJECTION)  # past the settings' own check
    with pytest.raises(ConfigError, match="invalid"):
        open_registry(bad, tmp_path)


def test_injection_in_architecture_is_refused(registry, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpts", "evil", model=INJECTION)
    with pytest.raises(ConfigError, match="invalid architecture"):
        registry.promote(ckpt, make_eval(0.0), baseline_result=MOSTPOP, baseline_kind="mostpop")
    assert "model_versions" in inspect(registry.engine).get_table_names()
    assert registry.list_versions() == []


def test_injection_strings_in_free_text_are_stored_verbatim(registry, tmp_path):
    ev = make_eval(0.0)
    ev.metrics[INJECTION] = 1.0
    out = _promote(registry, tmp_path, "a", ev, dataset_version=INJECTION, code_version=INJECTION[:30])
    assert out.promoted
    v = registry.get_version(1)
    assert v.dataset_version == INJECTION and v.code_version == INJECTION[:30]
    assert v.metrics[INJECTION] == 1.0
    assert "model_versions" in inspect(registry.engine).get_table_names()
    assert len(registry.list_versions()) == 1


def test_a_checkpoint_that_changed_after_its_check_is_not_registered(registry, tmp_path):
    """`promotion.check_scored` compares the checkpoint with what its evaluation scored before the registry
    copies it; a `recsys train` by hand (no workspace lock) could replace it in between. The copy's address is
    compared again before any version row: nothing is registered."""
    import dataclasses
    from types import SimpleNamespace

    ckpt = make_checkpoint(tmp_path / "ckpts", "moved")
    scored = directory_digest(ckpt)
    (ckpt / "model.safetensors").write_bytes(b"other weights")  # replaced after the evaluation's check
    changed = SimpleNamespace(**dataclasses.asdict(make_eval(0.1)), checkpoint_sha256=scored)
    with pytest.raises(RegistryError, match=(rf"moved changed while it was being registered \(its evaluation "
                                             rf"scored {scored[:12]}, the copy is [0-9a-f]{{12}}\): nothing was "
                                             r"registered; evaluate it again, then promote$")):
        registry.promote(ckpt, changed, baseline_result=MOSTPOP, baseline_kind="mostpop")
    assert registry.list_versions() == [] and registry.history() == []
