"""Replicas of one run that differ only by their seed, summed up per metric: the mean, the standard deviation and a
95 % interval across the seeds.

Across seeds a metric ``m`` becomes ``m`` (the mean over the seeds that recorded it), ``m_seed_std`` (their sample
standard deviation, n − 1), ``m_ci_low`` / ``m_ci_high`` (the 95 % interval of the mean over the seeds, the interval
a reader compares, on the scale of the metric's kind: :func:`~fdattack.statistics.intervals.mean_interval`, so a rate
stays in [0, 1] and a distance above 0) and, once per record, ``seeds/count``. The seed is the independent unit; each
replica's own within-run interval (over its targets, images, clients) and a rate's trials (``_trials``) floor the
seed-to-seed spread (:func:`seed_within`), so seeds that happen to agree keep the uncertainty each of them measured.
Two settings on the same seeds are compared by their paired difference
(:func:`~fdattack.statistics.paired.paired_difference`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fdattack.statistics.intervals import (
    HIGH,
    LOW,
    TRIALS,
    UNITS,
    interval_keys,
    is_interval_key,
    mean_interval,
    wilson_interval,
    within_variance,
)

#: suffix of a metric's standard deviation across seeds
SEED_STD = "_seed_std"
#: the number of seeds behind an aggregate record
SEEDS_KEY = "seeds/count"


def is_number(value: object) -> bool:
    """Whether ``value`` is a metric's number (a bool is not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: object) -> float:
    return float(value) if is_number(value) else math.nan  # type: ignore[arg-type]


def seed_within(final: dict[str, object], key: str) -> float:
    """One seed's within-run variance of ``key``: for a rate over counted trials (``key_trials``), that of Wilson's
    interval over them (never 0, not at 0 hits either); else that of the seed's own interval, read at the normal
    quantile (an interval of a mean over a handful of units, read at Student's quantile, makes this floor larger than
    the unit's variance: conservative); NaN where the seed has neither."""
    value, trials = _number(final.get(key)), _number(final.get(key + TRIALS))
    if math.isfinite(value) and math.isfinite(trials) and trials > 0 and 0.0 <= value <= 1.0:
        return within_variance(*wilson_interval(round(value * trials), int(trials)))
    return within_variance(_number(final.get(key + LOW)), _number(final.get(key + HIGH)), units=_number(final.get(key + UNITS)))


def across_seeds(replicas: Sequence[dict[str, object]]) -> dict[str, float]:
    """Mean, ``_seed_std`` and 95 % interval (:func:`~fdattack.statistics.intervals.mean_interval`) across ``replicas``
    (one flat metrics dict per seed) of every numeric metric; NaN (recorded as None) and missing values are left out of
    a metric's seeds."""
    keys = list(dict.fromkeys(key for replica in replicas for key in replica if not is_interval_key(key) and key != SEEDS_KEY))
    out: dict[str, float] = {SEEDS_KEY: float(len(replicas))}
    for key in keys:
        present = [replica[key] for replica in replicas if key in replica]
        if not all(value is None or is_number(value) for value in present):
            continue  # not a metric (a string)
        having = [r for r in replicas if key in r and r[key] is not None and math.isfinite(float(r[key]))]  # type: ignore[arg-type]
        values = np.array([float(r[key]) for r in having])  # type: ignore[arg-type]
        within = [seed_within(r, key) for r in having]
        trials = [_number(r.get(key + TRIALS)) for r in having]
        out[key] = float(values.mean()) if len(values) else math.nan
        out[key + SEED_STD] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        out.update(interval_keys(key, mean_interval(key, values, within=within, trials=trials)))
    return out
