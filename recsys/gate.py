"""The promotion gate: pure decision logic, no I/O.

A candidate is promoted only if, on the *same* evaluation set as its baseline (the champion, or MostPop
when there is no champion yet), its metric (test NDCG@10 by default) is higher by at least `min_delta`
and, when `significance` is on, a one-sided paired test over per-user values gives p < `alpha`.
Anything missing or NaN refuses. Every outcome carries a readable reason.

Paired test: a one-sided paired t-test on per-user differences (`scipy.stats.ttest_rel`,
alternative="greater"). Why not the Wilcoxon signed-rank test: the gate compares *mean* NDCG@10, and the
t-test tests exactly that mean difference, while Wilcoxon tests a pseudo-median and drops zero differences
— with per-user NDCG (mostly zeros, a few large values) it can call a candidate significantly better whose
mean is worse. With hundreds of users the sample mean of the differences is close to normal (CLT), which is
what the t-test needs; Smucker, Allan & Carterette (CIKM 2007) also found the t-test agrees with
randomisation tests on IR metrics where Wilcoxon and sign tests do not. Degenerate cases are handled
explicitly: all differences zero → p = 1 (no evidence); all differences equal and positive → p = 0 (every
user improved by the same amount, so the variance is zero and the t statistic is unbounded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from recsys.config import GateConfig

# Differences below this are floating-point noise (the same model's mean computed two ways), not a gain.
_EPS = 1e-12


@dataclass(frozen=True)
class Scores:
    """One model's result on one evaluation set."""

    metric_value: float | None
    eval_fingerprint: str | None
    # user_id -> the gate metric for that user; None when per-user values are unavailable.
    per_user: Mapping[str, float] | None = None


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reason: str
    candidate_metric: float | None = None
    baseline_metric: float | None = None
    delta: float | None = None
    p_value: float | None = None
    n_users: int | None = None


def load_statistics() -> None:
    """Import scipy's statistics (over a second on a small CPU). The registry calls this before it takes the
    promotion lock, never inside the transaction that holds it, and only when there is something to decide:
    replaying a recorded decision — every run with nothing new — never needs it."""
    import scipy.stats  # noqa: F401


def _finite(value: float | None) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def paired_pvalue(candidate: np.ndarray, baseline: np.ndarray) -> float:
    """One-sided p-value for mean(candidate - baseline) > 0 (paired t-test; see the module docstring)."""
    diff = np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if diff.size < 2:
        raise ValueError("a paired test needs at least 2 users")
    if np.all(np.abs(diff) <= _EPS):
        return 1.0
    if np.ptp(diff) <= _EPS:  # constant non-zero difference: zero variance
        return 0.0 if diff[0] > 0 else 1.0
    from scipy import stats  # loaded already (`load_statistics`) when the registry decides

    return float(stats.ttest_rel(candidate, baseline, alternative="greater").pvalue)


def _paired_arrays(
    candidate: Mapping[str, float], baseline: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray] | str:
    """Align per-user values by user id, or return why they cannot be paired."""
    if set(candidate) != set(baseline):
        only_c = len(set(candidate) - set(baseline))
        only_b = len(set(baseline) - set(candidate))
        return (
            f"per-user results cover different users ({only_c} only in the candidate, {only_b} only in "
            "the baseline)"
        )
    users = sorted(candidate)
    c = np.array([candidate[u] for u in users], dtype=np.float64)
    b = np.array([baseline[u] for u in users], dtype=np.float64)
    if not (np.isfinite(c).all() and np.isfinite(b).all()):
        return "per-user values contain NaN or infinite entries"
    return c, b


def decide(
    candidate: Scores,
    baseline: Scores | None,
    config: GateConfig,
    *,
    baseline_label: str = "the champion",
) -> GateDecision:
    """Decide whether `candidate` replaces `baseline`. Pure: same inputs, same decision."""
    metric = config.metric
    if not _finite(candidate.metric_value):
        return GateDecision(False, f"candidate {metric} is missing or NaN ({candidate.metric_value!r})")
    cand_value = float(candidate.metric_value)  # type: ignore[arg-type]
    if baseline is None:
        return GateDecision(False, f"no baseline to compare against ({baseline_label})", cand_value)
    if not candidate.eval_fingerprint:
        return GateDecision(False, "candidate has no evaluation-set fingerprint", cand_value)
    if baseline.eval_fingerprint != candidate.eval_fingerprint:
        return GateDecision(
            False,
            f"{baseline_label} was scored on a different evaluation set "
            f"({str(baseline.eval_fingerprint)[:12]} vs {candidate.eval_fingerprint[:12]})",
            cand_value,
        )
    if not _finite(baseline.metric_value):
        return GateDecision(
            False, f"{baseline_label}'s {metric} is missing or NaN ({baseline.metric_value!r})", cand_value
        )
    base_value = float(baseline.metric_value)  # type: ignore[arg-type]
    delta = cand_value - base_value

    p_value: float | None = None
    n_users: int | None = None
    pairing_problem: str | None = None
    if candidate.per_user is not None and baseline.per_user is not None:
        paired = _paired_arrays(candidate.per_user, baseline.per_user)
        if isinstance(paired, str):
            pairing_problem = paired
        else:
            n_users = int(paired[0].size)
            if n_users < 2:
                pairing_problem = f"only {n_users} paired user(s); a paired test needs at least 2"
            else:
                p_value = paired_pvalue(*paired)
    else:
        pairing_problem = "per-user values are missing"

    def result(promote: bool, reason: str) -> GateDecision:
        return GateDecision(promote, reason, cand_value, base_value, delta, p_value, n_users)

    comparison = f"{metric} {cand_value:.6f} vs {baseline_label} {base_value:.6f} (delta {delta:+.6f})"
    if delta <= _EPS:
        verb = "equal to" if abs(delta) <= _EPS else "worse than"
        return result(False, f"candidate is {verb} {baseline_label}: {comparison}")
    if delta < config.min_delta - _EPS:
        return result(False, f"improvement below min_delta {config.min_delta:g}: {comparison}")
    if config.significance:
        if pairing_problem is not None:
            return result(False, f"significance test impossible: {pairing_problem}; {comparison}")
        assert p_value is not None
        if not p_value < config.alpha:
            return result(
                False,
                f"improvement not significant: paired t-test p={p_value:.4g} >= alpha {config.alpha:g} "
                f"over {n_users} users; {comparison}",
            )
        return result(
            True, f"better than {baseline_label}: {comparison}, p={p_value:.4g} < {config.alpha:g}"
        )
    return result(True, f"better than {baseline_label}: {comparison} (significance test off)")
