"""Evaluation: full ranking with seen items and padding masked, per-user values, checkpoints re-scored on a
dataset whose vocabulary changed."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from recsys import schema
from recsys.checkpoint import save_checkpoint
from recsys.config import EvaluateConfig
from recsys.evaluate import eval_fingerprint, evaluate_checkpoint, evaluate_model, write_outputs
from recsys.models.base import Batch, SequentialModel
from recsys.models.mostpop import MostPop, MostPopConfig
from recsys.prepare import TEST, TRAIN, load, prepare, save
from recsys.ranking import MISS_RANK
from recsys.sequences import SequenceData

METRIC_KEYS = {"ndcg@5", "ndcg@10", "ndcg@20", "hr@5", "hr@10", "hr@20", "mrr"}


class ScriptedScores(SequentialModel):
    """Scores fixed per item id (column 0 = padding gets `pad_score`, to prove it is never ranked)."""

    name = "scripted"

    def __init__(self, item_scores: torch.Tensor, pad_score: float = float("inf")):
        super().__init__(len(item_scores) - 1, 0)
        self.item_scores = item_scores.clone()
        self.item_scores[0] = pad_score

    def score(self, batch: Batch) -> torch.Tensor:
        return self.item_scores.expand(batch.items.shape[0], -1).clone()


def seen_before(data: SequenceData, target: int) -> set[int]:
    user = int(np.searchsorted(data.offsets, target, side="right"))
    return set(data.items[data.offsets[user - 1] : target].tolist())


def test_ranks_with_hand_computable_scores(tiny_prepared):
    """Score = item id: the target's rank is 1 + #unseen items with a larger-or-equal id (ties impossible)."""
    n = tiny_prepared.n_items
    model = ScriptedScores(torch.arange(n + 1, dtype=torch.float32))
    result = evaluate_model(model, tiny_prepared, "test")
    data = SequenceData.from_prepared(tiny_prepared)
    expected = []
    for t in data.eval_targets("test"):
        target, seen = int(data.items[t]), seen_before(data, t)
        # a target the user already has in the input (a repeat) is a miss, after every item (PROTOCOL.md)
        expected.append(MISS_RANK if target in seen else 1 + sum(1 for i in range(target + 1, n + 1)
                                                                 if i not in seen))
    assert result.per_user["rank"].tolist() == expected
    assert MISS_RANK in expected and min(expected) <= n  # both cases occur in the tiny data


def test_constant_scores_rank_target_last_among_unseen(tiny_prepared):
    """All items tie (an untrained model): ties count against the target; padding (scored +inf) never counts."""
    n = tiny_prepared.n_items
    model = ScriptedScores(torch.zeros(n + 1))
    result = evaluate_model(model, tiny_prepared, "valid")
    data = SequenceData.from_prepared(tiny_prepared)
    expected = [MISS_RANK if int(data.items[t]) in seen_before(data, t) else n - len(seen_before(data, t))
                for t in data.eval_targets("valid")]
    assert result.per_user["rank"].tolist() == expected


def test_per_user_frame(trained_sasrec, tiny_prepared, tiny_prepared_dir):
    _, ckpt = trained_sasrec
    result = evaluate_checkpoint(ckpt, tiny_prepared_dir, "test")
    pu = result.per_user
    test_users = tiny_prepared.events.loc[tiny_prepared.events.role == TEST, "user"]
    assert len(pu) == len(test_users) == result.metrics["n_users"]
    assert pu["user"].tolist() == test_users.tolist() and pu["user_id"].is_unique
    users = tiny_prepared.users
    assert dict(zip(pu["user"], pu["user_id"])) == dict(zip(users["user"], users["user_id"]))
    assert set(pu.columns) == {"user", "user_id", "rank"} | METRIC_KEYS
    assert pu["user"].dtype == np.int32 and pu["rank"].dtype == np.int64
    for key in METRIC_KEYS:
        assert pu[key].mean() == pytest.approx(result.metrics[key], abs=1e-12)
        assert 0.0 <= result.metrics[key] <= 1.0
    np.testing.assert_allclose(pu["mrr"], 1.0 / pu["rank"])
    np.testing.assert_allclose(pu["hr@10"], (pu["rank"] <= 10).astype(float))


def test_evaluate_checkpoint_equals_evaluate_model(trained_sasrec, tiny_prepared_dir):
    from recsys.checkpoint import load_model

    _, ckpt = trained_sasrec
    model, _ = load_model(ckpt)
    prepared = load(tiny_prepared_dir)
    for split in ("valid", "test"):
        direct = evaluate_model(model, prepared, split)
        via_checkpoint = evaluate_checkpoint(ckpt, tiny_prepared_dir, split)
        assert via_checkpoint.metrics == direct.metrics
        pd.testing.assert_frame_equal(via_checkpoint.per_user, direct.per_user)
        assert via_checkpoint.eval_fingerprint == direct.eval_fingerprint


def test_eval_fingerprint(tiny_prepared, tiny_prepared_dir, tiny_generated, tiny_prepare_config):
    """The gate compares two models' scores only under the same fingerprint: it must follow the data, not
    only the split's name, and survive a save/load round trip."""
    assert eval_fingerprint(load(tiny_prepared_dir), "test") == eval_fingerprint(tiny_prepared, "test")
    assert eval_fingerprint(tiny_prepared, "test") != eval_fingerprint(tiny_prepared, "valid")
    fewer = prepare(tiny_generated.interactions.iloc[:-20], tiny_prepare_config, tiny_generated.items)
    assert eval_fingerprint(fewer, "test") != eval_fingerprint(tiny_prepared, "test")


def test_sampled_metrics_are_a_labelled_extra(trained_sasrec, tiny_prepared_dir):
    _, ckpt = trained_sasrec
    full = evaluate_checkpoint(ckpt, tiny_prepared_dir, "test")
    both = evaluate_checkpoint(ckpt, tiny_prepared_dir, "test", EvaluateConfig(sampled_negatives=5))
    assert {k: both.metrics[k] for k in full.metrics} == full.metrics  # headline numbers unchanged
    assert set(both.metrics) - set(full.metrics) == {f"sampled5_{k}" for k in METRIC_KEYS}
    # Ranking among 5 negatives can only be easier than among the whole catalogue.
    assert both.metrics["sampled5_ndcg@10"] >= full.metrics["ndcg@10"]
    assert both.metrics["sampled5_hr@5"] >= full.metrics["hr@5"]


def test_write_outputs(trained_sasrec, tiny_prepared_dir, tmp_path):
    _, ckpt = trained_sasrec
    result = evaluate_checkpoint(ckpt, tiny_prepared_dir, "test")
    write_outputs(result, tmp_path / "m" / "x.json", tmp_path / "e" / "per_user.parquet", {"best_epoch": 3})
    metrics = json.loads((tmp_path / "m" / "x.json").read_text())
    assert METRIC_KEYS <= set(metrics) and metrics["best_epoch"] == 3
    assert metrics["eval_fingerprint"] == result.eval_fingerprint
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "e" / "per_user.parquet"), result.per_user)


# --- a checkpoint re-scored on a newer dataset with a changed vocabulary --------------------------------------


@pytest.fixture(scope="module")
def vocabulary_change(tiny_generated, tiny_prepare_config, tmp_path_factory):
    """(old prepared, MostPop checkpoint trained on it, new prepared dir, removed item, new item ids).

    The new dataset drops one item entirely and adds two brand-new items: one appears first in time (so it
    takes dense id 1, which the old model gives to another item), and both are the test target of some users.
    """
    old_frame = tiny_generated.interactions
    old = prepare(old_frame, tiny_prepare_config)
    data = SequenceData.from_prepared(old)
    model = MostPop(MostPopConfig(), n_items=old.n_items, n_users=old.n_users)
    model.fit_statistics(data.train_items())
    root = tmp_path_factory.mktemp("vocab")
    ckpt = save_checkpoint(root / "mostpop", model, dataset_fingerprint=old.fingerprint["fingerprint"],
                           item_ids=old.items["item_id"].tolist(), user_ids=old.users["user_id"].tolist())

    removed = old.items["item_id"].iloc[-1]
    new_items = ["new-1", "new-2"]
    frame = old_frame[old_frame[schema.ITEM] != removed]
    t0, t_end = int(frame[schema.TIMESTAMP].min()), int(frame[schema.TIMESTAMP].max())
    users = sorted(frame[schema.USER].unique())
    extra = [(u, "new-1", t0 - 100 + k) for k, u in enumerate(users[:4])]  # earliest events of all
    extra += [(u, new_items[k % 2], t_end + 1 + k) for k, u in enumerate(users[4:12])]  # newest: test targets
    extra += [(u, "new-2", t0 + k) for k, u in enumerate(users[12:16])]
    extra_frame = pd.DataFrame(extra, columns=[schema.USER, schema.ITEM, schema.TIMESTAMP])
    new = prepare(pd.concat([frame[[schema.USER, schema.ITEM, schema.TIMESTAMP]], extra_frame], ignore_index=True),
                  tiny_prepare_config)
    save(new, root / "new")
    assert new.items["item_id"].iloc[0] == "new-1" and removed not in set(new.items["item_id"])
    return old, ckpt, root / "new", removed, new_items


def test_unknown_targets_rank_last_and_new_items_never_recommended(vocabulary_change):
    old, ckpt, new_dir, _, _ = vocabulary_change
    new = load(new_dir)
    result = evaluate_checkpoint(ckpt, new_dir, "test")
    data = SequenceData.from_prepared(new)

    # Independent expectation by raw id: MostPop's training counts on the *old* data; items unknown to the
    # model can never beat anything (they are last), and ties count against the target.
    old_train = old.events[old.events.role == TRAIN]
    old_raw = old.items.set_index("item")["item_id"]
    counts = Counter(old_raw.loc[old_train["item"]].tolist())
    known = set(old.items["item_id"])
    new_raw = new.items["item_id"].tolist()  # index i = dense id i + 1
    expected, unknown_targets = [], 0
    for t in data.eval_targets("test"):
        target = new_raw[data.items[t] - 1]
        seen = {new_raw[i - 1] for i in seen_before(data, t)}
        candidates = [raw for raw in new_raw if raw != target and raw not in seen]
        if target in seen:  # a repeat: a miss (PROTOCOL.md masks every item in the input)
            expected.append(MISS_RANK)
        elif target not in known:
            unknown_targets += 1
            expected.append(1 + len(candidates))  # last
        else:
            expected.append(1 + sum(1 for raw in candidates if raw in known and counts[raw] >= counts[target]))
    assert unknown_targets >= 4
    assert result.per_user["rank"].tolist() == expected
    assert len(result.per_user) == new.fingerprint["n_test"]


def test_vocabulary_change_with_a_neural_model(trained_sasrec, vocabulary_change):
    _, ckpt = trained_sasrec
    _, _, new_dir, _, new_items = vocabulary_change
    new = load(new_dir)
    result = evaluate_checkpoint(ckpt, new_dir, "test")
    data = SequenceData.from_prepared(new)
    raw = new.items["item_id"].tolist()
    ranks = result.per_user["rank"].tolist()
    n_unknown = 0
    for rank, t in zip(ranks, data.eval_targets("test")):
        target = int(data.items[t])
        if target in seen_before(data, t):  # a repeat: a miss
            assert rank == MISS_RANK
        elif raw[target - 1] in new_items:
            n_unknown += 1
            assert rank == new.n_items - len(seen_before(data, t))  # last among candidates
        else:
            # A known target is never beaten by a new item: at most the known unseen candidates beat it.
            known_candidates = [i for i in range(1, new.n_items + 1)
                                if raw[i - 1] not in new_items and i != target and i not in seen_before(data, t)]
            assert rank <= 1 + len(known_candidates)
    assert n_unknown >= 4
    assert all(0.0 <= result.metrics[k] <= 1.0 for k in METRIC_KEYS)


def test_the_automatic_scoring_batch_is_512_on_a_cpu_and_sized_by_the_score_table_on_cuda():
    """`eval_batch_size` / `evaluate.batch_size` 0: a CPU scores 512 targets a batch; CUDA as many as keep the
    model's per-batch score table within 2^28 elements — MOJITO's table is (1 + F) rows of scores per
    target, so it gets (1 + F) × fewer; a setting > 0 is taken as it is."""
    from recsys.model_configs import MODEL_CONFIGS
    from recsys.models import build_model
    from recsys.ranking import SCORING_ELEMENTS_CUDA, scoring_batch_size

    sasrec = build_model("sasrec", MODEL_CONFIGS["sasrec"](max_len=50), n_items=3266, n_users=10)
    mojito = build_model("mojito", MODEL_CONFIGS["mojito"](max_len=50, fism_items=20), n_items=3266, n_users=10)
    assert scoring_batch_size(0, sasrec, "cpu") == scoring_batch_size(0, mojito, "cpu") == 512
    assert scoring_batch_size(0, sasrec, "cuda") == SCORING_ELEMENTS_CUDA // 3267 == 82_165
    assert scoring_batch_size(0, mojito, "cuda") == SCORING_ELEMENTS_CUDA // (21 * 3267) == 3_912
    assert scoring_batch_size(64, mojito, "cuda") == 64
    with pytest.raises(ValueError, match="evaluate.batch_size"):
        EvaluateConfig(batch_size=-1)


def test_scores_do_not_depend_on_the_scoring_batch(trained_sasrec, tiny_prepared, monkeypatch):
    import math

    import recsys.ranking
    from recsys.checkpoint import load_model

    model = load_model(trained_sasrec[1])[0]
    real, batches = recsys.ranking.eval_batch, []
    monkeypatch.setattr(recsys.ranking, "eval_batch", lambda data, targets, *a: batches.append(len(targets))
                        or real(data, targets, *a))
    ranks, calls = [], {}
    for size in (0, 7):
        batches.clear()
        ranks.append(evaluate_model(model, tiny_prepared, "valid",
                                    EvaluateConfig(batch_size=size)).per_user["rank"])
        calls[size] = list(batches)
    n_valid = sum(calls[0])
    # it split
    assert len(calls[0]) == 1 and len(calls[7]) == math.ceil(n_valid / 7) > 1 and max(calls[7]) == 7
    assert ranks[0].tolist() == ranks[1].tolist()


def test_scoring_batches_hold_similar_lengths_and_results_come_back_in_user_order(tiny_prepared):
    """Targets are batched by input length (a batch pads to its longest input), and the ranks and users come
    back in `eval_targets` order, with or without the sampled extra."""
    from recsys.ranking import RankingInputs, rank_targets

    data = SequenceData.from_prepared(tiny_prepared)
    n = tiny_prepared.n_items
    model = ScriptedScores(torch.arange(n + 1, dtype=torch.float32))
    inputs = RankingInputs(data, "valid", 6, batch_size=3)
    widths = [eb.batch.items.shape[1] for eb in inputs.batches]
    assert len(set(widths)) > 1 and widths == sorted(widths)  # lengths differ in the data; batches ascend
    targets = data.eval_targets("valid")
    assert inputs.users.tolist() == np.searchsorted(data.offsets, targets, side="right").tolist()
    expected = [MISS_RANK if int(data.items[t]) in seen_before(data, t) else
                1 + sum(1 for i in range(int(data.items[t]) + 1, n + 1) if i not in seen_before(data, t))
                for t in targets]
    assert inputs.ranks(model).tolist() == expected
    users, ranks, sampled = rank_targets(model, data, "valid", batch_size=3, sampled_negatives=5)
    assert users.tolist() == inputs.users.tolist() and ranks.tolist() == expected
    missed = ranks == MISS_RANK  # a repeat misses under both; the rest rank among 1 + 5 sampled items
    assert (sampled == MISS_RANK).tolist() == missed.tolist() and bool((sampled[~missed] <= 6).all())
