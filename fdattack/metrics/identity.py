"""Evaluation-classifier score of reconstructions: top-k identity accuracy (the GMI / KED-MI convention).

PLI itself scores with SSIM only (pli.md §10.3); this second figure makes PLI comparable with later
model-inversion attacks. The classifier is trained apart from every federated model, on ground truth; its classes
are the targets' private looks and, beside them, classes a reconstruction must not fall into (the targets' public
looks, the non-target labels: :mod:`fdattack.evaluation.identity`), so that copying the public look is a miss.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from fdattack.functional import topk_accuracy


class IdentityScorer:
    """Top-1 / top-5 of reconstructions under an evaluation classifier whose first T outputs are the targets.

    A reconstruction of target j is a hit when j's output ranks first (top-5: among the first five) over *all* the
    classifier's outputs, the extra classes included.

    Args:
        predict: ``images (N, C, H, W) -> (N, K)`` logits, K >= T; outputs 0..T-1 stand for ``target_labels`` in
            that order (the targets' private looks), the others for anything else (public looks, other labels).
        target_labels: the labels the first T outputs stand for.
        test_accuracy: the classifier's own top-1 on held-out images (reported next to its scores).
        public_look: ``(images (P, C, H, W), labels (P,))``: the targets' public means, scored as
            ``eval_top1_public_look`` (what a copy of the public look earns) over the labels scored; None = not logged.
        class_names: a name per output (for messages and readers), or None.
    """

    def __init__(self, predict: Callable[[Tensor], Tensor], target_labels: list[int], test_accuracy: float,
                 public_look: Optional[tuple[Tensor, Tensor]] = None, class_names: Optional[Sequence[str]] = None) -> None:
        self.predict = predict
        self.index = {label: i for i, label in enumerate(target_labels)}
        self.test_accuracy = test_accuracy
        self.public_look = public_look
        self.class_names = tuple(class_names) if class_names is not None else None
        self._public_hits: Optional[dict[int, float]] = None

    def _rows(self, labels: Tensor) -> Tensor:
        return torch.tensor([self.index[int(y)] for y in labels], dtype=torch.long)

    def public_look_hits(self) -> dict[int, float]:
        """Target label -> 1.0 if its public mean is classified as its private look, else 0.0 (computed once)."""
        if self._public_hits is None:
            self._public_hits = {}
            if self.public_look is not None and len(self.public_look[1]):
                images, labels = self.public_look
                top = self.predict(images).argmax(dim=1)
                self._public_hits = {int(y): float(t == r) for y, t, r in zip(labels, top, self._rows(labels))}
        return self._public_hits

    def __call__(self, recon: Tensor, labels: Tensor) -> dict[str, float]:
        logits = self.predict(recon)
        rows = self._rows(labels)
        out = {"eval_top1": topk_accuracy(logits, rows, 1), "eval_top5": topk_accuracy(logits, rows, 5),
               "eval_classifier_accuracy": self.test_accuracy}
        hits = [self.public_look_hits()[int(y)] for y in labels if int(y) in self.public_look_hits()]
        if hits:
            out["eval_top1_public_look"] = sum(hits) / len(hits)
        return out
