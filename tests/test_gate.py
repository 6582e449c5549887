"""The promotion gate's decision logic and its paired test (pure functions, no database)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from recsys.config import GateConfig
from recsys.gate import Scores, decide, paired_pvalue

FP = "f" * 64
USERS = [f"u{i}" for i in range(60)]


def scores(values: np.ndarray | list[float], fp: str = FP, metric: float | None = None) -> Scores:
    values = np.asarray(values, dtype=float)
    return Scores(
        float(values.mean()) if metric is None else metric, fp, dict(zip(USERS[: len(values)], values))
    )


BASE = np.random.default_rng(0).uniform(0.0, 0.5, 60)
NOISE = np.random.default_rng(1).normal(0.0, 0.01, 60)


def test_clear_improvement_is_promoted_with_its_p_value():
    out = decide(scores(BASE + 0.05 + NOISE), scores(BASE), GateConfig())
    assert out.promote
    assert out.delta == pytest.approx(0.05 + NOISE.mean())
    assert out.p_value is not None and out.p_value < 1e-6
    assert out.n_users == 60
    assert "better than the champion" in out.reason


def test_lower_is_refused():
    out = decide(scores(BASE - 0.05 + NOISE), scores(BASE), GateConfig(significance=False))
    assert not out.promote
    assert "worse than" in out.reason
    assert out.delta < 0


def test_equal_is_refused_even_without_significance():
    out = decide(scores(BASE), scores(BASE), GateConfig(significance=False, min_delta=0.0))
    assert not out.promote
    assert "equal to" in out.reason
    assert out.p_value == 1.0  # all paired differences are zero: no evidence at all


def test_min_delta_is_required():
    small = scores(BASE + 0.004)
    assert not decide(small, scores(BASE), GateConfig(min_delta=0.01, significance=False)).promote
    assert "min_delta" in decide(small, scores(BASE), GateConfig(min_delta=0.01, significance=False)).reason
    assert decide(small, scores(BASE), GateConfig(min_delta=0.003, significance=False)).promote


def test_significance_on_refuses_a_noisy_gain_that_significance_off_accepts():
    rng = np.random.default_rng(7)
    noisy = BASE + 0.002 + rng.normal(0.0, 0.1, 60)  # tiny mean gain, large per-user noise
    noisy = noisy - noisy.mean() + BASE.mean() + 0.002
    on = decide(scores(noisy), scores(BASE), GateConfig(significance=True, alpha=0.05))
    off = decide(scores(noisy), scores(BASE), GateConfig(significance=False))
    assert not on.promote and "not significant" in on.reason and on.p_value > 0.05
    assert off.promote and "significance test off" in off.reason


@pytest.mark.parametrize("bad", [float("nan"), None, float("inf")])
def test_nan_or_missing_candidate_metric_never_promotes(bad):
    out = decide(Scores(bad, FP, None), scores(BASE), GateConfig(significance=False))
    assert not out.promote
    assert "missing or NaN" in out.reason


def test_nan_baseline_metric_never_promotes():
    out = decide(scores(BASE + 0.1), Scores(float("nan"), FP, None), GateConfig(significance=False))
    assert not out.promote and "missing or NaN" in out.reason


def test_nan_per_user_value_refuses_under_significance():
    values = BASE + 0.1
    values[3] = np.nan
    cand = Scores(0.5, FP, dict(zip(USERS, values)))
    out = decide(cand, scores(BASE), GateConfig())
    assert not out.promote and "NaN" in out.reason


def test_no_baseline_refuses():
    out = decide(scores(BASE), None, GateConfig(), baseline_label="MostPop")
    assert not out.promote and "no baseline" in out.reason


def test_different_evaluation_sets_are_never_compared():
    out = decide(scores(BASE + 0.1), scores(BASE, fp="e" * 64), GateConfig(significance=False))
    assert not out.promote and "different evaluation set" in out.reason


def test_missing_candidate_fingerprint_refuses():
    out = decide(Scores(0.9, None, None), scores(BASE), GateConfig(significance=False))
    assert not out.promote and "fingerprint" in out.reason


def test_missing_per_user_values_refuse_only_when_significance_is_on():
    cand = Scores(float(BASE.mean()) + 0.1, FP, None)
    assert not decide(cand, scores(BASE), GateConfig(significance=True)).promote
    assert "per-user values are missing" in decide(cand, scores(BASE), GateConfig()).reason
    assert decide(cand, scores(BASE), GateConfig(significance=False)).promote


def test_per_user_sets_must_match():
    cand = scores(BASE[:50] + 0.1)
    out = decide(cand, scores(BASE), GateConfig())
    assert not out.promote and "different users" in out.reason


def test_paired_pvalue_matches_a_one_sided_paired_t_test():
    cand = BASE + 0.01 + NOISE
    expected = stats.ttest_rel(cand, BASE, alternative="greater").pvalue
    assert paired_pvalue(cand, BASE) == pytest.approx(expected)
    # One-sided: a candidate that is worse is nowhere near significant.
    assert paired_pvalue(BASE - 0.01 + NOISE, BASE) > 0.5


def test_paired_pvalue_degenerate_differences():
    assert paired_pvalue(BASE, BASE) == 1.0  # all zero: no evidence
    assert paired_pvalue(BASE + 0.01, BASE) == 0.0  # every user better by the same amount
    assert paired_pvalue(BASE - 0.01, BASE) == 1.0
    with pytest.raises(ValueError):
        paired_pvalue(np.array([0.1]), np.array([0.0]))


def test_mean_drop_is_never_significant_even_when_most_users_improve():
    # Most users gain a little, a few lose a lot: the mean (what the gate compares) drops. A rank test
    # on the median would call this an improvement; the gate must not.
    base = np.full(60, 0.5)
    cand = base + 0.01
    cand[:6] = 0.0
    assert cand.mean() < base.mean()
    out = decide(scores(cand), scores(base), GateConfig())
    assert not out.promote and "worse than" in out.reason
    assert stats.wilcoxon(cand - base, alternative="greater").pvalue < 0.05  # what Wilcoxon would say
    assert out.p_value is not None and out.p_value > 0.5


def test_decision_carries_both_metrics():
    out = decide(scores(BASE + 0.05 + NOISE), scores(BASE), GateConfig())
    assert math.isclose(out.baseline_metric, float(BASE.mean()))
    assert math.isclose(out.candidate_metric, float((BASE + 0.05 + NOISE).mean()))
