"""Top-k accuracy of logits against labels, skipping unlabeled rows (label −1)."""

from __future__ import annotations

import torch
from torch import Tensor


def topk_accuracy(logits: Tensor, labels: Tensor, k: int = 1) -> float:
    """Fraction of labeled rows (label >= 0) whose label is among the k largest logits; NaN without labeled rows.

    ``k`` is capped at the number of classes. A NaN logit never ranks high: a row whose own logit is NaN is
    a miss, and when every labeled row is all NaN (a diverged model, NaN images) the accuracy is NaN, never
    a count of hits on the first classes.
    """
    keep = labels >= 0
    logits, labels = logits[keep], labels[keep].to(torch.long)
    if not bool((~torch.isnan(logits).all(dim=1)).any()):
        return float("nan")
    top = logits.masked_fill(torch.isnan(logits), float("-inf")).topk(min(k, logits.shape[1]), dim=1).indices
    own_is_nan = torch.isnan(logits.gather(1, labels[:, None]))[:, 0]
    return float(((top == labels[:, None]).any(dim=1) & ~own_is_nan).float().mean())
