"""`evaluate.mask_seen: false`, for data where people come back to items: validation, the test and serving
rank every item, a repeated target among them; one rule for the three, recorded in the checkpoint, part of
the evaluation fingerprint and of the resume key."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from test_evaluate import ScriptedScores, seen_before

from recsys.config import ConfigError, EvaluateConfig, load_params
from recsys.evaluate import eval_fingerprint, evaluate_model
from recsys.layout import VALID_COLUMN
from recsys.ranking import MISS_RANK
from recsys.recommend import recommend
from recsys.sequences import SequenceData

ALL_ITEMS = EvaluateConfig(mask_seen=False)


def test_every_item_is_ranked_and_a_repeated_target_among_them(tiny_prepared):
    """Score = item id: under the default a repeat is a miss and the seen items are no competitors; with
    mask_seen false the rank is 1 + #items with a larger id, seen or not."""
    n = tiny_prepared.n_items
    model = ScriptedScores(torch.arange(n + 1, dtype=torch.float32))
    data = SequenceData.from_prepared(tiny_prepared)
    targets = data.eval_targets("test")
    masked = evaluate_model(model, tiny_prepared, "test").per_user["rank"].tolist()
    every = evaluate_model(model, tiny_prepared, "test", ALL_ITEMS).per_user["rank"].tolist()
    assert every == [1 + n - int(data.items[t]) for t in targets]
    repeats = [i for i, t in enumerate(targets) if int(data.items[t]) in seen_before(data, t)]
    assert repeats and all(masked[i] == MISS_RANK and every[i] <= n for i in repeats)
    fresh = [i for i in range(len(targets)) if i not in repeats]
    assert all(every[i] >= masked[i] for i in fresh)  # a fresh target has the seen items back as competitors
    assert any(every[i] > masked[i] for i in fresh)


def test_the_rule_is_part_of_the_evaluation_fingerprint(tiny_prepared):
    """The gate compares figures only under one fingerprint: a champion scored under the other rule is
    re-scored. The default's fingerprint is the one stored before the key (no re-scoring on upgrade)."""
    model = ScriptedScores(torch.zeros(tiny_prepared.n_items + 1))
    default = evaluate_model(model, tiny_prepared, "test").eval_fingerprint
    assert default == eval_fingerprint(tiny_prepared, "test")
    assert evaluate_model(model, tiny_prepared, "test", ALL_ITEMS).eval_fingerprint != default


def test_validation_follows_the_rule_and_the_checkpoint_records_it(tiny_prepared, tiny_sasrec_config,
                                                                   fast_train_config, tmp_path):
    """The trainer selects its epoch under the test's rule; a state saved under the other rule is another run
    (not resumed into this one); the checkpoint says which rule it serves by."""
    from recsys.train import train_model

    curves = {}
    for mask_seen in (True, False):
        out = tmp_path / f"mask_seen_{mask_seen}"
        train_model("sasrec", tiny_sasrec_config, fast_train_config, tiny_prepared, out / "model",
                    curve_path=out / "curve.csv", resume_root=tmp_path / "resume", mask_seen=mask_seen)
        assert json.loads((out / "model" / "model.json").read_text())["mask_seen"] is mask_seen
        with (out / "curve.csv").open() as f:
            curves[mask_seen] = list(csv.DictReader(f))
    # Same seed, same steps: the losses agree (the second run trained, rather than resuming the first's
    # state) and validation differs by the rule alone.
    assert [r["loss"] for r in curves[True]] == [r["loss"] for r in curves[False]]
    assert [r[VALID_COLUMN] for r in curves[True]] != [r[VALID_COLUMN] for r in curves[False]]


def test_serving_follows_the_rule_its_checkpoint_was_trained_under():
    """A history's items come back only from a checkpoint trained under mask_seen false; one saved before the
    key (no `mask_seen` in its meta) masks them, as it was gated."""
    model = ScriptedScores(torch.tensor([0.0, 5.0, 4.0, 3.0, 2.0]))
    history = [1, 3]
    before_the_key = recommend(model, {"n_items": 4}, history, 4, at_time=0)
    assert [i for i, _ in before_the_key] == [2, 4]
    assert recommend(model, {"n_items": 4, "mask_seen": True}, history, 4, at_time=0) == before_the_key
    assert [i for i, _ in recommend(model, {"n_items": 4, "mask_seen": False}, history, 4, at_time=0)] \
        == [1, 2, 3, 4]


def test_the_setting_is_read_strictly(write_params):
    assert load_params(write_params({"evaluate": {"mask_seen": False}})).evaluate.mask_seen is False
    assert load_params(write_params()).evaluate.mask_seen is True  # params.yaml's, PROTOCOL.md's rule
    with pytest.raises(ConfigError, match="mask_seen"):
        load_params(write_params({"evaluate": {"mask_seen": "no"}}))


def test_the_train_stage_reruns_when_the_rule_changes(repo_root):
    """dvc.yaml's train stages depend on evaluate.mask_seen (validation ranks under it), not on the rest of
    `evaluate` (the cut-offs do not change which epoch is best)."""
    import yaml

    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert "evaluate.mask_seen" in stages["train"]["do"]["params"]
    assert "evaluate" not in stages["train"]["do"]["params"]
    assert np.isin(["evaluate"], stages["evaluate"]["do"]["params"]).all()


def test_a_resume_state_saved_under_the_other_rule_is_another_run(tiny_sasrec_config, fast_train_config):
    """Validation under the other rule selects other epochs: its saved state must not be resumed. The
    default's key is the one saved before the setting existed (those states still resume)."""
    from recsys.train_state import run_key

    key = run_key("sasrec", tiny_sasrec_config, fast_train_config, "data-fingerprint")
    assert run_key("sasrec", tiny_sasrec_config, fast_train_config, "data-fingerprint", None, True) == key
    assert run_key("sasrec", tiny_sasrec_config, fast_train_config, "data-fingerprint", None, False) != key
