"""Top-k accuracy of logits against labels, skipping unlabeled rows (label −1)."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.classification import multiclass_accuracy


def topk_accuracy(logits: Tensor, labels: Tensor, k: int = 1) -> float:
    """Fraction of labeled rows (label >= 0) whose label is among the k largest logits; NaN without labeled rows.

    ``k`` is capped at the number of classes.
    """
    keep = labels >= 0
    if not bool(keep.any()):
        return float("nan")
    num_classes = logits.shape[1]
    return float(multiclass_accuracy(logits[keep], labels[keep].to(torch.long), num_classes=num_classes,
                                     top_k=min(k, num_classes), average="micro"))
