"""The `prepare` stage: k-core, stable time order, dense ids, leave-one-out / global-time splits, no leakage,
fingerprint."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recsys import schema
from recsys.config import PrepareConfig
from recsys.prepare import HISTORY, TEST, TRAIN, VALID, PrepareError, k_core, load, prepare, save
from recsys.sequences import SequenceData, eval_batch, train_batch

ALL = PrepareConfig(min_user_interactions=1, min_item_interactions=1)
GLOBAL = PrepareConfig(min_user_interactions=1, min_item_interactions=1, split="global_time",
                       valid_quantile=0.5, test_quantile=0.75)


def frame_of(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=[schema.USER, schema.ITEM, schema.TIMESTAMP]).astype(
        {schema.TIMESTAMP: "int64"})


@st.composite
def interaction_tables(draw, max_users=8, max_items=8, max_rows=60, max_time=30):
    """Random small tables with many timestamp ties and repeated (user, item) pairs."""
    n = draw(st.integers(1, max_rows))
    users = draw(st.lists(st.integers(0, max_users - 1), min_size=n, max_size=n))
    items = draw(st.lists(st.integers(0, max_items - 1), min_size=n, max_size=n))
    times = draw(st.lists(st.integers(0, max_time), min_size=n, max_size=n))
    return frame_of([(f"u{u}", f"i{i}", 1_000 + t) for u, i, t in zip(users, items, times)])


@st.composite
def unique_item_tables(draw, max_users=6, max_events=12, max_time=30):
    """Every event has its own item id, so an item id identifies its event (for value-level leakage checks)."""
    rows = []
    for u in range(draw(st.integers(1, max_users))):
        times = draw(st.lists(st.integers(0, max_time), min_size=1, max_size=max_events))
        rows += [(f"u{u}", f"u{u}-e{k}", 1_000 + t) for k, t in enumerate(times)]
    order = draw(st.permutations(range(len(rows))))  # users interleaved, like a real log
    return frame_of([rows[i] for i in order])


# --- k-core -------------------------------------------------------------------------------------------------


def naive_k_core(rows: list[tuple[str, str]], min_user: int, min_item: int) -> set[int]:
    """Alternate user and item peeling (a different order than `k_core`); the k-core is unique."""
    alive = set(range(len(rows)))
    while True:
        users = Counter(rows[i][0] for i in alive)
        alive_u = {i for i in alive if users[rows[i][0]] >= min_user}
        items = Counter(rows[i][1] for i in alive_u)
        alive_ui = {i for i in alive_u if items[rows[i][1]] >= min_item}
        if alive_ui == alive:
            return alive
        alive = alive_ui


@settings(max_examples=80, deadline=None)
@given(interaction_tables(), st.integers(1, 4), st.integers(1, 4))
def test_k_core_properties(frame, min_user, min_item):
    core = k_core(frame, min_user, min_item)
    # Every user and item left qualifies.
    assert (core[schema.USER].value_counts() >= min_user).all()
    assert (core[schema.ITEM].value_counts() >= min_item).all()
    # Rows are a subset of the input, in the original order.
    assert core.index.is_monotonic_increasing and set(core.index) <= set(frame.index)
    # A fixed point: filtering again changes nothing.
    pd.testing.assert_frame_equal(k_core(core, min_user, min_item), core)
    # Maximal: equals the unique k-core computed by a naive, differently ordered peeling.
    rows = list(zip(frame[schema.USER], frame[schema.ITEM]))
    assert set(core.index) == naive_k_core(rows, min_user, min_item)


def test_k_core_cascades_hand_example():
    # users ≥ 3, items ≥ 2: u3 (2 events) and items a, b (1 each) go; then u1 has only "c" left and "d"
    # only one event; then u2 has two events: everything cascades away. With items ≥ 1 only u3 goes.
    frame = frame_of([("u1", "a", 1), ("u1", "b", 2), ("u1", "c", 3), ("u2", "c", 4), ("u2", "d", 5),
                      ("u2", "c", 6), ("u3", "c", 7), ("u3", "d", 8)])
    assert k_core(frame, 3, 2).empty
    kept = k_core(frame, 3, 1)
    assert kept[schema.USER].tolist() == ["u1"] * 3 + ["u2"] * 3


def test_prepare_refuses_empty_results():
    with pytest.raises(PrepareError, match="no interactions"):
        prepare(frame_of([]), ALL)
    with pytest.raises(PrepareError, match="k-core"):
        prepare(frame_of([("u1", "a", 1), ("u2", "b", 2)]), PrepareConfig(min_user_interactions=2))


# --- order and ids ------------------------------------------------------------------------------------------


def test_stable_time_order_breaks_ties_by_original_order():
    frame = frame_of([("u1", "a", 5), ("u1", "b", 3), ("u1", "c", 5), ("u1", "d", 3), ("u1", "e", 4)])
    p = prepare(frame, ALL)
    raw = p.items.set_index("item")["item_id"]
    assert raw.loc[p.events["item"]].tolist() == ["b", "d", "e", "a", "c"]
    assert p.events["timestamp"].tolist() == [3, 3, 4, 5, 5]


def test_tie_order_follows_the_input_not_the_id_spelling():
    forward = prepare(frame_of([("u1", "z", 7), ("u1", "a", 7), ("u1", "m", 7)]), ALL)
    assert forward.items.set_index("item")["item_id"].loc[forward.events["item"]].tolist() == ["z", "a", "m"]


def test_dense_ids_by_first_appearance_and_zero_unused():
    frame = frame_of([("bob", "x", 20), ("alice", "y", 10), ("alice", "x", 30), ("bob", "z", 5),
                      ("bob", "y", 40), ("alice", "w", 50)])
    p = prepare(frame, ALL)
    # Time order: bob z(5), alice y(10), bob x(20), alice x(30), bob y(40), alice w(50).
    assert p.users["user_id"].tolist() == ["bob", "alice"] and p.users["user"].tolist() == [1, 2]
    assert p.items["item_id"].tolist() == ["z", "y", "x", "w"] and p.items["item"].tolist() == [1, 2, 3, 4]
    assert p.events["user"].tolist() == [1, 1, 1, 2, 2, 2]
    assert p.events["item"].tolist() == [1, 3, 2, 2, 3, 4]
    assert p.n_users == 2 and p.n_items == 4


@settings(max_examples=40, deadline=None)
@given(interaction_tables(), st.integers(1, 3), st.integers(1, 3))
def test_ids_dense_sorted_and_faithful(frame, min_user, min_item):
    core = k_core(frame, min_user, min_item)
    if core.empty:
        return
    p = prepare(frame, PrepareConfig(min_user_interactions=min_user, min_item_interactions=min_item))
    ev = p.events
    assert sorted(ev["user"].unique()) == list(range(1, p.n_users + 1))
    assert sorted(ev["item"].unique()) == list(range(1, p.n_items + 1))
    assert ev["user"].is_monotonic_increasing
    for _, g in ev.groupby("user"):
        assert g["timestamp"].is_monotonic_increasing
    # The dense ids map back to exactly the k-core's (user, item, timestamp) multiset.
    users = p.users.set_index("user")["user_id"]
    items = p.items.set_index("item")["item_id"]
    back = Counter(zip(users.loc[ev["user"]], items.loc[ev["item"]], ev["timestamp"]))
    assert back == Counter(zip(core[schema.USER], core[schema.ITEM], core[schema.TIMESTAMP]))
    assert ev.dtypes.to_dict() == {"user": np.int32, "item": np.int32, "timestamp": np.int64, "role": np.int8}


# --- leave-one-out ------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(interaction_tables())
def test_loo_one_valid_and_one_test_per_eligible_user(frame):
    p = prepare(frame, ALL)
    for _, g in p.events.groupby("user", sort=False):
        roles = g["role"].tolist()
        if len(roles) >= 3:
            assert roles == [TRAIN] * (len(roles) - 2) + [VALID, TEST]
        else:
            assert roles == [TRAIN] * len(roles)


def _assert_no_target_in_training(p, max_len):
    data = SequenceData.from_prepared(p)
    spans = data.train_spans(max_len)
    for _, s, e in spans:
        assert (data.roles[s:e] == TRAIN).all()
        assert e - s <= max_len + 1
    if len(spans) == 0:
        return
    batch = train_batch(data, spans)
    eval_items = set(data.items[data.roles != TRAIN].tolist())
    used = set(batch.items[batch.items > 0].tolist()) | set(batch.targets[batch.targets > 0].tolist())
    # Items are unique per event here, so an item id identifies its event.
    assert not (used & eval_items)
    # …and training sees the newest training events (the span ends at the last training event).
    for u, s, e in spans:
        lo, hi = data.offsets[u - 1], data.offsets[u]
        assert e == lo + int((data.roles[lo:hi] == TRAIN).sum())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unique_item_tables(), st.integers(1, 6))
def test_loo_targets_never_reach_training(frame, max_len):
    _assert_no_target_in_training(prepare(frame, ALL), max_len)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unique_item_tables(), st.integers(1, 6))
def test_global_time_targets_never_reach_training(frame, max_len):
    _assert_no_target_in_training(prepare(frame, GLOBAL), max_len)


def test_global_time_user_without_events_can_train():
    # "c" only has an event after the test cutoff: dropped entirely, yet kept in users.parquet with the
    # highest dense id (users are numbered by first appearance), so offsets end [..., 4, 4].
    frame = frame_of([("a", "x", 1), ("a", "y", 2), ("a", "z", 3), ("a", "w", 4), ("c", "q", 10)])
    prepared = prepare(frame, GLOBAL)
    data = SequenceData.from_prepared(prepared)
    spans = data.train_spans(5)
    assert spans.tolist() == [[1, 0, 2]]  # user a: its two training events


def test_eval_inputs_include_valid_only_for_test(tiny_prepared):
    data = SequenceData.from_prepared(tiny_prepared)
    test_idx, valid_idx = data.eval_targets("test"), data.eval_targets("valid")
    assert len(test_idx) == len(valid_idx) == tiny_prepared.fingerprint["n_test"] > 0
    assert (test_idx == valid_idx + 1).all()  # LOO: valid is directly before test for every user
    long = 10_000
    test_b, valid_b = eval_batch(data, test_idx, long), eval_batch(data, valid_idx, long)
    for row, (t, v) in enumerate(zip(test_idx, valid_idx)):
        user = int(test_b.users[row])
        start = data.offsets[user - 1]
        test_input = test_b.batch.items[row][test_b.batch.items[row] > 0].numpy()
        valid_input = valid_b.batch.items[row][valid_b.batch.items[row] > 0].numpy()
        np.testing.assert_array_equal(test_input, data.items[start:t])
        np.testing.assert_array_equal(valid_input, data.items[start:v])
        assert test_input[-1] == data.items[v]  # the validation event is the newest test input
        assert (data.roles[start:v] == TRAIN).all()  # the validation input is training events only
    assert (test_b.targets.numpy() == data.items[test_idx]).all()
    assert (valid_b.targets.numpy() == data.items[valid_idx]).all()


# --- global-time split --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(interaction_tables(max_time=40))
def test_global_time_split(frame):
    p = prepare(frame, GLOBAL)
    t_valid, t_test = np.quantile(frame[schema.TIMESTAMP].to_numpy(), [0.5, 0.75])
    ev = p.events
    assert (ev.loc[ev.role == TRAIN, "timestamp"] < t_valid).all()
    assert (ev.loc[ev.role == HISTORY, "timestamp"] >= t_valid).all()
    valid_t = ev.loc[ev.role == VALID, "timestamp"]
    assert ((valid_t >= t_valid) & (valid_t < t_test)).all()
    assert (ev.loc[ev.role == TEST, "timestamp"] >= t_test).all()
    for _, g in ev.groupby("user"):
        roles = g["role"].to_numpy()
        assert (roles == VALID).sum() <= 1 and (roles == TEST).sum() <= 1
        has_train = (roles == TRAIN).any()
        if not has_train:  # a target needs history before the cutoff
            assert not np.isin(roles, [VALID, TEST]).any()
        if (roles == TEST).any():  # nothing after a test target is kept
            assert roles[-1] == TEST
        # Nothing at or after the test cutoff except the test target itself.
        late = g["timestamp"].to_numpy() >= t_test
        assert late.sum() == (roles == TEST).sum()
        # The validation target is the user's first event in the validation period.
        if (roles == VALID).any():
            first = np.flatnonzero(g["timestamp"].to_numpy() >= t_valid)[0]
            assert roles[first] == VALID
    # Raw events of eligible users are kept up to (and including) their first test-period event.
    assert len(ev) <= len(frame)


def test_global_time_hand_example():
    # Sorted times 1,2,3,4,5,5,6,7,7,8 → valid cutoff (q=0.5) = 5, test cutoff (q=0.75) = 6.75.
    frame = frame_of([("a", "x", 1), ("a", "y", 2), ("a", "z", 5), ("a", "w", 6), ("a", "v", 7), ("a", "q", 8),
                      ("b", "x", 3), ("b", "y", 4), ("c", "z", 5), ("c", "x", 7)])
    p = prepare(frame, GLOBAL)
    fp = p.fingerprint  # where training ends, the held-out (warm starts) and the test (the gate) periods begin
    assert (fp["train_until"], fp["held_out_from"], fp["test_from"]) == (4, 5.0, 6.75)
    users = p.users.set_index("user")["user_id"]
    items = p.items.set_index("item")["item_id"]
    got = [(users[u], items[i], r) for u, i, r in zip(p.events.user, p.events.item, p.events.role)]
    assert got == [
        ("a", "x", TRAIN), ("a", "y", TRAIN), ("a", "z", VALID), ("a", "w", HISTORY), ("a", "v", TEST),
        ("b", "x", TRAIN), ("b", "y", TRAIN),
        ("c", "z", HISTORY),  # c has no training history: no target, and its test-period event is dropped
    ]


# --- fingerprint and persistence ----------------------------------------------------------------------------


def test_fingerprint_deterministic_and_sensitive(tiny_interactions, tiny_prepare_config):
    base = prepare(tiny_interactions, tiny_prepare_config).fingerprint["fingerprint"]
    assert prepare(tiny_interactions.copy(), tiny_prepare_config).fingerprint["fingerprint"] == base
    moved = tiny_interactions.copy()
    moved.loc[moved.index[-1], schema.TIMESTAMP] += 1
    assert prepare(moved, tiny_prepare_config).fingerprint["fingerprint"] != base
    renamed = tiny_interactions.copy()
    renamed[schema.USER] = renamed[schema.USER].replace({"u1": "renamed"})
    assert prepare(renamed, tiny_prepare_config).fingerprint["fingerprint"] != base
    other = dataclasses.replace(tiny_prepare_config, min_item_interactions=2)
    assert prepare(tiny_interactions, other).fingerprint["fingerprint"] != base
    split = dataclasses.replace(tiny_prepare_config, split="global_time")
    assert prepare(tiny_interactions, split).fingerprint["fingerprint"] != base


@settings(max_examples=40, deadline=None)
@given(interaction_tables(max_time=40))
def test_the_fingerprint_records_where_training_ends_and_the_held_out_period_starts(frame):
    """`train_until`: the newest training event; `held_out_from` (global_time): the cut every held-out event
    is at or after — what a warm start and the gate compare a model's own `train_until` with."""
    for config in (GLOBAL, ALL):
        p = prepare(frame, config)
        train = p.events.loc[p.events.role == TRAIN, "timestamp"]
        assert p.fingerprint["train_until"] == (int(train.max()) if len(train) else None)
        if config.split == "loo":
            assert p.fingerprint["held_out_from"] is None and p.fingerprint["test_from"] is None
            continue
        cut, test_cut = p.fingerprint["held_out_from"], p.fingerprint["test_from"]
        assert (cut, test_cut) == tuple(np.quantile(frame[schema.TIMESTAMP].to_numpy(), [0.5, 0.75]))
        assert (train < cut).all() and (p.events.loc[p.events.role != TRAIN, "timestamp"] >= cut).all()
        assert (p.events.loc[p.events.role == TEST, "timestamp"] >= test_cut).all()


def test_fingerprint_counts(tiny_prepared):
    fp, ev = tiny_prepared.fingerprint, tiny_prepared.events
    assert len(fp["fingerprint"]) == 64
    assert (fp["n_users"], fp["n_items"], fp["n_events"]) == (tiny_prepared.n_users, tiny_prepared.n_items, len(ev))
    assert fp["n_train"] + fp["n_valid"] + fp["n_test"] == len(ev)
    assert fp["n_valid"] == (ev.role == VALID).sum() and fp["n_test"] == (ev.role == TEST).sum()


def test_titles_follow_items(tiny_prepared, tiny_generated):
    titles = dict(zip(tiny_generated.items["item_id"], tiny_generated.items["title"]))
    assert tiny_prepared.items["title"].tolist() == [titles[i] for i in tiny_prepared.items["item_id"]]


def test_save_load_round_trip(tiny_prepared, tmp_path):
    save(tiny_prepared, tmp_path / "p")
    loaded = load(tmp_path / "p")
    pd.testing.assert_frame_equal(loaded.events, tiny_prepared.events)
    pd.testing.assert_frame_equal(loaded.users, tiny_prepared.users)
    pd.testing.assert_frame_equal(loaded.items, tiny_prepared.items, check_dtype=False)
    assert loaded.fingerprint == tiny_prepared.fingerprint


def test_load_refuses_incomplete_directory(tiny_prepared, tmp_path):
    save(tiny_prepared, tmp_path / "p")
    (tmp_path / "p" / "fingerprint.json").unlink()
    with pytest.raises(PrepareError, match="fingerprint.json"):
        load(tmp_path / "p")


def test_stage_main_reads_the_store(tiny_store, tiny_prepared, write_params, tmp_path):
    from recsys.prepare import main

    params = write_params()
    main(["--params", str(params), "--store", str(tiny_store), "--out", str(tmp_path / "out")])
    assert load(tmp_path / "out").fingerprint == tiny_prepared.fingerprint


def test_prepare_logs_what_each_filter_step_kept(tiny_generated, tiny_prepare_config, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="recsys.prepare"):
        prepared = prepare(tiny_generated.interactions, tiny_prepare_config)
    n_in = len(tiny_generated.interactions)
    lines = [r.getMessage() for r in caplog.records if r.name == "recsys.prepare"]
    kcore = [line for line in lines if line.startswith("3-core filter kept ")]
    assert kcore and f" of {n_in} events" in kcore[0], lines
    split = [line for line in lines if line.startswith("loo split kept ")]
    fp = prepared.fingerprint
    assert split == [f"loo split kept {fp['n_events']} of {fp['n_events']} events: {fp['n_valid']} validation "
                     f"and {fp['n_test']} test targets"], lines


@pytest.mark.parametrize("damage", ["truncate events", "fingerprint not JSON", "users missing"])
def test_a_damaged_prepared_dataset_is_one_line_naming_the_rebuild(tiny_prepared_dir, tmp_path, damage):
    """A truncated events.parquet or a fingerprint.json that is not JSON was a 100-line traceback from train and
    evaluate; a missing users.parquet said only its path."""
    import shutil

    from recsys.prepare import PrepareError, load

    copy = tmp_path / "prepared"
    shutil.copytree(tiny_prepared_dir, copy)
    if damage == "truncate events":
        broken = copy / "events.parquet"
        broken.write_bytes(broken.read_bytes()[:100])
    elif damage == "fingerprint not JSON":
        broken = copy / "fingerprint.json"
        broken.write_text("{")
    else:
        broken = copy / "users.parquet"
        broken.unlink()
    with pytest.raises(PrepareError, match=(rf"^{broken} cannot be read \(.+\): the prepare stage's output is "
                                            r"damaged; rebuild it with `dvc repro prepare`$")):
        load(copy)


def test_an_items_file_that_is_not_text_is_one_line(tmp_path):
    from recsys.prepare import PrepareError, read_titles

    (tmp_path / "items.csv").write_bytes(b"item_id,title\n1,a\n\xff\xfe")
    with pytest.raises(PrepareError, match=r"items.csv cannot be read \(.+\); put the data version back"):
        read_titles(tmp_path)
