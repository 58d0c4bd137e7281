"""Evaluation-classifier score of reconstructions: top-k identity accuracy (the GMI / KED-MI convention).

PLI itself scores with SSIM only (pli.md §10.3); this second figure makes PLI comparable with later
model-inversion attacks. The classifier is trained apart from every federated model, on ground truth.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from fdattack.functional import topk_accuracy


class IdentityScorer:
    """Top-1 / top-5 of reconstructions under an evaluation classifier over the target labels.

    Args:
        predict: ``images (N, C, H, W) -> (N, T)`` logits over the targets, in ``target_labels`` order.
        target_labels: the labels the classifier's outputs stand for.
        test_accuracy: the classifier's own top-1 on held-out images (reported next to its scores).
    """

    def __init__(self, predict: Callable[[Tensor], Tensor], target_labels: list[int], test_accuracy: float) -> None:
        self.predict = predict
        self.index = {label: i for i, label in enumerate(target_labels)}
        self.test_accuracy = test_accuracy

    def __call__(self, recon: Tensor, labels: Tensor) -> dict[str, float]:
        logits = self.predict(recon)
        rows = torch.tensor([self.index[int(y)] for y in labels])
        return {"eval_top1": topk_accuracy(logits, rows, 1), "eval_top5": topk_accuracy(logits, rows, 5),
                "eval_classifier_accuracy": self.test_accuracy}
