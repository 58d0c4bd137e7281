"""Entropy and KL divergence of probability rows (natural log), the quantities every family measures outputs with."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy(p: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy H(p) = −Σ_u p_u ln p_u along ``dim`` (0 ln 0 = 0)."""
    return -torch.special.xlogy(p, p).sum(dim=dim)


def softmax_entropy(logits: Tensor, dim: int = -1) -> Tensor:
    """H(softmax(l)) along ``dim``, from log-softmax (no probability that underflows to 0 is logged)."""
    log_p = torch.log_softmax(logits.float(), dim=dim)
    return -(log_p.exp() * log_p).sum(dim=dim)


def kl_divergence(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """KL(p ‖ q) = Σ_u p_u ln(p_u / q_u) along ``dim``: p the truth, q the estimate (pdafd.md §8.1's direction).

    Terms with p_u = 0 are 0; q is floored at the smallest positive float, so an estimate that misses a class
    costs a large finite amount instead of inf.
    """
    q = q.clamp_min(torch.finfo(q.dtype).tiny)
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(dim=dim)
