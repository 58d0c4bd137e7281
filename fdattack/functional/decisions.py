"""Whether an attack leaks beyond its baseline, is shown to be within a margin of it, or neither: a decision per cell,
from the per-seed differences between the attack and its control (the attacker's best without the protocol's data).

With e_s the difference on the leaky side at seed s (the attack's value less the control's, or the control's less the
attack's for a distance such as LDIA's KL, lower where it leaks), its mean ē and the standard error se of
:func:`~fdattack.functional.intervals.standard_error` (the seeds' spread, floored by each seed's own within-run
variance, so three seeds that agree keep the binomial spread of their targets), t = t_{n−1}:

* **leaks** where the two-sided 1 − α interval lies wholly above 0: ē − t_{1−α/2} · se > 0;
* **stopped** (equivalent to the baseline within the margin δ) where the one-sided 1 − α upper bound lies below δ:
  ē + t_{1−α} · se < δ. This is the upper half of the two one-sided tests (TOST; Schuirmann, J. Pharmacokinet.
  Biopharm. 1987): an attack far below its baseline is as stopped as one at it. δ is fixed before the run
  (:data:`MARGINS`, or the matrix file's ``margins:``). A difference shown to be above 0 but below δ is within the
  margin the reader declared negligible: stopped, and the interval says by how much;
* **undecided** where neither holds: the seeds cannot tell a leak from none. A non-significant interval is never read
  as a stop;
* **unknown** with fewer than two finite seeds, or where the differences are one constant with no within-run spread
  known (nothing to scale a test by: an old ``matrix.json`` without ``within``).

The interval is cut to the range the mean difference can take (a rate's difference from a control c̄ lies in
[−c̄, 1 − c̄]). ``alpha`` is the error rate of each of the two tests; a sequential design that looks K times spends
α/K at each look (:func:`look_alpha`), so its error rate holds under optional stopping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy import stats

from fdattack.functional.intervals import CONFIDENCE, standard_error

#: differences that agree to this (relative) tolerance are one: 0.35 − 0.30 and 0.45 − 0.40 differ in the 17th digit,
#: which must not read as a spread to scale a test by
SPREAD_TOLERANCE = 1e-9
#: the default equivalence margin δ of each headline metric, fixed before any run: one chance level of an accuracy or
#: top-1 (the string names the cell's metric that holds it: 1/T for T targets), 0.02 of an AUC, 1 % of a TPR at 1 % FPR
#: (its own baseline), 0.1 nats of LDIA's KL (a twentieth of the uniform guess's on 10 classes)
MARGINS: dict[str, float | str] = {
    "accuracy": "chance",
    "eval_top1": "chance",
    "top1": "chance",
    "auc": 0.02,
    "tpr_at_1pct_fpr": 0.01,
    "kl": 0.1,
}


class Verdict(str, Enum):
    """What the seeds show of one attack in one cell against its baseline."""

    leaks = "leaks"
    stopped = "stopped"
    undecided = "undecided"
    unknown = "unknown"


@dataclass(frozen=True)
class Decision:
    """One cell's verdict and the numbers behind it, all on the leaky side (positive: more than the baseline leaks).

    Attributes:
        verdict: see the module docstring.
        mean: ē, the mean of the per-seed differences on the leaky side.
        low, high: its two-sided 1 − α interval (NaN under two seeds).
        upper: its one-sided 1 − α upper bound, compared with the margin.
        margin: δ.
        n: the seeds paired.
        alpha: the error rate of each test.
    """

    verdict: Verdict
    mean: float
    low: float
    high: float
    upper: float
    margin: float
    n: int
    alpha: float


def leak_side_differences(values: Sequence[float], controls: Sequence[float], lower_leaks: bool) -> np.ndarray:
    """e_s per seed: value − control, or control − value where lower values leak; NaN where either is missing."""
    v, c = np.asarray(values, dtype=np.float64), np.asarray(controls, dtype=np.float64)
    if v.shape != c.shape or v.ndim != 1:
        raise ValueError(f"one value and one control per seed, got shapes {v.shape} and {c.shape}")
    return c - v if lower_leaks else v - c


def decide(
    values: Sequence[float],
    controls: Sequence[float],
    margin: float,
    *,
    lower_leaks: bool = False,
    within: Sequence[float] | None = None,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    alpha: float = 1 - CONFIDENCE,
) -> Decision:
    """The verdict on an attack's per-seed ``values`` against its per-seed ``controls`` (paired by position).

    Args:
        margin: δ > 0, on the metric's own scale.
        lower_leaks: a lower value means more leakage (a distance to the truth).
        within: per seed, the within-run variance of its difference (the value's plus the control's; NaN: unknown).
        bounds: the range of the metric itself; the mean difference's range follows from it and the controls' mean.
        alpha: the error rate of each of the two tests.
    """
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    e = leak_side_differences(values, controls, lower_leaks)
    w = np.full(len(e), math.nan) if within is None else np.asarray(within, dtype=np.float64)
    kept = np.isfinite(e)
    e, w = e[kept], w[kept]
    n = len(e)
    if n and float(np.ptp(e)) <= SPREAD_TOLERANCE * max(1.0, float(np.abs(e).max())):
        e = np.full(n, float(e.mean()))  # one difference up to rounding: no spread between the seeds
    if n < 2:
        mean = float(e.mean()) if n else math.nan
        return Decision(Verdict.unknown, mean, math.nan, math.nan, math.nan, margin, n, alpha)
    mean, se = float(e.mean()), standard_error(e, w)
    if se == 0.0:
        return Decision(Verdict.unknown, mean, math.nan, math.nan, math.nan, margin, n, alpha)
    control_mean = float(np.asarray(controls, dtype=np.float64)[kept].mean())
    lowest, highest = _difference_range(bounds, control_mean, lower_leaks)
    two_sided, one_sided = (float(stats.t.ppf(q, n - 1)) for q in (1 - alpha / 2, 1 - alpha))
    low, high = max(lowest, mean - two_sided * se), min(highest, mean + two_sided * se)
    upper = min(highest, mean + one_sided * se)
    if upper < margin:
        verdict = Verdict.stopped
    elif low > 0:
        verdict = Verdict.leaks
    else:
        verdict = Verdict.undecided
    return Decision(verdict, mean, low, high, upper, margin, n, alpha)


def _difference_range(bounds: tuple[float, float], control_mean: float, lower_leaks: bool) -> tuple[float, float]:
    """Where the mean leak-side difference can lie when the metric lies in ``bounds`` and the controls average
    ``control_mean``."""
    low, high = bounds
    return (control_mean - high, control_mean - low) if lower_leaks else (low - control_mean, high - control_mean)


def look_alpha(alpha: float, looks: int) -> float:
    """The error rate of each of ``looks`` planned looks at a growing set of seeds, so that the chance of any false
    verdict over all of them stays at most ``alpha`` whichever look a cell stops at (Bonferroni's spending of α over
    the looks: the simplest valid group-sequential design; Pocock, Biometrika 1977, and Lan & DeMets, Biometrika 1983,
    spend it less conservatively by modelling the looks' correlation)."""
    if looks < 1:
        raise ValueError(f"a sequential design looks at least once, got {looks}")
    return alpha / looks
