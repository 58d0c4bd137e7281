"""The 95 % intervals of membership metrics (Shi et al., PoPETs 2025, §4.1.4): a bootstrap of the candidates, the independent units.

Each target client is scored on its members and on as many label-matched non-members drawn with replacement from the
test candidates (the authors' protocol), so one test candidate can be drawn twice for a client and for several clients. A replicate
resamples each client's members apart and the test candidates once for all clients, within each label (scipy's
``bootstrap`` resamples each sample it is given apart: a stratified bootstrap); a non-member draw of a candidate drawn
k times in the replicate weighs k. Resampling each client's draws as if they were distinct and the clients as if
they shared none would take repeated and shared candidates for independent ones and make the interval too narrow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fdattack.statistics.intervals import BOOTSTRAP_RESAMPLES, CONFIDENCE, NO_INTERVAL, Interval, scipy_bootstrap


@dataclass(frozen=True)
class ClientScores:
    """One target client's evaluation set.

    Attributes:
        members: (n₁,) scores of its members.
        non_members: (n₀,) scores of its non-member draws.
        non_member_ids: (n₀,) the candidate each draw is (an id repeats where it was drawn twice).
    """

    members: np.ndarray
    non_members: np.ndarray
    non_member_ids: np.ndarray


def membership_points(
    members: np.ndarray, non_members: np.ndarray, fpr_levels: Sequence[float], non_member_weights: np.ndarray | None = None
) -> np.ndarray:
    """[TPR at each FPR level, AUC, balanced accuracy] of each row of member and non-member scores, as
    :func:`fdattack.functional.membership_metrics.membership_metrics` computes them from the ROC over every distinct score.

    The ROC has a point after each run of equal scores, from the highest down. TPR at FPR ≤ a: the largest TPR of a
    point with at most floor(a · n₀) false positives (0 at none). AUC: the trapezoids under the points (ties count ½).
    Balanced accuracy: max over the points and (0, 0) of ½(TPR + 1 − FPR). A non-member of weight k counts as k
    non-members of its score (n₀ the total weight); a row of total weight 0 is NaN.

    Args:
        members: (B, n₁) scores; non_members: (B, n₀) or (n₀,) scores; row b of each is one sample.
        non_member_weights: (B, n₀) non-negative whole weights, or None (all 1).

    Returns:
        (B, len(fpr_levels) + 2).
    """
    rows, n1 = members.shape
    n0 = non_members.shape[-1]
    weights = np.ones((rows, n0)) if non_member_weights is None else np.broadcast_to(non_member_weights, (rows, n0)).astype(np.float64)
    negatives = weights.sum(axis=1, keepdims=True)
    scores = np.concatenate([members, np.broadcast_to(non_members, (rows, n0))], axis=1)
    order = np.argsort(-scores, axis=1)
    sorted_scores = np.take_along_axis(scores, order, axis=1)
    tp = np.cumsum(order < n1, axis=1)
    fp = np.cumsum(np.take_along_axis(np.concatenate([np.zeros((rows, n1)), weights], axis=1), order, axis=1), axis=1)
    ends = np.concatenate([sorted_scores[:, 1:] != sorted_scores[:, :-1], np.ones((rows, 1), dtype=bool)], axis=1)  # ROC points
    with np.errstate(divide="ignore", invalid="ignore"):
        columns = [np.where(ends & (fp <= np.floor(level * negatives + 1e-9)), tp, 0).max(axis=1) / n1 for level in fpr_levels]
        # the ROC point before each point: tp and fp never decrease, so a running max of the points' values carries them forward
        tp_before = np.maximum.accumulate(np.concatenate([np.zeros((rows, 1)), np.where(ends, tp, 0)[:, :-1]], axis=1), axis=1)
        fp_before = np.maximum.accumulate(np.concatenate([np.zeros((rows, 1)), np.where(ends, fp, 0)[:, :-1]], axis=1), axis=1)
        columns.append(np.where(ends, (fp - fp_before) * (tp + tp_before), 0).sum(axis=1) / (2 * n1 * negatives[:, 0]))  # trapezoids
        columns.append(0.5 * (1 + np.where(ends, tp / n1 - fp / negatives, 0.0).max(axis=1)))
    points = np.stack(columns, axis=1)
    points[negatives[:, 0] == 0] = math.nan
    return points


def membership_bootstrap(
    clients: Sequence[ClientScores],
    strata: Sequence[np.ndarray],
    fpr_levels: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> list[Interval]:
    """Percentile bootstrap intervals (``scipy.stats.bootstrap``) of the mean over clients of [TPR at each FPR level,
    AUC, balanced accuracy] (:func:`membership_points`).

    A replicate resamples each client's members and each stratum of test candidates with replacement, apart (each
    keeps its size; one of a single element is the same in every replicate); a client's non-member draw of candidate
    i weighs the number of times i is in the replicate. At most :data:`BOOTSTRAP_CELLS` resampled values are held at
    once, so memory does not grow with ``resamples``.

    Args:
        clients: the evaluation set of each client (members and non-members non-empty).
        strata: the test candidates' ids, one array per label; every ``non_member_ids`` is in one of them.
        fpr_levels: the FPR levels of the TPRs.

    Returns:
        One interval per metric, in the order above; (NaN, NaN) where a replicate leaves a client with no non-member
        (a handful of draws) or nothing can be resampled.
    """
    width = len(fpr_levels) + 2
    if not clients:
        return [NO_INTERVAL] * width
    ids = np.concatenate([np.asarray(s) for s in strata])
    if len(np.unique(ids)) != len(ids):
        raise ValueError("a candidate id is in two strata or twice in one")
    order = np.argsort(ids)
    positions = []
    for client in clients:
        at = np.searchsorted(ids[order], client.non_member_ids).clip(max=len(ids) - 1)
        if not np.array_equal(ids[order][at], client.non_member_ids):
            raise ValueError("every non-member id must be in a stratum")
        positions.append(order[at])
    bounds = np.cumsum([0, *(len(s) for s in strata)])
    samples = [np.asarray(c.members, dtype=np.float64) for c in clients] + [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    moving = [i for i, s in enumerate(samples) if len(s) >= 2]
    if not moving:
        return [NO_INTERVAL] * width

    def statistic(*resampled: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = resampled[0].shape[0]
        full = [np.broadcast_to(s, (rows, len(s))) for s in samples]
        for i, r in zip(moving, resampled):
            full[i] = r
        drawn = np.concatenate(full[len(clients) :], axis=1)  # (rows, U): the candidates of each replicate
        counts = np.bincount((np.arange(rows)[:, None] * len(ids) + drawn).ravel(), minlength=rows * len(ids)).reshape(rows, len(ids))
        total = sum(membership_points(full[k], c.non_members, fpr_levels, counts[:, positions[k]]) for k, c in enumerate(clients))
        return (total / len(clients)).T

    cells = len(ids) + sum(len(c.members) + len(c.non_members) for c in clients)
    result = scipy_bootstrap([samples[i] for i in moving], statistic, cells, resamples, confidence, seed, vectorized=True)
    return [(float(lo), float(hi)) for lo, hi in zip(result.confidence_interval.low, result.confidence_interval.high)]
