"""Warm start (recsys/warm.py): vocabulary mapping by raw id, compatibility, `train.init` cold | warm | auto,
a fresh optimiser, determinism, and a cold start untouched by any of it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from recsys.checkpoint import CheckpointError, save_checkpoint
from recsys.config import ConfigError, PrepareConfig
from recsys.lineage import describe_init
from recsys.model_configs import TrainConfig
from recsys.models import build_model
from recsys.models.bert4rec import BERT4RecConfig
from recsys.models.mojito import MojitoConfig
from recsys.train import train_model
from recsys.warm import CHECKPOINT, SOURCE_FILE, read_source, start, write_none, write_source

CHAMPION_ITEMS = ["a", "b", "c", "d", "e", "f"]
CHAMPION_USERS = ["u1", "u2", "u3"]
SHA = "ab" * 32
WARM = TrainConfig(init="warm", device="cpu", progress="off")
AUTO = dataclasses.replace(WARM, init="auto")


def listing(directory: Path) -> list[list]:
    return [[p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()]
            for p in sorted(directory.iterdir())]


def make_champion(tmp_path: Path, name: str, config, *, items=CHAMPION_ITEMS, users=CHAMPION_USERS,
                  version: int = 3, init: dict | None = None, seed: int = 1,
                  train_until: int | None = None, prepare: dict | None = None) -> Path:
    """A champion checkpoint (seeded random weights) installed as the warm source; returns the warm dir."""
    torch.manual_seed(seed)
    model = build_model(name, config, n_items=len(items), n_users=len(users))
    extra = {k: v for k, v in (("init", init), ("train_until", train_until), ("prepare", prepare))
             if v is not None}
    ckpt = save_checkpoint(tmp_path / f"champion-{name}", model, dataset_fingerprint="0" * 64, item_ids=items,
                           user_ids=users, extra=extra or None)
    warm_dir = tmp_path / "warm" / name
    write_source(warm_dir, version, SHA, listing(ckpt), ckpt)
    return warm_dir


def fresh(name: str, config, items, users, seed: int = 2):
    torch.manual_seed(seed)
    model = build_model(name, config, n_items=len(items), n_users=len(users))
    return model, {k: v.clone() for k, v in model.state_dict().items()}


def champion_weights(warm_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(warm_dir / CHECKPOINT / "model.safetensors"))


def assert_rows_follow_ids(ours: torch.Tensor, before: torch.Tensor, theirs: torch.Tensor, new_ids, old_ids):
    """Known ids carry the champion's row exactly; new ids keep the fresh row; row 0 is the champion's."""
    where = {raw: i for i, raw in enumerate(old_ids) if i > 0}
    assert torch.equal(ours[0], theirs[0])
    for j, raw in enumerate(new_ids):
        if j == 0:
            continue
        expected = theirs[where[raw]] if raw in where else before[j]
        assert torch.equal(ours[j], expected), (j, raw)


# --- vocabulary ---------------------------------------------------------------------------------------------


def test_known_items_keep_their_embeddings_new_items_get_fresh_ones(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    items = ["c", "a", "x", "f", "b", "d", "e", "y"]  # the catalogue grew by x and y, and was reordered
    model, before = fresh("sasrec", tiny_sasrec_config, items, ["u9"])
    record = start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, items, ["u9"])

    theirs, ours = champion_weights(warm_dir), model.state_dict()
    assert ours["item_emb.weight"].shape == (len(items) + 1, tiny_sasrec_config.dim)
    assert_rows_follow_ids(ours["item_emb.weight"], before["item_emb.weight"], theirs["item_emb.weight"],
                           [None, *items], [None, *CHAMPION_ITEMS])
    assert not ours["item_emb.weight"][0].any()  # padding stays zero
    for name in ours:  # position embeddings, blocks, norms: the champion's, exactly
        if name != "item_emb.weight":
            assert torch.equal(ours[name], theirs[name]), name
    assert record["mode"] == "warm" and record["from_version"] == 3 and record["from_sha256"] == SHA
    assert record["items"] == {"kept": 6, "new": 2, "dropped": 0} and record["fresh"] == []
    assert "users" not in record  # SASRec has no user rows
    assert describe_init(record) == "warm from v3"


def test_items_gone_from_the_data_are_dropped(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    items = ["f", "b", "d"]  # a, c, e left the catalogue
    model, before = fresh("sasrec", tiny_sasrec_config, items, ["u1"])
    record = start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, items, ["u1"])
    theirs, ours = champion_weights(warm_dir)["item_emb.weight"], model.state_dict()["item_emb.weight"]
    assert ours.shape == (4, tiny_sasrec_config.dim)
    for j, raw in enumerate(items, 1):
        assert torch.equal(ours[j], theirs[1 + CHAMPION_ITEMS.index(raw)]), raw
    assert record["items"] == {"kept": 3, "new": 0, "dropped": 3}


def test_bert4rec_keeps_its_mask_row_and_output_bias_by_item(tmp_path):
    config = BERT4RecConfig(dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_len=10)
    warm_dir = make_champion(tmp_path, "bert4rec", config)
    items = ["b", "z", "a"]
    model, before = fresh("bert4rec", config, items, ["u1"])
    record = start(model, "bert4rec", dataclasses.replace(config, mask_prob=0.5), WARM, warm_dir, items,
                   ["u1"])
    theirs, ours = champion_weights(warm_dir), model.state_dict()
    new_ids, old_ids = [None, *items], [None, *CHAMPION_ITEMS]
    assert_rows_follow_ids(ours["item_emb.weight"][:-1], before["item_emb.weight"], theirs["item_emb.weight"],
                           new_ids, old_ids)
    assert torch.equal(ours["item_emb.weight"][-1], theirs["item_emb.weight"][-1])  # [mask] row
    assert ours["item_emb.weight"].shape[0] == len(items) + 2 and model.mask_id == len(items) + 1
    assert_rows_follow_ids(ours["out_bias"], before["out_bias"], theirs["out_bias"], new_ids, old_ids)
    assert record["items"] == {"kept": 2, "new": 1, "dropped": 4}


def test_mojito_maps_users_and_keeps_time_tensors_that_match_in_shape(tmp_path):
    config = MojitoConfig(dim=16, n_layers=1, n_heads=2, max_len=10, time_dim=4, fism_items=3)
    warm_dir = make_champion(tmp_path, "mojito", config)
    users, items = ["u3", "new-user", "u1"], ["a", "b"]
    wider = dataclasses.replace(config, time_dim=6)  # a free field that changes the time tensors' shapes
    model, before = fresh("mojito", wider, items, users)
    record = start(model, "mojito", wider, WARM, warm_dir, items, users)
    theirs, ours = champion_weights(warm_dir), model.state_dict()
    assert_rows_follow_ids(ours["user_emb.weight"], before["user_emb.weight"], theirs["user_emb.weight"],
                           [None, *users], [None, *CHAMPION_USERS])
    assert record["users"] == {"kept": 2, "new": 1, "dropped": 1}
    assert record["items"] == {"kept": 2, "new": 0, "dropped": 4}
    assert set(record["fresh"]) == {"time_enc.log_period", "time_enc.basis", "time_enc.bias",
                                    "ctx_proj.weight"}
    for name in record["fresh"]:
        assert torch.equal(ours[name], before[name]), name
    # What matches in shape carries over — the time projection's bias, the blocks, the mixing weights.
    for name in ("ctx_proj.bias", "sigma_noise", "pos_emb.weight", "blocks.0.attn.mix1.weight"):
        assert torch.equal(ours[name], theirs[name]), name


# --- compatibility ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, reason", [
    ({"dim": 32, "n_heads": 2}, "dim=16 (now 32)"),
    ({"n_layers": 2}, "n_layers=1 (now 2)"),
    ({"max_len": 30}, "max_len=20 (now 30)"),
    ({"loss": "bce"}, "loss='ce' (now 'bce')"),
])
def test_incompatible_champion_falls_back_to_cold_under_auto_with_the_reason_logged(
        tmp_path, tiny_sasrec_config, caplog, change, reason):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    config = dataclasses.replace(tiny_sasrec_config, **change)
    model, before = fresh("sasrec", config, CHAMPION_ITEMS, CHAMPION_USERS)
    with caplog.at_level(logging.WARNING, logger="recsys.warm"):
        record = start(model, "sasrec", config, AUTO, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert record["mode"] == "cold" and record["requested"] == "auto" and reason in record["reason"]
    assert "init=cold model=sasrec" in caplog.text and reason in caplog.text
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched
    assert describe_init(record).startswith("cold (auto: the champion v3 has ")


def test_incompatible_champion_is_a_one_line_error_under_warm(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    config = dataclasses.replace(tiny_sasrec_config, dim=32, n_heads=2)
    model, _ = fresh("sasrec", config, CHAMPION_ITEMS, CHAMPION_USERS)
    with pytest.raises(ConfigError) as err:
        start(model, "sasrec", config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("sasrec: cannot warm-start: the champion v3 has dim=16 (now 32)")
    assert "set sasrec.dim back to 16" in message and "train.init" in message and "auto or cold" in message


def test_a_champion_of_another_family_is_not_a_starting_point(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "bert4rec", BERT4RecConfig(dim=16, n_layers=1, n_heads=1, max_len=20))
    model, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    record = start(model, "sasrec", tiny_sasrec_config, AUTO, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert record["mode"] == "cold" and "is a bert4rec model, not sasrec" in record["reason"]
    with pytest.raises(ConfigError, match="is a bert4rec model, not sasrec"):
        start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)


def test_a_champion_that_trained_on_events_today_holds_out_is_not_a_starting_point(tmp_path, tiny_sasrec_config):
    """Late-arriving events moved today's global_time cut (`held_out_from`) to or before the champion's newest
    training event: its weights may hold today's validation and test events. Cold under auto, a one-line
    error under warm; a cut after its events, loo (no cut) and a champion that recorded none start warm."""
    until = 1_700_000_000
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config, train_until=until)
    model, before = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    record = start(model, "sasrec", tiny_sasrec_config, AUTO, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS,
                   held_out_from=until - 3600.5)
    assert record["mode"] == "cold" and record["reason"] == (
        "the champion v3 was trained on events up to 2023-11-14 22:13:20 UTC, and today's split holds out every "
        "event from 2023-11-14 21:13:20 UTC (today's prepare quantile cut is earlier than the one it trained "
        "under: events that arrived late, or that the k-core filter re-admitted, move it): it may have learnt "
        "today's validation and test events")  # (a cut of 21:13:19.5: the first whole second it holds out)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched
    with pytest.raises(ConfigError) as err:
        start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS,
              held_out_from=float(until))  # at the cut: that event is held out today
    assert "\n" not in str(err.value) and str(err.value).startswith(
        "sasrec: cannot warm-start: the champion v3 was trained on events up to 2023-11-14 22:13:20 UTC")
    for cut in (until + 0.5, None):
        assert start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS,
                     held_out_from=cut)["mode"] == "warm"
    unrecorded = make_champion(tmp_path / "older", "sasrec", tiny_sasrec_config)
    assert start(model, "sasrec", tiny_sasrec_config, WARM, unrecorded, CHAMPION_ITEMS, CHAMPION_USERS,
                 held_out_from=0.0)["mode"] == "warm"


def test_a_champion_that_trained_on_data_split_otherwise_is_refused_by_the_train_stage_too(
        tmp_path, tiny_sasrec_config):
    """`recsys warm` never picks such a source, but `dvc repro` after prepare.split (or a k-core threshold)
    changed reruns train on the source an earlier `recsys warm` wrote: its weights may have learnt what
    today's split validates and tests on. Cold under auto, one line under warm; the same settings, or a
    champion that recorded none, start warm."""
    loo = dataclasses.asdict(PrepareConfig(split="loo"))
    by_time = dataclasses.asdict(PrepareConfig(split="global_time"))
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config, prepare=by_time)
    model, before = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    record = start(model, "sasrec", tiny_sasrec_config, AUTO, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS, split=loo)
    assert record["mode"] == "cold" and record["reason"] == (
        "the champion v3 trained on data split otherwise (prepare.split global_time, now loo): it may have "
        "learnt events today's split validates and tests on"), record
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched
    with pytest.raises(ConfigError) as err:
        start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS, split=loo)
    assert "\n" not in str(err.value) and "run `recsys warm` (it picks a source split as today's data is)" in str(
        err.value), str(err.value)
    core = dataclasses.asdict(PrepareConfig(split="loo", min_user_interactions=10))
    loo_dir = make_champion(tmp_path / "loo", "sasrec", tiny_sasrec_config, prepare=loo)
    refused = start(model, "sasrec", tiny_sasrec_config, AUTO, loo_dir, CHAMPION_ITEMS, CHAMPION_USERS, split=core)
    assert "prepare.min_user_interactions" in refused["reason"], refused
    assert start(model, "sasrec", tiny_sasrec_config, WARM, loo_dir, CHAMPION_ITEMS, CHAMPION_USERS,
                 split=loo)["mode"] == "warm"
    unrecorded = make_champion(tmp_path / "older", "sasrec", tiny_sasrec_config)
    assert start(model, "sasrec", tiny_sasrec_config, WARM, unrecorded, CHAMPION_ITEMS, CHAMPION_USERS,
                 split=loo)["mode"] == "warm"


def test_a_warm_started_checkpoint_records_the_newest_event_its_weights_have_seen():
    """Its own data's newest training event, or its warm source's when later: the source's knowledge is in its
    weights, so the next leak check must see it (a source that recorded none adds nothing)."""
    from recsys.held_out import weights_until

    assert weights_until(100, None) == 100
    assert weights_until(100, {"mode": "warm", "from_train_until": 250}) == 250
    assert weights_until(300, {"mode": "warm", "from_train_until": 250}) == 300
    assert weights_until(None, {"mode": "warm", "from_train_until": 250}) == 250
    assert weights_until(100, {"mode": "warm"}) == 100 and weights_until(None, None) is None


def older_champion(tmp_path: Path, config, edit) -> Path:
    """A champion whose model.json an older recsys wrote (`edit` changes its config mapping)."""
    torch.manual_seed(1)
    model = build_model("sasrec", config, n_items=len(CHAMPION_ITEMS), n_users=len(CHAMPION_USERS))
    ckpt = save_checkpoint(tmp_path / "older", model, dataset_fingerprint="0" * 64, item_ids=CHAMPION_ITEMS,
                           user_ids=CHAMPION_USERS)
    meta = json.loads((ckpt / "model.json").read_text())
    edit(meta["config"])
    (ckpt / "model.json").write_text(json.dumps(meta))
    warm_dir = tmp_path / "warm" / "sasrec"
    write_source(warm_dir, 3, SHA, listing(ckpt), ckpt)
    return warm_dir


def test_a_champion_saved_before_keys_were_added_or_retired_is_compared_as_it_loads(tmp_path,
                                                                                      tiny_sasrec_config):
    """A retired key is dropped and a key added since takes its default, as `load_model` reads it: such a
    champion is compatible when that reading equals today's config (not refused by its raw JSON)."""
    def older(config: dict) -> None:
        config["gbce_t"] = 0.75  # retired since
        assert config.pop("emb_scale") is True  # added since, with today's default

    warm_dir = older_champion(tmp_path, tiny_sasrec_config, older)
    model, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    record = start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert record["mode"] == "warm" and record["from_version"] == 3


def test_a_champion_trained_with_a_retired_value_is_refused_with_a_setting_that_exists(tmp_path,
                                                                                         tiny_sasrec_config):
    warm_dir = older_champion(tmp_path, tiny_sasrec_config, lambda config: config.update(loss="gbce"))
    model, before = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    record = start(model, "sasrec", tiny_sasrec_config, AUTO, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert record["mode"] == "cold" and "cannot be used by this version" in record["reason"]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError) as err:
        start(model, "sasrec", tiny_sasrec_config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert "\n" not in str(err.value) and "loss='gbce'" in str(err.value)
    assert "train a sasrec cold (train.init: cold) and promote it" in str(err.value)


def test_fields_that_only_shape_training_may_differ(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    config = dataclasses.replace(tiny_sasrec_config, dropout=0.5, n_negatives=64, weight_init="xavier")
    model, _ = fresh("sasrec", config, CHAMPION_ITEMS, CHAMPION_USERS)
    assert start(model, "sasrec", config, WARM, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)["mode"] == "warm"


def test_no_source_is_cold_under_auto_and_an_error_under_warm(tmp_path, tiny_sasrec_config):
    write_none(tmp_path / "warm", "the registry has no champion yet")
    model, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    reasons = [start(model, "sasrec", tiny_sasrec_config, AUTO, d, CHAMPION_ITEMS, CHAMPION_USERS)["reason"]
               for d in (tmp_path / "warm", tmp_path / "missing", None)]
    assert reasons == ["the registry has no champion yet",
                       f"there is no warm source at {tmp_path / 'missing'} (`recsys warm` writes it)",
                       "no warm source was given"]
    with pytest.raises(ConfigError, match=r"no champion yet; run `recsys warm` once a sasrec version is"):
        start(model, "sasrec", tiny_sasrec_config, WARM, tmp_path / "warm", CHAMPION_ITEMS, CHAMPION_USERS)


# --- auto's cold restarts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("streak, every, mode",
                         [(3, 5, "warm"), (4, 5, "cold"), (0, 1, "cold"), (50, 0, "warm")])
def test_auto_trains_every_nth_version_of_a_warm_line_cold(tmp_path, tiny_sasrec_config, streak, every, mode):
    init = {"mode": "warm", "from_version": 2, "warm_streak": streak} if streak else None
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config, init=init)
    model, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    cfg = dataclasses.replace(AUTO, warm_cold_every=every)
    record = start(model, "sasrec", tiny_sasrec_config, cfg, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert record["mode"] == mode
    if mode == "warm":
        assert record["warm_streak"] == streak + 1
    else:
        assert f"train.warm_cold_every = {every}" in record["reason"]
    # `warm` asks for a warm start whatever the line's length.
    forced = start(model, "sasrec", tiny_sasrec_config, dataclasses.replace(cfg, init="warm"), warm_dir,
                   CHAMPION_ITEMS, CHAMPION_USERS)
    assert forced["mode"] == "warm" and forced["warm_streak"] == streak + 1


def test_a_source_whose_cold_try_lost_starts_warm_again_and_a_bad_flag_is_damage(tmp_path,
                                                                                  tiny_sasrec_config):
    init = {"mode": "warm", "from_version": 2, "warm_streak": 4}
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config, init=init)
    ckpt = tmp_path / "champion-sasrec"
    write_source(warm_dir, 3, SHA, listing(ckpt), ckpt, cold_tried=True)
    assert read_source(warm_dir).cold_tried
    model, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    cfg = dataclasses.replace(AUTO, warm_cold_every=5)
    record = start(model, "sasrec", tiny_sasrec_config, cfg, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)
    assert record["mode"] == "warm" and record["warm_streak"] == 1  # the line is counted from the cold try
    path = warm_dir / SOURCE_FILE
    path.write_text(path.read_text().replace('"cold_tried": true', '"cold_tried": "yes"'))
    with pytest.raises(CheckpointError, match=r"damaged \(cold_tried is 'yes', not true or false\)"):
        read_source(warm_dir)


def test_auto_trains_cold_when_the_catalogue_grew_too_much(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    items = [*CHAMPION_ITEMS, "x", "y"]  # 2 new of 6 known: 33 %
    model, _ = fresh("sasrec", tiny_sasrec_config, items, CHAMPION_USERS)
    def auto(growth: float):
        return dataclasses.replace(AUTO, warm_max_catalogue_growth=growth)

    grown = start(model, "sasrec", tiny_sasrec_config, auto(0.3), warm_dir, items, CHAMPION_USERS)
    assert grown["mode"] == "cold"
    assert grown["reason"] == ("the catalogue grew by 2 items, 33.3% of the champion v3's 6, more than "
                               "train.warm_max_catalogue_growth = 0.3")
    within = start(model, "sasrec", tiny_sasrec_config, auto(0.34), warm_dir, items, CHAMPION_USERS)
    assert within["mode"] == "warm"
    # Items dropped from the catalogue are not growth.
    shrunk, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS[:2], CHAMPION_USERS)
    assert start(shrunk, "sasrec", tiny_sasrec_config, auto(0.0), warm_dir, CHAMPION_ITEMS[:2],
                 CHAMPION_USERS)["mode"] == "warm"


# --- the source directory -----------------------------------------------------------------------------------


def test_a_changed_copy_of_the_champion_is_refused_even_under_auto(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    weights = warm_dir / CHECKPOINT / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\x00" * 8)
    model, _ = fresh("sasrec", tiny_sasrec_config, CHAMPION_ITEMS, CHAMPION_USERS)
    with pytest.raises(CheckpointError, match="is not the registry's file.*run `recsys warm`"):
        start(model, "sasrec", tiny_sasrec_config, AUTO, warm_dir, CHAMPION_ITEMS, CHAMPION_USERS)


def test_the_source_is_written_once_and_names_only_plain_files(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    ckpt = tmp_path / "champion-sasrec"
    before = (warm_dir / SOURCE_FILE).read_bytes()
    assert write_source(warm_dir, 3, SHA, listing(ckpt), ckpt) is False  # same content: nothing rewritten
    assert read_source(warm_dir).version == 3 and (warm_dir / SOURCE_FILE).read_bytes() == before
    escape = [["../model.json", 2, "0" * 64]]
    with pytest.raises(CheckpointError, match="invalid source"):
        write_source(tmp_path / "other", 3, SHA, escape, ckpt)
    killed = [warm_dir.parent / ".sasrec-k1ll3d", warm_dir.parent / ".sasrec-old"]  # what a kill -9 leaves
    for leftover in killed:
        (leftover / CHECKPOINT).mkdir(parents=True)
    assert write_none(warm_dir, "the registry has no champion yet") is True
    assert not any(leftover.exists() for leftover in killed)
    assert not (warm_dir / CHECKPOINT).exists()
    assert json.loads((warm_dir / SOURCE_FILE).read_text())["reason"] == "the registry has no champion yet"
    assert sorted(p.name for p in warm_dir.parent.iterdir()) == ["sasrec"]  # no temporary leftovers


# --- through the trainer ------------------------------------------------------------------------------------


@pytest.fixture
def champion_source(trained_sasrec, tmp_path) -> Path:
    """The 3-epoch SASRec of the tiny dataset as registry version 7, installed as the warm source."""
    _, ckpt = trained_sasrec
    warm_dir = tmp_path / "warm" / "sasrec"
    write_source(warm_dir, 7, SHA, listing(ckpt), ckpt)
    return warm_dir


def run(prepared, config, cfg, root: Path, warm_dir, **kwargs):
    return train_model("sasrec", config, cfg, prepared, root / "model", curve_path=root / "curve.csv",
                       resume_root=root / "resume", warm_dir=warm_dir, **kwargs)


def test_cold_training_never_reads_the_source_and_is_unchanged(tiny_prepared, tiny_sasrec_config,
                                                               fast_train_config, champion_source, tmp_path):
    cfg = dataclasses.replace(fast_train_config, epochs=1)
    (champion_source / SOURCE_FILE).write_text("{damaged")  # a cold run does not even open it
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "with", champion_source)
    run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "without", None)
    for name in ("model.safetensors", "model.json", "items.json", "users.json"):
        with_source, without = (tmp_path / run_dir / "model" / name for run_dir in ("with", "without"))
        assert with_source.read_bytes() == without.read_bytes(), name
    assert "init" not in json.loads((tmp_path / "with" / "model" / "model.json").read_text())


def test_warm_training_is_deterministic_records_its_source_and_differs_from_cold(
        tiny_prepared, tiny_sasrec_config, fast_train_config, champion_source, tmp_path):
    cfg = dataclasses.replace(fast_train_config, epochs=2, init="warm")
    a = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "a", champion_source)
    b = run(tiny_prepared, tiny_sasrec_config, cfg, tmp_path / "b", champion_source)
    assert (tmp_path / "a" / "model" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model" / "model.safetensors").read_bytes()
    assert a.best_valid == b.best_valid
    meta = json.loads((tmp_path / "a" / "model" / "model.json").read_text())
    source_until = json.loads((champion_source / CHECKPOINT / "model.json").read_text())["train_until"]
    assert meta["init"] == {"requested": "warm", "mode": "warm", "from_version": 7, "from_sha256": SHA,
                            "warm_streak": 1, "fresh": [], "from_train_until": source_until,
                            "items": {"kept": tiny_prepared.n_items, "new": 0, "dropped": 0}}
    assert meta["train_until"] == max(tiny_prepared.fingerprint["train_until"], source_until)
    cold = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(cfg, init="cold"), tmp_path / "c", None)
    assert (tmp_path / "c" / "model" / "model.safetensors").read_bytes() != (
        tmp_path / "a" / "model" / "model.safetensors").read_bytes()
    del cold


def test_late_arriving_events_that_move_the_global_time_cut_make_the_next_start_cold(
        tiny_interactions, tiny_prepare_config, tiny_sasrec_config, fast_train_config, tmp_path):
    """Real prepare and training under global_time: the champion records its newest training event; a batch of
    older events moves today's cut before it, and the next `auto` run trains cold, saying why."""
    from recsys import schema
    from recsys.prepare import prepare

    split = dataclasses.replace(tiny_prepare_config, split="global_time")
    yesterday = prepare(tiny_interactions, split)
    cfg = dataclasses.replace(fast_train_config, epochs=1)
    run(yesterday, tiny_sasrec_config, cfg, tmp_path / "champion", None)
    champion = tmp_path / "champion" / "model"
    until = json.loads((champion / "model.json").read_text())["train_until"]
    assert until == yesterday.fingerprint["train_until"] < yesterday.fingerprint["held_out_from"]
    warm_dir = tmp_path / "warm" / "sasrec"
    write_source(warm_dir, 7, SHA, listing(champion), champion)

    late = tiny_interactions.sample(frac=0.5, random_state=0)  # as many events again, from before all others
    times = tiny_interactions[schema.TIMESTAMP]
    late[schema.TIMESTAMP] -= int(times.max() - times.min())
    today = prepare(pd.concat([tiny_interactions, late], ignore_index=True), split)
    assert today.fingerprint["held_out_from"] <= until
    auto = dataclasses.replace(cfg, init="auto")
    run(today, tiny_sasrec_config, auto, tmp_path / "today", warm_dir)
    init = json.loads((tmp_path / "today" / "model" / "model.json").read_text())["init"]
    assert init["mode"] == "cold" and init["reason"].startswith("the champion v7 was trained on events up to ")
    assert "may have learnt today's validation and test events" in init["reason"]
    run(yesterday, tiny_sasrec_config, auto, tmp_path / "same", warm_dir)  # yesterday's cut: warm
    assert json.loads((tmp_path / "same" / "model" / "model.json").read_text())["init"]["mode"] == "warm"


def test_the_optimiser_starts_fresh_and_a_cold_resume_state_is_never_picked_up(
        tiny_prepared, tiny_sasrec_config, fast_train_config, champion_source, tmp_path):
    from test_train import Interrupt

    root = tmp_path / "run"
    cfg = dataclasses.replace(fast_train_config, epochs=3)
    with pytest.raises(KeyboardInterrupt):  # a cold run leaves its state after epoch 1
        run(tiny_prepared, tiny_sasrec_config, cfg, root, None, on_epoch=Interrupt(at=1))
    warm = dataclasses.replace(cfg, init="warm")
    with pytest.raises(KeyboardInterrupt):
        run(tiny_prepared, tiny_sasrec_config, warm, root, champion_source, on_epoch=Interrupt(at=1))
    states = sorted((root / "resume").iterdir())
    assert len(states) == 2  # the warm run did not continue the cold one: a state of its own
    warm_state = max(states, key=lambda p: p.stat().st_mtime)
    steps = json.loads((warm_state / "state.json").read_text())["steps"]
    adam_steps = {float(v) for k, v in load_file(str(warm_state / "state.safetensors")).items()
                  if k.startswith("optim.") and k.endswith(".step")}
    assert adam_steps == {float(steps)}  # Adam counted only this run's first epoch: it started at step 0
    seen = Interrupt()
    run(tiny_prepared, tiny_sasrec_config, warm, root, champion_source, on_epoch=seen)
    assert seen.seen == [2, 3]  # …and the warm run resumes its own state


def test_warm_keep_blends_the_champion_with_the_fresh_initialisation(tmp_path, tiny_sasrec_config):
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    items = ["c", "a", "x", "f", "b", "d", "e"]  # x is new
    model, before = fresh("sasrec", tiny_sasrec_config, items, ["u9"])
    record = start(model, "sasrec", tiny_sasrec_config, dataclasses.replace(WARM, warm_keep=0.25), warm_dir,
                   items, ["u9"])
    theirs, ours = champion_weights(warm_dir), model.state_dict()
    where = {raw: i for i, raw in enumerate([None, *CHAMPION_ITEMS]) if i > 0}
    for j, raw in enumerate(items, start=1):
        expected = before["item_emb.weight"][j] if raw not in where else (
            0.25 * theirs["item_emb.weight"][where[raw]] + 0.75 * before["item_emb.weight"][j])
        assert torch.allclose(ours["item_emb.weight"][j], expected, atol=1e-6), raw
    assert not ours["item_emb.weight"][0].any()  # padding: zero in both, so zero blended
    for name in ours:
        if name != "item_emb.weight":
            assert torch.allclose(ours[name], 0.25 * theirs[name] + 0.75 * before[name], atol=1e-6), name
    assert record["keep"] == 0.25 and record["mode"] == "warm"


@pytest.mark.parametrize("name, config", [
    ("bert4rec", BERT4RecConfig(dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_len=10)),
    ("mojito", MojitoConfig(dim=16, n_layers=1, n_heads=2, max_len=10, time_dim=4, fism_items=3)),
])
def test_warm_keep_blends_every_carried_parameter_of_bert4rec_and_mojito(tmp_path, name, config):
    """The same blend for the models with more id-indexed tensors ([mask] row, output bias, user rows)."""
    warm_dir = make_champion(tmp_path, name, config)
    items, users = ["c", "x", "a"], ["u2", "new-user"]  # x and new-user are new
    model, before = fresh(name, config, items, users)
    record = start(model, name, config, dataclasses.replace(WARM, warm_keep=0.25), warm_dir, items, users)
    theirs, ours = champion_weights(warm_dir), model.state_dict()
    parameters = {n for n, _ in model.named_parameters()}
    old = {"items": [None, *CHAMPION_ITEMS], "users": [None, *CHAMPION_USERS]}
    new = {"items": [None, *items], "users": [None, *users]}
    blended = 0
    for key, value in ours.items():
        if key not in parameters:
            continue
        kind = model.id_rows.get(key)
        if kind is None:
            assert torch.allclose(value, 0.25 * theirs[key] + 0.75 * before[key], atol=1e-6), key
            blended += 1
            continue
        for j, raw in enumerate(new[kind]):
            if raw is not None and raw not in old[kind]:
                assert torch.equal(value[j], before[key][j]), (key, raw)  # a new id: fresh, not blended
            else:
                i = 0 if raw is None else old[kind].index(raw)
                assert torch.allclose(value[j], 0.25 * theirs[key][i] + 0.75 * before[key][j], atol=1e-6), (key, raw)
        extra = value.shape[0] - len(new[kind])  # BERT4Rec's [mask] row, after the last item
        for r in range(1, extra + 1):
            assert torch.allclose(value[-r], 0.25 * theirs[key][-r] + 0.75 * before[key][-r], atol=1e-6), key
    assert blended > 5 and record["keep"] == 0.25


def test_the_blend_runs_on_the_models_device_not_the_champions(tmp_path, tiny_sasrec_config):
    # The champion's tensors load on the CPU; a model on another device (a GPU in production, `meta` here,
    # which no CPU tensor may be mixed with either) must receive them on its own device, blended or not.
    warm_dir = make_champion(tmp_path, "sasrec", tiny_sasrec_config)
    items = ["c", "a", "x", "f", "b", "d", "e"]
    for keep in (0.5, 1.0):
        model, _ = fresh("sasrec", tiny_sasrec_config, items, ["u9"])
        model.to("meta")
        record = start(model, "sasrec", tiny_sasrec_config, dataclasses.replace(WARM, warm_keep=keep), warm_dir,
                       items, ["u9"])
        assert record["mode"] == "warm"
        assert {t.device.type for t in model.state_dict().values()} == {"meta"}


def test_a_warm_start_stops_by_its_own_epoch_floor_not_the_cold_one(tiny_prepared, tiny_sasrec_config,
                                                                    fast_train_config, champion_source,
                                                                    tmp_path):
    # lr = 0: validation never improves after epoch 1, so patience 2 alone stops after epoch 3.
    base = dataclasses.replace(fast_train_config, epochs=20, patience=2, lr=0.0, min_epochs=8, init="warm")
    warm = run(tiny_prepared, tiny_sasrec_config, base, tmp_path / "a", champion_source)
    assert (warm.best_epoch, warm.epochs_run, warm.stopped_by) == (1, 3, "early_stopping")
    floored = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(base, warm_min_epochs=5),
                  tmp_path / "b", champion_source)
    assert (floored.epochs_run, floored.stopped_by) == (5, "early_stopping")
    cold = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(base, init="cold", warm_min_epochs=5),
               tmp_path / "c", None)
    assert (cold.epochs_run, cold.stopped_by) == (8, "early_stopping")  # a cold start keeps min_epochs


def test_a_warm_start_stops_by_its_own_patience_and_a_larger_one_goes_on_from_its_kept_state(
        tiny_prepared, tiny_sasrec_config, fast_train_config, champion_source, tmp_path):
    # lr = 0: validation never improves after epoch 1, so a patience of p stops after epoch p + 1.
    base = dataclasses.replace(fast_train_config, epochs=20, patience=6, lr=0.0, init="warm")
    as_cold = run(tiny_prepared, tiny_sasrec_config, base, tmp_path / "a", champion_source)  # 0 = patience
    assert (as_cold.best_epoch, as_cold.epochs_run, as_cold.stopped_by) == (1, 7, "early_stopping")
    short = dataclasses.replace(base, warm_patience=2)
    warm = run(tiny_prepared, tiny_sasrec_config, short, tmp_path / "b", champion_source, keep_final_state=True)
    assert (warm.best_epoch, warm.epochs_run, warm.stopped_by) == (1, 3, "early_stopping")
    cold = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(short, init="cold"), tmp_path / "c", None)
    assert (cold.epochs_run, cold.stopped_by) == (7, "early_stopping")  # a cold start keeps `patience`
    # Early stopping's settings are not the run's identity: under a larger warm patience the same run trains
    # on from the state it kept at epoch 3, epochs 4 and 5 only.
    seen = []
    longer = run(tiny_prepared, tiny_sasrec_config, dataclasses.replace(short, warm_patience=4),
                 tmp_path / "b", champion_source, keep_final_state=True, on_epoch=lambda epoch, row: seen.append(epoch))
    assert (seen, longer.epochs_run, longer.best_epoch, longer.stopped_by) == ([4, 5], 5, 1, "early_stopping")


@pytest.mark.parametrize("bad", [{"warm_keep": 0.0}, {"warm_keep": 1.5}, {"warm_min_epochs": -1},
                                 {"warm_patience": -1}, {"warm_patience": 10**7}])
def test_warm_settings_are_validated(bad):
    with pytest.raises(ValueError, match="train.warm_"):
        TrainConfig(**bad)
