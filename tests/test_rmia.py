"""RMIA (Zarifzadeh, Liu & Shokri, ICML 2024) against federated distillation: the test by hand, and the two attacks
beside distillation and co-op LiRA on the same simulation."""

from __future__ import annotations

import torch

from fdattack.functional.rmia import offline_marginal, offline_rmia


def test_offline_rmia_matches_a_hand_computed_case() -> None:
    """a = 0.3, γ = 2, two references (the second did not answer candidate 3), candidate 4 outside the population.

    Pr(x) = 0.65 · mean_OUT + 0.35: 0.61, 0.675, 0.545, 0.74 (candidate 3 from the first reference alone), 0.415; the
    ratios Pr(x|θ)/Pr(x): 1.475, 0.741, 0.367, 0.811, 1.928. x dominates z where ratio(z) <= ratio(x)/2: candidates 0,
    1 and 3 each dominate only candidate 2 of their 3 others (1/3); candidate 2 dominates none; candidate 4, outside
    the population (its others are all four), dominates 1, 2 and 3 (3/4)."""
    target = torch.tensor([0.9, 0.5, 0.2, 0.6, 0.8])
    references = torch.tensor([[0.3, 0.5, 0.4, 0.6, 0.1], [0.5, 0.5, 0.2, 0.2, 0.1]])
    answered = torch.ones(2, 5, dtype=torch.bool)
    answered[1, 3] = False
    population = torch.tensor([True, True, True, True, False])
    marginal = offline_marginal(references, 0.3, answered)
    torch.testing.assert_close(marginal, torch.tensor([0.61, 0.675, 0.545, 0.74, 0.415], dtype=torch.float64))
    scores = offline_rmia(target, references, population, a=0.3, gamma=2.0, answered=answered)
    torch.testing.assert_close(scores, torch.tensor([1 / 3, 1 / 3, 0.0, 1 / 3, 3 / 4], dtype=torch.float64))


def test_with_gamma_one_a_sample_counts_ties_but_never_itself() -> None:
    """γ = 1: x dominates every z with a ratio at or below its own; equal ratios dominate each other, x never counts."""
    target = torch.tensor([0.5, 0.5, 0.25])
    references = torch.tensor([[0.5, 0.5, 0.5]])
    scores = offline_rmia(target, references, torch.ones(3, dtype=torch.bool), a=1.0, gamma=1.0)
    torch.testing.assert_close(scores, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
