"""95 % intervals (fdattack.statistics.intervals, membership_bootstrap, comparisons) against hand-computed values and
scipy, the metric-kind table, and every scorer logging them beside its metrics as ``<metric>_ci_low`` / ``_ci_high``."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import torch
from scipy import stats

from fdattack.attacks.results import LabelDistributions, MembershipScores
from fdattack.cli import main
from fdattack.evaluation.candidates import CandidatePool
from fdattack.evaluation.label_distribution import LabelDistributionScorer
from fdattack.evaluation.membership import MembershipScorer
from fdattack.functional.membership_metrics import FPR_LEVELS, membership_metrics
from fdattack.statistics.intervals import (
    STANDARD_ERROR_RESAMPLES,
    mean_interval,
    positive_bootstrap_interval,
    positive_interval,
    rate_interval,
    t_interval,
    wilson_interval,
    within_variance,
)
from fdattack.statistics.kinds import MetricKind, metric_kind
from fdattack.statistics.membership_bootstrap import ClientScores, membership_bootstrap, membership_points
from fdattack.statistics.paired import holm, holm_adjusted, paired_difference
from fdattack.tracking.seed_aggregate import aggregate_metrics
from fdattack.tracking.summary import attack_summary, format_score
from tests.conftest import error_of

T2 = 4.302652729749462  # t_{2, 0.975}: three seeds
LEVELS = list(FPR_LEVELS.values())


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


def test_rate_interval_by_hand() -> None:
    """[0.2, 0.3, 0.4]: p̄ = 0.3, s²/n = 0.01/3, n* = 0.21 / (0.01/3) = 63 trials, z = t₂; Wilson at n* = 63:
    [0.1224, 0.5685] (Student's t gives [0.052, 0.548]). [0.9, 1, 1]: p̄ = 29/30, s²/n = 1/900, n* = 29."""
    for values, p, variance in [([0.2, 0.3, 0.4], 0.3, 0.01 / 3), ([0.9, 1.0, 1.0], 29 / 30, (0.01 / 3) / 3)]:
        n = p * (1 - p) / variance
        centre = (p + T2**2 / (2 * n)) / (1 + T2**2 / n)
        half = T2 * math.sqrt(p * (1 - p) / n + T2**2 / (4 * n * n)) / (1 + T2**2 / n)
        assert rate_interval(values) == pytest.approx((centre - half, centre + half), abs=1e-9)
    assert rate_interval([0.2, 0.3, 0.4]) == pytest.approx((0.1223592, 0.5684870), abs=1e-6)
    assert rate_interval([1.0, 1.0, 1.0]) == (1.0, 1.0) and rate_interval([0.0, 0.0]) == (0.0, 0.0)  # a constant
    assert all(math.isnan(v) for v in rate_interval([0.4]))
    with pytest.raises(ValueError, match="rates must lie in"):
        rate_interval([0.5, 1.2])


def test_a_rate_counts_its_trials_and_its_seeds_own_spread() -> None:
    """Three seeds of 20 targets each. At 0 hits everywhere: Wilson over the 60 trials with z = t₂, [0, z²/(60 + z²)]
    = [0, 0.236], not a point. At 0.2 / 0.2 / 0.2: Wilson at p = 0.2 over 60. At 0.1 / 0.2 / 0.3 the seeds' spread
    (n* = 0.16 / (0.01/3) = 48 < 60) sets it, and with 5 trials a seed (15 < 48) the trials cap it: never narrower than
    Wilson over all the trials behind it."""
    z2 = T2**2
    assert rate_interval([0.0, 0.0, 0.0], trials=[20, 20, 20]) == pytest.approx((0.0, z2 / (60 + z2)))
    p, n = 0.2, 60
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), T2 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    assert rate_interval([0.2, 0.2, 0.2], trials=[20, 20, 20]) == pytest.approx((centre - half, centre + half))
    assert rate_interval([0.1, 0.2, 0.3], trials=[20, 20, 20]) == pytest.approx(rate_interval([0.1, 0.2, 0.3]))
    capped, free = rate_interval([0.1, 0.2, 0.3], trials=[5, 5, 5]), rate_interval([0.1, 0.2, 0.3])
    assert capped[0] < free[0] and capped[1] > free[1]
    within = [within_variance(*wilson_interval(4, 20))] * 3  # each seed's own Wilson interval at 4 of 20
    n = 0.16 / (within[0] / 3)  # the seeds agree: their own spread (Wilson's at 4 of 20) sets n*
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), T2 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    assert rate_interval([0.2, 0.2, 0.2], within=within) == pytest.approx((centre - half, centre + half))


def test_rate_interval_tends_to_the_t_interval_with_many_trials() -> None:
    """n* grows with the number of units: 2,000 rates around 0.5 give the t interval within 1 % of its width."""
    values = np.random.default_rng(0).uniform(0.3, 0.7, 2000)
    (low, high), (t_low, t_high) = rate_interval(values), t_interval(values)
    assert abs(low - t_low) < 0.01 * (t_high - t_low) and abs(high - t_high) < 0.01 * (t_high - t_low)


def test_positive_interval_by_hand() -> None:
    """[0.1, 0.2, 0.4]: logs log 0.2 + (−1, 0, 1) log 2, so ȳ = log 0.2 and s = log 2 ≤ 1: the hull of the modified Cox
    interval exp(ȳ + s²/2 ± t₂ sqrt(s²/3 + s⁴/4)) = [0.0341, 1.895] and Student's t cut at 0 ([−0.146, 0.613] → [0, 0.613]):
    [0, 1.895]. [0.5, 1, 2] at s = log 2 likewise; a 0 among the values: t alone; s = 1.5: Cox half faded out."""
    s2 = math.log(2) ** 2
    centre, half = math.log(0.2) + s2 / 2, T2 * math.sqrt(s2 / 3 + s2 * s2 / 4)
    assert positive_interval([0.1, 0.2, 0.4]) == pytest.approx((0.0, math.exp(centre + half)), rel=1e-9)
    assert positive_interval([0.1, 0.2, 0.4]) == pytest.approx((0.0, 1.8947202), rel=1e-6)
    assert positive_interval([0.0, 0.1, 0.2]) == pytest.approx((0.0, t_interval([0.0, 0.1, 0.2])[1]))  # a 0: t, cut at 0
    assert positive_interval([1e-9, 0.1, 0.2]) == pytest.approx(positive_interval([0.0, 0.1, 0.2]), abs=1e-6)  # no jump at 0
    values = np.exp(np.array([-1.5, 0.0, 1.5]))  # s = 1.5: half of the way from the hull to t alone
    t_low, t_high = t_interval(values, bounds=(0.0, math.inf))
    s2, ybar = 1.5**2, 0.0
    cox_low, cox_high = (math.exp(ybar + s2 / 2 + sign * T2 * math.sqrt(s2 / 3 + s2 * s2 / 4)) for sign in (-1, 1))
    assert positive_interval(values) == pytest.approx((t_low - 0.5 * max(0.0, t_low - cox_low), t_high + 0.5 * (cox_high - t_high)))
    assert positive_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="positive quantities must be"):
        positive_interval([0.1, -0.2])


def test_adversarial_seeds_keep_rates_in_range_and_distances_above_zero() -> None:
    """The reviewer's cases: Student's t of [0, 0, 1] is [−1.10, 1.77] and of [0.9, 1, 1] reaches 1.11; a KL of
    [0.01, 0.02, 5] has t interval [−5.5, 8.8]. By their kinds every rate stays in [0, 1], every distance above 0, and
    each interval holds the mean shown beside it (random triples: 0s, 1s, ties and spreads over decades)."""
    assert t_interval([0, 0, 1])[0] < 0 and t_interval([0.9, 1, 1])[1] > 1 and t_interval([0.01, 0.02, 5.0])[0] < 0
    rng = np.random.default_rng(0)
    rates = [[0, 0, 1], [0.9, 1, 1], [0.1, 0.2, 0.0], [0.97, 0.9, 1.0], *(rng.choice([0, 1, rng.uniform()], 3) for _ in range(300))]
    for values in rates:
        for key in ("attack/pli/accuracy", "attack/vmi/top1", "attack/lira/auc", "attack/lira/tpr_at_1pct_fpr"):
            low, high = mean_interval(key, values)
            assert 0 <= low <= np.mean(values) <= high <= 1, (key, values)
    distances = [[0.01, 0.02, 5.0], [25.0, 30.0, 45.0], *(np.exp(rng.normal(0, rng.uniform(0.01, 2), 3)) for _ in range(300))]
    for values in distances:
        for key in ("attack/ldia/kl", "attack/gmi/fid", "attack/gmi/knn_dist", "attack/ldia/l1"):
            low, high = mean_interval(key, values)
            assert 0 <= low <= np.mean(values) <= high < math.inf, (key, values)


def test_mean_interval_takes_the_scale_of_the_metric_kind() -> None:
    values = [0.2, 0.3, 0.4]
    assert mean_interval("attack/pli/accuracy", values) == rate_interval(values)
    assert mean_interval("attack/ldia/kl", values) == positive_interval(values)
    assert mean_interval("attack/pli/ssim", values) == t_interval(values)
    assert mean_interval("attack/vmi/kl", [-0.1, 0.2, 0.3]) == t_interval([-0.1, 0.2, 0.3])  # VMI's loss term, not LDIA's KL
    assert mean_interval("attack/pli/accuracy", [0.2, float("nan"), 0.4]) == rate_interval([0.2, 0.4])


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("attack/pli/accuracy", MetricKind.rate),
        ("attack/pli/prior_eval_top1", MetricKind.rate),
        ("attack/lira/paper_tpr_at_0.1pct_fpr", MetricKind.rate),
        ("attack/lattack/target_top1", MetricKind.rate),
        ("protocol/client_acc_mean", MetricKind.rate),
        ("attack/ldia/kl_eq7", MetricKind.positive),
        ("attack/gmi/fid", MetricKind.positive),
        ("attack/pli/too_close_to_public", MetricKind.positive),
        ("time/total_s", MetricKind.positive),
        ("attack/pli/ssim", MetricKind.signed),
        ("attack/lattack/feature_cosine_raw", MetricKind.signed),
        ("protocol/distill_loss", MetricKind.signed),
    ],
)
def test_the_metric_kind_table(key: str, kind: MetricKind) -> None:
    assert metric_kind(key) == kind


def test_over_targets_an_inversion_rate_is_wider_than_wilson_over_correlated_images() -> None:
    """Five targets of 10 images each, every image of a target a hit or every one a miss (a label's inversions share
    its search): Wilson over the 50 images, [0.46, 0.72], takes them for 50 independent trials; over the 5 targets,
    [0.13, 0.94], the only independent units."""
    per_target = np.array([1.0, 1.0, 0.0, 1.0, 0.0])
    images = wilson_interval(30, 50)
    targets = mean_interval("top1", per_target)
    assert images == pytest.approx((0.4618, 0.7239), abs=1e-4)
    z, n = 2.7764451051977934, 4  # t_{4, 0.975}; n* = 0.6 · 0.4 / (0.3 / 5) = 4 trials
    centre, half = (0.6 + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(0.24 / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert targets == pytest.approx((centre - half, centre + half)) and targets == pytest.approx((0.1312, 0.9371), abs=1e-4)


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
        assert membership_points(members[None], non_members[None], LEVELS)[0] == pytest.approx(expected, abs=1e-6)  # torchmetrics: float32


def test_a_non_member_of_weight_k_counts_as_k_copies() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        members, non_members = np.round(rng.normal(0.5, 1, 40), 1), np.round(rng.normal(0, 1, 300), 1)
        weights = rng.integers(0, 4, 300)
        weighted = membership_points(members[None], non_members, LEVELS, weights[None])
        repeated = membership_points(members[None], np.repeat(non_members, weights)[None], LEVELS)
        assert weighted == pytest.approx(repeated, abs=1e-12)
    assert np.isnan(membership_points(members[None], non_members, LEVELS, np.zeros((1, 300)))).all()


def test_membership_bootstrap_is_scipys_on_distinct_non_members() -> None:
    """One client whose non-member draws are distinct candidates: resampling the candidates is resampling the
    non-members, so the intervals are those of scipy.stats.bootstrap over (members, non-members) with the same seed."""
    rng = np.random.default_rng(0)
    members, non_members, ids = rng.normal(0.5, 1, 300), rng.normal(0, 1, 300), np.arange(1000, 1300)
    ours = membership_bootstrap([ClientScores(members, non_members, ids)], [ids], LEVELS, resamples=500, seed=3)
    theirs = stats.bootstrap(
        (members, non_members),
        lambda m, n, axis=-1: membership_points(m, n, LEVELS).T,
        n_resamples=500,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(3),
    ).confidence_interval
    np.testing.assert_allclose(np.asarray(ours), np.column_stack([theirs.low, theirs.high]), rtol=0, atol=1e-12)
    assert membership_bootstrap([ClientScores(members, non_members, ids)], [ids], LEVELS, resamples=500, seed=3) == ours  # seeded


def test_shared_and_repeated_non_members_widen_the_interval() -> None:
    """Five clients drew the same 100 non-members: their errors move together, and resampling the candidates once for
    all clients gives an AUC interval 1.5 times as wide as resampling each client's draws apart (measured: 1.51 at
    seed 1), which took 500 shared draws for 500 independent ones. One client whose 100 draws are 25 candidates drawn
    4 times each: resampling the 25 candidates gives an interval 1.64 times as wide as resampling the 100 draws."""
    rng = np.random.default_rng(1)
    ids, non_members = np.arange(100), rng.normal(0, 1, 100)
    clients = [ClientScores(rng.normal(1, 1, 100), non_members, ids) for _ in range(5)]
    shared = membership_bootstrap(clients, [ids], LEVELS, resamples=1000)[2]

    def mean_over_clients(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return sum(membership_points(samples[2 * k], samples[2 * k + 1], LEVELS) for k in range(5)).T / 5

    apart = stats.bootstrap(
        tuple(a for c in clients for a in (c.members, c.non_members)),
        mean_over_clients,
        n_resamples=1000,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert shared[1] - shared[0] > 1.3 * (apart.high[2] - apart.low[2])
    members, candidates, drawn = rng.normal(1, 1, 100), rng.normal(0, 1, 25), np.repeat(np.arange(25), 4)  # 25 drawn 4 times each
    repeated = membership_bootstrap([ClientScores(members, candidates[drawn], drawn)], [np.arange(25)], LEVELS)[2]
    as_distinct = stats.bootstrap(
        (members, candidates[drawn]),
        lambda m, n, axis=-1: membership_points(m, n, LEVELS).T,
        n_resamples=1000,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert repeated[1] - repeated[0] > 1.3 * (as_distinct.high[2] - as_distinct.low[2])


def test_membership_bootstrap_brackets_the_mean_over_clients_and_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(2)

    def clients(n: int) -> tuple[list[ClientScores], list[np.ndarray]]:
        ids = [np.arange(k * n, (k + 1) * n) for k in range(3)]
        return [ClientScores(rng.normal(0.5, 1, n), rng.normal(0, 1, n), i) for i in ids], [np.concatenate(ids)]

    small, large = clients(100), clients(1600)
    point = np.mean([membership_points(c.members[None], c.non_members, LEVELS)[0] for c in small[0]], axis=0)
    intervals = membership_bootstrap(*small, LEVELS, resamples=400)
    assert all(low <= value <= high for (low, high), value in zip(intervals, point))
    auc_small, auc_large = intervals[2], membership_bootstrap(*large, LEVELS, resamples=400)[2]
    assert auc_large[1] - auc_large[0] < 0.5 * (auc_small[1] - auc_small[0])
    separated = ClientScores(np.full(10, 2.0), np.zeros(10), np.arange(10))
    assert membership_bootstrap([separated], [np.arange(10)], LEVELS, resamples=100)[2] == (1.0, 1.0)


def test_membership_bootstrap_memory_does_not_grow_with_the_resamples() -> None:
    """evaluation.bootstrap_resamples at its largest, 100,000: the hand-rolled bootstrap asked 29.8 GiB at 10⁹; this one
    holds a bounded batch of resamples at once (peak under 150 MB, whatever the resamples), and the config refuses more."""
    rng = np.random.default_rng(0)
    clients = [ClientScores(rng.normal(0.3, 1, 50), rng.normal(0, 1, 50), rng.integers(0, 100, 50)) for _ in range(2)]
    strata = [np.unique(np.concatenate([c.non_member_ids for c in clients]))]
    tracemalloc.start()
    membership_bootstrap(clients, strata, LEVELS, resamples=100_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 150 * 2**20


def test_bootstrap_resamples_has_an_upper_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "evaluation.bootstrap_resamples=1000000000", "--print-config"]) == 2
    assert "evaluation.bootstrap_resamples=1000000000 is out of range; allowed: [100, 100000]" in error_of(capsys.readouterr().err)


def test_membership_scorer_logs_an_interval_beside_each_metric() -> None:
    rng = torch.Generator().manual_seed(0)
    n = 200
    origin = torch.cat([torch.zeros(n, dtype=torch.long), torch.full((n,), -1)])
    pool = CandidatePool(torch.zeros(2 * n, 1, 2, 2), torch.zeros(2 * n, dtype=torch.long), origin)
    scores = torch.randn(1, 2 * n, generator=rng, dtype=torch.float64) + (origin == 0).double()
    metrics = MembershipScorer(pool, seed=0, resamples=200)("lira", MembershipScores((0,), scores, paper_scores=scores * 2)).metrics
    for key in (*FPR_LEVELS, "auc", "balanced_accuracy"):
        for prefix in ("", "paper_"):
            value, low, high = (metrics[f"attack/lira/{prefix}{key}{end}"] for end in ("", "_ci_low", "_ci_high"))
            assert low <= value <= high and low < high, key
    assert 0.7 < metrics["attack/lira/auc"] < 0.85 and metrics["attack/lira/auc_ci_low"] > 0.6
    assert metrics["attack/lira/paper_auc_ci_low"] == metrics["attack/lira/auc_ci_low"]  # a monotone transform: the same ranks


# ----------------------------------------------------------------------------------------------------- FID
def _features(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_the_fid_interval_is_scipys_standard_error_of_torchmetrics_fid_on_the_log_scale() -> None:
    """Three labels of 6 inversions, resampled within each label: ours (the n × n Fréchet distance per replicate) is
    θ̂ · exp(± 1.96 · se*/θ̂) with se* the standard error scipy.stats.bootstrap gives for torchmetrics' FID per
    replicate, at the same seed."""
    from torch import nn
    from torchmetrics.image.fid import FrechetInceptionDistance

    from fdattack.functional.frechet import FrechetToReference

    class Given(nn.Module):
        num_features = 8

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    real, fake = _features(200, 8, 0) * 0.5, _features(18, 8, 1) + 0.4
    strata = [np.arange(j, 18, 3) for j in range(3)]

    def torchmetrics_fid(*rows: np.ndarray) -> float:
        metric = FrechetInceptionDistance(feature=Given())
        metric.update(real, real=True)
        metric.update(fake[torch.as_tensor(np.concatenate(rows))], real=False)
        return float(metric.compute())

    distance = FrechetToReference(real).of_rows(fake)
    ours = positive_bootstrap_interval(strata, lambda *rows: distance(torch.as_tensor(np.concatenate(rows))), seed=5)
    se = stats.bootstrap(
        strata, torchmetrics_fid, n_resamples=STANDARD_ERROR_RESAMPLES, vectorized=False, rng=np.random.default_rng(5)
    ).standard_error
    fid = torchmetrics_fid(*strata)
    half = 1.959963984540054 * se
    assert ours == pytest.approx((fid * math.exp(-half / fid), fid * math.exp(half / fid)), rel=1e-5)


def test_the_fid_interval_holds_the_fid_where_the_percentile_interval_misses_it() -> None:
    """64 Gaussian images in 512 features: a resample repeats a third of the images and its FID sits above the FID in
    every replicate, so the percentile interval misses it; the interval from the standard error holds it, above 0."""
    from fdattack.functional.frechet import FrechetToReference

    reference = FrechetToReference(_features(1500, 512, 0))
    fake = _features(64, 512, 1) + 0.3
    distance = reference.of_rows(fake)
    fid = reference(fake)

    def of(*rows: np.ndarray) -> float:
        return distance(torch.as_tensor(np.concatenate(rows)))

    percentile = stats.bootstrap((np.arange(64),), of, n_resamples=200, vectorized=False, method="percentile", rng=np.random.default_rng(0))
    assert percentile.confidence_interval.low > fid
    low, high = positive_bootstrap_interval([np.arange(64)], of)
    assert 0 < low < fid < high and high - low < 0.1 * fid
    assert all(math.isnan(v) for v in positive_bootstrap_interval([np.arange(1), np.arange(1, 2)], of))  # one image per label


# ----------------------------------------------------------------------------------------------- comparisons
def test_paired_difference_by_hand() -> None:
    """a − b = [0.1, 0.15, 0.2]: mean 0.15, sd 0.05, t = 0.15 / (0.05/√3) = 3√3 = 5.196; with 2 degrees of freedom
    the two-sided p is 1 − t/√(t² + 2) = 1 − √(27/29) = 0.0351, the interval 0.15 ± t₂ · 0.05/√3."""
    difference = paired_difference([0.5, 0.6, 0.7], [0.4, 0.45, 0.5])
    assert difference.mean == pytest.approx(0.15) and difference.n == 3
    assert (difference.low, difference.high) == pytest.approx((0.15 - T2 * 0.05 / math.sqrt(3), 0.15 + T2 * 0.05 / math.sqrt(3)))
    assert difference.p_value == pytest.approx(1 - math.sqrt(27 / 29), rel=1e-9)
    left_out = paired_difference([0.5, float("nan"), 0.7, 0.9], [0.4, 0.45, 0.5, 0.8])
    assert left_out.n == 3 and left_out.mean == pytest.approx(0.4 / 3)
    assert math.isnan(paired_difference([0.5, 0.6], [0.4, 0.5]).p_value)  # no spread: the t test cannot scale
    # equal at every seed up to rounding (0.6 − 0.8 and 0.2 − 0.4 differ in the 17th digit): still no spread, not p ≈ 1e-32
    rounded = paired_difference([0.6, 0.2, 0.6], [0.8, 0.4, 0.8])
    assert rounded.mean == pytest.approx(-0.2) and math.isnan(rounded.p_value)
    # the same −0.1 at every seed with each seed's own spread (sd 0.05 of its difference): t = 0.1 / (0.05/√3) = 2√3
    # a rate's difference from a control at 0.1 cannot pass 0.9: the interval is cut there (plain t reached 1.06)
    bounded = paired_difference([0.7, 1.0, 1.0], [0.1, 0.1, 0.1], bounds=(0.0, 1.0))
    assert bounded.high == pytest.approx(0.9) and paired_difference([0.7, 1.0, 1.0], [0.1, 0.1, 0.1]).high > 0.9
    floored = paired_difference([0.1, 0.1, 0.1], [0.2, 0.2, 0.2], within=[0.05**2] * 3)
    assert floored.p_value == pytest.approx(2 * stats.t.sf(2 * math.sqrt(3), 2)) and floored.low < -0.1 < floored.high
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([0.5, 0.6], [0.4])


def test_holm_by_hand() -> None:
    """p = [0.01, 0.04, 0.03, 0.005]: sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 → max 0.06; at
    α = 0.05 the first and last survive. p = [0.01, 0.02, 0.03]: Bonferroni (α/3 = 0.0167) keeps one, Holm all three
    (0.01 ≤ 0.05/3, 0.02 ≤ 0.05/2, 0.03 ≤ 0.05). A NaN counts in m and never survives."""
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.01, 0.02, 0.03]) == [True, True, True] and [p * 3 <= 0.05 for p in (0.01, 0.02, 0.03)] == [True, False, False]
    assert holm([0.01, float("nan"), 0.03]) == [True, False, False]  # 0.01·3 = 0.03, then 0.03·2 = 0.06
    assert holm([0.2, 0.5]) == [False, False] and holm([]) == []


# ----------------------------------------------------------------------------------------------- scorers
def test_across_seeds_each_metric_takes_its_kind() -> None:
    replicas = [
        {"attack/pli/accuracy": 0.9, "attack/ldia/kl": 0.01, "attack/pli/ssim": 0.2},
        {"attack/pli/accuracy": 1.0, "attack/ldia/kl": 0.02, "attack/pli/ssim": 0.3},
        {"attack/pli/accuracy": 1.0, "attack/ldia/kl": 5.0, "attack/pli/ssim": 0.4},
    ]
    aggregate = aggregate_metrics(replicas)
    for key, interval in (
        ("attack/pli/accuracy", rate_interval([0.9, 1.0, 1.0])),
        ("attack/ldia/kl", positive_interval([0.01, 0.02, 5.0])),
        ("attack/pli/ssim", t_interval([0.2, 0.3, 0.4])),
    ):
        assert (aggregate[key + "_ci_low"], aggregate[key + "_ci_high"]) == pytest.approx(interval)
    assert aggregate["attack/pli/accuracy_ci_high"] <= 1 and aggregate["attack/ldia/kl_ci_low"] >= 0


def test_label_distribution_intervals_are_over_the_clients_above_zero() -> None:
    """LDIA's KL and the other distances: the interval of the mean over the clients' distances, on the log scale (the
    Chebyshev and total-variation distances, within [0, 1], as rates)."""
    from fdattack.functional.label_distribution import distances

    class Split:
        num_classes = 3
        private = [type("P", (), {"labels": torch.tensor(labels)})() for labels in ([0, 0, 1], [1, 2, 2], [0, 1, 2])]

    scorer = LabelDistributionScorer(Split(), seed=0)  # type: ignore[arg-type]
    estimates = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])
    metrics = scorer("ldia", LabelDistributions((0, 1, 2), estimates)).metrics
    per_client = distances(scorer.truth, estimates.double())
    for key, values in per_client.items():
        low, high = metrics[f"attack/ldia/{key}_ci_low"], metrics[f"attack/ldia/{key}_ci_high"]
        expected = rate_interval(values.numpy()) if key in ("chebyshev", "tv") else positive_interval(values.numpy())
        assert (low, high) == pytest.approx(expected) and 0 <= low < metrics[f"attack/ldia/{key}"] < high
    assert t_interval(per_client["kl"].numpy())[0] < 0  # where Student's t reached below 0
    assert metrics["attack/ldia/kl"] == pytest.approx(per_client["kl"].numpy().mean())


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


def test_the_distances_between_two_distributions_keep_their_interval_inside_0_1() -> None:
    """LDIA's Chebyshev and total-variation distances lie in [0, 1]; the default run's Chebyshev over 4 clients printed
    [0.328, 1.251] on the log scale. As rates their interval stays inside [0, 1]."""
    from fdattack.statistics.intervals import mean_interval
    from fdattack.statistics.kinds import MetricKind, metric_kind

    values = [0.30, 0.45, 0.85, 0.89]
    for key in ("attack/ldia/chebyshev", "attack/ldia/tv", "attack/ldia/uniform_chebyshev"):
        assert metric_kind(key) == MetricKind.rate
        low, high = mean_interval(key, values)
        assert 0.0 <= low < sum(values) / 4 < high <= 1.0
