"""FedInverse's HSIC (fedinverse.md §5) against hand values, independent NumPy implementations, the properties an
independence measure must have, and the spec's own numbers (§5.5)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from fdattack.functional import (
    HSICOptions,
    dependence,
    hsic_biased,
    hsic_loss_term,
    hsic_unbiased,
    kernel_coco,
    kernel_matrix,
    nhsic,
    split_halves,
)

ESTIMATORS = ("nhsic_code", "biased_eq3", "unbiased", "coco_code")
X3 = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)  # D = [[0, 1, 4], [1, 0, 5], [4, 5, 0]]
D3 = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 5.0], [4.0, 5.0, 0.0]], dtype=torch.float64)


def _random_kernels(m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(m, 3, generator=g, dtype=torch.float64), torch.randn(m, 2, generator=g, dtype=torch.float64)
    return torch.exp(-(torch.cdist(x, x) ** 2) / 4), torch.exp(-(torch.cdist(y, y) ** 2) / 2)


def _uniform_halves(m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(m, d, generator=g, dtype=torch.float64), torch.rand(m, d, generator=g, dtype=torch.float64)


def _code_nhsic(x: np.ndarray, y: np.ndarray, kernel_dtype: type = np.float64) -> float:
    """The released ``hsic_normalized_cca`` (σ = 5, d-scaled Gaussian kernels, ε = 1e-5) transliterated to NumPy."""
    m = x.shape[0]
    h = np.eye(m) - np.ones((m, m)) / m

    def centred_kernel(a: np.ndarray) -> np.ndarray:
        r = (a * a).sum(1)[:, None]
        k = np.exp(-np.abs(r - 2 * a @ a.T + r.T) / (2 * 25.0 * a.shape[1])).astype(kernel_dtype)
        return k @ h.astype(kernel_dtype)

    kx, ky = centred_kernel(x), centred_kernel(y)
    ridge = 1e-5 * m * np.eye(m, dtype=kernel_dtype)
    rx, ry = kx @ np.linalg.inv(kx + ridge), ky @ np.linalg.inv(ky + ridge)
    return float((rx * ry.T).sum())


def test_kernel_matrices_hand_values() -> None:
    assert torch.allclose(kernel_matrix(X3, HSICOptions(sigma=1.0)), torch.exp(-D3 / 4), atol=1e-12)  # w = 2σ²d
    unscaled = HSICOptions(sigma=1.0, sigma_scale_by_dim=False)
    assert torch.allclose(kernel_matrix(X3, unscaled), torch.exp(-D3 / 2), atol=1e-12)
    linear = torch.diag(torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64))
    assert torch.equal(kernel_matrix(X3, HSICOptions(kernel="linear")), linear)
    assert torch.allclose(kernel_matrix(X3, HSICOptions(kernel="imq")), 1 / torch.sqrt(D3 + 1), atol=1e-12)
    # the code's median: over [X; X], distances {1, 4, 5} four times each plus three zeros: median 4, w = 2·4²
    assert torch.allclose(kernel_matrix(X3, HSICOptions(sigma=0.0)), torch.exp(-D3 / 32), atol=1e-12)
    # Gretton's: σ = median of the distances {1, 2, √5} = 2, w = 2σ² = 8
    assert torch.allclose(kernel_matrix(X3, HSICOptions(sigma=0.0, median="gretton")), torch.exp(-D3 / 8), atol=1e-12)


def test_code_median_keeps_its_zeros_mean_fallback_and_floor() -> None:
    # rows 0, 0, 0, 1: over [X; X] 16 of the 28 lower-triangle values are 0, so the median is 0 and the code falls
    # back to the mean 12/28 = 3/7 (the plain median of the six pairs, 0.5, would give another width): w = 2·(3/7)²
    four = torch.tensor([[0.0], [0.0], [0.0], [1.0]], dtype=torch.float64)
    assert float(kernel_matrix(four, HSICOptions(sigma=0.0))[0, 3]) == pytest.approx(math.exp(-49 / 18), abs=1e-12)
    # a median distance of 1e-4 is floored at 0.01: w = 2·0.01², K_12 = exp(−1e-4 / 2e-4)
    close = torch.tensor([[0.0], [0.01]], dtype=torch.float64)
    assert float(kernel_matrix(close, HSICOptions(sigma=0.0))[0, 1]) == pytest.approx(math.exp(-0.5), abs=1e-9)


def test_estimators_hand_values() -> None:
    # Linear kernel, x = y = X3: HX = X − (1/3, 2/3), (HX)ᵀHX = [[2/3, −2/3], [−2/3, 8/3]], Tr((HKH)²) = 76/9
    linear = HSICOptions(estimator="biased_eq3", kernel="linear")
    assert float(dependence(X3, X3, linear)) == pytest.approx(76 / 81, abs=1e-6)
    # m = 2: K H = (1 − a) H and R = (1 − a)/(1 − a + 2ε) H, so nHSIC = the product of the two ratios (Tr H = 1)
    k, l = torch.tensor([[1.0, 0.5], [0.5, 1.0]]), torch.tensor([[1.0, 0.2], [0.2, 1.0]])
    assert float(nhsic(k, l, eps=0.1)) == pytest.approx(0.5 * 0.8 / (0.7 * 1.0), abs=1e-6)
    # HKH = (1 − a)H for m = 2: ‖(1 − a)(1 − b)H‖_F^(1/2) / 2 = √(0.4) / 2
    assert float(kernel_coco(k, l)) == pytest.approx(math.sqrt(0.4) / 2, abs=1e-6)


def test_estimators_match_independent_numpy_implementations() -> None:
    k, l = _random_kernels(6, seed=3)
    kn, ln, m = k.numpy(), l.numpy(), 6
    h = np.eye(m) - np.ones((m, m)) / m
    assert float(hsic_biased(k, l)) == pytest.approx(np.trace(kn @ h @ ln @ h) / m**2, abs=1e-12)
    assert float(kernel_coco(k, l)) == pytest.approx(math.sqrt(np.linalg.norm(h @ kn @ h @ h @ ln @ h)) / m, abs=1e-12)
    rx = kn @ h @ np.linalg.inv(kn @ h + 1e-3 * m * np.eye(m))
    ry = ln @ h @ np.linalg.inv(ln @ h + 1e-3 * m * np.eye(m))
    assert float(nhsic(k, l, eps=1e-3)) == pytest.approx(float(np.trace(rx @ ry)), abs=1e-10)
    # the unbiased estimator is the U-statistic of E k_ij l_ij + E k_ij l_qr − 2 E k_ij l_iq over distinct indices
    tuples = list(itertools.permutations(range(m), 4))
    u_stat = np.mean([kn[i, j] * ln[i, j] + kn[i, j] * ln[q, r] - 2 * kn[i, j] * ln[i, q] for i, j, q, r in tuples])
    assert float(hsic_unbiased(k, l)) == pytest.approx(u_stat, abs=1e-12)


def test_every_estimator_ignores_a_constant_added_to_a_kernel() -> None:
    """``dependence`` carries the Gaussian kernel as K − 1, which is exact only because of this."""
    k, l = _random_kernels(7, seed=4)
    for estimator in (hsic_biased, hsic_unbiased, nhsic, kernel_coco):
        assert float(estimator(k - 1, l + 2.5)) == pytest.approx(float(estimator(k, l)), rel=1e-9), estimator.__name__


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_joint_permutation_symmetry_and_translation_invariance(estimator: str) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = x[:, :2] ** 2 + 0.3 * torch.randn(40, 2, generator=g, dtype=torch.float64)
    options = HSICOptions(estimator=estimator, sigma=1.0, sigma_scale_by_dim=False)
    value = float(dependence(x, y, options))
    perm = torch.randperm(40, generator=g)
    assert float(dependence(x[perm], y[perm], options)) == pytest.approx(value, rel=1e-9)
    assert float(dependence(y, x, options)) == pytest.approx(value, rel=1e-9)
    assert float(dependence(x + 7.0, y - 3.0, options)) == pytest.approx(value, rel=1e-9)
    assert float(dependence(x, y[perm], options)) < value  # unpairing the samples loses the dependence


def test_independence_detected_with_large_n() -> None:
    g = torch.Generator().manual_seed(1)
    n = 400
    x, y = torch.randn(n, 2, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
    quadratic = torch.cat([x[:, :1] ** 2, torch.randn(n, 1, generator=g, dtype=torch.float64)], 1)  # uncorrelated
    shuffled = x[torch.randperm(n, generator=g)]
    for estimator in ESTIMATORS:
        options = HSICOptions(estimator=estimator, sigma=0.0, median="gretton")
        independent, dependent = float(dependence(x, y, options)), float(dependence(x, quadratic, options))
        identical, broken = float(dependence(x, x, options)), float(dependence(x, shuffled, options))
        assert independent < dependent < identical, estimator
        assert broken < dependent, estimator
    unbiased = HSICOptions(estimator="unbiased", sigma=0.0, median="gretton")
    assert abs(float(dependence(x, y, unbiased))) < 0.02 * float(dependence(x, x, unbiased))
    assert abs(float(dependence(x, y, unbiased))) < 0.1 * float(dependence(x, quadratic, unbiased))


def test_biased_and_unbiased_agree_as_n_grows() -> None:
    gaps = []
    for n in (30, 400):  # the bias is O(1/n)
        x = torch.randn(n, 2, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
        biased = float(dependence(x, x, HSICOptions(estimator="biased_eq3", sigma=0.0, median="gretton")))
        unbiased = float(dependence(x, x, HSICOptions(estimator="unbiased", sigma=0.0, median="gretton")))
        gaps.append(abs(biased - unbiased) / unbiased)
    assert gaps[1] < 0.02 < gaps[0]


def test_defaults_are_the_codes() -> None:
    """§5.6: nHSIC, Gaussian kernel on both sides, σ = 5 scaled by d, ε = 1e-5."""
    x, y = torch.rand(5, 7, dtype=torch.float64), torch.rand(5, 7, dtype=torch.float64)
    assert float(dependence(x, y)) == pytest.approx(_code_nhsic(x.numpy(), y.numpy()), rel=1e-9)


def test_bandwidth_effects() -> None:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    doubled = torch.cat([x, x], dim=1)  # every pixel twice: d-scaling keeps the kernel, a plain σ does not
    assert torch.allclose(kernel_matrix(doubled), kernel_matrix(x), atol=1e-12)
    plain = HSICOptions(sigma=1.0, sigma_scale_by_dim=False)
    assert not torch.allclose(kernel_matrix(doubled, plain), kernel_matrix(x, plain), atol=1e-3)
    gretton = HSICOptions(sigma=0.0, median="gretton")  # Gretton's median makes the kernel scale-free
    assert torch.allclose(kernel_matrix(10 * x, gretton), kernel_matrix(x, gretton), atol=1e-12)
    # §5.5 conclusion 2: σ = 5 with d-scaling is nearly flat in CelebA pixel space, Eq. 3 ≈ 1e-7 for m = 30
    x1, _ = _uniform_halves(30, 12288)
    assert bool((kernel_matrix(x1) > 0.99).all())
    assert 1e-8 < float(dependence(x1, x1, HSICOptions(estimator="biased_eq3"))) < 1e-6
    assert float(dependence(x1, x1, HSICOptions(estimator="biased_eq3", sigma=0.0, median="gretton"))) > 1e-3


def test_spec_numbers_of_the_code_estimator() -> None:
    """§5.5: nHSIC on uniform images, and on halves shrunk towards their means by a (m = 30, d = 12288)."""
    x1, x2 = _uniform_halves(30, 12288)
    shrink = [(1.0, 24.40), (0.5, 15.67), (0.2, 2.74), (0.1, 0.29), (0.05, 0.02)]
    for a, expected in shrink:
        value = float(dependence(x1.mean(0) + a * (x1 - x1.mean(0)), x2.mean(0) + a * (x2 - x2.mean(0))))
        assert value == pytest.approx(expected, abs=0.01), a
    # conclusion 1: ≈ m − 1 whatever the dependence (independent 24.3945, identical 24.3954 in the table)
    independent, identical = float(dependence(x1, x2)), float(dependence(x1, x1))
    assert independent == pytest.approx(24.3945, abs=0.01) and identical == pytest.approx(24.3954, abs=0.01)
    assert abs(independent - identical) < 1e-3 * 29
    a1, a2 = _uniform_halves(2, 1024)  # MNIST's m = 2: ≈ 0.988 and nearly constant
    assert float(dependence(a1, a2)) == pytest.approx(0.9878, abs=1e-3)
    assert float(dependence(a1, a1)) == pytest.approx(0.9882, abs=1e-3)
    assert float(dependence(x1, x2)) == pytest.approx(_code_nhsic(x1.numpy(), x2.numpy()), rel=1e-6)


def test_float32_keeps_the_precision_of_float64_where_the_kernel_is_flat() -> None:
    x1, x2 = _uniform_halves(30, 12288)
    for a in (0.05, 0.01):  # near-identical images around 0.5: kernel entries ≈ 1 − 1e-5 and 1 − 4e-7
        h1, h2 = x1.mean(0) + a * (x1 - x1.mean(0)), x2.mean(0) + a * (x2 - x2.mean(0))
        exact = float(dependence(h1, h2))
        assert float(dependence(h1.float(), h2.float())) == pytest.approx(exact, rel=1e-5), a
    # the code's float32 kernel matrices lose more than 1 % at a = 0.05, so the check above can fail
    h1, h2 = x1.mean(0) + 0.05 * (x1 - x1.mean(0)), x2.mean(0) + 0.05 * (x2 - x2.mean(0))
    assert _code_nhsic(h1.numpy(), h2.numpy(), np.float32) != pytest.approx(float(dependence(h1, h2)), rel=1e-2)
    assert dependence(h1.half(), h2.half()).dtype == torch.float32


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kernel", ["gaussian", "linear", "imq"])
def test_gradcheck(estimator: str, kernel: str) -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    options = HSICOptions(estimator=estimator, kernel=kernel, sigma=1.5, sigma_scale_by_dim=False)
    assert torch.autograd.gradcheck(lambda a, b: dependence(a, b, options), (x, y))


def test_median_width_carries_no_gradient() -> None:
    """As in the code (the width goes through numpy): the gradient is that of a fixed σ equal to the median."""
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64, requires_grad=True)
    y = torch.randn(6, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    sigma = float(torch.pdist(x.detach()).median())  # six rows, 15 pairs: the middle one
    median = HSICOptions(kernel_y="linear", sigma=0.0, median="gretton")
    fixed = HSICOptions(kernel_y="linear", sigma=sigma, sigma_scale_by_dim=False)
    value_median, value_fixed = dependence(x, y, median), dependence(x, y, fixed)
    assert value_median.item() == pytest.approx(value_fixed.item(), rel=1e-12)
    (grad_median,) = torch.autograd.grad(value_median, x)
    (grad_fixed,) = torch.autograd.grad(value_fixed, x)
    assert torch.allclose(grad_median, grad_fixed, atol=1e-12)


def test_split_halves_drops_the_last_sample_of_an_odd_batch() -> None:
    x = torch.arange(5 * 4, dtype=torch.float64).reshape(5, 1, 2, 2)
    x1, x2 = split_halves(x)
    assert torch.equal(x1, x[0:2].flatten(1)) and torch.equal(x2, x[2:4].flatten(1))
    assert [h.shape[0] for h in split_halves(torch.zeros(6, 3))] == [3, 3]
    with pytest.raises(ValueError, match="at least 4 samples"):
        split_halves(torch.zeros(3, 2))
    batch = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64, requires_grad=True)
    options = HSICOptions(sigma=1.0)
    torch.autograd.gradcheck(lambda b: hsic_loss_term(b, lambda_h=0.3, sign=1, options=options), (batch,))
    (grad,) = torch.autograd.grad(hsic_loss_term(batch, lambda_h=0.3, sign=1, options=options), batch)
    assert bool((grad[4] == 0).all()) and bool((grad[:4] != 0).any())  # MNIST's digit 4 never enters


def test_sign_convention() -> None:
    batch = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    value = float(dependence(*split_halves(batch)))
    assert float(hsic_loss_term(batch, lambda_h=0.05, sign=1)) == pytest.approx(0.05 * value, rel=1e-12)
    assert float(hsic_loss_term(batch, lambda_h=0.05, sign=-1)) == pytest.approx(-0.05 * value, rel=1e-12)
    # §5.4: along "spread every half away from its mean", the +1 term rises (minimising it shrinks the halves,
    # less diversity) and the −1 term falls (minimising it spreads them, more diversity)
    means = torch.cat([half.mean(0, keepdim=True).expand_as(half) for half in (batch[:4], batch[4:])])
    for sign in (1, -1):
        scale = torch.ones((), dtype=torch.float64, requires_grad=True)
        (slope,) = torch.autograd.grad(hsic_loss_term(means + scale * (batch - means), lambda_h=1.0, sign=sign), scale)
        assert float(slope) * sign > 0, sign
    assert float(hsic_loss_term(torch.zeros(1, 3), lambda_h=0.0, sign=1)) == 0.0  # the baselines: any batch, no HSIC


def test_bad_arguments_raise() -> None:
    x = torch.randn(6, 2)
    bad = [
        HSICOptions(estimator="cka"),
        HSICOptions(kernel="rbf"),
        HSICOptions(kernel_y="rbf"),  # type: ignore
        HSICOptions(sigma=-1.0),
        HSICOptions(sigma=0.0, median="mean"),
    ]  # type: ignore[arg-type]
    for options in bad:
        with pytest.raises(ValueError):
            dependence(x, x, options)
    with pytest.raises(ValueError, match="at least 4 pairs"):
        dependence(x[:3], x[:3], HSICOptions(estimator="unbiased"))
    with pytest.raises(ValueError, match="same number"):
        dependence(x, x[:5])
    with pytest.raises(ValueError, match="sign"):
        hsic_loss_term(x, lambda_h=0.05, sign=0)  # type: ignore[arg-type]
