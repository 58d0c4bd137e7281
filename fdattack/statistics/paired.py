"""Comparing two settings measured on the same seeds, and a family of such comparisons.

Two settings run on the same seeds share each seed's split, initialisation and data order, so their per-seed values
are paired: the difference is tested on the per-seed differences d_s = a_s − b_s (Student's paired t: the t interval
of their mean and the one-sample t test of mean 0, ``scipy.stats.ttest_1samp``), not by whether the two settings'
intervals overlap (for two independent means of equal standard errors, non-overlap of their 95 % intervals is a test
at about the 0.6 % level, and it ignores the pairing). A page that claims which of m differences survive controls the
chance of any false claim among them with Holm's step-down correction (Holm, Scand. J. Statist. 1979): with the
p-values sorted p₍₁₎ ≤ … ≤ p₍ₘ₎, reject H₍ᵢ₎ while p₍ⱼ₎ ≤ α / (m − j + 1) for every j ≤ i.
(``scipy.stats.false_discovery_control`` controls the false discovery rate, Benjamini-Hochberg, a weaker promise;
scipy has no Holm.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from fdattack.statistics.intervals import CONFIDENCE, standard_error, t_interval


@dataclass(frozen=True)
class Difference:
    """The paired difference a − b over the seeds both settings recorded.

    Attributes:
        mean: the mean of the per-seed differences.
        low, high: its Student-t interval (``confidence``, 95 % by default).
        p_value: two-sided p-value of the one-sample t test of mean difference 0 (its standard error floored by the
            runs' own spread where given); NaN where there is no spread to scale by or fewer than two seeds are paired.
        n: the number of paired seeds.
        standard_error: the standard error of ``mean`` (:func:`~fdattack.statistics.intervals.standard_error`); 0
            where there is no spread to scale by or fewer than two seeds are paired.
    """

    mean: float
    low: float
    high: float
    p_value: float
    n: int
    standard_error: float = 0.0


def paired_difference(
    a_per_seed: Sequence[float] | np.ndarray,
    b_per_seed: Sequence[float] | np.ndarray,
    confidence: float = CONFIDENCE,
    within: Sequence[float] | np.ndarray | None = None,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Difference:
    """The difference a − b of two settings' values on the same seeds (position s of each is seed s); a seed where
    either value is NaN is left out of both. ``within``: each seed's within-run variance of its difference (a's plus
    b's), the floor under the seeds' spread (:func:`~fdattack.statistics.intervals.standard_error`): with it, a
    difference that is the same at every seed has a test too, scaled by the runs' own spread. ``bounds``: the range of
    the metric itself; the interval is cut to where the mean difference can lie (a − b̄ for a in the range)."""
    a, b = np.asarray(a_per_seed, dtype=np.float64), np.asarray(b_per_seed, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need one value per seed on each side, got shapes {a.shape} and {b.shape}")
    kept = np.isfinite(a) & np.isfinite(b)
    d = (a - b)[kept]
    w = np.full(len(d), math.nan) if within is None else np.asarray(within, dtype=np.float64)[kept]
    if len(d) and _constant(d):
        d = np.full(len(d), float(d.mean()))  # one difference up to rounding: no spread between the seeds
    mean = float(d.mean()) if len(d) else math.nan
    reference = float(b[kept].mean()) if len(d) else 0.0
    low, high = t_interval(d, confidence, within=w, bounds=(bounds[0] - reference, bounds[1] - reference))
    se = standard_error(d, w) if len(d) >= 2 else 0.0
    p_value = float(2 * stats.t.sf(abs(mean) / se, len(d) - 1)) if se > 0 else math.nan
    return Difference(mean, low, high, p_value, len(d), se)


def _constant(d: np.ndarray) -> bool:
    """Whether the differences are one value up to floating-point rounding (0.6 − 0.8 and 0.2 − 0.4 differ in the 17th
    digit): their spread is then rounding error, and a t test scaled by it would call any such difference certain."""
    return float(np.ptp(d)) <= 1e-9 * max(1.0, float(np.abs(d).max()))


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values: p̃₍ᵢ₎ = max over j ≤ i of min(1, (m − j + 1) p₍ⱼ₎), in the input order; a NaN p-value
    counts in m, stays NaN and is never rejected."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    order = np.argsort(np.where(np.isnan(p), np.inf, p), kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.fmax.accumulate(scaled)  # NaNs at the end of the order: fmax skips them
    adjusted[np.isnan(p)] = math.nan
    return [float(v) for v in adjusted]


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Which of the hypotheses behind ``p_values`` Holm's step-down procedure rejects at family-wise level ``alpha``."""
    return [bool(v <= alpha) for v in holm_adjusted(p_values)]
