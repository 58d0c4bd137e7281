"""95 % intervals of the metrics fdattack reports, each resampling or averaging the independent unit, on a scale that
keeps it inside the metric's range (docs/intervals.md has the table of metric -> method -> unit).

* The mean of a handful of independent units (seeds, targets, clients, probe points): :func:`mean_interval`, on the
  scale of the metric's kind (:func:`~fdattack.functional.metric_kinds.metric_kind`):

  - ``rate`` (in [0, 1]): :func:`rate_interval`, the Wilson interval with the effective number of trials
    n* = p̄(1 − p̄) / s²_p̄ and Student's t quantile (Korn & Graubard, Survey Methodology 1998; Dean & Pagano, J. Survey
    Stat. Methodol. 2015, §2): inside [0, 1] at every p̄, with no constant to pick at 0 or 1;
  - ``positive`` (≥ 0): :func:`positive_interval`, the modified Cox interval of a mean on the log scale (Olsson, J.
    Stat. Educ. 2005, Eq. 6): above 0, and the interval of the arithmetic mean, not of the geometric one;
  - ``signed``: :func:`t_interval`, Student's t.

* A success rate of independent 0/1 trials (attack accuracy over targets, a classifier's test accuracy):
  :func:`wilson_interval`.
* A positive statistic that is not a mean of units (the FID of inversions): :func:`positive_bootstrap_interval`, from
  the standard error of ``scipy.stats.bootstrap``'s replicates (each stratum resampled apart) on the log scale.
* Membership metrics: :mod:`fdattack.functional.membership_bootstrap` (the percentile bootstrap of the candidates).

Every interval is (low, high): (v, v) where all units agree (no spread to show), (NaN, NaN) where there is too little
to say (fewer than two units). Bootstraps are seeded, so a run scored again has the same intervals.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

from fdattack.functional.metric_kinds import MetricKind, metric_kind

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

Interval = tuple[float, float]
NO_INTERVAL: Interval = (math.nan, math.nan)


def interval_keys(key: str, interval: Interval) -> dict[str, float]:
    """``{key_ci_low: low, key_ci_high: high}``."""
    return {key + LOW: float(interval[0]), key + HIGH: float(interval[1])}


def is_interval_key(key: str) -> bool:
    """Whether ``key`` is one end of another metric's interval."""
    return key.endswith((LOW, HIGH))


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    data = np.asarray(values, dtype=np.float64).ravel()
    return data[np.isfinite(data)]


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


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval of the mean of ``values`` (NaNs left out): mean ± t_{n-1} · sd / sqrt(n)."""
    data = _finite(values)
    if len(data) < 2:
        return NO_INTERVAL
    mean, sem = float(data.mean()), float(stats.sem(data))
    if sem == 0.0:
        return mean, mean
    low, high = stats.t.interval(confidence, len(data) - 1, loc=mean, scale=sem)
    return float(low), float(high)


def rate_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The interval of the mean p̄ of rates in [0, 1] (NaNs left out): Wilson's with the effective number of trials.

    n* = p̄(1 − p̄) / s²_p̄, s²_p̄ = s² / n the squared standard error of the mean over the n units, and z = t_{n-1}:
    (p̄ + z²/2n* ± z · sqrt(p̄(1 − p̄)/n* + z²/4n*²)) / (1 + z²/n*). It holds p̄, stays inside [0, 1], is (p̄, p̄) where the
    units agree (0 and 1 included) and equals the t interval as n* grows.

    Raises:
        ValueError: a value outside [0, 1].
    """
    data = _finite(values)
    if np.any((data < 0) | (data > 1)):
        raise ValueError(f"rates must lie in [0, 1], got {data.min():g} .. {data.max():g}")
    if len(data) < 2:
        return NO_INTERVAL
    p, variance = float(data.mean()), float(data.var(ddof=1)) / len(data)
    if variance == 0.0:
        return p, p
    trials = p * (1 - p) / variance
    z2 = _t_quantile(len(data), confidence) ** 2
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = math.sqrt(z2 * (variance + z2 / (4 * trials * trials))) / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def positive_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The interval of the mean of non-negative ``values`` (NaNs left out): the modified Cox interval on the log scale.

    With y = log x, ȳ and s² their mean and variance over n units: exp(ȳ + s²/2 ± t_{n-1} · sqrt(s²/n + s⁴/(2(n − 1)))),
    the interval of the arithmetic mean of a log-normal quantity, above 0. Where a value is 0 (no log), Student's t
    interval with its low end cut at 0 (the mean of non-negative values is never below 0, so the cut loses no coverage).

    Raises:
        ValueError: a negative value.
    """
    data = _finite(values)
    if np.any(data < 0):
        raise ValueError(f"positive quantities must be ≥ 0, got {data.min():g}")
    if len(data) < 2:
        return NO_INTERVAL
    if np.any(data == 0):
        low, high = t_interval(data, confidence)
        return max(0.0, low), high
    logs = np.log(data)
    centre, s2, n = float(logs.mean()), float(logs.var(ddof=1)), len(data)
    if s2 == 0.0:
        return float(data[0]), float(data[0])
    half = _t_quantile(n, confidence) * math.sqrt(s2 / n + s2 * s2 / (2 * (n - 1)))
    with np.errstate(over="ignore"):  # a spread beyond float64 (e^709): an upper end of inf
        return float(np.exp(centre + s2 / 2 - half)), float(np.exp(centre + s2 / 2 + half))


_BY_KIND: dict[MetricKind, Callable[[np.ndarray, float], Interval]] = {
    MetricKind.rate: rate_interval,
    MetricKind.positive: positive_interval,
    MetricKind.signed: t_interval,
}
_RANGE = {MetricKind.rate: (0.0, 1.0), MetricKind.positive: (0.0, math.inf), MetricKind.signed: (-math.inf, math.inf)}


def mean_interval(key: str, values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The interval of the mean of ``values``, one per independent unit (a seed, a target, a client), on the scale of
    ``key``'s kind (:func:`~fdattack.functional.metric_kinds.metric_kind`): :func:`rate_interval`,
    :func:`positive_interval` or :func:`t_interval`. Values outside the kind's range (a detail of an attack that shares
    a name in the table, such as VMI's ``kl`` loss term, a Monte-Carlo estimate that can be negative) take
    :func:`t_interval`; NaNs are left out."""
    data = _finite(values)
    kind = metric_kind(key)
    low, high = _RANGE[kind]
    if np.any((data < low) | (data > high)):
        kind = MetricKind.signed
    return _BY_KIND[kind](data, confidence)


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
