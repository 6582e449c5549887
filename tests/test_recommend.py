"""The pipeline's closing line reports the champion's NDCG@10 as the gate measured it on the current test set."""

from __future__ import annotations

from recsys.recommend import gate_metric

PROMOTED = {"promoted": True, "version": 3, "candidate_metric": 0.21, "baseline_kind": "champion",
            "baseline_version": 2, "baseline_metric": 0.18, "metric": "ndcg@10"}
REFUSED = {"promoted": False, "version": 4, "candidate_metric": 0.17, "baseline_kind": "champion",
           "baseline_version": 3, "baseline_metric": 0.205, "metric": "ndcg@10"}


def test_a_just_promoted_champion_reports_its_own_gate_value():
    assert gate_metric(PROMOTED, champion_version=3) == 0.21


def test_a_defended_champion_reports_its_re_scored_value_not_the_stored_one():
    assert gate_metric(REFUSED, champion_version=3) == 0.205


def test_no_gate_value_when_the_decision_is_about_another_champion_or_absent():
    assert gate_metric(REFUSED, champion_version=2) is None
    assert gate_metric({**REFUSED, "baseline_kind": "mostpop", "baseline_version": None}, 3) is None
    assert gate_metric(None, 3) is None
