"""Generic training objectives of the protocols' phases: ``(logits, batch) -> scalar loss``.

Distillation batches carry the soft target in ``batch["target"]`` (rows aligned with the batch). Objectives
without data-dependent branches are declared :func:`~fdattack.lit.classifier.vmappable`, so that clients of
one architecture train with them as one vmapped batch (:mod:`fdattack.engine.vectorised`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from fdattack import functional
from fdattack.data.imageset import IndexedBatch
from fdattack.lit.classifier import cross_entropy, vmappable


@vmappable
def l1_to_logits(logits: Tensor, batch: IndexedBatch) -> Tensor:
    """FedMD digest: mean absolute error to the consensus logits (``nn.L1Loss``; Takahashi et al., CVPR 2023, §4.1;
    Shi et al., PoPETs 2025, Eq. 1)."""
    return functional.l1_to_logits(logits, batch["target"])  # type: ignore[typeddict-item]


@vmappable
def soft_cross_entropy(logits: Tensor, batch: IndexedBatch) -> Tensor:
    """DS-FL distillation: -sum_u q_u log softmax(z)_u averaged over the batch (Takahashi et al., CVPR 2023, §4.1)."""
    return functional.soft_cross_entropy(logits, batch["target"])  # type: ignore[typeddict-item]


@vmappable
def kl_to_probs(logits: Tensor, batch: IndexedBatch) -> Tensor:
    """Cronus distillation: KL(p_teacher || softmax(z)), batchmean (Shi et al., PoPETs 2025, Eq. 2)."""
    return functional.kl_divergence_from_logits(batch["target"], logits, reduction="batchmean")  # type: ignore[typeddict-item]


def mixed_ce_kl(logits: Tensor, batch: IndexedBatch) -> Tensor:
    """Cronus mixed KD: CE on rows with a hard label and no soft target, KL on rows with a soft target.

    Rows with ``target`` summing to 0 are private rows (hard label only). Not :func:`vmappable`: which terms
    exist depends on the batch's rows, so these clients train one at a time.
    """
    target = batch["target"]  # type: ignore[typeddict-item]
    soft = target.sum(dim=-1) > 0
    loss = logits.new_zeros(())
    if (~soft).any():
        loss = loss + F.cross_entropy(logits[~soft], batch["y"][~soft]) * (~soft).float().mean()
    if soft.any():
        loss = loss + functional.kl_divergence_from_logits(target[soft], logits[soft], reduction="batchmean") * soft.float().mean()
    return loss


__all__ = ["cross_entropy", "l1_to_logits", "soft_cross_entropy", "kl_to_probs", "mixed_ce_kl"]
