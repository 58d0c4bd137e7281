"""Label distributions: LDIA's estimate from outputs (Shi et al., PoPETs 2025, Eq. 4) and the distances it is scored with (their §4.1.3).

Rows are distributions over the M classes; every distance reduces over the last dimension and returns one
value per row.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from fdattack.functional.information import kl_divergence

#: the floor of p in the printed Eq. 7 direction KL(p̂ ‖ p), where p has empty classes (Shi et al., PoPETs 2025, Eq. 7)
EQ7_FLOOR = 1e-12


def estimate_from_outputs(outputs: Tensor, kind: Literal["logits", "probs"]) -> Tensor:
    """p̂ = (1/|D_inf|) Σ_x softmax(z(x)) (Eq. 4) over the rows of ``outputs`` (N, M); probability uploads
    (Cronus, DS-FL's softmax uploads) are averaged with no second softmax (the paper does not say), each row scaled to sum 1 first: a no-op
    for a softmax, and a distribution from LabelAvg's weighted top-K label vectors (top weight 1, summing to more).
    Float64, (M,)."""
    rows = outputs.double()
    if kind != "probs":
        return torch.softmax(rows, dim=-1).mean(dim=0)
    sums = rows.sum(dim=-1, keepdim=True)
    return torch.where(sums > 0, rows / sums, rows).mean(dim=0)


def label_proportions(labels: Tensor, num_classes: int) -> Tensor:
    """p_m = |D^m| / |D|: the true label distribution of a set's labels (M,), float64."""
    counts = torch.bincount(labels.long(), minlength=num_classes).double()
    return counts / counts.sum()


def chebyshev(p: Tensor, q: Tensor) -> Tensor:
    """max_m |p_m − q_m| (Eq. 8)."""
    return (p - q).abs().amax(dim=-1)


def mean_l1(p: Tensor, q: Tensor) -> Tensor:
    """(1/M) Σ_m |p_m − q_m| (the "mean l1-distance" Shi et al. mention)."""
    return (p - q).abs().mean(dim=-1)


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    """½ Σ_m |p_m − q_m|."""
    return 0.5 * (p - q).abs().sum(dim=-1)


def distances(truth: Tensor, estimate: Tensor) -> dict[str, Tensor]:
    """Every LDIA distance of ``estimate`` from ``truth`` (rows (..., M)), one value per row.

    ``kl`` is KL(p ‖ p̂), the primary metric (finite where a client lacks a class, as the authors' code computes it);
    ``kl_eq7`` is the printed Eq. 7 direction KL(p̂ ‖ p) with p floored at :data:`EQ7_FLOOR`.
    """
    return {
        "kl": kl_divergence(truth, estimate),
        "kl_eq7": kl_divergence(estimate, truth.clamp_min(EQ7_FLOOR)),
        "chebyshev": chebyshev(truth, estimate),
        "l1": mean_l1(truth, estimate),
        "tv": total_variation(truth, estimate),
    }


def random_distributions(shape: tuple[int, ...], num_classes: int, generator: torch.Generator) -> Tensor:
    """The Random baseline's guesses q = u / Σu with u ~ U(0, 1)^M (Shi et al., PoPETs 2025, §4.2, who do not say how
    they draw it): (*shape, M), float64."""
    u = torch.rand(*shape, num_classes, generator=generator, dtype=torch.float64)
    return u / u.sum(dim=-1, keepdim=True)
