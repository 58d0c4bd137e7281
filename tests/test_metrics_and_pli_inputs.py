"""Shared attack metrics and PLI's closed-form inputs, against hand-computed values and an optimiser."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fdattack.attacks.pli_inputs import alpha_for_peak, confidence_gap_q, optimal_inputs, optimal_server_input
from fdattack.functional.attack_accuracy import attack_accuracy, class_means
from fdattack.functional.image import gaussian_window, pairwise_ssim, paper_ssim, standard_ssim, total_variation


def test_paper_ssim_of_constant_images_with_unit_window() -> None:
    # 1x1 window: no variance, SSIM = (2uv + C1) / (u^2 + v^2 + C1) with u = 0, v = 1 in [0, 1], C1 = (0.01*2)^2
    a, b = -torch.ones(1, 1, 4, 4), torch.ones(1, 1, 4, 4)
    c1 = 0.02**2
    assert paper_ssim(a, b, window=1).item() == pytest.approx(c1 / (1 + c1), rel=1e-6)
    # u = 0.5, v = 1: (2*0.5 + C1) / (1.25 + C1)
    assert paper_ssim(torch.zeros(1, 1, 4, 4), b, window=1).item() == pytest.approx((1 + c1) / (1.25 + c1), rel=1e-6)


def test_ssims_are_one_on_identical_images_and_lower_otherwise() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 3, 16, 16, generator=g) * 2 - 1
    y = (x + 0.5 * torch.randn(3, 3, 16, 16, generator=g)).clamp(-1, 1)
    for ssim in (paper_ssim, standard_ssim):
        assert torch.allclose(ssim(x, x), torch.ones(3), atol=1e-5)
        assert bool((ssim(x, y) < 0.95).all())


def test_paper_ssim_matches_a_direct_2d_window_and_pairwise_matches_pairs() -> None:
    """The separable filter equals one 2-D zero-padded convolution with the 11x11 window; the shared-moment
    pairwise form equals calling paper_ssim on every pair."""
    g = torch.Generator().manual_seed(3)
    a = torch.rand(4, 3, 20, 20, generator=g, dtype=torch.float64) * 2 - 1
    b = torch.rand(5, 3, 20, 20, generator=g, dtype=torch.float64) * 2 - 1

    def direct(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x * 0.5 + 0.5, y * 0.5 + 0.5
        w = gaussian_window()[None, None].repeat(3, 1, 1, 1)
        f = lambda z: F.conv2d(z, w, padding=5, groups=3)  # noqa: E731
        mx, my = f(x), f(y)
        vx, vy, cxy = f(x * x) - mx**2, f(y * y) - my**2, f(x * y) - mx * my
        c1, c2 = 0.02**2, 0.06**2
        return (((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))).flatten(1).mean(1)

    assert torch.allclose(paper_ssim(a, b[:4]).double(), direct(a, b[:4]), atol=1e-6)
    by_pair = torch.stack([paper_ssim(a[i : i + 1].expand_as(b), b) for i in range(4)])
    assert torch.allclose(pairwise_ssim(a, b), by_pair, atol=1e-6)
    assert pairwise_ssim(a[:0], b).shape == (0, 5)


def test_total_variation_hand_computed() -> None:
    x = torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]]])
    assert total_variation(x).item() == pytest.approx(1.0 + 2.0)


def test_attack_accuracy_criterion() -> None:
    g = torch.Generator().manual_seed(1)
    private = torch.rand(3, 1, 12, 12, generator=g) * 2 - 1
    public = torch.rand(3, 1, 12, 12, generator=g) * 2 - 1
    recon = torch.stack([private[0], public[1], private[0]])
    result = attack_accuracy(recon, torch.tensor([0, 1, 2]), private, public)
    assert result.success.tolist() == [True, False, False]
    assert result.accuracy == pytest.approx(1 / 3)
    assert result.too_close_to_public == 1  # the second looks like label 1's public mean
    # a label without private data (NaN mean) is never the answer
    private_nan = private.clone()
    private_nan[2] = float("nan")
    assert attack_accuracy(recon[:1], torch.tensor([0]), private_nan, public).accuracy == 1.0


def test_class_means() -> None:
    images = torch.tensor([1.0, 3.0, 10.0]).reshape(3, 1, 1, 1)
    means = class_means(images, torch.tensor([0, 0, 2]), 3)
    assert means[0].item() == 2.0 and means[2].item() == 10.0 and math.isnan(means[1].item())


def test_eq6_table_values_for_alpha_5() -> None:
    for j_classes, peak, rest in ((1000, 0.0012211, 0.00099978), (530, 0.0023036, 0.0018860), (200, 0.0061003, 0.0049945)):
        p = optimal_server_input(torch.tensor([3]), j_classes, 5.0)[0]
        assert p[3].item() == pytest.approx(peak, rel=1e-4)
        assert p[0].item() == pytest.approx(rest, rel=1e-4)
        assert p.sum().item() == pytest.approx(1.0, abs=1e-6)
        assert alpha_for_peak(p[3].item(), j_classes) == pytest.approx(5.0, rel=1e-4)


@pytest.mark.parametrize("alpha", [0.5, 2.0, 5.0])
def test_eq6_maximises_q_against_a_numerical_optimiser(alpha: float) -> None:
    j_classes, label = 7, 2
    closed = optimal_inputs(torch.tensor([label]), j_classes, alpha)[0]
    q_closed = confidence_gap_q(closed[j_classes:], closed[:j_classes], label, alpha)
    torch.manual_seed(0)
    z_client = torch.zeros(j_classes, requires_grad=True)
    z_server = torch.randn(j_classes, requires_grad=True)
    opt = torch.optim.Adam([z_client, z_server], lr=0.05)
    for _ in range(3000):
        q = confidence_gap_q(torch.softmax(z_client, -1), torch.softmax(z_server, -1), label, alpha)
        opt.zero_grad()
        (-q).backward()
        opt.step()
    with torch.no_grad():
        p_server = torch.softmax(z_server, -1)
        q_numeric = confidence_gap_q(torch.softmax(z_client, -1), p_server, label, alpha)
    assert q_numeric.item() <= q_closed.item() + 1e-4
    assert q_numeric.item() == pytest.approx(q_closed.item(), abs=2e-3)
    torch.testing.assert_close(p_server, closed[:j_classes], atol=2e-3, rtol=0)


def test_topk_accuracy_and_identity_scorer_by_hand() -> None:
    from fdattack.evaluation.identity import IdentityScorer
    from fdattack.functional import topk_accuracy

    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.15, 0.05], [0.2, 0.3, 0.5]])
    labels = torch.tensor([1, 1, 0])
    assert topk_accuracy(logits, labels, 1) == pytest.approx(1 / 3)  # only row 0 ranks its label first
    assert topk_accuracy(logits, labels, 2) == pytest.approx(2 / 3)  # row 1's label is second; row 2's is last
    assert topk_accuracy(logits, labels, 5) == 1.0  # k capped at the 3 classes
    scorer = IdentityScorer(lambda images: logits, target_labels=[7, 3, 5], test_accuracy=0.9)
    scores = scorer(torch.zeros(3, 1, 2, 2), torch.tensor([3, 3, 7]))  # labels 3, 3, 7 are outputs 1, 1, 0
    assert scores == {"eval_top1": pytest.approx(1 / 3), "eval_top5": 1.0, "eval_classifier_accuracy": 0.9}
