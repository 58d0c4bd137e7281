"""Entropy and KL divergence of probability rows (natural log), the quantities every family measures outputs with.

Every function reduces over the class dimension only and returns one value per row, except where a ``reduction``
argument says otherwise.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor


def entropy(p: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy H(p) = −Σ_u p_u ln p_u along ``dim`` (0 ln 0 = 0): PLI's αH(p⁰) (Takahashi et al., CVPR 2023, Eq. 4), DS-FL's ERA and
    FedGEMS' inverse-entropy weights (their App. B)."""
    return -torch.special.xlogy(p, p).sum(dim=dim)


def softmax_entropy(logits: Tensor, dim: int = -1) -> Tensor:
    """H(softmax(l)) along ``dim``, from log-softmax (no probability that underflows to 0 is logged)."""
    log_p = torch.log_softmax(logits.float(), dim=dim)
    return -(log_p.exp() * log_p).sum(dim=dim)


def kl_divergence(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """KL(p ‖ q) = Σ_u p_u ln(p_u / q_u) along ``dim``: p the truth, q the estimate (the direction of the code of Shi et
    al., PoPETs 2025; their Eq. 7 prints KL(q ‖ p)).

    Terms with p_u = 0 are 0; q is floored at the smallest positive float, so an estimate that misses a class
    costs a large finite amount instead of inf.
    """
    q = q.clamp_min(torch.finfo(q.dtype).tiny)
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(dim=dim)


def kl_divergence_from_logits(p: Tensor, logits: Tensor, reduction: Literal["none", "batchmean"] = "none") -> Tensor:
    """KL(p ‖ softmax(z)) = Σ_u p_u (ln p_u − log_softmax(z)_u) over the last dim: p the target rows, z the model's logits.

    The KD loss L^KL of DS-FL and Cronus (Shi et al., PoPETs 2025, Eq. 2) and the Cronus students of Distillation-based LiRA
    (their §3.3.2). ``reduction="none"`` gives one value per row; ``"batchmean"`` their sum over the rows
    divided by the row count (``F.kl_div``'s, as Eq. 2's 1/|B|).
    """
    log_q = F.log_softmax(logits, dim=-1)
    if reduction == "batchmean":
        return F.kl_div(log_q, p, reduction="batchmean")
    if reduction == "none":
        return F.kl_div(log_q, p, reduction="none").sum(dim=-1)
    raise ValueError(f"reduction must be 'none' or 'batchmean', got {reduction!r}")
