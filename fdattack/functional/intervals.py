"""95 % intervals for every kind of metric fdattack reports, computed the standard way for each kind.

* a success rate over independent trials (attack accuracy over targets, top-1 over inversions): the Wilson score
  interval (``scipy.stats.binomtest(...).proportion_ci(method="wilson")``), which stays inside [0, 1] and is not
  degenerate at 0 or 1 successes;
* a mean over items (SSIM per target, feature cosines and KNN distances per sample, gradient cosines per point): the
  percentile bootstrap of the mean (``scipy.stats.bootstrap``), resampling the items;
* any other statistic of items (the FID of inversions): the percentile bootstrap of the statistic (:func:`bootstrap_interval`);
* a mean over a handful of units (LDIA's distance over clients, a metric over seeds): Student's t interval of the mean
  (``scipy.stats.t.interval``), the spread of the units;
* membership metrics (TPR at a fixed FPR, AUC, balanced accuracy): a stratified percentile bootstrap that resamples
  each client's members and non-members apart (:func:`membership_bootstrap`).

Every interval is (low, high); (NaN, NaN) where there is too little to say (no trial, fewer than two items). The
bootstrap is seeded, so that a run's intervals are the same when it is scored again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

#: the confidence level of every interval fdattack reports
CONFIDENCE = 0.95
#: bootstrap resamples of an interval
BOOTSTRAP_RESAMPLES = 1000
#: suffixes of an interval's two keys beside its metric: ``attack/pli/accuracy_ci_low`` and ``_ci_high``
LOW, HIGH = "_ci_low", "_ci_high"
#: scores resampled at once by :func:`membership_bootstrap` (its memory: about 50 bytes a score)
_BOOTSTRAP_CELLS = 2_000_000

Interval = tuple[float, float]
NO_INTERVAL: Interval = (math.nan, math.nan)


def interval_keys(key: str, interval: Interval) -> dict[str, float]:
    """``{key_ci_low: low, key_ci_high: high}``."""
    return {key + LOW: float(interval[0]), key + HIGH: float(interval[1])}


def is_interval_key(key: str) -> bool:
    """Whether ``key`` is one end of another metric's interval."""
    return key.endswith((LOW, HIGH))


def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> Interval:
    """The Wilson score interval of a success rate ``successes / trials``."""
    if trials <= 0:
        return NO_INTERVAL
    result = stats.binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(result.low), float(result.high)


def bootstrap_mean_interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> Interval:
    """The percentile bootstrap interval of the mean of ``values`` (NaNs left out)."""
    data = np.asarray(values, dtype=np.float64).ravel()
    data = data[np.isfinite(data)]
    if len(data) < 2:
        return NO_INTERVAL
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    result = stats.bootstrap(
        (data,),
        np.mean,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def bootstrap_interval(
    items: int,
    statistic: Callable[[np.ndarray], float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """The percentile bootstrap interval of any ``statistic(indices)`` of ``items`` items resampled with replacement
    (for statistics that are not a plain mean, such as a Fréchet distance)."""
    if items < 2:
        return NO_INTERVAL
    rng = np.random.default_rng(seed)
    replicates = np.array([statistic(rng.integers(0, items, items)) for _ in range(resamples)], dtype=np.float64)
    replicates = replicates[np.isfinite(replicates)]
    if len(replicates) == 0:
        return NO_INTERVAL
    alpha = (1 - confidence) / 2
    return float(np.quantile(replicates, alpha)), float(np.quantile(replicates, 1 - alpha))


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval of the mean of ``values`` (NaNs left out): mean ± t_{n-1} · sd / sqrt(n)."""
    data = np.asarray(values, dtype=np.float64).ravel()
    data = data[np.isfinite(data)]
    if len(data) < 2:
        return NO_INTERVAL
    mean, sem = float(data.mean()), float(stats.sem(data))
    if sem == 0.0:
        return mean, mean
    low, high = stats.t.interval(confidence, len(data) - 1, loc=mean, scale=sem)
    return float(low), float(high)


# ------------------------------------------------------------------------------------------- membership
def membership_points(members: np.ndarray, non_members: np.ndarray, fpr_levels: Sequence[float]) -> np.ndarray:
    """[TPR at each FPR level, AUC, balanced accuracy] of each row of member and non-member scores, as
    :func:`fdattack.functional.membership_metrics.membership_metrics` computes them from the ROC over every distinct score.

    The ROC has a point after each run of equal scores, from the highest down. TPR at FPR ≤ a: the largest TPR of a
    point with at most floor(a · n₀) false positives (0 at none). AUC: the trapezoids under the points (ties count ½).
    Balanced accuracy: max over the points and (0, 0) of ½(TPR + 1 − FPR).

    Args:
        members: (B, n₁) scores; non_members: (B, n₀) scores; row b of each is one sample.

    Returns:
        (B, len(fpr_levels) + 2).
    """
    n1, n0 = members.shape[1], non_members.shape[1]
    scores = np.concatenate([members, non_members], axis=1)
    order = np.argsort(-scores, axis=1)
    sorted_scores = np.take_along_axis(scores, order, axis=1)
    member_first = order < n1
    tp, fp = np.cumsum(member_first, axis=1), np.cumsum(~member_first, axis=1)
    ends = np.concatenate([sorted_scores[:, 1:] != sorted_scores[:, :-1], np.ones((len(scores), 1), dtype=bool)], axis=1)  # ROC points
    columns = [np.where(ends & (fp <= math.floor(level * n0 + 1e-9)), tp, 0).max(axis=1) / n1 for level in fpr_levels]
    # the ROC point before each point: tp and fp never decrease, so a running max of the points' values carries them forward
    before = np.zeros_like(tp[:, :1])
    tp_before = np.maximum.accumulate(np.concatenate([before, np.where(ends, tp, 0)[:, :-1]], axis=1), axis=1)
    fp_before = np.maximum.accumulate(np.concatenate([before, np.where(ends, fp, 0)[:, :-1]], axis=1), axis=1)
    columns.append(np.where(ends, (fp - fp_before) * (tp + tp_before), 0).sum(axis=1) / (2 * n1 * n0))  # trapezoids
    columns.append(0.5 * (1 + np.where(ends, tp / n1 - fp / n0, 0.0).max(axis=1)))
    return np.stack(columns, axis=1)


def membership_bootstrap(
    per_client: Sequence[tuple[np.ndarray, np.ndarray]],
    fpr_levels: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> list[Interval]:
    """Percentile bootstrap intervals of the mean over clients of [TPR at each FPR level, AUC, balanced accuracy].

    Each replicate resamples every client's members and its non-members with replacement, apart (a stratified
    bootstrap: each client keeps its numbers of members and non-members), and averages the clients' metrics.

    Args:
        per_client: (member scores, non-member scores) of each client, both non-empty.
        fpr_levels: the FPR levels of the TPRs.

    Returns:
        One interval per metric, in the order above.
    """
    width = len(fpr_levels) + 2
    if not per_client:
        return [NO_INTERVAL] * width
    rng = np.random.default_rng(seed)
    replicates = np.zeros((resamples, width))
    for members, non_members in per_client:
        members, non_members = np.asarray(members, dtype=np.float64), np.asarray(non_members, dtype=np.float64)
        rows = max(1, _BOOTSTRAP_CELLS // (len(members) + len(non_members)))
        for start in range(0, resamples, rows):
            b = min(rows, resamples - start)
            replicates[start : start + b] += membership_points(
                members[rng.integers(0, len(members), (b, len(members)))],
                non_members[rng.integers(0, len(non_members), (b, len(non_members)))],
                fpr_levels,
            )
    replicates /= len(per_client)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(replicates, alpha, axis=0), np.quantile(replicates, 1 - alpha, axis=0)
    return [(float(lo), float(hi)) for lo, hi in zip(low, high)]
