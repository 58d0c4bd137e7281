"""Offline RMIA (Zarifzadeh, Liu & Shokri, "Low-Cost High-Power Membership Inference Attacks", ICML 2024, §3): a
likelihood-ratio test of each sample x against population samples z, with reference models that never trained on x.

With Pr(x|θ) the target model's probability of x's label and Pr(x) its mean over reference models,
LR_θ(x, z) = (Pr(x|θ) / Pr(x)) / (Pr(z|θ) / Pr(z)) and the score is Score_MIA(x) = Pr_z(LR_θ(x, z) ≥ γ), the share of the
population x dominates by at least γ. Offline (only OUT references), Pr(x) = ½((1 + a)·Pr_OUT(x) + (1 − a)): ``a``
scales the OUT mean up toward what IN models would give (the authors' ``run_rmia``, whose γ is 1 and whose ``a`` is
tuned on a reference model whose members are known, 0 in their demo).
"""

from __future__ import annotations

import torch
from torch import Tensor


def offline_marginal(reference: Tensor, a: float, answered: Tensor | None = None) -> Tensor:
    """Pr(x) per sample from the OUT references' probabilities (K, N): ½((1 + a)·mean + (1 − a)), the mean over the
    references that ``answered`` (K, N) bool, every one where None; NaN where none answered."""
    ref = reference.double()
    weight = torch.ones_like(ref) if answered is None else answered.double()
    count = weight.sum(dim=0)
    mean = torch.where(count > 0, (ref * weight).sum(dim=0) / count.clamp_min(1), torch.full_like(count, float("nan")))
    return (1 + a) / 2 * mean + (1 - a) / 2


def offline_rmia(
    target: Tensor, reference: Tensor, population: Tensor, a: float, gamma: float = 1.0, answered: Tensor | None = None
) -> Tensor:
    """Score_MIA(x) for every sample: the share of the ``population`` samples z ≠ x with LR(x, z) ≥ γ.

    Args:
        target: (N,) the target model's probability of each sample's label.
        reference: (K, N) the OUT references' probabilities of the same.
        population: (N,) bool, the samples that serve as z (the ones with a target and a reference probability).
        a: the offline scaling of Pr_OUT(x), in [0, 1].
        gamma: the likelihood-ratio threshold γ.
        answered: (K, N) bool, which reference probabilities exist (None = all).

    Returns:
        (N,) float64 scores in [0, 1] (NaN where the population holds no other sample).
    """
    ratio = target.double() / offline_marginal(reference, a, answered)
    z = ratio[population].sort().values
    # LR(x, z) >= γ  <=>  ratio(z) <= ratio(x) / γ: count the population at or below that, then leave x itself out
    dominated = torch.searchsorted(z, ratio / gamma, right=True).double()
    itself = population & (ratio >= gamma * ratio)
    others = population.sum().double() - population.double()
    return torch.where(others > 0, (dominated - itself.double()) / others.clamp_min(1), torch.full_like(ratio, float("nan")))
