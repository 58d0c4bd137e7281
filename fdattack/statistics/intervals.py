"""95 % intervals of the metrics fdattack reports, each resampling or averaging the independent unit, on a scale that
keeps it inside the metric's range (docs/intervals.md has the table of metric -> method -> unit).

* The mean of a handful of independent units (seeds, targets, clients, probe points): :func:`mean_interval`, on the
  scale of the metric's kind (:func:`~fdattack.statistics.kinds.metric_kind`):

  - ``rate`` (in [0, 1]): :func:`rate_interval`, the Wilson interval with the effective number of trials
    n* = p̄(1 − p̄) / se² and Student's t quantile (Korn & Graubard, Survey Methodology 1998; Dean & Pagano, J. Survey
    Stat. Methodol. 2015, §2), n* at most the trials behind the units: inside [0, 1] at every p̄;
  - ``positive`` (≥ 0): :func:`positive_interval`, Student's t cut at 0 joined with the modified Cox interval of a
    log-normal mean (Olsson, J. Stat. Educ. 2005, Eq. 6) while the values are not spread over decades;
  - ``signed``: :func:`t_interval`, Student's t, cut to [−1, 1] for an SSIM or a cosine.

  Across seeds, each seed's own within-run interval (over its targets, images, clients, candidates) floors the
  standard error (:func:`standard_error`): three seeds that agree keep the spread each one measured.
* A success rate of independent 0/1 trials (attack accuracy over targets, a classifier's test accuracy):
  :func:`wilson_interval`.
* A positive statistic that is not a mean of units (the FID of inversions): :func:`positive_bootstrap_interval`, from
  the standard error of ``scipy.stats.bootstrap``'s replicates (each stratum resampled apart) on the log scale.
* Membership metrics: :mod:`fdattack.statistics.membership_bootstrap` (the percentile bootstrap of the candidates).

Every interval is (low, high): (v, v) only where all units agree and none has a spread of its own (a constant, such
as chance), (NaN, NaN) where there is too little to say (fewer than two units). Bootstraps are seeded, so a run scored
again has the same intervals. ``tests/test_coverage.py`` measures each interval's coverage by simulation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

from fdattack.statistics.kinds import MetricKind, metric_kind, metric_range

#: the confidence level of every interval fdattack reports
CONFIDENCE = 0.95
#: bootstrap resamples of a percentile interval
BOOTSTRAP_RESAMPLES = 1000
#: bootstrap resamples of a standard error (Efron & Tibshirani, An Introduction to the Bootstrap, 1993, §6.4: 200 are
#: plenty for a standard error, where a percentile needs 1,000 or more)
STANDARD_ERROR_RESAMPLES = 200
#: the most bootstrap resamples ``evaluation.bootstrap_resamples`` allows (the replicates alone: 48 bytes each for the
#: six membership metrics); the percentile ends' Monte-Carlo error at 1,000 is already small beside the interval's width
BOOTSTRAP_RESAMPLES_MAX = 100_000
#: resampled values held at once by a bootstrap (its memory: a few hundred MB at most, whatever the resamples)
BOOTSTRAP_CELLS = 2_000_000
#: suffixes of an interval's two keys beside its metric: ``attack/pli/accuracy_ci_low`` and ``_ci_high``
LOW, HIGH = "_ci_low", "_ci_high"
#: suffix of a rate's count of independent trials beside it: ``attack/pli/accuracy_trials`` (its targets)
TRIALS = "_trials"
#: suffix of the count of units a mean's interval is over (Student's t with units − 1 degrees of freedom): ``attack/ldia/kl_units``
UNITS = "_units"

Interval = tuple[float, float]
NO_INTERVAL: Interval = (math.nan, math.nan)


def interval_keys(key: str, interval: Interval, units: int | None = None) -> dict[str, float]:
    """``{key_ci_low: low, key_ci_high: high}``, and ``key_units`` where the interval is a mean's over ``units`` units
    read at Student's quantile (so its width can be read back as a standard error: :func:`within_variance`)."""
    keys = {key + LOW: float(interval[0]), key + HIGH: float(interval[1])}
    return keys if units is None else {**keys, key + UNITS: float(units)}


def is_interval_key(key: str) -> bool:
    """Whether ``key`` belongs beside another metric: one end of its interval, or its count of trials."""
    return key.endswith((LOW, HIGH, TRIALS, UNITS))


def _t_quantile(units: int, confidence: float) -> float:
    return float(stats.t.ppf((1 + confidence) / 2, units - 1))


# ----------------------------------------------------------------------------------------------- closed forms
def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> Interval:
    """The Wilson score interval of a success rate ``successes / trials`` of independent trials."""
    if trials <= 0:
        return NO_INTERVAL
    result = stats.binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(result.low), float(result.high)


def wilson_interval_of_rate(rate: float, trials: int, confidence: float = CONFIDENCE) -> Interval:
    """:func:`wilson_interval` of a rate measured over ``trials`` trials (successes: round(rate · trials)); (NaN, NaN)
    for a NaN rate."""
    return wilson_interval(round(rate * trials), trials, confidence) if math.isfinite(rate) else NO_INTERVAL


def within_variance(low: float | None, high: float | None, confidence: float = CONFIDENCE, units: float | None = None) -> float:
    """The squared standard error that a run's own 95 % interval [low, high] implies: ((high − low) / 2q)², q the normal
    quantile, or Student's with ``units`` − 1 degrees of freedom for a mean's interval over that many units (read at
    the normal quantile, an interval over 2 clients would claim 42 times its variance); an asymmetric interval,
    Wilson's at 0 hits, counts by its width; NaN where an end is missing."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return math.nan
    q = (
        _t_quantile(int(units), confidence)
        if units is not None and math.isfinite(units) and units >= 2
        else stats.norm.ppf((1 + confidence) / 2)
    )
    return ((high - low) / (2 * float(q))) ** 2


def _aligned(values: Sequence[float] | np.ndarray, within: Sequence[float] | np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The finite values and, position by position, their within-run variances (NaN where none was given)."""
    data = np.asarray(values, dtype=np.float64).ravel()
    variances = np.full(len(data), math.nan) if within is None else np.asarray(within, dtype=np.float64).ravel()
    if len(variances) != len(data):
        raise ValueError(f"one within-run variance per value: {len(variances)} for {len(data)} values")
    kept = np.isfinite(data)
    return data[kept], variances[kept]


def standard_error(data: np.ndarray, within: np.ndarray) -> float:
    """The standard error of the mean of ``data`` over its n independent units (seeds), using the evidence inside each
    unit too: sqrt(max(s² / n, mean(w) / n)), s² the units' sample variance and w each unit's own within-run variance
    (its targets, images, candidates; NaN where unknown). The variance of a unit's value is the spread between units
    plus its own sampling error, so mean(w) is a floor under s²: where the units agree by chance (three seeds at 0.68),
    the interval keeps the within-run spread instead of collapsing to a point."""
    n = len(data)
    between = float(data.var(ddof=1)) / n if n >= 2 else 0.0
    known = within[np.isfinite(within)]
    floor = float(known.mean()) / n if len(known) else 0.0
    return math.sqrt(max(between, floor))


def t_interval(
    values: Sequence[float] | np.ndarray,
    confidence: float = CONFIDENCE,
    within: Sequence[float] | np.ndarray | None = None,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Interval:
    """Student's t interval of the mean of ``values`` (NaNs left out): mean ± t_{n-1} · se, se of
    :func:`standard_error` (the plain sd / sqrt(n) without ``within``), cut to the range ``bounds`` the mean cannot
    leave (an SSIM's [−1, 1]; cutting loses no coverage)."""
    data, variances = _aligned(values, within)
    if len(data) < 2:
        return NO_INTERVAL
    mean, se = float(data.mean()), standard_error(data, variances)
    if se == 0.0:
        return mean, mean
    half = _t_quantile(len(data), confidence) * se
    return max(bounds[0], mean - half), min(bounds[1], mean + half)


def _wilson(p: float, trials: float, z: float) -> Interval:
    """Wilson's interval of a rate p over (effective) ``trials`` with quantile z, inside [0, 1]."""
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return (0.0 if p == 0 else max(0.0, centre - half)), (1.0 if p == 1 else min(1.0, centre + half))  # exact ends at 0 and 1


def rate_interval(
    values: Sequence[float] | np.ndarray,
    confidence: float = CONFIDENCE,
    trials: Sequence[float] | np.ndarray | None = None,
    within: Sequence[float] | np.ndarray | None = None,
) -> Interval:
    """The interval of the mean p̄ of rates in [0, 1] over n units (NaNs left out): Wilson's with the effective number of
    trials and Student's t quantile (Korn & Graubard, Survey Methodology 1998; Dean & Pagano, J. Survey Stat.
    Methodol. 2015, §2).

    n* = p̄(1 − p̄) / se², se of :func:`standard_error` (the spread between the units, floored by their ``within``-run
    variances), z = t_{n-1}: (p̄ + z²/2n* ± z · sqrt(p̄(1 − p̄)/n* + z²/4n*²)) / (1 + z²/n*). Where each unit's rate
    counts independent ``trials`` (a seed's 20 targets), n* is at most their total N: the units cannot know more than
    all their trials together (a design effect of at least 1), so at p̄ = 0 or 1, or where the units agree, the interval
    is Wilson's over N trials, never a point. Without trials a p̄ of 0 or 1 takes the t interval of the within-run
    floor, cut to [0, 1], and units that agree with no within-run spread give (p̄, p̄) (a constant such as chance).

    Raises:
        ValueError: a value outside [0, 1].
    """
    data, variances = _aligned(values, within)
    if np.any((data < 0) | (data > 1)):
        raise ValueError(f"rates must lie in [0, 1], got {data.min():g} .. {data.max():g}")
    if len(data) < 2:
        return NO_INTERVAL
    _, counts = _aligned(values, trials)
    total = float(counts.sum()) if np.all(np.isfinite(counts) & (counts > 0)) else math.nan  # every unit's, or none
    p, se = float(data.mean()), standard_error(data, variances)
    z = _t_quantile(len(data), confidence)
    spread = p * (1 - p)
    if math.isfinite(total):
        effective = total if se == 0.0 or spread == 0.0 else min(total, spread / se**2)
        return _wilson(p, effective, z)
    if se == 0.0:
        return p, p
    if spread == 0.0:
        return max(0.0, p - z * se), min(1.0, p + z * se)
    return _wilson(p, spread / se**2, z)


#: log-scale spreads (the sample sd of log x) up to which a positive mean takes the hull of the modified Cox and the
#: t interval, and from which it takes the t interval alone; linear in between
COX_FULL, COX_NONE = 1.0, 2.0


def positive_interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE, within: Sequence[float] | np.ndarray | None = None
) -> Interval:
    """The interval of the mean of non-negative ``values`` (NaNs left out), inside [0, ∞).

    Two intervals of the arithmetic mean: Student's t cut at 0 (:func:`t_interval`, floored by ``within``), and the
    modified Cox interval of a log-normal mean (Olsson, J. Stat. Educ. 2005, Eq. 6: with y = log x, ȳ and s² their mean
    and variance, exp(ȳ + s²/2 ± t_{n-1} · sqrt(s²/n + s⁴/(2(n − 1))))), which keeps its coverage where the values are
    skewed (a log-normal spread of s = 1 at 3 seeds: 0.93, where t covers 0.84). The interval is their hull while
    s ≤ 1; beyond, the values span decades (a value near 0 beside others, where Cox's ends run to 1e±100), the
    log-normal reading is not credible, and the Cox part fades out linearly until s = 2, from where t alone remains.
    It thus moves continuously with the values, a 0 among them included (s is then unbounded: t alone). Two values take
    t alone.

    Raises:
        ValueError: a negative value.
    """
    data, variances = _aligned(values, within)
    if np.any(data < 0):
        raise ValueError(f"positive quantities must be ≥ 0, got {data.min():g}")
    if len(data) < 2:
        return NO_INTERVAL
    low, high = t_interval(data, confidence, variances, bounds=(0.0, math.inf))
    if np.any(data == 0):
        return low, high
    logs = np.log(data)
    centre, s2, n = float(logs.mean()), float(logs.var(ddof=1)), len(data)
    weight = min(1.0, max(0.0, (COX_NONE - math.sqrt(s2)) / (COX_NONE - COX_FULL)))
    if weight == 0.0 or s2 == 0.0 or n < 3:  # two values: t₁ = 12.7 on s⁴ puts Cox's ends at 1e±5 of the values
        return low, high
    half = _t_quantile(n, confidence) * math.sqrt(s2 / n + s2 * s2 / (2 * (n - 1)))
    cox_low, cox_high = math.exp(centre + s2 / 2 - half), math.exp(centre + s2 / 2 + half)
    return low - weight * max(0.0, low - cox_low), high + weight * max(0.0, cox_high - high)


def mean_interval(
    key: str,
    values: Sequence[float] | np.ndarray,
    confidence: float = CONFIDENCE,
    within: Sequence[float] | np.ndarray | None = None,
    trials: Sequence[float] | np.ndarray | None = None,
) -> Interval:
    """The interval of the mean of ``values``, one per independent unit (a seed, a target, a client), on the scale of
    ``key``'s kind (:func:`~fdattack.statistics.kinds.metric_kind`): :func:`rate_interval`,
    :func:`positive_interval` or :func:`t_interval` cut to the metric's range
    (:func:`~fdattack.statistics.kinds.metric_range`: an SSIM or a cosine in [−1, 1]). ``within``: each unit's
    own within-run variance (:func:`within_variance`); ``trials``: each unit's count of independent trials, for a rate.
    Values outside the kind's range (a detail of an attack that shares a name in the table, such as VMI's ``kl`` loss
    term, a Monte-Carlo estimate that can be negative) take the plain :func:`t_interval`; NaNs are left out."""
    data = np.asarray(values, dtype=np.float64).ravel()
    finite = data[np.isfinite(data)]
    kind, (low, high) = metric_kind(key), metric_range(key)
    if np.any((finite < low) | (finite > high)):
        return t_interval(data, confidence, within)
    if kind is MetricKind.rate:
        return rate_interval(data, confidence, trials, within)
    if kind is MetricKind.positive:
        return positive_interval(data, confidence, within)
    return t_interval(data, confidence, within, bounds=(low, high))


# -------------------------------------------------------------------------------------------------- bootstrap
def scipy_bootstrap(
    samples: list[np.ndarray],
    statistic: Callable[..., object],
    cells: int,
    resamples: int,
    confidence: float,
    seed: int,
    vectorized: bool,
) -> Any:
    """``scipy.stats.bootstrap`` with its percentile interval, seeded, in batches that hold at most
    :data:`BOOTSTRAP_CELLS` resampled values (``cells`` values in one replicate), and without scipy's warning about a
    non-finite replicate (the callers turn that into (NaN, NaN))."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        return stats.bootstrap(
            samples,
            statistic,
            n_resamples=resamples,
            confidence_level=confidence,
            method="percentile",
            vectorized=vectorized,
            batch=max(1, BOOTSTRAP_CELLS // cells),
            rng=np.random.default_rng(seed),
        )


def positive_bootstrap_interval(
    strata: Sequence[np.ndarray],
    statistic: Callable[..., float],
    confidence: float = CONFIDENCE,
    resamples: int = STANDARD_ERROR_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """The interval of a positive ``statistic(*strata)`` θ̂ from its bootstrap standard error se* on the log scale:
    θ̂ · exp(± z · se*/θ̂), the normal interval of log θ̂ by the delta method, above 0 and around θ̂.

    se* is the standard deviation of ``scipy.stats.bootstrap``'s replicates, each stratum resampled with replacement
    apart (so each keeps its size; one of a single element is the same in every resample). Its percentile interval is
    not used: a resample repeats about a third of the items, and a statistic biased by its number of items (a Fréchet
    distance, larger with fewer distinct images) sits above θ̂ in nearly every resample, so the percentile interval can
    miss θ̂ altogether (64 Gaussian images in 512 features: FID 725, percentile interval [787, 824]).

    Args:
        strata: 1-d arrays (of item indices, say).
        statistic: ``(*resampled strata) -> value``; a non-finite value makes the interval (NaN, NaN).

    Where the estimate is within noise of 0 (z · se* > θ̂, the FID of a set with itself: float error), the log scale
    says nothing: past that point the upper end grows as θ̂ + (e − 1) · z · se*, continuous with θ̂ · exp(z · se*/θ̂) at
    z · se* = θ̂ and above θ̂ + z · se*, and the lower end θ̂ · exp(−z · se*/θ̂) goes to 0.

    Returns:
        (NaN, NaN) where no stratum has two elements; [max(0, θ̂ − z · se*), θ̂ + z · se*] where θ̂ ≤ 0.
    """
    arrays = [np.asarray(s) for s in strata]
    moving = [i for i, a in enumerate(arrays) if len(a) >= 2]
    estimate = statistic(*arrays)
    if not moving or not math.isfinite(estimate):
        return NO_INTERVAL

    def of_moving(*resampled: np.ndarray) -> float:
        full = list(arrays)
        for i, a in zip(moving, resampled):
            full[i] = a
        return statistic(*full)

    cells = sum(len(arrays[i]) for i in moving)
    result = scipy_bootstrap([arrays[i] for i in moving], of_moving, cells, resamples, confidence, seed, vectorized=False)
    half = float(stats.norm.ppf((1 + confidence) / 2)) * float(result.standard_error)
    if not math.isfinite(half):
        return NO_INTERVAL
    if estimate <= 0:
        return max(0.0, estimate - half), estimate + half
    relative = half / estimate
    upper = estimate * math.exp(relative) if relative <= 1 else estimate + half * (math.e - 1)
    return estimate * math.exp(-relative), upper
