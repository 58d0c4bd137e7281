"""The shared math of fdattack.functional against hand-computed values and the properties that define it."""

from __future__ import annotations

import math

import pytest
import torch

from fdattack.functional import (
    entropy,
    forward_difference_gradient,
    kl_divergence,
    kl_divergence_from_logits,
    l1_to_logits,
    offline_lira,
    offline_lira_float32_lambda,
    offline_lira_log_probability,
    online_lira,
    scaled_confidence,
    scaled_confidence_from_probs,
    soft_cross_entropy,
    softmax_entropy,
    topk_accuracy,
)


def test_entropy_and_kl_hand_values() -> None:
    assert float(entropy(torch.tensor([0.5, 0.5]))) == pytest.approx(math.log(2))
    assert float(entropy(torch.tensor([1.0, 0.0, 0.0]))) == 0.0
    assert float(softmax_entropy(torch.zeros(7))) == pytest.approx(math.log(7), rel=1e-6)  # the maximum, at uniform
    assert float(softmax_entropy(torch.tensor([1000.0, 0.0]))) == pytest.approx(0.0, abs=1e-6)  # no log(0) = nan
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    assert float(kl_divergence(p, q)) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert float(kl_divergence(q, q)) == 0.0
    rows = torch.softmax(torch.randn(100, 5), -1), torch.softmax(torch.randn(100, 5), -1)
    assert bool((kl_divergence(*rows) > 0).all())  # Gibbs: positive wherever the rows differ
    assert bool((entropy(rows[0]) <= math.log(5)).all())
    assert math.isfinite(float(kl_divergence(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))))  # a missed class: large, finite


def test_kl_from_logits_is_kl_to_the_softmax() -> None:
    p, logits = torch.tensor([[0.25, 0.75], [1.0, 0.0]]), torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    expected = [0.25 * math.log(0.5) + 0.75 * math.log(1.5), math.log(4 / 3)]  # softmax rows (1/2, 1/2) and (3/4, 1/4)
    per_row = kl_divergence_from_logits(p, logits)
    assert torch.allclose(per_row, torch.tensor(expected))
    assert torch.allclose(per_row, kl_divergence(p, torch.softmax(logits, -1)))
    assert float(kl_divergence_from_logits(p, logits, reduction="batchmean")) == pytest.approx(sum(expected) / 2)
    assert float(kl_divergence_from_logits(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 200.0]]))) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="reduction"):
        kl_divergence_from_logits(p, logits, reduction="sum")  # type: ignore[arg-type]


def test_distillation_losses_hand_values() -> None:
    assert float(l1_to_logits(torch.tensor([[1.0, -1.0]]), torch.tensor([[0.0, 1.0]]))) == pytest.approx(1.5)
    logits, target = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.25, 0.75]])
    assert float(soft_cross_entropy(logits, target)) == pytest.approx(math.log(2))


def test_topk_accuracy_skips_unlabeled_rows() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0], [1.0, 2.0, 3.0], [3.0, 1.0, 2.0]])
    labels = torch.tensor([0, 2, -1, 1])
    assert topk_accuracy(logits, labels, 1) == pytest.approx(1 / 3)
    assert topk_accuracy(logits, labels, 2) == pytest.approx(2 / 3)
    assert topk_accuracy(logits, labels, 10) == 1.0
    assert math.isnan(topk_accuracy(logits, torch.full((4,), -1), 1))


def test_scaled_confidence_is_stable_where_probabilities_saturate() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    p = torch.softmax(logits.double(), -1)[0, 0]
    assert float(scaled_confidence(logits, torch.tensor([0]))) == pytest.approx(float(torch.log(p / (1 - p))))
    saturated = scaled_confidence(torch.tensor([[100.0, 0.0], [200.0, 0.0]]), torch.tensor([0, 0]))
    assert torch.allclose(saturated, torch.tensor([100.0, 200.0], dtype=torch.float64))  # float32 p rounds both to 1.0
    k_models = torch.randn(4, 3, 5)  # (K, N, J): φ of every model on every sample at once
    assert scaled_confidence(k_models, torch.tensor([0, 1, 2])).shape == (4, 3)
    probs = torch.tensor([[0.9, 0.1], [1.0, 0.0]])
    from_probs = scaled_confidence_from_probs(probs, torch.tensor([0, 0]))
    assert float(from_probs[0]) == pytest.approx(math.log(9)) and float(from_probs[1]) == pytest.approx(math.log((1 - 1e-8) / 1e-8))


def test_offline_lira_ranks_members_above_and_never_ties_at_saturation() -> None:
    reference = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])  # μ = 1, σ = 1 per sample
    target = torch.tensor([1.0, 9.0, 40.0])
    score = offline_lira(target, reference)
    assert torch.allclose(score, torch.tensor([0.0, 8.0, 39.0], dtype=torch.float64))
    cdf32 = offline_lira_float32_lambda(target, reference)
    assert float(cdf32[0]) == 0.5 and float(cdf32[1]) == float(cdf32[2]) == 1.0  # the authors' float32 CDF ties these two
    log_lambda = offline_lira_log_probability(target, reference)
    assert float(log_lambda[0]) == pytest.approx(math.log(0.5)) and log_lambda[1] < log_lambda[2] <= 0  # log space keeps them apart
    pooled = offline_lira(target, reference + torch.tensor([0.0, 0.0, 1.0]), global_variance=True)
    assert pooled.shape == (3,) and torch.isfinite(pooled).all()
    assert torch.isfinite(offline_lira(target, torch.ones(3, 3))).all()  # σ = 0: floored, not a division by zero
    assert torch.equal(offline_lira_float32_lambda(torch.tensor([0.5, 1.0, 2.0]), torch.ones(3, 3)), torch.tensor([0.0, 0.5, 1.0]))


def test_offline_lira_variance_is_per_sample_unless_pooled() -> None:
    reference = torch.tensor([[0.0, 0.0], [2.0, 4.0]])  # per-sample μ = (1, 2), unbiased σ = (√2, 2√2)
    target = torch.tensor([3.0, 3.0])
    per_sample = torch.tensor([2 / math.sqrt(2), 1 / (2 * math.sqrt(2))], dtype=torch.float64)
    assert torch.allclose(offline_lira(target, reference), per_sample)
    pooled = math.sqrt((1 + 1 + 4 + 4) / (4 - 2))  # squared deviations from each sample's mean over K·N − N degrees of freedom
    assert torch.allclose(
        offline_lira(target, reference, global_variance=True), torch.tensor([2 / pooled, 1 / pooled], dtype=torch.float64)
    )


def test_online_lira_is_the_gaussian_log_likelihood_ratio() -> None:
    inside = torch.tensor([[1.0], [3.0]])  # μ_in = 2, σ_in = √2
    outside = torch.tensor([[-2.0], [2.0]])  # μ_out = 0, σ_out = 2√2
    x = torch.tensor([1.5])
    s_in, s_out = math.sqrt(2), 2 * math.sqrt(2)
    expected = (-0.5 * ((1.5 - 2) / s_in) ** 2 - math.log(s_in)) - (-0.5 * (1.5 / s_out) ** 2 - math.log(s_out))
    assert float(online_lira(x, inside, outside)) == pytest.approx(expected)


def test_forward_difference_gradient_estimates_the_gradient_of_a_black_box() -> None:
    a = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    loss = lambda x: (x.flatten(1) @ a.T).pow(2).sum(-1)  # noqa: E731  per-sample ||A x||^2
    x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(1))
    true = (2 * (x.flatten(1) @ a.T) @ a).reshape_as(x)
    estimate, queries = forward_difference_gradient(loss, x, m=2000, epsilon=1e-3, generator=torch.Generator().manual_seed(2))
    assert queries == 4 * (2000 + 1)
    cosine = torch.nn.functional.cosine_similarity(estimate.flatten(1), true.flatten(1), dim=-1)
    assert bool((cosine > 0.9).all())
    few = [forward_difference_gradient(loss, x, m=5, epsilon=1e-3, generator=torch.Generator().manual_seed(s))[0] for s in range(400)]
    mean = torch.stack(few).mean(0)  # unbiased up to O(ε): the average of many 5-direction estimates approaches ∇L
    assert float(torch.nn.functional.cosine_similarity(mean.flatten(), true.flatten(), dim=0)) > 0.95
    assert float((mean - true).norm() / true.norm()) < 0.25  # in magnitude too: E[d (uᵀg) u] = g needs the factor d
