"""Scoring of :class:`~fdattack.fd.results.LabelDistributions` against the clients' true label proportions
(Shi et al., PoPETs 2025, §4.1.3), with the Random and uniform-guess baselines.

Each distance is computed per client and averaged over the clients, with the 95 % interval of that mean over the
clients (the units) on the log scale of a non-negative quantity (:func:`~fdattack.statistics.intervals.mean_interval`:
the modified Cox interval, above 0, where Student's t would reach below 0). The baselines score guesses made without
any attack: the Random baseline one normalised-uniform draw per client from a fixed seed (and the mean over
1,000 such draws, steadier), the uniform guess p̂ = 1/M for every client (hard to beat for near-IID clients). They
carry no interval: the uniform guess is exact, the mean over 1,000 draws has no Monte-Carlo error worth one, and
the single draw is an illustration of one guess.
"""

from __future__ import annotations

import torch

from fdattack.data.federated import FederatedSplit
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import SCORERS, ScoringContext
from fdattack.fd.results import LabelDistributions
from fdattack.functional.label_distribution import distances, label_proportions, random_distributions
from fdattack.statistics.intervals import interval_keys, mean_interval

#: draws averaged in the ``random_*_mean1000`` baselines
RANDOM_DRAWS = 1000
#: baseline distances logged (the two the paper tabulates)
BASELINE_METRICS = ("kl", "chebyshev")


class LabelDistributionScorer:
    """Holds every client's true label distribution p and the baselines' scores (fixed for the run).

    Args:
        split: the federated split (private labels).
        seed: seeds the Random baseline's draws.
    """

    def __init__(self, split: FederatedSplit, seed: int) -> None:
        self.truth = torch.stack([label_proportions(p.labels, split.num_classes) for p in split.private])
        generator = torch.Generator().manual_seed(seed)
        one_draw = random_distributions((len(self.truth),), split.num_classes, generator)
        many = random_distributions((RANDOM_DRAWS, len(self.truth)), split.num_classes, generator)
        uniform = torch.full_like(self.truth, 1.0 / split.num_classes)
        self.baselines: dict[str, float] = {}
        for key in BASELINE_METRICS:
            self.baselines[f"random_{key}"] = float(distances(self.truth, one_draw)[key].mean())
            self.baselines[f"random_{key}_mean1000"] = float(distances(self.truth, many)[key].mean())
            self.baselines[f"uniform_{key}"] = float(distances(self.truth, uniform)[key].mean())

    def __call__(self, attack: str, result: LabelDistributions) -> Report:
        """``attack/<attack>/{kl,kl_eq7,chebyshev,l1,tv}`` (means over the estimated clients, each with the interval of
        the mean over the clients: ``_ci_low``, ``_ci_high``, and their count, ``_units``) and the baselines."""
        truth = self.truth[list(result.clients)]
        scores = distances(truth, result.estimates.double())
        metrics = {}
        for key, value in scores.items():
            metrics[f"attack/{attack}/{key}"] = float(value.mean())
            metrics.update(interval_keys(f"attack/{attack}/{key}", mean_interval(key, value.numpy()), units=len(value)))
        metrics.update({f"attack/{attack}/{key}": value for key, value in self.baselines.items()})
        return Report(metrics=metrics)


@SCORERS.register(LabelDistributions)
def build_label_distribution_scorer(context: ScoringContext) -> LabelDistributionScorer:
    """The clients' true label distributions, the baselines seeded with the evaluation seed."""
    return LabelDistributionScorer(context.oracle.split, context.seed)
