"""Whether an attack leaks beyond its baseline, is shown to be within a margin of it, or neither: a decision per cell,
from the per-seed differences between the attack and its control (the attacker's best without the protocol's data).

With e_s the difference on the leaky side at seed s (the attack's value less the control's, or the control's less the
attack's for a distance such as LDIA's KL, lower where it leaks), its mean ē and the standard error se of
:func:`~fdattack.statistics.intervals.standard_error` (the seeds' spread, floored by each seed's own within-run
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

The difference, its interval and its standard error are the paired difference of
:func:`~fdattack.statistics.paired.paired_difference` (the one rule for two settings on the same seeds, which the
matrix's defense comparisons use too), cut to the range the mean difference can take (a rate's difference from a
control c̄ lies in [−c̄, 1 − c̄]). ``alpha`` is the error rate of each of the two tests, and the family-wise level of
the comparisons that say a defense *reduces* an attack (:func:`is_reduction`); a sequential design that looks K times
spends α/K at each look (:func:`look_alpha`), so its error rate holds under optional stopping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy import stats

from fdattack.statistics.paired import paired_difference

#: the error rate of each test of a verdict (a 95 % interval for a leak, a one-sided 95 % bound for a stop) and the
#: family-wise level of the matrix's comparisons; ``--decide`` spends it over its looks (:func:`look_alpha`)
ALPHA = 0.05
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


def decide(
    values: Sequence[float],
    controls: Sequence[float],
    margin: float,
    *,
    lower_leaks: bool = False,
    within: Sequence[float] | None = None,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    alpha: float = ALPHA,
) -> Decision:
    """The verdict on an attack's per-seed ``values`` against its per-seed ``controls`` (paired by position), from
    their paired difference (:func:`~fdattack.statistics.paired.paired_difference`, the control the reference) turned
    to the leaky side.

    Args:
        margin: δ > 0, on the metric's own scale.
        lower_leaks: a lower value means more leakage (a distance to the truth).
        within: per seed, the within-run variance of its difference (the value's plus the control's; NaN: unknown).
        bounds: the range of the metric itself; the mean difference's range follows from it and the controls' mean.
        alpha: the error rate of each of the two tests.
    """
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    d = paired_difference(values, controls, 1 - alpha, within=within, bounds=bounds)
    mean = 0.0 - d.mean if lower_leaks else d.mean  # 0.0 − x: no −0.0 where nothing differs
    if d.n < 2 or d.standard_error == 0.0:
        return Decision(Verdict.unknown, mean, math.nan, math.nan, math.nan, margin, d.n, alpha)
    low, high = (0.0 - d.high, 0.0 - d.low) if lower_leaks else (d.low, d.high)
    kept = np.isfinite(np.asarray(values, dtype=np.float64)) & np.isfinite(np.asarray(controls, dtype=np.float64))
    highest = _highest_difference(bounds, float(np.asarray(controls, dtype=np.float64)[kept].mean()), lower_leaks)
    upper = min(highest, mean + float(stats.t.ppf(1 - alpha, d.n - 1)) * d.standard_error)
    if upper < margin:
        verdict = Verdict.stopped
    elif low > 0:
        verdict = Verdict.leaks
    else:
        verdict = Verdict.undecided
    return Decision(verdict, mean, low, high, upper, margin, d.n, alpha)


def _highest_difference(bounds: tuple[float, float], control_mean: float, lower_leaks: bool) -> float:
    """The largest the mean leak-side difference can be when the metric lies in ``bounds`` and the controls average
    ``control_mean``."""
    return control_mean - bounds[0] if lower_leaks else bounds[1] - control_mean


def is_reduction(difference: float, survives: bool, lower_leaks: bool) -> bool:
    """Whether a defense *reduces* an attack: its paired difference from no defense (defended − undefended) survives
    Holm's correction over the matrix's comparisons (:func:`~fdattack.statistics.paired.holm_adjusted`, at the
    verdicts' α) and lies on the side where less leaks (below 0; above 0 for a distance)."""
    return survives and (difference > 0 if lower_leaks else difference < 0)


def look_alpha(alpha: float, looks: int) -> float:
    """The error rate of each of ``looks`` planned looks at a growing set of seeds, so that the chance of any false
    verdict over all of them stays at most ``alpha`` whichever look a cell stops at (Bonferroni's spending of α over
    the looks: the simplest valid group-sequential design; Pocock, Biometrika 1977, and Lan & DeMets, Biometrika 1983,
    spend it less conservatively by modelling the looks' correlation)."""
    if looks < 1:
        raise ValueError(f"a sequential design looks at least once, got {looks}")
    return alpha / looks
