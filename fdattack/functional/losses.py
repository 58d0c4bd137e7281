"""Distillation losses shared by protocols and attacks, and the L-Attack's loss toward a target class."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def l1_to_logits(logits: Tensor, target_logits: Tensor) -> Tensor:
    """Mean absolute difference to target logits (``nn.L1Loss``): FedMD's digest to the consensus (Takahashi et al., CVPR 2023, §4.1;
    Shi et al., PoPETs 2025, Eq. 1) and the distillation of LiRA's shadow students from a client's uploads (Shi et al.,
    §3.3.2)."""
    return F.l1_loss(logits, target_logits)


def soft_cross_entropy(logits: Tensor, target_probs: Tensor) -> Tensor:
    """−Σ_u q_u log softmax(z)_u averaged over rows: distillation to soft labels (DS-FL, Takahashi et al., CVPR 2023, §4.1)."""
    return -(target_probs * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


#: δ of the L-Attack's −log(q_c* + δ) on probability or label vectors (a choice: Xiao et al., DSN 2024 give none)
LOG_DELTA = 1e-8


def target_class_loss(outputs: Tensor, target: int, loss: str, kind: str, delta: float = LOG_DELTA) -> Tensor:
    """Per-row loss toward class c* = ``target``: what a generator lowers to make images of c* (Xiao et al., DSN 2024,
    §IV-C, leave it open: "the loss function of the local model").

    On logits f: ``ce`` −log softmax(f)_c*, ``neg_logit`` −f_c*, ``neg_prob`` −softmax(f)_c*. On probabilities or label
    vectors q (``kind="probs"``, e.g. LabelAvg's w ⊙ v or v_smooth): ``ce`` −log(q_c* + δ), ``neg_prob`` −q_c*; they carry
    no logits, so ``neg_logit`` is refused.

    Args:
        outputs: (N, J) logits or probabilities.
        target: c*.
        loss: ``ce`` | ``neg_logit`` | ``neg_prob``.
        kind: ``logits`` | ``probs``.

    Returns:
        (N,) the losses.
    """
    if kind == "logits":
        if loss == "ce":
            return -F.log_softmax(outputs, dim=-1)[:, target]
        if loss == "neg_logit":
            return -outputs[:, target]
        if loss == "neg_prob":
            return -F.softmax(outputs, dim=-1)[:, target]
    elif kind == "probs":
        if loss == "ce":
            return -torch.log(outputs[:, target] + delta)
        if loss == "neg_prob":
            return -outputs[:, target]
        if loss == "neg_logit":
            raise ValueError("loss 'neg_logit' needs logits; these outputs are probabilities (use 'ce' or 'neg_prob')")
    raise ValueError(f"unknown loss {loss!r} or kind {kind!r}: loss is ce | neg_logit | neg_prob, kind logits | probs")
