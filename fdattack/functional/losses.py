"""Distillation losses shared by protocols and attacks."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def l1_to_logits(logits: Tensor, target_logits: Tensor) -> Tensor:
    """Mean absolute difference to target logits (``nn.L1Loss``): FedMD's digest to the consensus (pli.md §5.1,
    pdafd.md Eq. 1) and the distillation of LiRA's shadow students from a client's uploads (pdafd.md §6.4)."""
    return F.l1_loss(logits, target_logits)


def soft_cross_entropy(logits: Tensor, target_probs: Tensor) -> Tensor:
    """−Σ_u q_u log softmax(z)_u averaged over rows: distillation to soft labels (DS-FL, pli.md §5.3)."""
    return -(target_probs * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
