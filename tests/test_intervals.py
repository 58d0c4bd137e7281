"""95 % intervals (fdattack.functional.intervals) against hand-computed values, and every scorer logging them beside
its metrics as ``<metric>_ci_low`` / ``_ci_high``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fdattack.attacks.results import LabelDistributions, MembershipScores
from fdattack.evaluation.label_distribution import LabelDistributionScorer
from fdattack.evaluation.membership import CandidatePool, MembershipScorer
from fdattack.functional.intervals import (
    bootstrap_interval,
    bootstrap_mean_interval,
    membership_bootstrap,
    membership_points,
    t_interval,
    wilson_interval,
)
from fdattack.functional.membership_metrics import FPR_LEVELS, membership_metrics
from fdattack.tracking.summary import attack_summary, format_score


# --------------------------------------------------------------------------------------------- closed forms
def test_wilson_interval_by_hand() -> None:
    """Wilson: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z = 1.959964."""
    z = 1.959963984540054
    for k, n in [(3, 5), (0, 5), (5, 5), (9, 20)]:
        p = k / n
        centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        assert wilson_interval(k, n) == pytest.approx((centre - half, centre + half), abs=1e-9)
    assert wilson_interval(0, 5)[0] == pytest.approx(0.0, abs=1e-12) and wilson_interval(5, 5)[1] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_t_interval_by_hand() -> None:
    """[1, 2, 3]: mean 2, standard error 1/sqrt(3), t_{2, 0.975} = 4.302653: 2 ± 2.484138."""
    assert t_interval([1.0, 2.0, 3.0]) == pytest.approx((2 - 2.4841377, 2 + 2.4841377), abs=1e-6)
    assert t_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert all(math.isnan(v) for v in t_interval([1.0]))
    assert t_interval([1.0, float("nan"), 3.0]) == pytest.approx(t_interval([1.0, 3.0]))


def test_bootstrap_mean_interval_matches_the_normal_approximation_on_many_items() -> None:
    """On 2,000 standard-normal items the percentile bootstrap of the mean is mean ± 1.96/sqrt(n) within 10 %."""
    values = np.random.default_rng(0).normal(size=2000)
    low, high = bootstrap_mean_interval(values)
    half = 1.959964 / math.sqrt(len(values))
    assert low < values.mean() < high
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert bootstrap_mean_interval([0.3, 0.3, 0.3]) == (0.3, 0.3)
    assert bootstrap_mean_interval(values) == bootstrap_mean_interval(values)  # seeded: a run scored again has the same intervals


def test_bootstrap_interval_of_a_statistic_brackets_it() -> None:
    values = np.random.default_rng(1).exponential(size=400)
    low, high = bootstrap_interval(len(values), lambda rows: float(np.median(values[rows])))
    assert low < np.median(values) < high and high - low < 0.5


# ------------------------------------------------------------------------------------------------ membership
def test_membership_points_equal_the_reported_metrics_with_ties() -> None:
    """The bootstrap's vectorised ROC gives exactly the TPRs at 1 % and 0.1 % FPR, AUC and balanced accuracy that
    membership_metrics (torchmetrics' float32 ROC) reports, on scores with many ties."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        n1, n0 = int(rng.integers(2, 200)), int(rng.integers(2, 1500))
        decimals = int(rng.integers(0, 3))
        members, non_members = np.round(rng.normal(0.4, 1, n1), decimals), np.round(rng.normal(0, 1, n0), decimals)
        reported = membership_metrics(
            torch.cat([torch.ones(n1), torch.zeros(n0)]).bool(), torch.tensor(np.concatenate([members, non_members]))
        )
        expected = [reported[key] for key in (*FPR_LEVELS, "auc", "balanced_accuracy")]
        assert membership_points(members[None], non_members[None], list(FPR_LEVELS.values()))[0] == pytest.approx(
            expected, abs=1e-6
        )  # torchmetrics: float32


def test_membership_bootstrap_brackets_the_mean_over_clients_and_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(2)
    levels = list(FPR_LEVELS.values())

    def clients(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(rng.normal(0.5, 1, n), rng.normal(0, 1, n)) for _ in range(3)]

    small, large = clients(100), clients(1600)
    point = np.mean([membership_points(m[None], s[None], levels)[0] for m, s in small], axis=0)
    intervals = membership_bootstrap(small, levels, resamples=400)
    assert all(low <= value <= high for (low, high), value in zip(intervals, point))
    auc_small, auc_large = intervals[2], membership_bootstrap(large, levels, resamples=400)[2]
    assert auc_large[1] - auc_large[0] < 0.5 * (auc_small[1] - auc_small[0])
    separated = membership_bootstrap([(np.full(10, 2.0), np.zeros(10))], levels, resamples=100)
    assert separated[2] == (1.0, 1.0)


def test_membership_scorer_logs_an_interval_beside_each_metric() -> None:
    rng = torch.Generator().manual_seed(0)
    n = 200
    origin = torch.cat([torch.zeros(n, dtype=torch.long), torch.full((n,), -1)])
    pool = CandidatePool(torch.zeros(2 * n, 1, 2, 2), torch.zeros(2 * n, dtype=torch.long), origin)
    scores = torch.randn(1, 2 * n, generator=rng, dtype=torch.float64) + (origin == 0).double()
    metrics = MembershipScorer(pool, seed=0, resamples=200)("lira", MembershipScores((0,), scores)).metrics
    for key in (*FPR_LEVELS, "auc", "balanced_accuracy"):
        value, low, high = (metrics[f"attack/lira/{key}{end}"] for end in ("", "_ci_low", "_ci_high"))
        assert low <= value <= high and low < high, key
    assert 0.7 < metrics["attack/lira/auc"] < 0.85 and metrics["attack/lira/auc_ci_low"] > 0.6


def test_label_distribution_intervals_are_the_spread_over_clients() -> None:
    """LDIA's KL and the other distances: the t interval of the mean over the clients' distances."""
    from fdattack.functional.label_distribution import distances

    class Split:
        num_classes = 3
        private = [type("P", (), {"labels": torch.tensor(labels)})() for labels in ([0, 0, 1], [1, 2, 2], [0, 1, 2])]

    scorer = LabelDistributionScorer(Split(), seed=0)  # type: ignore[arg-type]
    estimates = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])
    metrics = scorer("ldia", LabelDistributions((0, 1, 2), estimates)).metrics
    per_client = distances(scorer.truth, estimates.double())["kl"].numpy()
    assert (metrics["attack/ldia/kl_ci_low"], metrics["attack/ldia/kl_ci_high"]) == pytest.approx(t_interval(per_client))
    assert metrics["attack/ldia/kl"] == pytest.approx(per_client.mean())


# ------------------------------------------------------------------------------------------------ the summary
def test_the_summary_prints_each_interval_after_its_value() -> None:
    final = {
        "attack/pli/accuracy": 0.4,
        "attack/pli/accuracy_ci_low": 0.118,
        "attack/pli/accuracy_ci_high": 0.769,
        "attack/pli/chance": 0.2,
        "attack/pli/chance_ci_low": 0.2,
        "attack/pli/chance_ci_high": 0.2,
        "attack/ldia/uniform_kl": 2.1293,
        "attack/ldia/uniform_kl_ci_low": 2.12926,
        "attack/ldia/uniform_kl_ci_high": 2.12934,
    }
    assert format_score(final, "attack/pli/accuracy", "{:.2f}") == "0.40 [0.12, 0.77]"
    assert format_score(final, "attack/pli/chance", "{:.2f}") == "0.20"  # no width: no interval
    assert format_score(final, "attack/ldia/uniform_kl", "{:.3f}") == "2.129"  # float noise across seeds: none either
    assert format_score(final, "attack/pli/ssim", "{:.3f}") == "-"
    assert "0.40 [0.12, 0.77]" in attack_summary(final)


def test_an_attack_is_listed_in_one_table_only() -> None:
    """VMI logs a ``kl`` detail (its flows' KL term): it stays in the inversion table, not in LDIA's."""
    final = {"attack/vmi/top1": 0.5, "attack/vmi/kl": 3.0, "attack/ldia/kl": 0.2}
    tables = attack_summary(final).split("\n\n")
    assert len(tables) == 2 and "vmi" in tables[0] and "ldia" not in tables[0] and "vmi" not in tables[1] and "ldia" in tables[1]


@pytest.mark.parametrize(("n", "d"), [(40, 128), (300, 16)])
def test_frechet_to_a_fixed_reference_equals_torchmetrics_fid(n: int, d: int) -> None:
    """The bootstrap's Fréchet distance (Σ_r^{1/2} taken once, the sample's eigenvalues in the smaller of n × n and D × D)
    is torchmetrics' FID of the same features, with fewer samples than dimensions and with more."""
    from torch import nn
    from torchmetrics.image.fid import FrechetInceptionDistance

    from fdattack.functional.frechet import FrechetToReference

    class Given(nn.Module):
        num_features = d

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    g = torch.Generator().manual_seed(0)
    real = torch.randn(500, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64) * 0.3
    fake = torch.randn(n, d, generator=g, dtype=torch.float64) + 0.5
    metric = FrechetInceptionDistance(feature=Given())
    metric.update(real, real=True)
    metric.update(fake, real=False)
    assert FrechetToReference(real)(fake) == pytest.approx(float(metric.compute()), rel=1e-6)
