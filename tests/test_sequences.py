"""Prepared events → padded batches: spans, left padding, shifted targets, bucketing, evaluation inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from recsys.config import PrepareConfig
from recsys.prepare import prepare
from recsys.sequences import (
    SequenceData,
    TrainingTensors,
    batch_rows,
    bucketed_batch_rows,
    bucketed_batches,
    eval_batch,
    micro_batch_count,
    micro_batches,
    random_batch_rows,
    train_batch,
)

ALL = PrepareConfig(min_user_interactions=1, min_item_interactions=1)


@pytest.fixture
def hand() -> SequenceData:
    """user 1: items a b c d e f (train a b c d, valid e, test f); user 2: b c g (train b); user 3: a c."""
    rows = [("u1", x, 10 + k) for k, x in enumerate("abcdef")]
    rows += [("u2", "b", 100), ("u2", "c", 101), ("u2", "g", 102)]
    rows += [("u3", "a", 200), ("u3", "c", 201)]
    p = prepare(pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"]), ALL)
    # Dense item ids by first appearance: a1 b2 c3 d4 e5 f6 g7.
    assert p.items["item_id"].tolist() == list("abcdefg")
    return SequenceData.from_prepared(p)


def test_layout(hand):
    assert hand.offsets.tolist() == [0, 6, 9, 11]
    assert hand.items.tolist() == [1, 2, 3, 4, 5, 6, 2, 3, 7, 1, 3]
    assert hand.roles.tolist() == [0, 0, 0, 0, 1, 2, 0, 1, 2, 0, 0]
    assert hand.train_items().tolist() == [1, 2, 3, 4, 2, 1, 3]
    assert hand.eval_targets("valid").tolist() == [4, 7]
    assert hand.eval_targets("test").tolist() == [5, 8]


def test_train_spans(hand):
    # user 2 has one training event: nothing to predict, no span. user 3: both events are training.
    assert hand.train_spans(10).tolist() == [[1, 0, 4], [3, 9, 11]]
    # max_len 2 keeps the newest 3 training events (2 inputs, 2 targets).
    assert hand.train_spans(2).tolist() == [[1, 1, 4], [3, 9, 11]]


def test_train_batch_left_pads_and_shifts(hand):
    batch = train_batch(hand, hand.train_spans(10))
    assert batch.items.tolist() == [[1, 2, 3], [0, 0, 1]]
    assert batch.targets.tolist() == [[2, 3, 4], [0, 0, 3]]
    assert batch.users.tolist() == [1, 3]
    assert batch.times.tolist() == [[10, 11, 12], [0, 0, 200]]
    assert batch.target_times.tolist() == [[11, 12, 13], [0, 0, 201]]


def test_bucketed_batches_cover_every_span_once():
    spans = np.stack([np.arange(1, 101), np.arange(100) * 10, np.arange(100) * 10 + 2 + np.arange(100) % 7], 1)
    batches = bucketed_batches(spans, 16, torch.Generator().manual_seed(0))
    assert all(1 <= len(b) <= 16 for b in batches)
    assert sorted(np.concatenate(batches)[:, 0].tolist()) == list(range(1, 101))
    again = bucketed_batches(spans, 16, torch.Generator().manual_seed(0))
    assert all((a == b).all() for a, b in zip(batches, again))
    other = bucketed_batches(spans, 16, torch.Generator().manual_seed(1))
    assert any(len(a) != len(b) or (a != b).any() for a, b in zip(batches, other))
    # Within a batch lengths are sorted (bucketing), which keeps padding small.
    for b in batches:
        lengths = b[:, 2] - b[:, 1]
        assert (np.diff(lengths) >= 0).all()


def test_eval_batch_inputs_seen_and_targets(hand):
    eb = eval_batch(hand, hand.eval_targets("test"), max_len=3)
    assert eb.targets.tolist() == [6, 7]
    assert eb.users.tolist() == [1, 2]
    # Model input is truncated to max_len; the seen set is the whole history.
    assert eb.batch.items.tolist() == [[3, 4, 5], [0, 2, 3]]
    assert eb.batch.next_time.tolist() == [15, 102]
    seen = sorted(zip(eb.seen_rows.tolist(), eb.seen_items.tolist()))
    assert seen == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 2), (1, 3)]


def test_eval_batch_maps_to_model_ids(hand):
    # The model knows only items a, c, e (its ids 1, 2, 3) and users u2 (its id 1).
    item_map = np.array([0, 1, 0, 2, 0, 3, 0, 0])
    user_map = np.array([0, 0, 1, 0])
    eb = eval_batch(hand, hand.eval_targets("test"), max_len=10, item_map=item_map, user_map=user_map)
    assert eb.batch.items.tolist() == [[1, 2, 3], [0, 0, 2]]  # unknown items dropped from the input
    assert eb.batch.users.tolist() == [0, 1]
    assert eb.targets.tolist() == [6, 7]  # targets and seen items stay in dataset ids
    assert sorted(eb.seen_items[eb.seen_rows == 0].tolist()) == [1, 2, 3, 4, 5]


def _random_data(seed: int) -> SequenceData:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 30, size=40)
    n = int(counts.sum())
    roles = np.concatenate([np.r_[np.zeros(max(c - 2, 0), np.int8), np.full(min(c, 2), 1, np.int8)] for c in counts])
    return SequenceData(n_items=50, n_users=40, offsets=np.r_[0, np.cumsum(counts)].astype(np.int64),
                        items=rng.integers(1, 51, n).astype(np.int64), times=np.arange(n, dtype=np.int64) + 1000,
                        roles=roles)


@pytest.mark.parametrize("max_len", [3, 8, 50])
def test_device_resident_batches_equal_host_batches(max_len):
    """The trainer cuts batches from TrainingTensors; each must equal train_batch of the same spans."""
    data = _random_data(max_len)
    spans = data.train_spans(max_len)
    tensors = TrainingTensors(data, spans)
    plan = bucketed_batch_rows(tensors.lengths, 7, torch.Generator().manual_seed(0))
    assert sorted(np.concatenate(plan).tolist()) == list(range(len(spans)))
    for rows in plan:
        width = int(tensors.lengths[rows].max()) - 1
        got, want = tensors.batch(torch.from_numpy(rows), width), train_batch(data, spans[rows])
        for field in ("items", "times", "users", "targets", "target_times"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_random_batches_cover_every_span_once_and_mix_lengths():
    lengths = np.repeat(np.arange(2, 12), 20)  # 200 spans, ten lengths
    plan = batch_rows(lengths, 16, torch.Generator().manual_seed(0), "random")
    assert [len(b) for b in plan] == [16] * 12 + [8]
    assert sorted(np.concatenate(plan).tolist()) == list(range(200))
    # Uniform batches: a batch spans most lengths, where bucketing puts one or two lengths in each.
    assert np.mean([len(set(lengths[b])) for b in plan]) > 6
    bucketed = batch_rows(lengths, 16, torch.Generator().manual_seed(0), "bucketed")
    assert np.mean([len(set(lengths[b])) for b in bucketed]) <= 2
    again = batch_rows(lengths, 16, torch.Generator().manual_seed(0), "random")
    assert all((a == b).all() for a, b in zip(plan, again))
    with pytest.raises(ValueError, match="train.batching must be 'bucketed' or 'random', got 'sorted'"):
        batch_rows(lengths, 16, torch.Generator(), "sorted")


def test_batching_is_a_checked_train_setting():
    from recsys.config import ConfigError, parse_params

    assert parse_params({"train": {"batching": "random"}}).train.batching == "random"
    with pytest.raises(ConfigError, match="batching"):
        parse_params({"train": {"batching": "sorted"}})


def test_bucketed_batches_are_the_rows_of_bucketed_batch_rows():
    spans = np.stack([np.arange(1, 51), np.arange(50) * 10, np.arange(50) * 10 + 2 + np.arange(50) % 5], 1)
    rows = bucketed_batch_rows(spans[:, 2] - spans[:, 1], 8, torch.Generator().manual_seed(3))
    batches = bucketed_batches(spans, 8, torch.Generator().manual_seed(3))
    assert len(rows) == len(batches) > 1  # zip below stops at the shorter list
    assert all((spans[r] == b).all() for r, b in zip(rows, batches))


@pytest.mark.parametrize("max_len", [1, 3, 8, 50])
def test_all_windows_make_every_training_transition_a_target_exactly_once(max_len):
    data = _random_data(7)
    spans = data.train_spans(max_len, windows="all")
    assert ((spans[:, 2] - spans[:, 1] >= 2) & (spans[:, 2] - spans[:, 1] <= max_len + 1)).all()
    targets = np.concatenate([np.arange(s + 1, e) for _, s, e in spans])  # event index of every target
    user_of = np.searchsorted(data.offsets, np.arange(len(data.items)), side="right")
    is_train = data.roles == 0
    expected = [i for i in range(len(data.items))  # a training event with an earlier training event
                if is_train[i] and i > data.offsets[user_of[i] - 1]]
    assert sorted(targets.tolist()) == expected
    # Each window's user owns its events; the newest window is the "last" span.
    assert all(data.offsets[u - 1] <= s and e <= data.offsets[u] for u, s, e in spans)
    last = data.train_spans(max_len, windows="last")
    assert {tuple(r) for r in last} <= {tuple(r) for r in spans}


def test_windows_must_be_known():
    with pytest.raises(ValueError, match="windows"):
        _random_data(1).train_spans(5, windows="some")


def test_random_batches_are_a_uniform_partition_sorted_by_length_within_each_batch():
    lengths = np.random.default_rng(0).integers(2, 50, size=103)
    plan = random_batch_rows(lengths, 16, torch.Generator().manual_seed(3))
    assert sorted(np.concatenate(plan).tolist()) == list(range(103))  # every span exactly once
    assert [len(rows) for rows in plan] == [16] * 6 + [7]
    assert all(np.all(np.diff(lengths[rows]) >= 0) for rows in plan)
    # Not bucketed: a batch spans most of the length range, as a uniform sample does.
    assert np.mean([lengths[rows].max() - lengths[rows].min() for rows in plan[:6]]) > 30


def test_micro_batches_pad_each_part_to_its_own_longest_and_weigh_it_by_its_targets():
    lengths = np.array([2, 3, 3, 5, 9, 10, 20])  # events per span, sorted: 1, 2, 2, 4, 8, 9, 19 targets
    parts = micro_batches(lengths, 3, lengths - 1)
    assert [(start, stop, width) for start, stop, width, _ in parts] == [(0, 2, 2), (2, 5, 8), (5, 7, 19)]
    assert [w for *_, w in parts] == pytest.approx([3 / 45, 14 / 45, 28 / 45])
    assert micro_batches(lengths, 1, lengths - 1) == [(0, 7, 19, 1.0)]
    # More parts than rows: one row each, the weights still sum to one.
    many = micro_batches(lengths, 50, lengths - 1)
    assert [(start, stop) for start, stop, *_ in many] == [(i, i + 1) for i in range(7)]
    assert sum(w for *_, w in many) == pytest.approx(1.0)


def test_micro_batches_refuse_unsorted_rows_no_rows_and_no_parts():
    with pytest.raises(ValueError, match="sorted by span length"):
        micro_batches(np.array([5, 2, 9]), 2, np.array([4, 1, 8]))
    with pytest.raises(ValueError, match="parts >= 1 and at least one row, got 0 and 3"):
        micro_batches(np.array([2, 5, 9]), 0, np.array([1, 4, 8]))
    with pytest.raises(ValueError, match="got 2 and 0"):
        micro_batches(np.array([], dtype=np.int64), 2, np.array([]))


def test_micro_batch_count_auto_is_eight_on_cpu_and_one_on_cuda_and_a_setting_wins():
    assert micro_batch_count(0, torch.device("cpu")) == 8
    assert micro_batch_count(0, torch.device("cuda")) == 1
    assert micro_batch_count(3, torch.device("cuda")) == 3
    assert micro_batch_count(1, torch.device("cpu")) == 1


def test_micro_batches_is_a_checked_train_setting():
    from recsys.config import ConfigError, parse_params

    assert parse_params({"train": {"micro_batches": 4}}).train.micro_batches == 4
    with pytest.raises(ConfigError, match="micro_batches must be >= 0"):
        parse_params({"train": {"micro_batches": -1}})
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_params({"train": {"micro_batches": "auto"}})
