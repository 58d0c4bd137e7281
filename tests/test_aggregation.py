"""Aggregation rules against hand-computed values (numbers written out, not produced by the code under test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fdattack.fd.aggregation import (
    diakonikolas_filter,
    era,
    fedavg,
    fedgems_ensemble,
    fedgems_fusion_loss,
    fedgems_kl,
    fedgems_subsets,
    mean_logits,
    robust_mean,
    softmax_uploads,
)
from fdattack.functional import entropy

ATOL = 1e-5


# ---------------------------------------------------------------------------------------------- FedMD, DS-FL
def test_mean_logits_of_two_clients() -> None:
    uploads = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[3.0, 0.0], [1.0, -2.0]]])
    assert torch.equal(mean_logits(uploads), torch.tensor([[2.0, 1.0], [2.0, 1.0]]))


def test_era_sharpens_the_mean_probability() -> None:
    # mean probs [0.6, 0.4] / 0.1 = [6, 4]; softmax = [1/(1+e^-2), e^-2/(1+e^-2)] = [0.880797, 0.119203].
    probs = torch.tensor([[[0.7, 0.3]], [[0.5, 0.5]]])
    assert torch.allclose(era(probs, 0.1), torch.tensor([[0.880797, 0.119203]]), atol=ATOL)
    # T = 1 on the same mean: softmax([0.6, 0.4]) = [0.549834, 0.450166].
    assert torch.allclose(era(probs, 1.0), torch.tensor([[0.549834, 0.450166]]), atol=ATOL)


def test_era_on_uploaded_logits() -> None:
    # softmax([ln 3, 0]) = [0.75, 0.25]; softmax([0, 0]) = [0.5, 0.5]; mean [0.625, 0.375] / 0.1 -> softmax([6.25, 3.75]).
    logits = torch.tensor([[[math.log(3.0), 0.0]], [[0.0, 0.0]]])
    first = 1.0 / (1.0 + math.exp(-2.5))
    assert torch.allclose(softmax_uploads(logits)[0, 0], torch.tensor([0.75, 0.25]))
    assert torch.allclose(era(softmax_uploads(logits), 0.1), torch.tensor([[first, 1.0 - first]]), atol=ATOL)


def test_era_rejects_non_positive_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        era(torch.full((2, 1, 2), 0.5), 0.0)


# ---------------------------------------------------------------------------------------------- FedGEMS
def test_entropy_natural_log() -> None:
    assert torch.allclose(entropy(torch.tensor([0.5, 0.5])), torch.tensor(math.log(2.0)))
    assert entropy(torch.tensor([1.0, 0.0])).item() == 0.0
    assert torch.allclose(entropy(torch.tensor([[0.25] * 4, [1.0, 0, 0, 0]])), torch.tensor([math.log(4.0), 0.0]))


def test_fedgems_ensemble_three_clients_one_wrong() -> None:
    # y = 0. Client 0 logits [2, 0] (right), client 1 [1, 0] (right), client 2 [0, 3] (wrong -> w = 0).
    # H(softmax([2,0])) = 0.365334, H(softmax([1,0])) = 0.582203 -> w = [2.737222, 1.717614, 0];
    # omega = softmax(w) = [0.701515, 0.253062, 0.045423] (the wrong client keeps e^0 / sum);
    # z = 0.701515*[2,0] + 0.253062*[1,0] + 0.045423*[0,3] = [1.656092, 0.136269].
    logits = torch.tensor([[[2.0, 0.0]], [[1.0, 0.0]], [[0.0, 3.0]]])
    h = [
        -sum(p * math.log(p) for p in (math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1))),
        -sum(p * math.log(p) for p in (math.exp(1) / (math.exp(1) + 1), 1 / (math.exp(1) + 1))),
    ]
    assert h == pytest.approx([0.365334, 0.582203], abs=1e-6)
    omega = [0.701515, 0.253062, 0.045423]
    expected = [2 * omega[0] + omega[1], 3 * omega[2]]
    assert expected == pytest.approx([1.656092, 0.136269], abs=1e-5)
    assert torch.allclose(fedgems_ensemble(logits, torch.tensor([0])), torch.tensor([expected]), atol=ATOL)


def test_fedgems_ensemble_all_wrong_is_the_plain_mean_and_one_hot_is_finite() -> None:
    logits = torch.tensor([[[0.0, 2.0], [500.0, 0.0]], [[1.0, 3.0], [400.0, 0.0]]])
    out = fedgems_ensemble(logits, torch.tensor([0, 0]))
    assert torch.allclose(out[0], torch.tensor([0.5, 2.5]))  # both wrong: softmax([0, 0]) = [1/2, 1/2]
    assert torch.isfinite(out).all()  # entropies underflow to 0 on row 1; weights stay finite


@pytest.mark.filterwarnings("ignore:reduction. .mean.")
def test_fedgems_kl_code_mode_is_the_authors_kldivloss() -> None:
    # z = [0, 1], teacher = [1, 0]: q = [0.268941, 0.731059], ln q - ln p_t = [-1, 1];
    # sum q (ln q - ln p_t) = 0.462117; the element-wise mean over J = 2 gives 0.231059.
    z, t = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    assert torch.allclose(fedgems_kl(z, t, "code"), torch.tensor(0.231059), atol=ATOL)
    # standard: batchmean KL(p_t || q) = sum p_t (ln p_t - ln q) = 0.731059 - 0.268941 = 0.462117.
    assert torch.allclose(fedgems_kl(z, t, "standard"), torch.tensor(0.462117), atol=ATOL)
    torch.manual_seed(0)
    z, t = torch.randn(5, 4), torch.randn(5, 4)
    authors = nn.KLDivLoss()(torch.log_softmax(t, -1), torch.softmax(z, -1))
    assert torch.allclose(fedgems_kl(z, t, "code"), authors, atol=1e-6)
    with pytest.raises(ValueError, match="kl_mode"):
        fedgems_kl(z, t, "forward")


CE_RIGHT = math.log(1 + math.exp(-2))  # CE([2, 0], y=0) = 0.126928
CE_WRONG = math.log(1 + math.exp(1))  # CE([0, 1], y=0) = 1.313262
KL_CODE = 0.231059  # fedgems_kl([0, 1], [1, 0], "code"), see above
KL_STANDARD = 0.462117


def test_fusion_loss_s1_row() -> None:
    loss, s1 = fedgems_fusion_loss(
        torch.tensor([[2.0, 0.0]]), torch.tensor([0]), torch.zeros(1, 2), torch.tensor([False]), None, 0.75, "code"
    )
    assert loss.item() == pytest.approx(0.126928, abs=1e-6) and CE_RIGHT == pytest.approx(0.126928, abs=1e-6)
    assert s1.tolist() == [True]


@pytest.mark.parametrize(("kl_mode", "kl"), [("code", KL_CODE), ("standard", KL_STANDARD)])
def test_fusion_loss_s2_row_uses_the_pool(kl_mode: str, kl: float) -> None:
    # 0.75 * 1.313262 + 0.25 * KL: code 1.042711, standard 1.100476.
    loss, s1 = fedgems_fusion_loss(
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([0]),
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([True]),
        torch.tensor([[9.0, -9.0]]),
        0.75,
        kl_mode,
    )
    assert loss.item() == pytest.approx(0.75 * CE_WRONG + 0.25 * kl, abs=1e-5)
    assert loss.item() == pytest.approx({"code": 1.042711, "standard": 1.100476}[kl_mode], abs=1e-5)
    assert s1.tolist() == [False]


def test_fusion_loss_s3_row_uses_the_ensemble() -> None:
    loss, _ = fedgems_fusion_loss(
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([0]),
        torch.tensor([[-9.0, 9.0]]),
        torch.tensor([False]),
        torch.tensor([[1.0, 0.0]]),
        0.75,
        "code",
    )
    assert loss.item() == pytest.approx(1.042711, abs=1e-5)
    with pytest.raises(ValueError, match="S3"):
        fedgems_fusion_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([0]), torch.zeros(1, 2), torch.tensor([False]), None, 0.75, "code")


def test_fusion_loss_sums_per_subset_means() -> None:
    # Rows: two S1 rows ([2,0] and [1,0], y=0), one S2 row, one S3 row. S1 contributes the MEAN of its two
    # CEs: (0.126928 + 0.313262) / 2 = 0.220095; S2 and S3 each 1.042711 (as above). Total 2.305517.
    z = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    y = torch.tensor([0, 0, 0, 0])
    pool = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    has_pool = torch.tensor([True, True, False, False])
    ensemble = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    loss, s1 = fedgems_fusion_loss(z, y, pool, has_pool, ensemble, 0.75, "code")
    s1_mean = (CE_RIGHT + math.log(1 + math.exp(-1))) / 2
    assert s1_mean == pytest.approx(0.220095, abs=1e-6)
    assert loss.item() == pytest.approx(s1_mean + 2 * 1.042711, abs=1e-5)
    assert s1.tolist() == [True, False, True, False]
    subsets = fedgems_subsets(z, y, has_pool)
    assert [m.tolist() for m in subsets] == [[True, False, True, False], [False, True, False, False], [False, False, False, True]]
    loss.backward()
    assert z.grad is not None and z.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- Cronus
def reference_filter(data: np.ndarray, eps: float, tau: float, cher: float = 2.5) -> np.ndarray:
    """Line-by-line translation of filterGaussianMean.m (hoonose/robust-filter); returns the kept rows."""
    n, d = data.shape
    centered = (data - data.mean(axis=0)) / math.sqrt(n)
    u, s, _ = np.linalg.svd(centered.T, full_matrices=False)
    if s[0] ** 2 < 1 + 3 * eps * math.log(1 / eps):
        return data
    v = u[:, 0]
    score = np.abs(data @ v - np.median(data @ v))
    order = np.argsort(score, kind="stable")
    rows, score = data[order], score[order]
    for i in range(1, n + 1):
        if (n - i) > cher * n * (math.erfc((score[i - 1] - 2 * eps) / math.sqrt(2)) / 2 + eps / (d * math.log(d * eps / tau))):
            break
    if i == 1 or i == n:
        return data
    return reference_filter(rows[:i], eps, tau, cher)


def _honest_probabilities(k: int, n: int, j: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.softmax(3 * torch.randn(k, n, j, generator=gen), dim=-1)


def test_filter_returns_the_mean_on_honest_probabilities() -> None:
    x = _honest_probabilities(10, 1, 10)[:, 0]
    mean, kept = diakonikolas_filter(x, 0.1, 0.1)
    assert kept.all()
    assert torch.allclose(mean, x.mean(dim=0), atol=1e-7)


def test_robust_mean_on_honest_probabilities_is_the_plain_mean() -> None:
    uploads = _honest_probabilities(10, 200, 10)
    mean, filtered = robust_mean(uploads, 0.1, 0.1)
    assert filtered.shape == (200,) and filtered.sum().item() == 0
    assert torch.allclose(mean, uploads.mean(dim=0), atol=1e-7)


def _line(honest_max: float) -> torch.Tensor:
    """10 points in R^10 on the e_1 axis: 9 honest first coordinates and one outlier at 50."""
    x = torch.zeros(10, 10, dtype=torch.float64)
    x[:, 0] = torch.tensor([-honest_max, -1, -0.5, -0.25, 0, 0, 0.25, 0.5, 1, 50], dtype=torch.float64)
    return x


def test_filter_removes_one_outlier_among_ten_by_hand() -> None:
    # Variance along e_1 = (8.875 + 2500)/10 - 4.75^2 = 228.3 >= 1 + 0.3 ln 10 = 1.691: the test fires.
    # Median 0; sorted scores 0,0,.25,.25,.5,.5,1,1,2.5,50. Rule: n - i > 25 (Q(s_i - 0.2) + 0.1/(10 ln 10)),
    # Q = Gaussian upper tail. i=9: 1 > 25 (Q(2.3) + 0.004343) = 25 (0.010724 + 0.004343) = 0.377 -> first hit
    # (i <= 8 need 2..9 > 25 (Q(0.8)=0.2119 | Q(0.3)=0.3821 | Q(0.05)=0.4801 | Q(-0.2)=0.5793 + ...)).
    # Keep the 9 honest points; their variance 8.875/9 - (2.5/9)^2 = 0.909 < 1.691: stop at mean -2.5/9 e_1.
    x = _line(2.5)
    mean, kept = diakonikolas_filter(x, 0.1, 0.1)
    assert kept.tolist() == [True] * 9 + [False]
    assert mean[0].item() == pytest.approx(-2.5 / 9) and mean[1:].abs().max().item() == 0.0
    assert x.mean(dim=0)[0].item() == pytest.approx(4.75)


def test_filter_keeps_one_outlier_when_honest_spread_is_small() -> None:
    # Same, honest extreme 1.5: i=9 needs 1 > 25 (Q(1.3) + 0.004343) = 25 (0.096800 + 0.004343) = 2.53: false,
    # and no smaller i qualifies, so the reference rule returns the plain mean (n = 10 is far below the
    # n ~ d/eps^2 the filter is designed for).
    x = _line(1.5)
    mean, kept = diakonikolas_filter(x, 0.1, 0.1)
    assert kept.all()
    assert torch.allclose(mean, x.mean(dim=0))


def test_filter_removes_eps_fraction_of_far_outliers() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(100, 10, generator=gen, dtype=torch.float64)
    x[90:] = 5.0  # 10 % corrupted, as in the reference test script
    mean, kept = diakonikolas_filter(x, 0.1, 0.1)
    assert not kept[90:].any()
    assert mean.norm() < x.mean(dim=0).norm() / 3  # true mean 0; the plain mean is about 0.5 * sqrt(10) away
    assert torch.allclose(mean, x[kept].mean(dim=0))


@pytest.mark.parametrize("n", [10, 30, 100])
def test_filter_matches_the_reference_matlab_translation(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    for d in (3, 10, 40):
        for outliers in (0, 1, n // 10):
            for scale in (1.0, 2.0):
                x = scale * torch.randn(n, d, generator=gen, dtype=torch.float64)
                if outliers:
                    x[-outliers:] += 6.0
                mean, kept = diakonikolas_filter(x, 0.1, 0.1)
                ref = reference_filter(x.numpy(), 0.1, 0.1)
                assert kept.sum().item() == len(ref), (n, d, outliers, scale)
                assert np.allclose(np.sort(x[kept].numpy(), axis=0), np.sort(ref, axis=0))
                assert np.allclose(mean.numpy(), ref.mean(axis=0))


def test_robust_mean_filters_each_sample_independently() -> None:
    gen = torch.Generator().manual_seed(1)
    honest = _honest_probabilities(10, 3, 10)
    planted = torch.randn(100, 10, generator=gen, dtype=torch.float64)
    planted[90:] = 5.0
    uploads = torch.zeros(100, 3, 10, dtype=torch.float64)
    uploads[:10, 0], uploads[:, 1], uploads[:10, 2] = honest[:, 0].double(), planted, honest[:, 2].double()
    uploads[10:, 0], uploads[10:, 2] = uploads[:10, 0].mean(0), uploads[:10, 2].mean(0)
    mean, filtered = robust_mean(uploads, 0.1, 0.1)
    expected_mean, kept = diakonikolas_filter(planted, 0.1, 0.1)
    assert filtered.tolist() == [0, int((~kept).sum()), 0] and filtered[1] >= 10
    assert torch.allclose(mean[1], expected_mean)
    assert torch.allclose(mean[[0, 2]], uploads[:, [0, 2]].mean(dim=0))


def test_filter_argument_checks() -> None:
    with pytest.raises(ValueError, match="eps"):
        robust_mean(torch.rand(3, 2, 4), 0.0, 0.1)
    with pytest.raises(ValueError, match="shape"):
        diakonikolas_filter(torch.rand(3), 0.1, 0.1)


# ---------------------------------------------------------------------------------------------- FedAvg
def test_fedavg_weighted_mean_max_counter_and_module_prefix() -> None:
    a = {
        "module.w": torch.tensor([1.0, 2.0]),
        "module.bn.running_mean": torch.tensor([0.0]),
        "module.bn.num_batches_tracked": torch.tensor(3),
    }
    b = {"w": torch.tensor([5.0, 6.0]), "bn.running_mean": torch.tensor([4.0]), "bn.num_batches_tracked": torch.tensor(7)}
    out = fedavg([a, b], [1.0, 3.0])
    assert list(out) == ["w", "bn.running_mean", "bn.num_batches_tracked"]
    assert torch.equal(out["w"], torch.tensor([4.0, 5.0]))  # (1*[1,2] + 3*[5,6]) / 4
    assert torch.equal(out["bn.running_mean"], torch.tensor([3.0]))  # (0 + 12) / 4
    assert out["bn.num_batches_tracked"].item() == 7 and out["bn.num_batches_tracked"].dtype == torch.int64
    assert out["w"].dtype == torch.float32


def test_fedavg_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="different keys"):
        fedavg([{"w": torch.ones(1)}, {"v": torch.ones(1)}], [1.0, 1.0])
    with pytest.raises(ValueError, match="positive sum"):
        fedavg([{"w": torch.ones(1)}], [0.0])
    with pytest.raises(ValueError, match="one weight per state"):
        fedavg([{"w": torch.ones(1)}], [1.0, 2.0])
