"""Membership-inference metrics from scores (Shi et al., PoPETs 2025, §4.1.4): ROC, TPR at a low FPR, AUC, balanced accuracy.

Scores are ranked, not thresholded at a fixed value: any monotone transform gives the same metrics. They are
mapped to dense ranks in [0, 1] before torchmetrics sees them (equal scores stay tied), so that its ROC neither
applies a sigmoid to scores outside [0, 1] nor loses their order in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_auroc, binary_roc

#: the FPR levels reported (the paper's 1 % and 0.1 %), as metric-name suffixes
FPR_LEVELS = {"tpr_at_1pct_fpr": 0.01, "tpr_at_0.1pct_fpr": 0.001}


def dense_ranks(scores: Tensor) -> Tensor:
    """Scores as dense ranks scaled to [0, 1] (ties keep one rank), float32."""
    values, inverse = torch.unique(scores, sorted=True, return_inverse=True)
    return inverse.float() / max(len(values) - 1, 1)


def roc(is_member: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
    """(FPR, TPR) of every threshold, from FPR 0 up (``sklearn.metrics.roc_curve``'s curve)."""
    fpr, tpr, _ = binary_roc(dense_ranks(scores), is_member.long(), thresholds=None)
    return fpr, tpr


def tpr_at_fpr(fpr: Tensor, tpr: Tensor, level: float) -> float:
    """The largest TPR at an ROC point whose FPR is at most ``level`` (the PDA-FD authors' code)."""
    allowed = fpr <= level
    return float(tpr[allowed].max()) if bool(allowed.any()) else 0.0


def membership_metrics(is_member: Tensor, scores: Tensor) -> dict[str, float]:
    """TPR at 1 % and 0.1 % FPR, AUC, and balanced accuracy max_τ ½(TPR_τ + 1 − FPR_τ) of one target's scores.

    Args:
        is_member: (N,) bool, True for members.
        scores: (N,) higher = more likely a member.
    """
    if bool(is_member.all()) or not bool(is_member.any()):
        raise ValueError("membership metrics need both members and non-members")
    fpr, tpr = roc(is_member, scores)
    metrics = {name: tpr_at_fpr(fpr, tpr, level) for name, level in FPR_LEVELS.items()}
    metrics["auc"] = float(binary_auroc(dense_ranks(scores), is_member.long(), thresholds=None))
    metrics["balanced_accuracy"] = float((0.5 * (tpr + 1 - fpr)).max())
    return metrics
