"""LiRA's membership scores (Carlini et al. 2022) as PDA-FD uses them (Shi et al., PoPETs 2025, §3.3, Eqs. 5-6), without saturation.

The scaled confidence φ = log(p_y / (1 − p_y)) is computed from logits as z_y − logsumexp_{j≠y} z_j, so
it stays finite and ordered where p_y rounds to 1. Offline LiRA fits N(μ_out, σ²_out) to the reference
("OUT") models' φ and scores a target φ_t by Φ((φ_t − μ_out) / σ_out) (Eq. 6); the primary score is the
standardised s = (φ_t − μ_out) / σ_out (or its log Φ in float64), which ranks the same without the ties at
exactly 1.0 that float32 CDFs give; the authors' float32 λ stays available for parity.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

PROB_CLAMP = 1e-8  #: the authors' clamp of p and 1 − p (in their code)
MIN_STD = 1e-8  #: σ used where the reference scores do not vary


def scaled_confidence(logits: Tensor, labels: Tensor) -> Tensor:
    """φ(f(x)_y) = log(p_y / (1 − p_y)) (Eq. 5) as z_y − logsumexp_{j≠y} z_j, for logits (..., N, J) and labels (N,):
    shape (..., N), float64."""
    z = logits.double()
    index = labels.to(torch.long).expand(*z.shape[:-1]).unsqueeze(-1)
    true = z.gather(-1, index).squeeze(-1)
    others = z.scatter(-1, index, float("-inf"))
    return true - torch.logsumexp(others, dim=-1)


def scaled_confidence_from_probs(probs: Tensor, labels: Tensor) -> Tensor:
    """φ from probability uploads (Cronus): log p_y − log1p(−p_y), p_y clamped to [1e-8, 1 − 1e-8]."""
    index = labels.to(torch.long).expand(*probs.shape[:-1]).unsqueeze(-1)
    p = probs.double().gather(-1, index).squeeze(-1).clamp(PROB_CLAMP, 1 - PROB_CLAMP)
    return torch.log(p) - torch.log1p(-p)


def _moments(reference: Tensor, answered: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Per sample: the mean, the sum of squared deviations and the count of the references' φ (K, N) in ``answered``
    (K, N) bool (every one where None), in ``dtype``."""
    ref = reference.to(dtype)
    weight = torch.ones_like(ref) if answered is None else answered.to(dtype)
    count = weight.sum(dim=0)
    mu = (ref * weight).sum(dim=0) / count.clamp_min(1)
    return mu, ((ref - mu) ** 2 * weight).sum(dim=0), count


def _unbiased_std(squares: Tensor, count: Tensor) -> Tensor:
    """sqrt(squares / (count − 1)) per sample; 0 below two values."""
    return torch.where(count > 1, squares / (count - 1).clamp_min(1), torch.zeros_like(squares)).sqrt()


def offline_lira(target: Tensor, reference: Tensor, global_variance: bool = False, answered: Tensor | None = None) -> Tensor:
    """Standardised offline-LiRA score s = (φ_t − μ_out) / σ_out per sample (higher = more likely a member).

    Args:
        target: (N,) φ of the target model on the N samples.
        reference: (K, N) φ of the K reference (OUT) models.
        global_variance: one σ pooled over all samples (Carlini's option, steadier for K <= 8) instead of the
            per-sample unbiased std (the paper's).
        answered: (K, N) bool, the reference scores that exist (a reference that withheld a sample has none); None =
            all. A sample no reference answered gets μ = 0 and the caller decides what its score means.
    """
    mu, squares, count = _moments(reference, answered, torch.float64)
    if global_variance:
        dof = float((count - 1).clamp_min(0).sum())
        sigma = (squares.sum() / max(dof, 1.0)).sqrt().expand_as(mu)
    else:
        sigma = _unbiased_std(squares, count)
    return (target.double() - mu) / sigma.clamp_min(MIN_STD)


def offline_lira_log_probability(target: Tensor, reference: Tensor, global_variance: bool = False) -> Tensor:
    """log λ = log Φ(s) in float64 (Eq. 6 in log space): the paper's score, ranked without saturation."""
    return torch.special.log_ndtr(offline_lira(target, reference, global_variance))


def offline_lira_float32_lambda(target: Tensor, reference: Tensor, answered: Tensor | None = None) -> Tensor:
    """λ = Φ((φ_t − μ_out) / σ_out) (Eq. 6) as the authors compute it, for parity with the paper's tables.

    float32 ``Normal(μ_out, σ_out).cdf`` with the per-sample unbiased std, σ = 0 replaced by 1e-8 (the authors' code). It is exactly
    1.0 from s ≈ 5.3 on, so it ties there; rank by :func:`offline_lira` or :func:`offline_lira_log_probability`.

    Args:
        target: (N,) φ of the target model; reference: (K, N) φ of the K >= 2 reference (OUT) models.
        answered: (K, N) bool, the reference scores that exist, as in :func:`offline_lira`; None = all.
    """
    mu, squares, count = _moments(reference, answered, torch.float32)
    sigma = _unbiased_std(squares, count)
    sigma = torch.where(sigma == 0, torch.full_like(sigma, MIN_STD), sigma)
    return torch.distributions.Normal(mu, sigma).cdf(target.float())


def online_lira(target: Tensor, inside: Tensor, outside: Tensor) -> Tensor:
    """log N(φ_t; μ_in, σ²_in) − log N(φ_t; μ_out, σ²_out): the likelihood ratio of online LiRA, in log space.

    Args:
        target: (N,) φ of the target model; inside/outside: (K, N) φ of reference models trained with/without each sample.
    """

    def log_normal(x: Tensor, ref: Tensor) -> Tensor:
        mu, sigma = ref.double().mean(dim=0), ref.double().std(dim=0, unbiased=True).clamp_min(MIN_STD)
        return -0.5 * ((x.double() - mu) / sigma) ** 2 - torch.log(sigma) - 0.5 * math.log(2 * math.pi)

    return log_normal(target, inside) - log_normal(target, outside)
